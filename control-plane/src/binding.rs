//! Binding: exactly one workspace per id, however many replicas race (docs/design.md §4.2).
//!
//! 1. In-replica single-flight: concurrent binds of one id share one spawned task, so a
//!    client that gives up never leaves a bind (and its lock) half-done.
//! 2. Cluster-wide: the task creates `/locks/<id>` on the replica's lease if absent. The
//!    winner re-reads the record (double-check), provisions on a node if it is not READY,
//!    and writes the record in a transaction guarded by the lock's create revision (the
//!    fencing token) that also deletes the lock. Losers watch the record and the lock from
//!    the lock's revision: READY or FAILED ends the wait, a deleted lock means "compete
//!    again".
//! 3. Every step runs under the bind deadline; the lock is released on every path.
//!
//! The binder owns single-flight and provisioning only: records, locks and view reads go
//! through the injected [`WorkspaceStore`](crate::store::WorkspaceStore).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_proto::meta::ErrorKind;
use berth_proto::v1;
use berth_workspace::{WorkspaceId, WorkspaceSpec};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use tokio::time::Instant;

use crate::config::ControlPlaneConfig;
use crate::error::{ControlPlaneError, Result};
use crate::metrics;
use crate::node_client::{NodeClients, node_request};
use crate::placement::Placement;
use crate::policy::IsolationPolicy;
use crate::records::{Origin, RECORD_VERSION, StoredState, WorkspaceRecord, now_ms};
use crate::snapshots::{Snapshots, SnapshotsRef};
use crate::store::{HolderOutcome, Lock, LockFence, NodePresence, WorkspaceStoreRef};
use crate::view::ReplicaView;

/// What a new workspace is made of (ignored when the record already exists).
#[derive(Clone, Debug)]
pub struct NewWorkspace {
    pub owner: String,
    pub agent: String,
    pub policy: IsolationPolicy,
    pub backend: String,
    pub spec: WorkspaceSpec,
    /// The creator may land on a node whose default backend is unsandboxed (it may use
    /// every unsandboxed backend). Matters only while `backend` is empty; a bind without a
    /// create of a record that never got a backend is placed as if this were false.
    pub any_backend: bool,
}

/// A request to make a workspace READY.
#[derive(Clone, Debug)]
pub struct BindRequest {
    pub workspace_id: WorkspaceId,
    /// `None`: only bring back an existing workspace (NotFound otherwise).
    pub create: Option<NewWorkspace>,
    /// A generation a node denied holding: a READY record at this generation is treated
    /// as not ready, so the workspace is provisioned again.
    pub replace_generation: Option<u64>,
    /// Skip the view: the caller found the cached record wrong (e.g. deleted meanwhile).
    pub linearizable: bool,
    /// Replace the workspace's files with this snapshot (`RestoreWorkspace`): provisioned
    /// again at a new generation, the copy it held moved to its node's quarantine. Set
    /// `replace_generation` to the record's generation with it.
    pub restore: Option<String>,
}

impl BindRequest {
    pub fn existing(workspace_id: WorkspaceId) -> Self {
        Self { workspace_id, create: None, replace_generation: None, linearizable: false, restore: None }
    }
}

type SharedBind = Shared<BoxFuture<'static, Result<Arc<WorkspaceRecord>>>>;

/// Counters of what binds did on this replica (metrics and tests read them).
#[derive(Debug, Default)]
pub struct BindStats {
    pub started: std::sync::atomic::AtomicU64,
    pub won: std::sync::atomic::AtomicU64,
    pub waited: std::sync::atomic::AtomicU64,
    pub provisioned: std::sync::atomic::AtomicU64,
}

