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
use crate::quarantine::{Quarantine, QuarantineReason};
use crate::snapshots::NodeSnapshotsRef;

mod slots;
mod startup;

use slots::ProvisionSlots;
pub use slots::default_provision_slots;

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
    /// When the last snapshot of this copy started (unix ms; 0: none on this node).
    pub last_snapshot_ms: AtomicI64,
}

impl Entry {
    pub fn touch(&self) {
        self.last_access_ms.store(now_ms(), Ordering::Relaxed);
    }

    /// Used (a call admitted, an exec ended) since its last snapshot started, or running
    /// an exec now: a snapshot may be behind its files.
    pub fn changed_since_snapshot(&self) -> bool {
        self.execs_in_flight.load(Ordering::Relaxed) > 0
            || self.last_access_ms.load(Ordering::Relaxed) >= self.last_snapshot_ms.load(Ordering::Relaxed)
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
    /// The snapshot store (`--snapshot-store`), if any.
    snapshots: RwLock<Option<NodeSnapshotsRef>>,
    /// Per host driver, admits `--max-concurrent-provisions` of its provisions at a time to
    /// their host work.
    provisions: ProvisionSlots,
}

/// Outcome of a provision.
pub struct Provisioned {
    pub created: bool,
    pub backend: String,
    /// The snapshot the new copy was restored from.
    pub restored: Option<berth_proto::v1::SnapshotTaken>,
    /// Restore candidates that failed (`<id>: <error>`), newest first.
    pub restore_failures: Vec<String>,
}

/// What a provision restores a new copy from (`ProvisionRequest.restore_snapshots`).
#[derive(Clone, Debug, Default)]
pub struct RestoreFrom {
    /// Snapshot ids, newest first.
    pub candidates: Vec<String>,
    /// Replace the copy held here too, and fail (keeping it) when none restores.
    pub required: bool,
}

impl Workspaces {
    pub fn new(
        data_dir: PathBuf,
        drivers: HashMap<String, BackendDriverRef>,
        default_backend: String,
        debug_provision_delay: Duration,
        provision_slots: usize,
    ) -> Self {
        Self {
            default_backend,
            entries: RwLock::new(HashMap::new()),
            lifecycle: Mutex::new(HashMap::new()),
            debug_provision_delay,
            debug_destroy_delay: std::sync::atomic::AtomicU64::new(0),
            hooks: RwLock::new(Vec::new()),
            floors: RwLock::new(HashMap::new()),
            quarantine: Quarantine::new(data_dir_quarantine(&data_dir)),
            snapshots: RwLock::new(None),
            provisions: ProvisionSlots::new(
                drivers.iter().filter(|(_, driver)| !driver.portable()).map(|(name, _)| name),
                provision_slots,
            ),
            drivers,
            data_dir,
        }
    }

    /// Snapshots go to (and restores come from) `snapshots` from now on.
    pub fn set_snapshots(&self, snapshots: NodeSnapshotsRef) {
        *self.snapshots.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(snapshots);
    }

