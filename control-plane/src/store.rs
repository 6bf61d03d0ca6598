//! `WorkspaceStore`: the one owner of a replica's workspace state — workspace records,
//! sessions and bind locks in the registry, and reads of the watch-fed view. Binding,
//! routing, authorization, sessions, sharing, the sweeper and the admin API go through its
//! typed methods; no other module builds a workspace, session or lock key.
//!
//! What is durable: records (`/workspaces/<id>`) and sessions (`/sessions/<id>`). Bind
//! locks (`/locks/<id>`) and leader keys hang on this replica's lease and vanish with it.
//! Rebuilt at start: the view (list + watch). What fences: a bind lock's create revision
//! ([`LockFence`]); every record write and delete compares it in the same transaction.
//! Every linearizable record read is folded into the view, so the view never lags what
//! this replica has already seen.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use berth_workspace::WorkspaceId;
use bytes::Bytes;
use futures::StreamExt;

use crate::error::{ControlPlaneError, Result};
use crate::keys::Keys;
use crate::lease::ReplicaLease;
use crate::records::{
    self, NodeRecord, SessionRecord, SnapshotPointer, StoredState, TombstoneRecord, WorkspaceRecord, WorkspaceUse,
};
use crate::registry::{self, Compare, RegistryRef, Txn, TxnOp, TxnOpResponse, WatchEvent};
use crate::session_commit::SessionCommitter;
use crate::txn_commit::TxnCommitter;
use crate::view::{EffectiveState, ReplicaView};

pub type WorkspaceStoreRef = Arc<WorkspaceStore>;

/// The fencing token of a bind lock this replica holds: the lock's create revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockFence(i64);

impl LockFence {
    /// The lock's create revision: grows with every lock taken in the cluster, so a bind
    /// derives its generations from it and they never repeat, not even after a delete.
    pub fn revision(self) -> i64 {
        self.0
    }

    #[cfg(test)]
    pub fn for_test(revision: i64) -> Self {
        Self(revision)
    }
}

/// A bind lock another replica (or an earlier bind of ours) holds.
#[derive(Clone, Copy, Debug)]
pub struct HeldLock {
    /// Where a watch for its release starts (exclusive).
    mod_revision: i64,
}

/// What taking a bind lock gave.
#[derive(Debug)]
pub enum Lock {
    Ours(LockFence),
    Held(HeldLock),
}

pub use crate::session_commit::SessionCreated;

/// How waiting for a lock holder ended.
pub enum HolderOutcome {
    /// The record turned READY or FAILED.
    Record(Box<WorkspaceRecord>),
    /// The lock went away without such a record (holder died, stalled or gave up), or the
    /// watch broke: look again from the top.
    LockReleased,
}

pub struct WorkspaceStore {
    registry: RegistryRef,
    keys: Keys,
    view: Arc<ReplicaView>,
    lease: Arc<ReplicaLease>,
    replica_id: String,
    /// Bind locks of binds and state changes in flight on this replica: lock value
    /// (`<replica_id>/<nonce>`) → its create revision once the create landed. A lock of
    /// ours that is not here is an orphan, for the lock janitor.
    own_locks: std::sync::Mutex<HashMap<String, Option<i64>>>,
    /// The group committer of session creates, started on first use (on the runtime of
    /// the first caller).
    sessions: std::sync::OnceLock<SessionCommitter>,
    /// The group committer of bind-lock takes and fenced writes (binds starting or ending
    /// together), started on first use.
    txns: std::sync::OnceLock<TxnCommitter>,
}

impl WorkspaceStore {
    pub fn new(
        registry: RegistryRef,
        keys: Keys,
        view: Arc<ReplicaView>,
        lease: Arc<ReplicaLease>,
        replica_id: impl Into<String>,
    ) -> Self {
        Self {
            registry,
            keys,
            view,
            lease,
            replica_id: replica_id.into(),
            own_locks: Default::default(),
            sessions: Default::default(),
            txns: Default::default(),
        }
    }