/// Single-flight and provisioning. Every record, lock and view access goes through the
/// injected [`WorkspaceStore`](crate::store::WorkspaceStore); the view handle here is only
/// for placement (live nodes and their load).
pub struct Binder {
    store: WorkspaceStoreRef,
    placement_view: Arc<ReplicaView>,
    nodes: Arc<NodeClients>,
    placement: Placement,
    config: ControlPlaneConfig,
    inflight: Mutex<HashMap<WorkspaceId, SharedBind>>,
    stats: BindStats,
    /// When this replica first found a node gone that holds a workspace's files.
    absent_since: Mutex<HashMap<String, Instant>>,
    /// Where a re-placement's restore candidates come from.
    snapshots: SnapshotsRef,
}

enum Observed {
    /// A usable record: READY on a live node.
    Ready(Arc<WorkspaceRecord>),
    /// Absent or not usable; `None` when absent.
    NotReady(Option<Box<WorkspaceRecord>>),
}

impl Binder {
    pub fn new(
        store: WorkspaceStoreRef,
        placement_view: Arc<ReplicaView>,
        nodes: Arc<NodeClients>,
        config: ControlPlaneConfig,
    ) -> Self {
        Self {
            store,
            placement_view,
            nodes,
            placement: Placement::new(),
            config,
            inflight: Mutex::new(HashMap::new()),
            stats: BindStats::default(),
            absent_since: Mutex::new(HashMap::new()),
            snapshots: Arc::new(Snapshots::disabled()),
        }
    }

    /// Re-placements restore from snapshots listed in `snapshots` (the pointer alone without).
    pub fn with_snapshots(mut self, snapshots: SnapshotsRef) -> Self {
        self.snapshots = snapshots;
        self
    }

    /// What binds on this replica did so far.
    pub fn stats(&self) -> &BindStats {
        &self.stats
    }

    /// Returns the workspace READY on a live node, binding it if needed.
    pub async fn ensure_ready(self: &Arc<Self>, request: BindRequest) -> Result<Arc<WorkspaceRecord>> {
        if !request.linearizable
            && let Some(record) = self.store.cached_ready(&request.workspace_id)
            && Some(record.generation) != request.replace_generation
        {
            return Ok(record);
        }
        let shared = {
            let mut inflight = self.inflight.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match inflight.get(&request.workspace_id) {
                Some(existing) => existing.clone(),
                None => {
                    let binder = Arc::clone(self);
                    let workspace_id = request.workspace_id.clone();
                    // Spawned: the bind finishes (and frees its lock) even if every caller
                    // goes away. Its span is a child of the first caller's, so the Provision
                    // it sends to a node joins that caller's trace.
                    let span = tracing::info_span!(
                        "bind",
                        ws_id = %workspace_id,
                        replica_id = %self.config.replica_id,
                    );
                    let task =
                        tokio::spawn(tracing::Instrument::instrument(async move { binder.bind(request).await }, span));
                    let shared = async move {
                        task.await.unwrap_or_else(|error| {
                            Err(ControlPlaneError::Internal(format!("bind task failed: {error}")))
                        })
                    }
                    .boxed()
                    .shared();
                    inflight.insert(workspace_id, shared.clone());
                    shared
                }
            }
        };
        shared.await
    }

    async fn bind(self: Arc<Self>, request: BindRequest) -> Result<Arc<WorkspaceRecord>> {
        use std::sync::atomic::Ordering::Relaxed;
        self.stats.started.fetch_add(1, Relaxed);
        metrics::bind_started();
        let deadline = Instant::now() + self.config.bind_timeout;
        let outcome = match tokio::time::timeout_at(deadline, self.bind_until_done(&request, deadline)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(ControlPlaneError::BindTimeout {
                workspace_id: request.workspace_id.to_string(),
                millis: self.config.bind_timeout.as_millis() as u64,
            }),
        };
        self.inflight.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(&request.workspace_id);
        outcome
    }

