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

use berth_workspace::{
    BackendDriverRef, BackendRef, Placement, ProvisionContext, WorkspaceError, WorkspaceId, WorkspaceSpec,
};
use serde::{Deserialize, Serialize};

use crate::error::NodeError;
use crate::limits::NodeLimits;
use crate::quarantine::{Quarantine, QuarantineReason};

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
    /// The workspace's owner as the replica named it (portable drivers label with it).
    #[serde(default)]
    owner: String,
}

/// One workspace on this node.
pub struct Entry {
    pub id: WorkspaceId,
    pub generation: u64,
    pub backend_name: String,
    pub spec: WorkspaceSpec,
    /// The owner the replica named at provision (empty for `global`).
    pub owner: String,
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
    debug_destroy_delay: std::sync::atomic::AtomicU64,
    hooks: RwLock<Vec<Arc<dyn LifecycleHook>>>,
    /// Per workspace without a copy here, the newest generation this node saw before its
    /// copy went away (`state/<id>.floor`): a provision at or below it is a stale placement.
    floors: RwLock<HashMap<WorkspaceId, u64>>,
    quarantine: Quarantine,
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
            drivers,
            default_backend,
            entries: RwLock::new(HashMap::new()),
            lifecycle: Mutex::new(HashMap::new()),
            debug_provision_delay,
            debug_destroy_delay: std::sync::atomic::AtomicU64::new(0),
            hooks: RwLock::new(Vec::new()),
            floors: RwLock::new(HashMap::new()),
            quarantine: Quarantine::new(data_dir_quarantine(&data_dir)),
            data_dir,
        }
    }

    /// Copies moved aside instead of deleted (superseded, orphaned, or replaced by a fresh
    /// workspace of the same id).
    pub fn quarantine(&self) -> &Quarantine {
        &self.quarantine
    }

    /// Test hook: every delete waits this long after removing the files, before it returns.
    pub fn set_debug_destroy_delay(&self, delay: Duration) {
        self.debug_destroy_delay.store(delay.as_millis() as u64, Ordering::Relaxed);
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

    fn floor_path(&self, id: &WorkspaceId) -> PathBuf {
        self.data_dir.join("state").join(format!("{id}.floor"))
    }

    /// The newest generation this node saw of a workspace it holds no copy of.
    pub fn floor(&self, id: &WorkspaceId) -> Option<u64> {
        self.floors.read().unwrap_or_else(|poisoned| poisoned.into_inner()).get(id).copied()
    }

    /// Remembers (durably) that generations up to `generation` of `id` are gone here.
    async fn raise_floor(&self, id: &WorkspaceId, generation: u64) -> Result<(), WorkspaceError> {
        let floor = self.floor(id).unwrap_or(0).max(generation);
        let path = self.floor_path(id);
        let temporary = path.with_extension(format!("floor.tmp-{}", rand::random::<u32>()));
        let io = |source| WorkspaceError::Io { op: "write", path: path.display().to_string(), source };
        tokio::fs::write(&temporary, floor.to_string()).await.map_err(io)?;
        tokio::fs::rename(&temporary, &path).await.map_err(io)?;
        self.floors.write().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id.clone(), floor);
        Ok(())
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
            if path.extension().and_then(|extension| extension.to_str()) == Some("floor") {
                self.restore_floor(&path).await;
                continue;
            }
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

    async fn restore_floor(&self, path: &Path) {
        let id = path.file_stem().and_then(|stem| stem.to_str()).and_then(|stem| WorkspaceId::new(stem).ok());
        let floor = tokio::fs::read_to_string(path).await.ok().and_then(|text| text.trim().parse::<u64>().ok());
        match (id, floor) {
            (Some(id), Some(floor)) => {
                self.floors.write().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id, floor);
            }
            _ => tracing::warn!(path = %path.display(), "skipping an unreadable generation floor"),
        }
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
            let placement = Placement { generation: meta.generation, owner: &meta.owner, fresh: false };
            let context =
                ProvisionContext { workspace_id: &meta.workspace_id, root: &root, spec: &meta.spec, placement };
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
            owner: meta.owner,
            backend,
            last_access_ms: AtomicI64::new(now_ms()),
            execs_in_flight: AtomicU32::new(0),
        });
        Ok(id)
    }

    /// Makes the workspace exist and run at `generation`. Idempotent: the same generation
    /// again is a no-op. Refused ([`NodeError::StaleGeneration`]) at or below a generation
    /// this node has already seen go, and below the copy it holds: a newer placement already
    /// happened. With `fresh` (the id had no workspace when the replica placed it), an older
    /// copy found here is never adopted: it is moved to the quarantine and the workspace
    /// starts empty.
    pub async fn provision(
        &self,
        id: &WorkspaceId,
        generation: u64,
        backend: &str,
        spec: &WorkspaceSpec,
        fresh: bool,
        owner: &str,
    ) -> Result<Provisioned, NodeError> {
        let backend_name = if backend.is_empty() { self.default_backend.clone() } else { backend.to_owned() };
        let driver = Arc::clone(self.driver(&backend_name)?);
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        if !self.debug_provision_delay.is_zero() {
            tokio::time::sleep(self.debug_provision_delay).await;
        }
        if let Some(floor) = self.floor(id)
            && generation <= floor
        {
            return Err(NodeError::StaleGeneration { workspace_id: id.clone(), newest: floor, asked: generation });
        }
        if let Some(existing) = self.get(id) {
            if generation < existing.generation {
                return Err(NodeError::StaleGeneration {
                    workspace_id: id.clone(),
                    newest: existing.generation,
                    asked: generation,
                });
            }
            if fresh && generation > existing.generation {
                // A copy the registry does not know: an orphan of a bind that never recorded
                // it, or of a workspace deleted while this node was away. Never adopted.
                self.quarantine_locked(&existing, QuarantineReason::ReplacedByFresh { generation }).await?;
            } else {
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
        }
        let root = self.root_of(id);
        tokio::fs::create_dir_all(&root).await.map_err(|source| WorkspaceError::Io {
            op: "create",
            path: id.to_string(),
            source,
        })?;
        let placement = Placement { generation, owner, fresh };
        let context = ProvisionContext { workspace_id: id, root: &root, spec, placement };
        let handle = driver.provision(context).await?;
        berth_workspace::layout::ensure(handle.as_ref()).await?;
        let created = self.get(id).is_none();
        self.write_meta(id, generation, &backend_name, spec, owner, true).await?;
        self.insert(Entry {
            id: id.clone(),
            generation,
            backend_name: backend_name.clone(),
            spec: spec.clone(),
            owner: owner.to_owned(),
            backend: Some(handle.clone()),
            last_access_ms: AtomicI64::new(now_ms()),
            execs_in_flight: AtomicU32::new(0),
        });
        for hook in self.hooks() {
            hook.provisioned(id, &handle).await;
        }
        Ok(Provisioned { created, backend: backend_name })
    }

    /// Stops the runtime, keeps the files. With `generation` (what the replica recorded),
    /// only that copy: a replica that lost its lock meanwhile cannot stop a newer one.
    pub async fn release(&self, id: &WorkspaceId, generation: Option<u64>) -> Result<(), NodeError> {
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        let Some(existing) = self.get(id) else { return Ok(()) };
        if let Some(expected) = generation
            && expected != existing.generation
        {
            return Err(NodeError::WrongGeneration { workspace_id: id.clone(), held: existing.generation, expected });
        }
        self.driver(&existing.backend_name)?.release(id).await?;
        self.write_meta(id, existing.generation, &existing.backend_name, &existing.spec, &existing.owner, false)
            .await?;
        self.insert(Entry {
            id: id.clone(),
            generation: existing.generation,
            backend_name: existing.backend_name.clone(),
            spec: existing.spec.clone(),
            owner: existing.owner.clone(),
            backend: None,
            last_access_ms: AtomicI64::new(existing.last_access_ms.load(Ordering::Relaxed)),
            execs_in_flight: AtomicU32::new(0),
        });
        for hook in self.hooks() {
            hook.released(id).await;
        }
        Ok(())
    }

    /// Deletes the workspace (the owner asked): runtime, files and state. With `generation`
    /// (what the replica recorded), a newer copy here is refused, never deleted, and every
    /// generation up to the deleted one is refused from then on. Returns whether something
    /// was removed.
    pub async fn delete(&self, id: &WorkspaceId, generation: Option<u64>) -> Result<bool, NodeError> {
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        let existing = self.get(id);
        if let (Some(existing), Some(generation)) = (&existing, generation)
            && existing.generation > generation
        {
            return Err(NodeError::StaleGeneration {
                workspace_id: id.clone(),
                newest: existing.generation,
                asked: generation,
            });
        }
        let floor = generation.unwrap_or(0).max(existing.as_ref().map_or(0, |existing| existing.generation));
        if floor > 0 {
            self.raise_floor(id, floor).await?;
        }
        if let Some(existing) = &existing {
            self.driver(&existing.backend_name)?.destroy(id).await?;
        }
        // State first: a crash after this leaves orphaned files, never a workspace that
        // claims to exist without them.
        self.remove_meta(id).await?;
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
        let delay = self.debug_destroy_delay.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        Ok(removed || existing.is_some())
    }

    /// Moves a copy a newer placement superseded (generation `up_to` or older) to the
    /// quarantine; a newer copy is left alone. Returns whether something was moved.
    pub async fn destroy_stale(&self, id: &WorkspaceId, up_to: u64) -> Result<bool, NodeError> {
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        let Some(existing) = self.get(id) else { return Ok(false) };
        if existing.generation > up_to {
            return Ok(false);
        }
        self.quarantine_locked(&existing, QuarantineReason::Superseded).await?;
        Ok(true)
    }

    /// Stops the copy's runtime, moves its files to the quarantine and forgets it; later
    /// provisions at or below its generation are refused. Under the lifecycle lock.
    async fn quarantine_locked(&self, existing: &Entry, reason: QuarantineReason) -> Result<(), NodeError> {
        let id = &existing.id;
        self.raise_floor(id, existing.generation).await?;
        self.driver(&existing.backend_name)?.destroy(id).await?;
        self.remove_meta(id).await?;
        self.remove(id);
        let root = self.root_of(id);
        let entry = self.quarantine.admit(id, existing.generation, &existing.backend_name, &root, reason).await?;
        tracing::warn!(ws_id = %id, generation = existing.generation, entry = %entry, "copy moved to the quarantine");
        for hook in self.hooks() {
            hook.destroyed(id).await;
        }
        Ok(())
    }

    /// Moves quarantine entry `name` into the live copy of its workspace on this node, as
    /// `restored-<name>/` at the top of the root, owned like the root. Returns the workspace
    /// and the path relative to its root. The root itself cannot be swapped by the sandbox
    /// (its parent is the node's), and a link planted at the destination makes the move
    /// fail, so the files never land outside the workspace.
    pub async fn restore_quarantined(&self, name: &str) -> Result<(WorkspaceId, String), NodeError> {
        let entry = self.quarantine.get(name).await?;
        let id = entry.workspace_id.clone();
        let lock = self.lifecycle_lock(&id);
        let _guard = lock.lock().await;
        if self.get(&id).is_none() {
            return Err(NodeError::RestoreElsewhere { workspace_id: id });
        }
        let root = self.root_of(&id);
        let relative = format!("restored-{name}");
        let destination = root.join(&relative);
        if tokio::fs::symlink_metadata(&destination).await.is_ok() {
            return Err(WorkspaceError::AlreadyExists { path: relative }.into());
        }
        self.quarantine.take(&entry, &destination).await?;
        let stat_io = |source| WorkspaceError::Io { op: "stat", path: root.display().to_string(), source };
        let metadata = tokio::fs::metadata(&root).await.map_err(stat_io)?;
        let (owner, group) =
            (std::os::unix::fs::MetadataExt::uid(&metadata), std::os::unix::fs::MetadataExt::gid(&metadata));
        let chowned = destination.clone();
        tokio::task::spawn_blocking(move || crate::quarantine::chown_tree(&chowned, owner, group))
            .await
            .map_err(|error| WorkspaceError::Backend { backend: "node", message: error.to_string() })?
            .map_err(|source| WorkspaceError::Io { op: "chown", path: destination.display().to_string(), source })?;
        tracing::info!(ws_id = %id, entry = name, "quarantined copy restored into the workspace");
        Ok((id, relative))
    }

    async fn remove_meta(&self, id: &WorkspaceId) -> Result<(), WorkspaceError> {
        let meta = self.meta_path(id);
        match tokio::fs::remove_file(&meta).await {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(WorkspaceError::Io { op: "remove", path: meta.display().to_string(), source }),
        }
    }

    async fn write_meta(
        &self,
        id: &WorkspaceId,
        generation: u64,
        backend: &str,
        spec: &WorkspaceSpec,
        owner: &str,
        running: bool,
    ) -> Result<(), WorkspaceError> {
        let meta = Meta {
            version: META_VERSION,
            workspace_id: id.clone(),
            generation,
            backend: backend.to_owned(),
            spec: spec.clone(),
            running,
            owner: owner.to_owned(),
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

fn data_dir_quarantine(data_dir: &Path) -> PathBuf {
    data_dir.join("quarantine")
}