    /// The replica this store writes for (`changed_by` of records, lock and leader values).
    pub fn replica_id(&self) -> &str {
        &self.replica_id
    }

    // ---- view reads: no registry call ------------------------------------------------

    /// The record as this replica's view last saw it.
    pub fn cached(&self, workspace_id: &WorkspaceId) -> Option<Arc<WorkspaceRecord>> {
        self.view.workspace(workspace_id.as_str()).map(|entry| entry.record)
    }

    /// The cached record if it is READY on a live node (the hot path of every call).
    pub fn cached_ready(&self, workspace_id: &WorkspaceId) -> Option<Arc<WorkspaceRecord>> {
        self.cached(workspace_id).filter(|record| self.effective_state(record) == EffectiveState::Ready)
    }

    pub fn effective_state(&self, record: &WorkspaceRecord) -> EffectiveState {
        self.view.effective_state(record)
    }

    /// Whether a workspace recorded on `node_id` is usable there (live and not drained).
    pub fn node_holds_workspaces(&self, node_id: &str) -> bool {
        self.view.node_holds_workspaces(node_id)
    }

    /// Every node live in the view.
    pub fn live_nodes(&self) -> Vec<Arc<NodeRecord>> {
        self.view.live_nodes()
    }

    /// Whether `workspace_id` has a record or a bind lock (a bind in flight), both read in
    /// one transaction: two reads could miss a bind that commits its record (and deletes its
    /// lock) between them.
    pub async fn record_or_lock_exists(&self, workspace_id: &WorkspaceId) -> Result<bool> {
        let response =
            self.registry
                .txn(Txn::new().and_then([
                    TxnOp::get(self.keys.workspace(workspace_id)),
                    TxnOp::get(self.keys.lock(workspace_id)),
                ]))
                .await?;
        Ok(response.responses.iter().any(|response| matches!(response, TxnOpResponse::Get(Some(_)))))
    }

    /// A live node's record.
    pub fn node(&self, node_id: &str) -> Option<Arc<NodeRecord>> {
        self.view.node(node_id)
    }

    /// The workspace's last access as its node reported it in a heartbeat.
    pub fn last_access_ms(&self, record: &WorkspaceRecord) -> Option<i64> {
        let node = self.view.node(record.node_id.as_deref().unwrap_or_default())?;
        node.last_access_ms.get(record.id.as_str()).copied()
    }

    /// The workspace's use as its node last reported it, with the time of that report
    /// (both on the clock of the replica that received it). `None` when the node has not
    /// reported this placement yet.
    pub fn reported_use(&self, record: &WorkspaceRecord) -> Option<(WorkspaceUse, i64)> {
        let node = self.view.node(record.node_id.as_deref().unwrap_or_default())?;
        let reported = node.workspace_use.get(record.id.as_str())?;
        (reported.generation >= record.generation).then(|| (reported.clone(), node.last_heartbeat_ms))
    }

    /// Refuses when the registry has not vouched for the view for longer than `bound`.
    pub fn check_view_current(&self, bound: Duration) -> Result<()> {
        let (prefix, silent_for) = self.view.staleness();
        if silent_for <= bound {
            return Ok(());
        }
        Err(ControlPlaneError::ViewStale {
            prefix: prefix.to_owned(),
            silent_ms: u64::try_from(silent_for.as_millis()).unwrap_or(u64::MAX),
            bound_ms: u64::try_from(bound.as_millis()).unwrap_or(u64::MAX),
        })
    }

    /// Every workspace in the view, in id order.
    pub fn workspaces(&self) -> Vec<Arc<WorkspaceRecord>> {
        self.view.workspaces.all().into_iter().map(|entry| entry.record).collect()
    }