    async fn bind_until_done(&self, request: &BindRequest, deadline: Instant) -> Result<Arc<WorkspaceRecord>> {
        use std::sync::atomic::Ordering::Relaxed;
        let workspace_id = &request.workspace_id;
        let mut backoff = Duration::from_millis(20);
        // Set when a holder we waited for let go of the lock without a result (it died or
        // stalled): winning the lock afterwards is a take-over.
        let mut holder_vanished = false;
        loop {
            // An id this replica has never seen, to be created: the lock and the read in one
            // round trip (what the lock's create revision saw needs no second look). An id
            // the view knows is read first: a READY record needs no lock.
            let (lock, checked) = if request.create.is_some() && self.store.cached(workspace_id).is_none() {
                let (lock, record) = self.store.acquire_lock_and_load(workspace_id).await?;
                match (lock, self.classify(record, request.replace_generation)) {
                    (Lock::Ours(fence), Observed::Ready(record)) => {
                        self.store.release_lock(workspace_id, fence).await;
                        return Ok(record);
                    }
                    (Lock::Held(_), Observed::Ready(record)) => return Ok(record),
                    (lock, Observed::NotReady(current)) => (lock, Some(current)),
                }
            } else {
                let current = match self.observe(workspace_id, request.replace_generation).await? {
                    Observed::Ready(record) => return Ok(record),
                    Observed::NotReady(current) => current,
                };
                if current.is_none() && request.create.is_none() {
                    return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()));
                }
                (self.store.acquire_lock(workspace_id).await?, None)
            };
            match lock {
                Lock::Ours(fence) => {
                    self.stats.won.fetch_add(1, Relaxed);
                    metrics::bind_won();
                    if holder_vanished {
                        metrics::bind_taken_over();
                    }
                    // Provision under the lock, then free it whatever happened (the record
                    // write already deletes it on success).
                    let outcome =
                        tokio::time::timeout_at(deadline, self.bind_under_lock(request, fence, checked)).await;
                    let outcome = match outcome {
                        Ok(outcome) => outcome,
                        Err(_) => Err(ControlPlaneError::BindTimeout {
                            workspace_id: workspace_id.to_string(),
                            millis: self.config.bind_timeout.as_millis() as u64,
                        }),
                    };
                    if outcome.is_err() {
                        self.store.release_lock(workspace_id, fence).await;
                    }
                    return outcome;
                }
                Lock::Held(lock) => {
                    self.stats.waited.fetch_add(1, Relaxed);
                    metrics::bind_waited();
                    match self.store.wait_for_holder(workspace_id, &lock).await? {
                        HolderOutcome::Record(record) => match record.state {
                            StoredState::Ready
                                if Some(record.generation) != request.replace_generation
                                    && record
                                        .node_id
                                        .as_deref()
                                        .is_some_and(|node| self.store.node_holds_workspaces(node)) =>
                            {
                                return Ok(Arc::from(record));
                            }
                            StoredState::Failed => {
                                return Err(ControlPlaneError::WorkspaceFailed {
                                    workspace_id: workspace_id.to_string(),
                                    reason: record.failure.clone().unwrap_or_default(),
                                });
                            }
                            _ => {}
                        },
                        HolderOutcome::LockReleased => holder_vanished = true,
                    }
                    // Compete again, with a little jitter so released waiters do not stampede.
                    if Instant::now() + backoff >= deadline {
                        continue;
                    }
                    tokio::time::sleep(backoff.mul_f64(0.5 + rand::random::<f64>())).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                }
            }
        }
    }

    /// A linearizable read of the record, folded into the view.
    async fn observe(&self, workspace_id: &WorkspaceId, replace_generation: Option<u64>) -> Result<Observed> {
        Ok(self.classify(self.store.load(workspace_id).await?, replace_generation))
    }

    /// Whether a record just read is usable: READY, not the generation to replace, on a
    /// node that holds workspaces.
    fn classify(&self, record: Option<WorkspaceRecord>, replace_generation: Option<u64>) -> Observed {
        match record {
            Some(record) => {
                let usable = record.state == StoredState::Ready
                    && Some(record.generation) != replace_generation
                    && record.node_id.as_deref().is_some_and(|node| self.store.node_holds_workspaces(node));
                if usable { Observed::Ready(Arc::new(record)) } else { Observed::NotReady(Some(Box::new(record))) }
            }
            None => Observed::NotReady(None),
        }
    }

    /// `checked`: the record as read in the transaction that took the lock (not READY), or
    /// `None` when the lock was taken on its own.
    async fn bind_under_lock(
        &self,
        request: &BindRequest,
        fence: LockFence,
        checked: Option<Option<Box<WorkspaceRecord>>>,
    ) -> Result<Arc<WorkspaceRecord>> {
        use std::sync::atomic::Ordering::Relaxed;
        let workspace_id = &request.workspace_id;
        // Double-check: another replica may have finished between our read and our lock.
        let current = match checked {
            Some(current) => current,
            None => match self.observe(workspace_id, request.replace_generation).await? {
                Observed::Ready(record) => {
                    self.store.release_lock(workspace_id, fence).await;
                    return Ok(record);
                }
                Observed::NotReady(current) => current,
            },
        };
        let now = now_ms();
        let mut record = match (current, &request.create) {
            (Some(record), _) => *record,
            (None, Some(new)) => WorkspaceRecord {
                version: RECORD_VERSION,
                id: workspace_id.clone(),
                owner: new.owner.clone(),
                agent: new.agent.clone(),
                policy: new.policy,
                backend: new.backend.clone(),
                spec: new.spec.clone(),
                state: StoredState::Failed,
                node_id: None,
                generation: 0,
                created_at_ms: now,
                updated_at_ms: now,
                failure: None,
                changed_by: String::new(),
                shared_with: Vec::new(),
                origin: Default::default(),
                origin_generation: 0,
                snapshot: None,
            },
            (None, None) => {
                self.store.release_lock(workspace_id, fence).await;
                return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()));
            }
        };
        let any_backend = request.create.as_ref().is_some_and(|new| new.any_backend);
        // Where the files are, and whether leaving them behind is allowed yet.
        let moving_reason = self.may_leave(&record).await?;
        // A drained node is still live: it snapshots the copy it holds before the copy
        // moves, so what was written before the move comes along.
        if moving_reason.is_some() {
            self.snapshot_before_move(&mut record).await;
        }
        let restore = match &request.restore {
            Some(snapshot_id) => Restore { candidates: vec![snapshot_id.clone()], replace: true },
            None if berth_proto::backends::is_portable(&record.backend) => Restore::default(),
            None => Restore { candidates: self.snapshots.restore_candidates(&record).await, replace: false },
        };
        let (node_id, generation, provisioned) =
            self.place_and_provision(&record, any_backend, fence, &restore).await?;
        if let Err(superseded @ ControlPlaneError::BindSuperseded { .. }) = provisioned {
            // A newer placement exists: recording ours (even as FAILED) would go back in time.
            return Err(superseded);
        }
        record.generation = generation;
        record.updated_at_ms = now_ms();
        record.changed_by = self.store.replica_id().to_owned();
        let outcome = match provisioned {
            Ok(Provisioned { backend, created, restored, restore_failures }) => {
                // A placement that keeps the files keeps the origin of the placement that
                // made them: a RECREATED_EMPTY stays visible however often the workspace
                // idles and wakes afterwards, until its files are lost (or restored) again.
                let portable = berth_proto::backends::is_portable(&record.backend);
                let new_origin = match (record.node_id.as_deref(), &moving_reason) {
                    (None, _) => Some(Origin::Fresh),
                    // A portable workspace's sandbox is adopted by whichever gateway takes
                    // it: the files come along, unless the provider no longer had it.
                    (Some(previous), _) if portable && created => Some(Origin::RecreatedEmpty {
                        reason: format!(
                            "the {} provider no longer had its sandbox; made again through {node_id}, empty (was on {previous})",
                            record.backend
                        ),
                    }),
                    (Some(_), _) if portable => None,
                    // Back on its node, which no longer had a copy (its data directory was
                    // lost, or a destroy half happened): the files are gone, say so.
                    (Some(previous), _) if previous == node_id && created => Some(Origin::RecreatedEmpty {
                        reason: format!("its node {node_id} no longer held its files; made again there, empty"),
                    }),
                    (Some(previous), _) if previous == node_id => None,
                    (Some(previous), Some(reason)) => Some(Origin::RecreatedEmpty {
                        reason: format!("{reason}; placed again on {node_id}, empty (its files stay on {previous})"),
                    }),
                    (Some(previous), None) => Some(Origin::RecreatedEmpty {
                        reason: format!("placed again on {node_id}, empty (its files stay on {previous})"),
                    }),
                };
                let new_origin = match (restored, new_origin) {
                    (Some(restored), _) => {
                        metrics::restore_done(if restore_failures.is_empty() { "restored" } else { "fell_back" });
                        if !restore_failures.is_empty() {
                            tracing::warn!(ws_id = %record.id, node_id = %node_id, snapshot = %restored.snapshot_id,
                                failures = ?restore_failures, "restored from an older snapshot: newer ones failed");
                        }
                        Some(Origin::Restored {
                            snapshot_id: restored.snapshot_id,
                            taken_at_ms: restored.created_unix_ms,
                        })
                    }
                    (None, Some(Origin::RecreatedEmpty { reason })) if !restore_failures.is_empty() => {
                        metrics::restore_done("failed");
                        tracing::error!(ws_id = %record.id, node_id = %node_id, failures = ?restore_failures,
                            "no snapshot restored; the workspace was made again empty");
                        Some(Origin::RecreatedEmpty {
                            reason: format!("{reason}; no snapshot restored: {}", restore_failures.join("; ")),
                        })
                    }
                    (None, other) => other,
                };
                match new_origin {
                    Some(origin) => {
                        record.origin = origin;
                        record.origin_generation = generation;
                    }
                    None if record.origin == Origin::Unknown => record.origin = Origin::Resumed,
                    None => {}
                }
                record.state = StoredState::Ready;
                record.node_id = Some(node_id);
                record.backend = backend;
                record.failure = None;
                self.stats.provisioned.fetch_add(1, Relaxed);
                Ok(())
            }
            Err(error) => {
                record.state = StoredState::Failed;
                record.failure = Some(error.to_string());
                Err(error)
            }
        };
        self.store.write_fenced(&record, fence).await?;
        outcome.map(|()| Arc::new(record))
    }

    /// Whether the workspace may be placed away from the node holding its files, and why.
    /// `Ok(None)`: it has no files anywhere yet, or its node is usable (placement goes back
    /// there). A drained node gives it up at once; a node that is gone only after the
    /// lost-node grace — until then the caller gets a retryable UNAVAILABLE, so a node that
    /// restarts or is briefly partitioned finds its workspaces where it left them. Gone is
    /// confirmed by a linearizable read, never taken from the view alone.
    async fn may_leave(&self, record: &WorkspaceRecord) -> Result<Option<String>> {
        let Some(node_id) = record.node_id.as_deref() else { return Ok(None) };
        if self.store.node_holds_workspaces(node_id) {
            self.forget_absence(node_id);
            return Ok(None);
        }
        let portable = berth_proto::backends::is_portable(&record.backend);
        match self.store.node_presence(node_id).await? {
            // The files are in the provider, not on the gateway: any other gateway adopts
            // the sandbox at once, no grace needed.
            NodePresence::Drained | NodePresence::Gone if portable => Ok(None),
            NodePresence::Drained => Ok(Some(format!("its node {node_id} was drained"))),
            // The view lags the registry: wait for it rather than place from it.
            NodePresence::Live => Err(ControlPlaneError::NodeAway {
                workspace_id: record.id.to_string(),
                node_id: node_id.to_owned(),
                absent_secs: 0,
                grace_secs: self.config.lost_node_grace.as_secs(),
            }),
            NodePresence::Gone => {
                let absent = self.absent_for(node_id);
                if absent < self.config.lost_node_grace {
                    return Err(ControlPlaneError::NodeAway {
                        workspace_id: record.id.to_string(),
                        node_id: node_id.to_owned(),
                        absent_secs: absent.as_secs(),
                        grace_secs: self.config.lost_node_grace.as_secs(),
                    });
                }
                Ok(Some(format!("its node {node_id} was lost (not live for {} s)", absent.as_secs())))
            }
        }
    }

    /// Asks the live node that holds the workspace (a drained one) for a snapshot of its copy
    /// under this bind's lock and puts it into the record as its latest, so the move restores
    /// it. Best effort: a node that does not answer leaves the latest pointer as it was.
    async fn snapshot_before_move(&self, record: &mut WorkspaceRecord) {
        if berth_proto::backends::is_portable(&record.backend) || record.state == StoredState::Failed {
            return;
        }
        let Some(node) = record.node_id.as_deref().and_then(|node_id| self.store.node(node_id)) else { return };
        if !node.snapshots {
            return;
        }
        let outcome = async {
            let mut client = self.nodes.get(&node.node_id, &node.address)?;
            let request = v1::SnapshotRequest { workspace_id: record.id.to_string() };
            let taken =
                client.snapshot(node_request(request, record.generation, self.config.provision_timeout)).await?;
            Ok::<_, ControlPlaneError>(taken.into_inner())
        }
        .await;
        match outcome {
            Ok(taken) => {
                tracing::info!(ws_id = %record.id, node_id = %node.node_id, snapshot = %taken.snapshot_id,
                    bytes = taken.bytes, "snapshot before the move");
                crate::snapshots::apply_taken(record, &node.node_id, Some(taken));
            }
            Err(error) => tracing::warn!(ws_id = %record.id, node_id = %node.node_id, %error,
                "no snapshot before the move; restoring the latest recorded one"),
        }
    }

    /// How long this replica has known `node_id` gone (zero the first time it looks).
    fn absent_for(&self, node_id: &str) -> Duration {
        let mut absent = self.absent_since.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        absent.entry(node_id.to_owned()).or_insert_with(Instant::now).elapsed()
    }

    fn forget_absence(&self, node_id: &str) {
        let mut absent = self.absent_since.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        absent.remove(node_id);
    }

    /// Places the workspace and provisions it. A node that is unreachable or not serving
    /// yet (fenced until its registration lands) gets a few retries, each at a new
    /// generation, so a half-made copy from a failed attempt is recognisably stale and
    /// removed by the node's reconciliation. Generations derive from the lock's revision,
    /// which grows with every lock in the cluster: a placement's generation is above every
    /// earlier one of the id, even one whose record was never written or was deleted, so no
    /// node mistakes it for an older copy (or an older copy for it). Returns the node, the
    /// generation and the provisioning outcome.
    async fn place_and_provision(
        &self,
        record: &WorkspaceRecord,
        any_backend: bool,
        fence: LockFence,
        restore: &Restore,
    ) -> Result<(String, u64, Result<Provisioned>)> {
        let base = placement_base(record.generation, fence);
        let mut backoff = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            // Prefer the node that holds the data (an IDLE workspace wakes where it slept).
            let node = self.placement.choose(
                &self.placement_view,
                record.id.as_str(),
                &record.backend,
                &record.spec.labels,
                record.node_id.as_deref(),
                !any_backend,
            )?;
            let generation = base + attempt;
            // Only the node that holds the workspace's files may adopt a copy it finds; on
            // any other node a copy of this id is an orphan (an unrecorded bind, a deleted
            // workspace) and the workspace starts empty there. A portable workspace's files
            // are the provider's sandbox: every gateway adopts it, unless the workspace was
            // never placed (then a sandbox found under its labels is an orphan).
            let fresh = if berth_proto::backends::is_portable(&record.backend) {
                record.node_id.is_none()
            } else {
                restore.replace || record.node_id.as_deref() != Some(node.node_id.as_str())
            };
            let outcome = self.provision_on(&node.node_id, &node.address, record, generation, fresh, restore).await;
            let retryable =
                matches!(&outcome, Err(ControlPlaneError::ProvisionFailed { code: tonic::Code::Unavailable, .. }));
            if !retryable || attempt == PROVISION_ATTEMPTS {
                return Ok((node.node_id.clone(), generation, outcome));
            }
            tracing::info!(ws_id = %record.id, node_id = %node.node_id, attempt, "node not serving; provisioning again");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            attempt += 1;
        }
    }

    /// Calls Provision on the node; returns the backend it used and whether the node made
    /// the workspace anew (it held no copy).
    async fn provision_on(
        &self,
        node_id: &str,
        address: &str,
        record: &WorkspaceRecord,
        generation: u64,
        fresh: bool,
        restore: &Restore,
    ) -> Result<Provisioned> {
        let mut client = self.nodes.get(node_id, address)?;
        let message = v1::ProvisionRequest {
            workspace_id: record.id.to_string(),
            generation,
            backend: record.backend.clone(),
            spec: Some(berth_proto::convert::spec_to_proto(&record.spec)),
            fresh,
            owner: record.owner.clone(),
            restore_snapshots: restore.candidates.clone(),
            restore_required: restore.replace,
        };
        let request = node_request(message, generation, self.config.provision_timeout);
        let started = std::time::Instant::now();
        let outcome = client.provision(request).await;
        let backend_label = match &outcome {
            Ok(response) => response.get_ref().backend.as_str(),
            Err(_) if record.backend.is_empty() => "default",
            Err(_) => record.backend.as_str(),
        };
        metrics::provision_done(backend_label, outcome.is_ok(), started.elapsed());
        match outcome {
            Ok(response) => {
                let response = response.into_inner();
                Ok(Provisioned {
                    backend: response.backend,
                    created: response.created,
                    restored: response.restored,
                    restore_failures: response.restore_failures,
                })
            }
            Err(status) if ErrorKind::of(&status) == Some(ErrorKind::StaleGeneration) => {
                Err(ControlPlaneError::BindSuperseded {
                    workspace_id: record.id.to_string(),
                    detail: format!("node {node_id}: {}", status.message()),
                })
            }
            Err(status) => Err(ControlPlaneError::ProvisionFailed {
                workspace_id: record.id.to_string(),
                node_id: node_id.to_owned(),
                code: status.code(),
                status_message: status.message().to_owned(),
            }),
        }
    }
}

