//! Binding: exactly one workspace per id, however many replicas race (DESIGN.md §4.2).
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

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_proto::v1;
use berth_workspace::{WorkspaceId, WorkspaceSpec};
use bytes::Bytes;
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;

use crate::config::ControlPlaneConfig;
use crate::error::{ControlPlaneError, Result};
use crate::keys::Keys;
use crate::lease::ReplicaLease;
use crate::metrics;
use crate::node_client::{NodeClients, node_request};
use crate::placement::Placement;
use crate::policy::IsolationPolicy;
use crate::records::{self, RECORD_VERSION, StoredState, WorkspaceRecord, now_ms};
use crate::registry::{Compare, KeyValue, RegistryRef, Txn, TxnOp, WatchEvent};
use crate::view::{EffectiveState, ReplicaView};

/// What a new workspace is made of (ignored when the record already exists).
#[derive(Clone, Debug)]
pub struct NewWorkspace {
    pub owner: String,
    pub agent: String,
    pub policy: IsolationPolicy,
    pub backend: String,
    pub spec: WorkspaceSpec,
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
}

impl BindRequest {
    pub fn existing(workspace_id: WorkspaceId) -> Self {
        Self { workspace_id, create: None, replace_generation: None }
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

pub struct Binder {
    pub(crate) registry: RegistryRef,
    pub(crate) keys: Keys,
    pub(crate) view: Arc<ReplicaView>,
    pub(crate) lease: Arc<ReplicaLease>,
    pub(crate) nodes: Arc<NodeClients>,
    pub(crate) placement: Placement,
    pub(crate) config: ControlPlaneConfig,
    inflight: Mutex<HashMap<WorkspaceId, SharedBind>>,
    pub stats: BindStats,
}

enum Observed {
    /// A usable record: READY on a live node.
    Ready(Arc<WorkspaceRecord>),
    /// Absent or not usable; `None` when absent.
    NotReady(Option<Box<WorkspaceRecord>>),
}

enum WaitOutcome {
    Record(Box<WorkspaceRecord>),
    LockReleased,
}

impl Binder {
    pub fn new(
        registry: RegistryRef,
        keys: Keys,
        view: Arc<ReplicaView>,
        lease: Arc<ReplicaLease>,
        nodes: Arc<NodeClients>,
        config: ControlPlaneConfig,
    ) -> Self {
        Self {
            registry,
            keys,
            view,
            lease,
            nodes,
            placement: Placement::new(),
            config,
            inflight: Mutex::new(HashMap::new()),
            stats: BindStats::default(),
        }
    }

    /// Returns the workspace READY on a live node, binding it if needed.
    pub async fn ensure_ready(self: &Arc<Self>, request: BindRequest) -> Result<Arc<WorkspaceRecord>> {
        if let Some(entry) = self.view.workspace(request.workspace_id.as_str())
            && self.view.effective_state(&entry.record) == EffectiveState::Ready
            && Some(entry.record.generation) != request.replace_generation
        {
            return Ok(entry.record);
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
        let lock_key = self.keys.lock(workspace_id);
        let mut backoff = Duration::from_millis(20);
        // Set when a holder we waited for let go of the lock without a result (it died or
        // stalled): winning the lock afterwards is a take-over.
        let mut holder_vanished = false;
        loop {
            let current = match self.observe(workspace_id, request.replace_generation).await? {
                Observed::Ready(record) => return Ok(record),
                Observed::NotReady(current) => current,
            };
            if current.is_none() && request.create.is_none() {
                return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()));
            }
            match self.acquire_lock(workspace_id).await? {
                Ok(fence) => {
                    self.stats.won.fetch_add(1, Relaxed);
                    metrics::bind_won();
                    if holder_vanished {
                        metrics::bind_taken_over();
                    }
                    // Provision under the lock, then free it whatever happened (the record
                    // write already deletes it on success).
                    let outcome = tokio::time::timeout_at(deadline, self.bind_under_lock(request, fence)).await;
                    let outcome = match outcome {
                        Ok(outcome) => outcome,
                        Err(_) => Err(ControlPlaneError::BindTimeout {
                            workspace_id: workspace_id.to_string(),
                            millis: self.config.bind_timeout.as_millis() as u64,
                        }),
                    };
                    if outcome.is_err() {
                        self.release_lock(&lock_key, fence).await;
                    }
                    return outcome;
                }
                Err(lock) => {
                    self.stats.waited.fetch_add(1, Relaxed);
                    metrics::bind_waited();
                    match self.wait_for_holder(workspace_id, &lock).await? {
                        WaitOutcome::Record(record) => match record.state {
                            StoredState::Ready
                                if Some(record.generation) != request.replace_generation
                                    && record
                                        .node_id
                                        .as_deref()
                                        .is_some_and(|node| self.view.node_holds_workspaces(node)) =>
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
                        WaitOutcome::LockReleased => holder_vanished = true,
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
        let key = self.keys.workspace(workspace_id);
        let (found, revision) = self.read_record(&key).await?;
        match found {
            Some((record, _)) => {
                let usable = record.state == StoredState::Ready
                    && Some(record.generation) != replace_generation
                    && record.node_id.as_deref().is_some_and(|node| self.view.node_holds_workspaces(node));
                if usable {
                    Ok(Observed::Ready(Arc::new(record)))
                } else {
                    Ok(Observed::NotReady(Some(Box::new(record))))
                }
            }
            None => {
                self.view.workspaces.apply_delete(&key, revision);
                Ok(Observed::NotReady(None))
            }
        }
    }

    /// Reads a workspace record linearizably and refreshes the view with it. Returns the
    /// record with its mod revision, and a revision at which absence was observed.
    pub(crate) async fn read_record(&self, key: &str) -> Result<(Option<(WorkspaceRecord, i64)>, i64)> {
        let response = self.registry.txn(Txn::new().and_then([TxnOp::get(key)])).await?;
        match response.first_get() {
            Some(kv) => {
                self.view.workspaces.apply_put(kv);
                let record = records::decode::<WorkspaceRecord>(key, &kv.value)?;
                Ok((Some((record, kv.mod_revision)), response.revision))
            }
            None => Ok((None, response.revision)),
        }
    }

    async fn bind_under_lock(&self, request: &BindRequest, fence: i64) -> Result<Arc<WorkspaceRecord>> {
        use std::sync::atomic::Ordering::Relaxed;
        let workspace_id = &request.workspace_id;
        // Double-check: another replica may have finished between our read and our lock.
        let current = match self.observe(workspace_id, request.replace_generation).await? {
            Observed::Ready(record) => {
                self.release_lock(&self.keys.lock(workspace_id), fence).await;
                return Ok(record);
            }
            Observed::NotReady(current) => current,
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
            },
            (None, None) => {
                self.release_lock(&self.keys.lock(workspace_id), fence).await;
                return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()));
            }
        };
        let (node_id, generation, provisioned) = self.place_and_provision(&record).await?;
        record.generation = generation;
        record.updated_at_ms = now_ms();
        record.changed_by = self.config.replica_id.clone();
        let outcome = match provisioned {
            Ok(backend) => {
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
        self.write_fenced(workspace_id, &record, fence).await?;
        outcome.map(|()| Arc::new(record))
    }

    /// Places the workspace and provisions it. A node that is unreachable or not serving
    /// yet (fenced until its registration lands) gets a few retries, each at a new
    /// generation, so a half-made copy from a failed attempt is recognisably stale and
    /// removed by the node's reconciliation. Returns the node, the generation and the
    /// provisioning outcome.
    async fn place_and_provision(&self, record: &WorkspaceRecord) -> Result<(String, u64, Result<String>)> {
        const ATTEMPTS: u64 = 5;
        let mut backoff = Duration::from_millis(100);
        let mut attempt = 1;
        loop {
            // Prefer the node that holds the data (an IDLE workspace wakes where it slept).
            let node = self.placement.choose(
                &self.view,
                record.id.as_str(),
                &record.backend,
                &record.spec.labels,
                record.node_id.as_deref(),
            )?;
            let generation = record.generation + attempt;
            let outcome = self.provision_on(&node.node_id, &node.address, record, generation).await;
            let retryable =
                matches!(&outcome, Err(ControlPlaneError::ProvisionFailed { code: tonic::Code::Unavailable, .. }));
            if !retryable || attempt == ATTEMPTS {
                return Ok((node.node_id.clone(), generation, outcome));
            }
            tracing::info!(ws_id = %record.id, node_id = %node.node_id, attempt, "node not serving; provisioning again");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(1));
            attempt += 1;
        }
    }

    /// Calls Provision on the node; returns the backend it used.
    async fn provision_on(
        &self,
        node_id: &str,
        address: &str,
        record: &WorkspaceRecord,
        generation: u64,
    ) -> Result<String> {
        let mut client = self.nodes.get(address)?;
        let message = v1::ProvisionRequest {
            workspace_id: record.id.to_string(),
            generation,
            backend: record.backend.clone(),
            spec: Some(berth_proto::convert::spec_to_proto(&record.spec)),
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
            Ok(response) => Ok(response.into_inner().backend),
            Err(status) => Err(ControlPlaneError::ProvisionFailed {
                workspace_id: record.id.to_string(),
                node_id: node_id.to_owned(),
                code: status.code(),
                status_message: status.message().to_owned(),
            }),
        }
    }

    /// Writes the record and deletes the lock in one transaction, only if we still hold the
    /// lock we took (its create revision is the fence).
    pub(crate) async fn write_fenced(
        &self,
        workspace_id: &WorkspaceId,
        record: &WorkspaceRecord,
        fence: i64,
    ) -> Result<()> {
        let lock_key = self.keys.lock(workspace_id);
        let response = self
            .registry
            .txn(Txn::new().when([Compare::create_revision(&lock_key, fence)]).and_then([
                TxnOp::put(self.keys.workspace(workspace_id), records::encode(record)),
                TxnOp::delete(&lock_key),
            ]))
            .await?;
        if !response.succeeded {
            return Err(ControlPlaneError::LostLock { workspace_id: workspace_id.to_string() });
        }
        Ok(())
    }

    /// Deletes the lock if it is still ours. When etcd does not answer, the release is
    /// retried in the background: the lock hangs on this replica's lease, which lives as long
    /// as the replica does, so a lock left behind would make every bind of the workspace, on
    /// every replica, wait for this replica to die.
    pub(crate) async fn release_lock(&self, lock_key: &str, fence: i64) {
        let txn = Txn::new().when([Compare::create_revision(lock_key, fence)]).and_then([TxnOp::delete(lock_key)]);
        if let Err(error) = self.registry.txn(txn).await {
            tracing::warn!(lock = lock_key, %error, "releasing a bind lock failed; retrying in the background");
            keep_releasing(Arc::clone(&self.registry), lock_key.to_owned(), OwnLock::Fence(fence));
        }
    }

    /// Takes the bind lock for a state change other than a bind (sweeper, close). Returns
    /// the fence, or `None` when another replica holds it.
    pub(crate) async fn try_lock(&self, workspace_id: &WorkspaceId) -> Result<Option<i64>> {
        Ok(self.acquire_lock(workspace_id).await?.ok())
    }

    /// Creates the bind lock on this replica's lease. Its value is the replica id plus a
    /// fresh nonce, so after an ambiguous failure (the create may or may not have landed)
    /// one read tells whether the lock is ours — an own lock left behind would otherwise
    /// block the workspace for as long as this replica lives.
    async fn acquire_lock(&self, workspace_id: &WorkspaceId) -> Result<std::result::Result<i64, KeyValue>> {
        let lock_key = self.keys.lock(workspace_id);
        let holder = format!("{}/{:016x}", self.config.replica_id, rand::random::<u64>());
        match self.registry.create_if_absent(&lock_key, Bytes::from(holder.clone()), self.lease.id()).await {
            Ok(outcome) => Ok(outcome),
            Err(error) if error.is_retryable() => match self.registry.get(&lock_key).await {
                Ok(Some(lock)) if lock.value == holder.as_bytes() => Ok(Ok(lock.create_revision)),
                Ok(Some(lock)) => Ok(Err(lock)),
                Ok(None) => Err(error.into()),
                // Still unknown whether the create landed: if it did, the lock is ours and
                // nobody else will ever delete it.
                Err(read_error) => {
                    keep_releasing(Arc::clone(&self.registry), lock_key, OwnLock::Value(Bytes::from(holder)));
                    Err(read_error.into())
                }
            },
            Err(error) => Err(error.into()),
        }
    }

    /// Waits until the lock holder finishes: the record turns READY / FAILED, or the lock
    /// goes away. Watches start right after the lock's revision so nothing is missed.
    async fn wait_for_holder(&self, workspace_id: &WorkspaceId, lock: &KeyValue) -> Result<WaitOutcome> {
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
                            return Ok(WaitOutcome::Record(Box::new(record)));
                        }
                    }
                    WatchEvent::Delete { key, .. } if key == lock_key => return Ok(WaitOutcome::LockReleased),
                    _ => {}
                }
            }
        }
        // The watch broke: look again from the top.
        Ok(WaitOutcome::LockReleased)
    }
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