    /// Up to `limit` workspaces with ids after `after` that pass `keep`, in id order, and
    /// whether more follow (a range scan of the view).
    pub fn workspace_page(
        &self,
        after: &str,
        limit: usize,
        keep: impl FnMut(&WorkspaceRecord) -> bool,
    ) -> (Vec<Arc<WorkspaceRecord>>, bool) {
        let (page, more) = self.view.workspaces.page(after, limit, keep);
        (page.into_iter().map(|entry| entry.record).collect(), more)
    }

    // ---- workspace records ---------------------------------------------------------

    /// A linearizable read of the record, folded into the view (a put, or a delete at the
    /// revision absence was observed).
    pub async fn load(&self, workspace_id: &WorkspaceId) -> Result<Option<WorkspaceRecord>> {
        let key = self.keys.workspace(workspace_id);
        let response = self.registry.txn(Txn::new().and_then([TxnOp::get(&key)])).await?;
        match response.first_get() {
            Some(kv) => {
                self.view.workspaces.apply_put(kv);
                Ok(Some(records::decode::<WorkspaceRecord>(&key, &kv.value)?))
            }
            None => {
                self.view.workspaces.apply_delete(&key, response.revision);
                Ok(None)
            }
        }
    }

    /// Writes the record and deletes its lock in one transaction, only if we still hold the
    /// lock we took (its create revision is the fence). The write is folded into the view at
    /// its revision, so this replica reads its own write at once (a caller that got the
    /// workspace READY finds it in ListWorkspaces) instead of when the watch delivers it.
    pub async fn write_fenced(&self, record: &WorkspaceRecord, fence: LockFence) -> Result<()> {
        let key = self.keys.workspace(&record.id);
        let value = records::encode(record);
        let revision = self.fenced_all(&record.id, fence, vec![TxnOp::put(&key, value.clone())]).await?;
        let written =
            registry::KeyValue { key, value, create_revision: 0, mod_revision: revision, version: 0, lease: 0 };
        self.view.workspaces.apply_put(&written);
        Ok(())
    }

    /// Deletes the record and its lock in one transaction, only if we still hold the lock.
    /// With a tombstone (a copy may survive on a node), it is written in the same
    /// transaction. Returns the transaction's revision (the tombstone's mod revision).
    pub async fn delete_fenced(
        &self,
        workspace_id: &WorkspaceId,
        fence: LockFence,
        tombstone: Option<&TombstoneRecord>,
    ) -> Result<i64> {
        let mut changes = vec![TxnOp::delete(self.keys.workspace(workspace_id))];
        if let Some(tombstone) = tombstone {
            changes.push(TxnOp::put(self.keys.tombstone(workspace_id.as_str()), records::encode(tombstone)));
        }
        self.fenced_all(workspace_id, fence, changes).await
    }