/// What a node answered to a Provision.
struct Provisioned {
    backend: String,
    /// The node held no copy of the workspace and made it empty (or from a snapshot).
    created: bool,
    /// The snapshot the new copy was restored from.
    restored: Option<v1::SnapshotTaken>,
    /// Candidates that failed to restore, newest first (`<id>: <error>`).
    restore_failures: Vec<String>,
}

/// What a provision restores a new copy from.
#[derive(Debug, Default)]
struct Restore {
    /// Snapshot ids, newest first; empty: nothing to restore.
    candidates: Vec<String>,
    /// Replace the copy the node holds (an explicit restore), not only a missing one.
    replace: bool,
}

/// Provision attempts per bind (each at the next generation).
const PROVISION_ATTEMPTS: u64 = 5;

/// The generation a bind's attempts count up from: above the record's, and above every
/// generation a bind under an earlier lock could have used (`revision * 8`, attempts < 8).
fn placement_base(record_generation: u64, fence: LockFence) -> u64 {
    const _: () = assert!(PROVISION_ATTEMPTS < 8);
    record_generation.max(fence.revision().max(0) as u64 * 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations_grow_with_the_lock_revision_whatever_the_record_says() {
        // A record deleted and created again starts at generation 0, but its lock is newer.
        let first = placement_base(0, LockFence::for_test(100)) + 1;
        let retried = placement_base(0, LockFence::for_test(100)) + PROVISION_ATTEMPTS;
        let after_delete = placement_base(0, LockFence::for_test(101)) + 1;
        assert!(after_delete > retried && retried > first);
        // A record written before generations followed revisions keeps growing.
        assert_eq!(placement_base(5_000, LockFence::for_test(10)), 5_000);
    }
}