    pub fn snapshots(&self) -> Option<NodeSnapshotsRef> {
        self.snapshots.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Snapshots the copy held here now (under its lifecycle lock, so one at a time per
    /// workspace and never during a provision, release or destroy), at the generation it
    /// holds; with `expected`, only that generation. `Ok(None)`: no store, a portable copy
    /// (its files are the provider's), or `only_if_changed` and unchanged since its last one.
    pub async fn snapshot(
        &self,
        id: &WorkspaceId,
        expected: Option<u64>,
        always: bool,
    ) -> Result<Option<berth_proto::v1::SnapshotTaken>, NodeError> {
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        let existing = self.get(id).ok_or_else(|| NodeError::NotHeld { workspace_id: id.clone() })?;
        if let Some(expected) = expected
            && expected != existing.generation
        {
            return Err(NodeError::WrongGeneration { workspace_id: id.clone(), held: existing.generation, expected });
        }
        self.snapshot_locked(&existing, always).await
    }

    async fn snapshot_locked(
        &self,
        existing: &Entry,
        always: bool,
    ) -> Result<Option<berth_proto::v1::SnapshotTaken>, NodeError> {
        let Some(snapshots) = self.snapshots() else { return Ok(None) };
        if self.driver(&existing.backend_name)?.portable() || (!always && !existing.changed_since_snapshot()) {
            return Ok(None);
        }
        let started_ms = now_ms();
        let taken = snapshots.take(&existing.id, existing.generation, &self.root_of(&existing.id)).await?;
        existing.last_snapshot_ms.store(started_ms, Ordering::Relaxed);
        Ok(Some(taken))
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

    /// How many workspaces this node holds.
    pub fn held(&self) -> usize {
        self.entries.read().unwrap_or_else(|poisoned| poisoned.into_inner()).len()
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

    /// The sandboxes at `backend`'s provider carrying this cluster's labels (a portable
    /// backend this node offers; none for host backends).
    pub async fn list_labelled(&self, backend: &str) -> Result<Vec<berth_workspace::LabelledSandbox>, NodeError> {
        Ok(self.driver(backend)?.list_labelled().await?)
    }

    /// Deletes one labelled sandbox at `backend`'s provider — unless this node holds that
    /// workspace (a janitor working from a record it had not yet seen must not remove it).
    pub async fn remove_labelled(
        &self,
        backend: &str,
        sandbox: &berth_workspace::LabelledSandbox,
    ) -> Result<(), NodeError> {
        if let Some(id) = &sandbox.workspace_id
            && self.get(id).is_some_and(|entry| entry.generation >= sandbox.generation)
        {
            return Err(NodeError::Workspace(WorkspaceError::AlreadyExists {
                path: format!("workspace {id} is held here"),
            }));
        }
        Ok(self.driver(backend)?.remove_labelled(sandbox).await?)
    }

    /// Brings `backend`'s warm pool to `target` ready runtimes (0 empties it).
    pub async fn fill_pool(&self, backend: &str, target: usize) -> Result<berth_workspace::PoolLevel, WorkspaceError> {
        self.driver(backend)?.fill_pool(target).await
    }

    pub fn offered(&self) -> Vec<String> {
        let mut names: Vec<String> = self.drivers.keys().cloned().collect();
        names.sort();
        names
    }

    /// Makes the workspace exist and run at `generation`. Idempotent: the same generation
    /// again is a no-op. Refused ([`NodeError::StaleGeneration`]) at or below a generation
    /// this node has already seen go, and below the copy it holds: a newer placement already
    /// happened. With `fresh` (the id had no workspace when the replica placed it), an older
    /// copy found here is never adopted: it is moved to the quarantine and the workspace
    /// starts empty.
    #[allow(clippy::too_many_arguments)]
    pub async fn provision(
        &self,
        id: &WorkspaceId,
        generation: u64,
        backend: &str,
        spec: &WorkspaceSpec,
        fresh: bool,
        owner: &str,
        restore: &RestoreFrom,
    ) -> Result<Provisioned, NodeError> {
        let backend_name = if backend.is_empty() { self.default_backend.clone() } else { backend.to_owned() };
        let driver = Arc::clone(self.driver(&backend_name)?);
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        if let Some(floor) = self.floor(id)
            && generation <= floor
        {
            return Err(NodeError::StaleGeneration { workspace_id: id.clone(), newest: floor, asked: generation });
        }
        if let Some(existing) = self.get(id)
            && generation < existing.generation
        {
            return Err(NodeError::StaleGeneration {
                workspace_id: id.clone(),
                newest: existing.generation,
                asked: generation,
            });
        }
        // An explicit restore makes the new tree first: the copy held here is replaced only
        // by a snapshot that restored completely.
        let restored_aside =
            if restore.required && !driver.portable() { Some(self.restore_aside(id, restore).await?) } else { None };
        if let Some(existing) = self.get(id) {
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
                    return Ok(Provisioned {
                        created: false,
                        backend: backend_name,
                        restored: None,
                        restore_failures: Vec::new(),
                    });
                }
                if existing.backend_name != backend_name {
                    // Switching backend: stop the old runtime, keep the files.
                    self.driver(&existing.backend_name)?.release(id).await?;
                }
            }
        }
        let root = self.root_of(id);
        let mut restored = None;
        let mut restore_failures = Vec::new();
        if let Some((incoming, taken, failures)) = restored_aside {
            self.replace_root(&root, &incoming).await?;
            restored = Some(taken);
            restore_failures = failures;
        } else if !driver.portable() && !restore.candidates.is_empty() && self.get(id).is_none() {
            // A copy made anew here where the workspace had files elsewhere: from its latest
            // snapshot that restores, before anything runs in it.
            match self.snapshots() {
                Some(snapshots) => {
                    let parent = self.data_dir.join("workspaces");
                    tokio::fs::create_dir_all(&parent).await.map_err(|source| WorkspaceError::Io {
                        op: "create",
                        path: parent.display().to_string(),
                        source,
                    })?;
                    (restored, restore_failures) = snapshots.restore(id, &restore.candidates, &root).await;
                }
                None => restore_failures.push("this node has no snapshot store (--snapshot-store)".to_owned()),
            }
        }
        // Host drivers only: a portable driver's provision is a provider's API call, with no
        // host work to bound. The slot is held to the end.
        let _slot = self.provisions.enter(&backend_name).await;
        if !self.debug_provision_delay.is_zero() {
            tokio::time::sleep(self.debug_provision_delay).await;
        }
        // A portable driver's files live in the provider's sandbox, never under the root.
        if !driver.portable() {
            tokio::fs::create_dir_all(&root).await.map_err(|source| WorkspaceError::Io {
                op: "create",
                path: id.to_string(),
                source,
            })?;
        }
        let placement = Placement { generation, owner, fresh };
        let context = ProvisionContext { workspace_id: id, root: &root, spec, placement };
        let (handle, adopted) = driver.provision_reporting(context).await?;
        if restored.is_some() {
            // Restored files belong to this process; the sandbox user owns the root (the
            // driver set it): give them the root's owner, as a restored quarantine copy.
            own_like_root(&root, &self.data_dir).await?;
        }
        // A host root's layout is read, and made where missing, on the host: no call into
        // the sandbox unless something else is in the way.
        let host_root = (!driver.portable()).then_some(root.as_path());
        berth_workspace::layout::ensure_at(handle.as_ref(), host_root).await?;
        // A portable driver knows whether the provider still had the sandbox; for host
        // drivers the data is this node's own directory, known by its entry.
        let created = match adopted {
            Some(adopted) => !adopted,
            None => self.get(id).is_none() || restored.is_some(),
        };
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
            // A restored copy is its snapshot until it is used.
            last_snapshot_ms: AtomicI64::new(if restored.is_some() { now_ms() + 1 } else { 0 }),
        });
        for hook in self.hooks() {
            hook.provisioned(id, &handle).await;
        }
        Ok(Provisioned { created, backend: backend_name, restored, restore_failures })
    }