    /// Records `pointer` as the workspace's latest snapshot, taken by `node_id`, outside a
    /// bind lock (interval and on-demand snapshots): only if the record still places the
    /// workspace on that node at the snapshot's generation — compared in the same
    /// transaction as the write, through the record's mod revision — and no bind lock is
    /// held (a bind or state change in flight writes the record it read, which would drop
    /// the pointer; it is retried briefly, then answered [`ControlPlaneError::LockBusy`]).
    /// A snapshot of another placement is [`ControlPlaneError::SnapshotFenced`]; one older
    /// than the recorded pointer is kept out (the record is answered unchanged).
    pub async fn record_snapshot(
        &self,
        workspace_id: &WorkspaceId,
        node_id: &str,
        pointer: &SnapshotPointer,
    ) -> Result<WorkspaceRecord> {
        let key = self.keys.workspace(workspace_id);
        let lock_key = self.keys.lock(workspace_id);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        let mut backoff = Duration::from_millis(25);
        loop {
            let read = self.registry.txn(Txn::new().and_then([TxnOp::get(&key), TxnOp::get(&lock_key)])).await?;
            let kv = match read.responses.first() {
                Some(TxnOpResponse::Get(Some(kv))) => kv.clone(),
                _ => {
                    return Err(ControlPlaneError::SnapshotFenced {
                        workspace_id: workspace_id.to_string(),
                        snapshot_id: pointer.id.clone(),
                        node_id: node_id.to_owned(),
                        snapshot_generation: pointer.generation,
                        record_generation: 0,
                        record_node: String::new(),
                    });
                }
            };
            let mut record = records::decode::<WorkspaceRecord>(&key, &kv.value)?;
            if record.generation != pointer.generation || record.node_id.as_deref() != Some(node_id) {
                return Err(ControlPlaneError::SnapshotFenced {
                    workspace_id: workspace_id.to_string(),
                    snapshot_id: pointer.id.clone(),
                    node_id: node_id.to_owned(),
                    snapshot_generation: pointer.generation,
                    record_generation: record.generation,
                    record_node: record.node_id.clone().unwrap_or_default(),
                });
            }
            if record.snapshot.as_ref().is_some_and(|latest| {
                latest.id == pointer.id
                    || (latest.generation == pointer.generation && latest.taken_at_ms > pointer.taken_at_ms)
            }) {
                return Ok(record);
            }
            let locked = matches!(read.responses.get(1), Some(TxnOpResponse::Get(Some(_))));
            if !locked {
                record.snapshot = Some(pointer.clone());
                let write = Txn::new()
                    .when([Compare::mod_revision(&key, kv.mod_revision), Compare::absent(&lock_key)])
                    .and_then([TxnOp::put(&key, records::encode(&record))]);
                if self.registry.txn(write).await?.succeeded {
                    // Folded into the view at once (the watch follows).
                    let _ = self.load(workspace_id).await;
                    return Ok(record);
                }
            }
            if tokio::time::Instant::now() + backoff > deadline {
                return Err(ControlPlaneError::LockBusy { workspace_id: workspace_id.to_string() });
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(400));
        }
    }

    /// Deletes a tombstone once its node confirmed the copy gone, if it is still the one
    /// written at `revision` (a later delete of the same id wrote its own).
    pub async fn delete_tombstone(&self, workspace_id: &WorkspaceId, revision: i64) -> Result<()> {
        let key = self.keys.tombstone(workspace_id.as_str());
        self.registry
            .txn(Txn::new().when([Compare::mod_revision(&key, revision)]).and_then([TxnOp::delete(&key)]))
            .await?;
        Ok(())
    }

    /// `changes` and the lock's delete, only while the lock is ours (its create revision is
    /// `fence`); `LostLock` otherwise.
    ///
    /// Fenced writes that arrive together are committed together (`txn_commit.rs`): a
    /// storm of binds ending at once costs a few transactions, each write still fenced by
    /// its own lock.
    async fn fenced_all(&self, workspace_id: &WorkspaceId, fence: LockFence, changes: Vec<TxnOp>) -> Result<i64> {
        let lock_key = self.keys.lock(workspace_id);
        let txn = Txn::new()
            .when([Compare::create_revision(&lock_key, fence.0)])
            .and_then(changes.into_iter().chain([TxnOp::delete(&lock_key)]));
        let response = self.committed(txn).await?;
        if !response.succeeded {
            return Err(ControlPlaneError::LostLock { workspace_id: workspace_id.to_string() });
        }
        Ok(response.revision)
    }

    /// `txn` through this replica's group committer (`txn_commit.rs`).
    async fn committed(&self, txn: Txn) -> registry::Result<registry::TxnResponse> {
        self.txns.get_or_init(|| TxnCommitter::start(Arc::clone(&self.registry))).txn(txn).await
    }

