//! The workspaces this node holds.
//!
//! Durable (under `<data-dir>`): `workspaces/<id>/` (the files) and `state/<id>.json`
//! (generation, backend, spec, whether the runtime should run), written atomically. Rebuilt
//! at start: the in-memory entries, and the runtimes of workspaces marked running (drivers
//! adopt what still exists, e.g. containers by label).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use berth_workspace::{BackendDriverRef, BackendRef, ProvisionContext, WorkspaceError, WorkspaceId, WorkspaceSpec};
use serde::{Deserialize, Serialize};

use crate::limits::NodeLimits;

const META_VERSION: u32 = 1;

/// Told about lifecycle changes, after they happened (under the workspace's lifecycle
/// lock). Hooks log their own failures: a hook never fails the change.
#[tonic::async_trait]
pub trait LifecycleHook: Send + Sync {
    /// The runtime is up and the layout exists (every provision, also an idempotent one).
    async fn provisioned(&self, _id: &WorkspaceId, _backend: &BackendRef) {}
    /// The runtime was stopped; the files stay.
    async fn released(&self, _id: &WorkspaceId) {}
    /// Runtime, files and state are gone (also a stale copy removed on command).
    async fn destroyed(&self, _id: &WorkspaceId) {}
}

#[derive(Debug, Serialize, Deserialize)]
struct Meta {
    version: u32,
    workspace_id: WorkspaceId,
    generation: u64,
    backend: String,
    spec: WorkspaceSpec,
    running: bool,
}

/// One workspace on this node.
pub struct Entry {
    pub id: WorkspaceId,
    pub generation: u64,
    pub backend_name: String,
    pub spec: WorkspaceSpec,
    /// `None` while released (data kept, no runtime).
    pub backend: Option<BackendRef>,
    pub last_access_ms: AtomicI64,
    pub execs_in_flight: AtomicU32,
}

impl Entry {
    pub fn touch(&self) {
        self.last_access_ms.store(now_ms(), Ordering::Relaxed);
    }
}

pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|elapsed| elapsed.as_millis() as i64).unwrap_or(0)
}

pub struct Workspaces {
    data_dir: PathBuf,
    drivers: HashMap<String, BackendDriverRef>,
    default_backend: String,
    entries: RwLock<HashMap<WorkspaceId, Arc<Entry>>>,
    /// Serialises lifecycle changes (provision / release / destroy) per workspace.
    lifecycle: Mutex<HashMap<WorkspaceId, Arc<tokio::sync::Mutex<()>>>>,
    debug_provision_delay: Duration,
    hooks: RwLock<Vec<Arc<dyn LifecycleHook>>>,
}

/// Outcome of a provision.
pub struct Provisioned {
    pub created: bool,
    pub backend: String,
}

impl Workspaces {
    pub fn new(
        data_dir: PathBuf,
        drivers: HashMap<String, BackendDriverRef>,
        default_backend: String,
        debug_provision_delay: Duration,
    ) -> Self {
        Self {
            data_dir,
            drivers,
            default_backend,
            entries: RwLock::new(HashMap::new()),
            lifecycle: Mutex::new(HashMap::new()),
            debug_provision_delay,
            hooks: RwLock::new(Vec::new()),
        }
    }

    /// Registers a hook for every later lifecycle change.
    pub fn add_hook(&self, hook: Arc<dyn LifecycleHook>) {
        self.hooks.write().unwrap_or_else(|poisoned| poisoned.into_inner()).push(hook);
    }