    /// Restores an explicit restore's snapshot beside the root (`.<id>.incoming`), so the
    /// held copy is untouched unless it restored. Under the lifecycle lock.
    async fn restore_aside(
        &self,
        id: &WorkspaceId,
        restore: &RestoreFrom,
    ) -> Result<(PathBuf, berth_proto::v1::SnapshotTaken, Vec<String>), NodeError> {
        let snapshots = self.snapshots().ok_or(NodeError::SnapshotsDisabled)?;
        let incoming = self.data_dir.join("workspaces").join(format!(".{id}.incoming"));
        let (restored, failures) = snapshots.restore(id, &restore.candidates, &incoming).await;
        match restored {
            Some(taken) => Ok((incoming, taken, failures)),
            None => Err(NodeError::Snapshot { workspace_id: id.clone(), what: "restore", reason: failures.join("; ") }),
        }
    }

    /// Puts a restored tree in place of the root (a root left behind without a copy, e.g.
    /// after the held copy moved to the quarantine, is removed first).
    async fn replace_root(&self, root: &Path, incoming: &Path) -> Result<(), WorkspaceError> {
        let (root, incoming) = (root.to_path_buf(), incoming.to_path_buf());
        tokio::task::spawn_blocking(move || {
            match std::fs::remove_dir_all(&root) {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => {
                    return Err(WorkspaceError::Io { op: "remove", path: root.display().to_string(), source });
                }
            }
            std::fs::rename(&incoming, &root).map_err(|source| WorkspaceError::Io {
                op: "rename",
                path: root.display().to_string(),
                source,
            })
        })
        .await
        .map_err(|error| WorkspaceError::Backend { backend: "node", message: error.to_string() })?
    }