    /// A linearizable read of a node's key and drain key: whether the node is live, drained,
    /// or gone. Decides, under the bind lock, whether a workspace on a node the view does
    /// not list may be placed elsewhere.
    pub async fn node_presence(&self, node_id: &str) -> Result<NodePresence> {
        let node_key = self.keys.node(node_id);
        let drain_key = self.keys.drain(node_id);
        let response = self.registry.txn(Txn::new().and_then([TxnOp::get(&node_key), TxnOp::get(&drain_key)])).await?;
        let present = |index: usize| matches!(response.responses.get(index), Some(TxnOpResponse::Get(Some(_))));
        Ok(match (present(0), present(1)) {
            (_, true) => NodePresence::Drained,
            (true, false) => NodePresence::Live,
            (false, false) => NodePresence::Gone,
        })
    }

    // ---- bind locks ----------------------------------------------------------------

    /// Creates the bind lock on this replica's lease. Its value is the replica id plus a
    /// fresh nonce, so after an ambiguous failure (the create may or may not have landed)
    /// one read tells whether the lock is ours — an own lock left behind would otherwise
    /// block the workspace for as long as this replica lives.
    pub async fn acquire_lock(&self, workspace_id: &WorkspaceId) -> Result<Lock> {
        let lock_key = self.keys.lock(workspace_id);
        let holder = format!("{}/{:016x}", self.replica_id, rand::random::<u64>());
        let held = |lock: registry::KeyValue| Lock::Held(HeldLock { mod_revision: lock.mod_revision });
        // Tracked before the create is sent, so the janitor never takes a lock of a bind
        // that is still deciding for one of its own.
        self.track_own_lock(&holder, None);
        let outcome =
            match self.registry.create_if_absent(&lock_key, Bytes::from(holder.clone()), self.lease.id()).await {
                Ok(Ok(create_revision)) => Ok(Lock::Ours(LockFence(create_revision))),
                Ok(Err(lock)) => Ok(held(lock)),
                Err(error) => self.settle_ambiguous_create(&lock_key, &holder, error).await,
            };
        self.track_outcome(&holder, &outcome);
        outcome
    }

    /// After a failed create of `lock_key` with value `holder`: a retryable failure may
    /// have landed, so one read tells whether the lock is ours.
    async fn settle_ambiguous_create(
        &self,
        lock_key: &str,
        holder: &str,
        error: registry::RegistryError,
    ) -> Result<Lock> {
        if !error.is_retryable() {
            return Err(error.into());
        }
        match self.registry.get(lock_key).await {
            Ok(Some(lock)) if lock.value == holder.as_bytes() => Ok(Lock::Ours(LockFence(lock.create_revision))),
            Ok(Some(lock)) => Ok(Lock::Held(HeldLock { mod_revision: lock.mod_revision })),
            Ok(None) => Err(error.into()),
            // Still unknown whether the create landed: if it did, the lock is ours and
            // nobody else will ever delete it.
            Err(read_error) => {
                keep_releasing(
                    Arc::clone(&self.registry),
                    lock_key.to_owned(),
                    OwnLock::Value(Bytes::from(holder.to_owned())),
                );
                Err(read_error.into())
            }
        }
    }

    fn track_outcome(&self, holder: &str, outcome: &Result<Lock>) {
        match outcome {
            Ok(Lock::Ours(fence)) => self.track_own_lock(holder, Some(fence.0)),
            // Not ours, or unknown: if the create landed after all, the lock is an orphan
            // the janitor deletes (finding 5 of issue 13).
            _ => self.forget_own_lock(holder),
        }
    }