    fn hooks(&self) -> Vec<Arc<dyn LifecycleHook>> {
        self.hooks.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    pub fn root_of(&self, id: &WorkspaceId) -> PathBuf {
        self.data_dir.join("workspaces").join(id.as_str())
    }

    fn meta_path(&self, id: &WorkspaceId) -> PathBuf {
        self.data_dir.join("state").join(format!("{id}.json"))
    }

    pub fn get(&self, id: &WorkspaceId) -> Option<Arc<Entry>> {
        self.entries.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Entry>> {
        self.entries.read().unwrap_or_else(|poisoned| poisoned.into_inner()).values().cloned().collect()
    }

    fn insert(&self, entry: Entry) {
        self.entries.write().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(entry.id.clone(), Arc::new(entry));
    }

    fn remove(&self, id: &WorkspaceId) {
        self.entries.write().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(id);
    }

    fn lifecycle_lock(&self, id: &WorkspaceId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.lifecycle.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(locks.entry(id.clone()).or_default())
    }

    fn driver(&self, name: &str) -> Result<&BackendDriverRef, WorkspaceError> {
        self.drivers
            .get(name)
            .ok_or_else(|| WorkspaceError::UnknownBackend { name: name.to_owned(), offered: self.offered().join(", ") })
    }

    pub fn offered(&self) -> Vec<String> {
        let mut names: Vec<String> = self.drivers.keys().cloned().collect();
        names.sort();
        names
    }

    /// Loads the state files and brings back the runtimes that should run, under today's
    /// defaults and ceilings (`limits`): a spec stored before the operator lowered a
    /// ceiling is brought down to it (and logged), not left above it.
    pub async fn restore(&self, limits: &NodeLimits) -> Result<(), WorkspaceError> {
        let state_dir = self.data_dir.join("state");
        tokio::fs::create_dir_all(&state_dir).await.map_err(|source| WorkspaceError::Io {
            op: "create",
            path: state_dir.display().to_string(),
            source,
        })?;
        // 0700: state files hold workspace specs, their env (API keys...) included; no
        // sandbox uid may read them, even one that got out of its sandbox.
        tokio::fs::set_permissions(&state_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .await
            .map_err(|source| WorkspaceError::Io { op: "chmod 0700", path: state_dir.display().to_string(), source })?;
        tokio::fs::create_dir_all(self.data_dir.join("workspaces")).await.map_err(|source| WorkspaceError::Io {
            op: "create",
            path: "workspaces".into(),
            source,
        })?;
        let mut listing = tokio::fs::read_dir(&state_dir).await.map_err(|source| WorkspaceError::Io {
            op: "list",
            path: state_dir.display().to_string(),
            source,
        })?;
        while let Ok(Some(file)) = listing.next_entry().await {
            let path = file.path();
            if path.extension().and_then(|extension| extension.to_str()) != Some("json") {
                continue;
            }
            match self.restore_one(&path, limits).await {
                Ok(id) => tracing::info!(ws_id = %id, "restored workspace"),
                Err(error) => tracing::warn!(path = %path.display(), %error, "skipping a workspace state file"),
            }
        }
        Ok(())
    }

    async fn restore_one(&self, path: &Path, limits: &NodeLimits) -> Result<WorkspaceId, WorkspaceError> {
        let bytes = tokio::fs::read(path).await.map_err(|source| WorkspaceError::Io {
            op: "read",
            path: path.display().to_string(),
            source,
        })?;
        let mut meta: Meta = serde_json::from_slice(&bytes)
            .map_err(|error| WorkspaceError::Corrupt { what: path.display().to_string(), reason: error.to_string() })?;
        let lowered = limits.clamp_spec(&mut meta.spec);
        if !lowered.is_empty() {
            tracing::warn!(ws_id = %meta.workspace_id, ?lowered, "restored workspace brought under today's ceilings");
        }
        let backend = if meta.running {
            let driver = self.driver(&meta.backend)?;
            let root = self.root_of(&meta.workspace_id);
            let context = ProvisionContext { workspace_id: &meta.workspace_id, root: &root, spec: &meta.spec };
            Some(driver.provision(context).await?)
        } else {
            None
        };
        let id = meta.workspace_id.clone();
        self.insert(Entry {
            id: meta.workspace_id,
            generation: meta.generation,
            backend_name: meta.backend,
            spec: meta.spec,
            backend,
            last_access_ms: AtomicI64::new(now_ms()),
            execs_in_flight: AtomicU32::new(0),
        });
        Ok(id)
    }

    /// Makes the workspace exist and run at `generation`. Idempotent: the same generation
    /// again is a no-op; an older one is refused (a newer placement already happened).
    pub async fn provision(
        &self,
        id: &WorkspaceId,
        generation: u64,
        backend: &str,
        spec: &WorkspaceSpec,
    ) -> Result<Provisioned, WorkspaceError> {
        let backend_name = if backend.is_empty() { self.default_backend.clone() } else { backend.to_owned() };
        let driver = Arc::clone(self.driver(&backend_name)?);
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        if !self.debug_provision_delay.is_zero() {
            tokio::time::sleep(self.debug_provision_delay).await;
        }
        if let Some(existing) = self.get(id) {
            if generation < existing.generation {
                return Err(WorkspaceError::InvalidArgument(format!(
                    "workspace {id} is at generation {} here; refusing older generation {generation}",
                    existing.generation
                )));
            }
            if let Some(handle) = &existing.backend
                && existing.backend_name == backend_name
                && existing.generation == generation
            {
                for hook in self.hooks() {
                    hook.provisioned(id, handle).await;
                }
                return Ok(Provisioned { created: false, backend: backend_name });
            }
            if existing.backend_name != backend_name {
                // Switching backend: stop the old runtime, keep the files.
                self.driver(&existing.backend_name)?.release(id).await?;
            }
        }
        let root = self.root_of(id);
        tokio::fs::create_dir_all(&root).await.map_err(|source| WorkspaceError::Io {
            op: "create",
            path: id.to_string(),
            source,
        })?;
        let context = ProvisionContext { workspace_id: id, root: &root, spec };
        let handle = driver.provision(context).await?;
        berth_workspace::layout::ensure(handle.as_ref()).await?;
        let created = self.get(id).is_none();
        self.write_meta(id, generation, &backend_name, spec, true).await?;
        self.insert(Entry {
            id: id.clone(),
            generation,
            backend_name: backend_name.clone(),
            spec: spec.clone(),
            backend: Some(handle.clone()),
            last_access_ms: AtomicI64::new(now_ms()),
            execs_in_flight: AtomicU32::new(0),
        });
        for hook in self.hooks() {
            hook.provisioned(id, &handle).await;
        }
        Ok(Provisioned { created, backend: backend_name })
    }

    /// Stops the runtime, keeps the files.
    pub async fn release(&self, id: &WorkspaceId) -> Result<(), WorkspaceError> {
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        let Some(existing) = self.get(id) else { return Ok(()) };
        self.driver(&existing.backend_name)?.release(id).await?;
        self.write_meta(id, existing.generation, &existing.backend_name, &existing.spec, false).await?;
        self.insert(Entry {
            id: id.clone(),
            generation: existing.generation,
            backend_name: existing.backend_name.clone(),
            spec: existing.spec.clone(),
            backend: None,
            last_access_ms: AtomicI64::new(existing.last_access_ms.load(Ordering::Relaxed)),
            execs_in_flight: AtomicU32::new(0),
        });
        for hook in self.hooks() {
            hook.released(id).await;
        }
        Ok(())
    }

    /// Removes runtime, files and state. With `only_up_to`, only a copy at that generation
    /// or older (a stale copy) is removed. Returns whether something was removed.
    pub async fn destroy(&self, id: &WorkspaceId, only_up_to: Option<u64>) -> Result<bool, WorkspaceError> {
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        let existing = self.get(id);
        if let (Some(existing), Some(limit)) = (&existing, only_up_to)
            && existing.generation > limit
        {
            return Ok(false);
        }
        if let Some(existing) = &existing {
            self.driver(&existing.backend_name)?.destroy(id).await?;
        }
        // State first: a crash after this leaves orphaned files, never a workspace that
        // claims to exist without them.
        let meta = self.meta_path(id);
        match tokio::fs::remove_file(&meta).await {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => return Err(WorkspaceError::Io { op: "remove", path: meta.display().to_string(), source }),
        }
        self.remove(id);
        let root = self.root_of(id);
        let removed = tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&root) {
            Ok(()) => Ok(true),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(WorkspaceError::Io { op: "remove", path: root.display().to_string(), source }),
        })
        .await
        .map_err(|error| WorkspaceError::Backend { backend: "node", message: error.to_string() })??;
        for hook in self.hooks() {
            hook.destroyed(id).await;
        }
        Ok(removed || existing.is_some())
    }

    async fn write_meta(
        &self,
        id: &WorkspaceId,
        generation: u64,
        backend: &str,
        spec: &WorkspaceSpec,
        running: bool,
    ) -> Result<(), WorkspaceError> {
        let meta = Meta {
            version: META_VERSION,
            workspace_id: id.clone(),
            generation,
            backend: backend.to_owned(),
            spec: spec.clone(),
            running,
        };
        let path = self.meta_path(id);
        let temporary = path.with_extension(format!("json.tmp-{}", rand::random::<u32>()));
        let bytes = serde_json::to_vec_pretty(&meta).unwrap_or_default();
        let io = |source| WorkspaceError::Io { op: "write", path: path.display().to_string(), source };
        tokio::fs::write(&temporary, bytes).await.map_err(io)?;
        tokio::fs::rename(&temporary, &path).await.map_err(io)?;
        Ok(())
    }
}