    /// Stops the runtime, keeps the files. With `generation` (what the replica recorded),
    /// only that copy: a replica that lost its lock meanwhile cannot stop a newer one. With
    /// a snapshot store, a copy used since its last snapshot is snapshotted once its runtime
    /// stopped (quiescent); the snapshot is answered, and a failed one logged (the release
    /// itself stands).
    pub async fn release(
        &self,
        id: &WorkspaceId,
        generation: Option<u64>,
    ) -> Result<Option<berth_proto::v1::SnapshotTaken>, NodeError> {
        let lock = self.lifecycle_lock(id);
        let _guard = lock.lock().await;
        let Some(existing) = self.get(id) else { return Ok(None) };
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
            last_snapshot_ms: AtomicI64::new(existing.last_snapshot_ms.load(Ordering::Relaxed)),
        });
        for hook in self.hooks() {
            hook.released(id).await;
        }
        let released = self.get(id).ok_or_else(|| NodeError::NotHeld { workspace_id: id.clone() })?;
        match self.snapshot_locked(&released, false).await {
            Ok(taken) => Ok(taken),
            Err(error) => {
                tracing::warn!(ws_id = %id, %error, "snapshot on release failed; released without one");
                Ok(None)
            }
        }
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
        let driver = self.driver(&existing.backend_name)?;
        if driver.portable() {
            // Nothing is on this node: the sandbox belongs to the newer placement (another
            // gateway adopted it, or a fresh one replaced it there). Drop the handle only.
            driver.forget(id).await?;
            self.remove_meta(id).await?;
            self.remove(id);
            tracing::info!(ws_id = %id, generation = existing.generation, ?reason, "forgot a superseded portable copy");
            for hook in self.hooks() {
                hook.destroyed(id).await;
            }
            return Ok(());
        }
        driver.destroy(id).await?;
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

/// Gives every file under `root` the root's owner, when that is not the owner of the
/// node's own `data_dir` (this process: what the restore wrote them as).
async fn own_like_root(root: &Path, data_dir: &Path) -> Result<(), WorkspaceError> {
    use std::os::unix::fs::MetadataExt;
    let stat = |path: PathBuf| async move {
        tokio::fs::metadata(&path).await.map_err(|source| WorkspaceError::Io {
            op: "stat",
            path: path.display().to_string(),
            source,
        })
    };
    let metadata = stat(root.to_path_buf()).await?;
    let (owner, group) = (metadata.uid(), metadata.gid());
    if owner == stat(data_dir.to_path_buf()).await?.uid() {
        return Ok(());
    }
    let chowned = root.to_path_buf();
    tokio::task::spawn_blocking(move || crate::quarantine::chown_tree(&chowned, owner, group))
        .await
        .map_err(|error| WorkspaceError::Backend { backend: "node", message: error.to_string() })?
        .map_err(|source| WorkspaceError::Io { op: "chown", path: root.display().to_string(), source })
}

fn data_dir_quarantine(data_dir: &Path) -> PathBuf {
    data_dir.join("quarantine")
}