    /// [`Self::acquire_lock`] and [`Self::load`] in one round trip: the lock is created on
    /// this replica's lease if absent, and the record is read in the same transaction, so
    /// it is what the lock's create revision saw (a bind that finished before it is
    /// visible; one that finishes after it needs this lock). The read is folded into the
    /// view. After an ambiguous failure it falls back to the two calls. Lock takes of binds
    /// that start together are committed together (`txn_commit.rs`).
    pub async fn acquire_lock_and_load(&self, workspace_id: &WorkspaceId) -> Result<(Lock, Option<WorkspaceRecord>)> {
        let lock_key = self.keys.lock(workspace_id);
        let key = self.keys.workspace(workspace_id);
        let holder = format!("{}/{:016x}", self.replica_id, rand::random::<u64>());
        self.track_own_lock(&holder, None);
        let txn = Txn::new()
            .when([Compare::absent(&lock_key)])
            .and_then([
                TxnOp::put_with_lease(&lock_key, Bytes::from(holder.clone()), self.lease.id()),
                TxnOp::get(&key),
            ])
            .or_else([TxnOp::get(&lock_key), TxnOp::get(&key)]);
        let response = match self.committed(txn).await {
            Ok(response) => response,
            // Whether the lock is ours is settled as for acquire_lock; the record is then
            // read on its own.
            Err(error) => {
                let outcome = self.settle_ambiguous_create(&lock_key, &holder, error).await;
                self.track_outcome(&holder, &outcome);
                let lock = outcome?;
                let record = self.load(workspace_id).await;
                return self.release_on_error(workspace_id, lock, record).await;
            }
        };
        let get = |index: usize| match response.responses.get(index) {
            Some(TxnOpResponse::Get(value)) => value.clone(),
            _ => None,
        };
        let record = match get(1) {
            Some(kv) => {
                self.view.workspaces.apply_put(&kv);
                records::decode::<WorkspaceRecord>(&key, &kv.value).map(Some).map_err(ControlPlaneError::from)
            }
            None => {
                self.view.workspaces.apply_delete(&key, response.revision);
                Ok(None)
            }
        };
        let lock = match (response.succeeded, get(0)) {
            (true, _) => Ok(Lock::Ours(LockFence(response.revision))),
            (false, Some(lock)) => Ok(Lock::Held(HeldLock { mod_revision: lock.mod_revision })),
            // Deleted between the compare and the get of the same txn cannot happen; treat it
            // as a lost race and let the caller retry.
            (false, None) => {
                Err(registry::RegistryError::Unavailable(format!("{lock_key} vanished during create")).into())
            }
        };
        self.track_outcome(&holder, &lock);
        self.release_on_error(workspace_id, lock?, record).await
    }

    /// `(lock, record)`, or the record's error with the lock released if it is ours (the
    /// caller never sees a lock it would have to free).
    async fn release_on_error(
        &self,
        workspace_id: &WorkspaceId,
        lock: Lock,
        record: Result<Option<WorkspaceRecord>>,
    ) -> Result<(Lock, Option<WorkspaceRecord>)> {
        match (record, lock) {
            (Ok(record), lock) => Ok((lock, record)),
            (Err(error), Lock::Ours(fence)) => {
                self.release_lock(workspace_id, fence).await;
                Err(error)
            }
            (Err(error), Lock::Held(_)) => Err(error),
        }
    }

    fn track_own_lock(&self, holder: &str, create_revision: Option<i64>) {
        self.own_locks.lock().unwrap_or_else(PoisonError::into_inner).insert(holder.to_owned(), create_revision);
    }

    fn forget_own_lock(&self, holder: &str) {
        self.own_locks.lock().unwrap_or_else(PoisonError::into_inner).remove(holder);
    }

    /// Bind locks carrying this replica's id that no bind or state change in flight here
    /// owns (key, create revision): left behind by an ambiguous create, or by an earlier
    /// process with this replica id. Also forgets own locks that are gone (released,
    /// deleted with their record, or expired).
    pub async fn orphan_locks(&self) -> Result<Vec<(String, i64)>> {
        let listed = self.registry.range(&self.keys.locks_prefix()).await?;
        let mut own_locks = self.own_locks.lock().unwrap_or_else(PoisonError::into_inner);
        let mut orphans = Vec::new();
        let mut listed_values = std::collections::HashSet::new();
        for lock in &listed.kvs {
            let Ok(value) = std::str::from_utf8(&lock.value) else { continue };
            listed_values.insert(value);
            let carries_our_id = value.rsplit_once('/').is_some_and(|(replica_id, _)| replica_id == self.replica_id);
            if carries_our_id && !own_locks.contains_key(value) {
                orphans.push((lock.key.clone(), lock.create_revision));
            }
        }
        // A lock that landed at or before the listing's revision and is not listed is gone
        // for good (a key never comes back with the same create revision).
        own_locks.retain(|holder, landed| match landed {
            Some(create_revision) => *create_revision > listed.revision || listed_values.contains(holder.as_str()),
            None => true,
        });
        Ok(orphans)
    }

    /// Deletes a lock only if it is still the one created at `create_revision`; `true` when
    /// it deleted it.
    pub async fn delete_lock_created_at(&self, lock_key: &str, create_revision: i64) -> Result<bool> {
        let txn =
            Txn::new().when([Compare::create_revision(lock_key, create_revision)]).and_then([TxnOp::delete(lock_key)]);
        Ok(self.registry.txn(txn).await?.succeeded)
    }

    /// Takes the bind lock for a state change other than a bind (sweeper, close, share).
    /// Returns the fence, or `None` when another replica holds it.
    pub async fn try_lock(&self, workspace_id: &WorkspaceId) -> Result<Option<LockFence>> {
        match self.acquire_lock(workspace_id).await? {
            Lock::Ours(fence) => Ok(Some(fence)),
            Lock::Held(_) => Ok(None),
        }
    }

    /// Deletes the lock if it is still ours. When etcd does not answer, the release is
    /// retried in the background: the lock hangs on this replica's lease, which lives as long
    /// as the replica does, so a lock left behind would make every bind of the workspace, on
    /// every replica, wait for this replica to die.
    pub async fn release_lock(&self, workspace_id: &WorkspaceId, fence: LockFence) {
        let lock_key = self.keys.lock(workspace_id);
        let txn = Txn::new().when([Compare::create_revision(&lock_key, fence.0)]).and_then([TxnOp::delete(&lock_key)]);
        if let Err(error) = self.registry.txn(txn).await {
            tracing::warn!(lock = %lock_key, %error, "releasing a bind lock failed; retrying in the background");
            keep_releasing(Arc::clone(&self.registry), lock_key, OwnLock::Fence(fence.0));
        }
    }

    /// Waits until the lock holder finishes: the record turns READY / FAILED, or the lock
    /// goes away. Watches start right after the lock's revision so nothing is missed.
    pub async fn wait_for_holder(&self, workspace_id: &WorkspaceId, lock: &HeldLock) -> Result<HolderOutcome> {
        let record_key = self.keys.workspace(workspace_id);
        let lock_key = self.keys.lock(workspace_id);
        let from = lock.mod_revision + 1;
        let records_watch = self.registry.watch_prefix(&record_key, from).await?;
        let locks_watch = self.registry.watch_prefix(&lock_key, from).await?;
        let mut events = futures::stream::select(records_watch, locks_watch);
        while let Some(batch) = events.next().await {
            for event in batch? {
                match event {
                    WatchEvent::Put(kv) if kv.key == record_key => {
                        self.view.workspaces.apply_put(&kv);
                        let record = records::decode::<WorkspaceRecord>(&kv.key, &kv.value)?;
                        if matches!(record.state, StoredState::Ready | StoredState::Failed) {
                            return Ok(HolderOutcome::Record(Box::new(record)));
                        }
                    }
                    WatchEvent::Delete { key, .. } if key == lock_key => {
                        // A holder that bound deleted the lock in the transaction that wrote
                        // the record, whose event may come second: one read, rather than
                        // competing again after a backoff for a record that is there.
                        // A failed read is a released lock, as before: compete again.
                        return Ok(match self.load(workspace_id).await {
                            Ok(Some(record)) if matches!(record.state, StoredState::Ready | StoredState::Failed) => {
                                HolderOutcome::Record(Box::new(record))
                            }
                            _ => HolderOutcome::LockReleased,
                        });
                    }
                    _ => {}
                }
            }
        }
        // The watch broke: look again from the top.
        Ok(HolderOutcome::LockReleased)
    }

    // ---- sessions ------------------------------------------------------------------

    /// Creates the session if its id is free and its workspace's record still exists (in
    /// the same transaction: a record read from the view may have been deleted by another
    /// replica meanwhile, and a session must never be handed out for a workspace that is
    /// gone); otherwise says which of the two stood in the way.
    ///
    /// Creates that arrive together are committed together (`session_commit.rs`): one
    /// transaction for many, each caller answered once its own record is durable.
    pub async fn create_session(&self, session: &SessionRecord) -> Result<SessionCreated> {
        let committer = self.sessions.get_or_init(|| SessionCommitter::start(Arc::clone(&self.registry)));
        committer
            .create(self.keys.session(&session.session_id), self.keys.workspace(&session.workspace_id), session.clone())
            .await
    }

    pub async fn session(&self, session_id: &str) -> Result<Option<SessionRecord>> {
        let key = self.keys.session(session_id);
        match self.registry.get(&key).await? {
            Some(kv) => Ok(Some(records::decode(&key, &kv.value)?)),
            None => Ok(None),
        }
    }

    /// Deletes the session; `false` when it did not exist.
    pub async fn delete_session(&self, session_id: &str) -> Result<bool> {
        Ok(self.registry.delete(&self.keys.session(session_id)).await?)
    }

    // ---- leadership ----------------------------------------------------------------

    /// Becomes or stays the leader of `role`: the leader key exists on our current lease
    /// (so it goes with this replica's lease, like its bind locks).
    pub async fn lead(&self, role: &str) -> registry::Result<Leadership> {
        let key = self.keys.leader(role);
        let lease = self.lease.id();
        let holder = Bytes::from(self.replica_id.clone());
        match self.registry.create_if_absent(&key, holder.clone(), lease).await? {
            Ok(_) => Ok(Leadership::Became),
            Err(existing) if existing.value == holder && existing.lease == lease => Ok(Leadership::Kept),
            Err(_) => Ok(Leadership::Other),
        }
    }
}

/// What [`WorkspaceStore::node_presence`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodePresence {
    /// Its key exists (the view may lag behind it).
    Live,
    /// An operator drained it: its workspaces move.
    Drained,
    /// No key: no heartbeat for a lease TTL.
    Gone,
}

/// What [`WorkspaceStore::lead`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leadership {
    /// This replica just took the leader key.
    Became,
    /// This replica already held it on its current lease.
    Kept,
    /// Another replica (or an older lease of ours) holds it.
    Other,
}

/// How a bind lock this replica may still hold is recognised.
enum OwnLock {
    /// We hold it; its create revision.
    Fence(i64),
    /// We may hold it: its value would be this (replica id and a nonce of ours).
    Value(Bytes),
}

/// Deletes a lock of ours in the background once etcd answers again, with capped backoff.
/// Safe at any later time: the delete compares the create revision, so a newer lock on the
/// same key (ours or another replica's) is never touched.
fn keep_releasing(registry: RegistryRef, lock_key: String, own: OwnLock) {
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(200);
        loop {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
            let fence = match &own {
                OwnLock::Fence(fence) => *fence,
                OwnLock::Value(value) => match registry.get(&lock_key).await {
                    Ok(Some(lock)) if lock.value == *value => lock.create_revision,
                    // Gone, or someone else's: nothing of ours to release.
                    Ok(_) => return,
                    Err(_) => continue,
                },
            };
            let txn =
                Txn::new().when([Compare::create_revision(&lock_key, fence)]).and_then([TxnOp::delete(&lock_key)]);
            if registry.txn(txn).await.is_ok() {
                tracing::info!(lock = %lock_key, "released a bind lock after retrying");
                return;
            }
        }
    });
}
