//! Idle sweeper (docs/design.md §4.5): one replica at a time — the holder of
//! `/leader/sweeper`, a key on its lease — releases the runtime of workspaces idle past the
//! TTL and marks them IDLE. Last access comes from the nodes' heartbeats (in the node
//! records), never from a registry write per request.
//!
//! Never idled early: a workspace with execs in flight or live MCP clients is in use; idle time is measured on
//! one clock (the node reports an age, the replica that receives it turns it into its own
//! time, and the sweeper compares it with that record's own report time); a workspace its
//! node has not reported yet starts counting when this sweeper first sees it.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use berth_proto::v1;
use tokio_util::sync::CancellationToken;

use crate::config::ControlPlaneConfig;
use crate::node_client::{NodeClients, node_request};
use crate::records::{StoredState, WorkspaceRecord, now_ms};
use crate::snapshots::{Snapshots, SnapshotsRef};
use crate::store::{Leadership, WorkspaceStoreRef};
use crate::view::EffectiveState;

#[derive(Debug, Default)]
pub struct SweeperStats {
    /// Sweeps this replica ran as leader.
    pub sweeps: AtomicU64,
    /// Workspaces this replica turned IDLE.
    pub idled: AtomicU64,
    /// 1 while this replica is the leader.
    pub leader: AtomicU64,
}

pub struct Sweeper {
    store: WorkspaceStoreRef,
    nodes: Arc<NodeClients>,
    idle_ttl: Duration,
    sweep_interval: Duration,
    node_call_timeout: Duration,
    /// READY workspaces (id, generation) no heartbeat reported yet, and when this sweeper
    /// first saw each: they are idle for as long as they have been seen, not since 1970.
    unreported_since: HashMap<(String, u64), Instant>,
    pub stats: Arc<SweeperStats>,
    /// Snapshot retention and garbage collection, every `snapshot_gc_interval`.
    snapshots: SnapshotsRef,
    snapshot_gc_interval: Duration,
    snapshot_gc_grace: Duration,
    last_snapshot_gc: Option<Instant>,
}

impl Sweeper {
    pub fn new(store: WorkspaceStoreRef, nodes: Arc<NodeClients>, config: &ControlPlaneConfig) -> Self {
        Self {
            store,
            nodes,
            idle_ttl: config.idle_ttl,
            sweep_interval: config.sweep_interval(),
            node_call_timeout: config.node_call_timeout,
            unreported_since: HashMap::new(),
            stats: Arc::new(SweeperStats::default()),
            snapshots: Arc::new(Snapshots::disabled()),
            snapshot_gc_interval: config.snapshot_gc_interval,
            snapshot_gc_grace: config.snapshot_gc_grace,
            last_snapshot_gc: None,
        }
    }

    /// As leader, also prunes snapshots to `--snapshot-keep` and collects blobs no manifest
    /// references (older than `grace`) every `interval`.
    pub fn with_snapshots(mut self, snapshots: SnapshotsRef, interval: Duration, grace: Duration) -> Self {
        self.snapshots = snapshots;
        self.snapshot_gc_interval = interval;
        self.snapshot_gc_grace = grace;
        self
    }

    async fn collect_snapshot_garbage(&mut self) {
        if !self.snapshots.enabled()
            || self.last_snapshot_gc.is_some_and(|last| last.elapsed() < self.snapshot_gc_interval)
        {
            return;
        }
        self.last_snapshot_gc = Some(Instant::now());
        self.snapshots.sweep(&self.store.workspaces(), self.snapshot_gc_grace).await;
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        let interval = self.sweep_interval;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            match self.lead().await {
                Ok(true) => {
                    self.stats.leader.store(1, Ordering::Relaxed);
                    self.stats.sweeps.fetch_add(1, Ordering::Relaxed);
                    self.sweep().await;
                    self.collect_snapshot_garbage().await;
                }
                Ok(false) => {
                    self.stats.leader.store(0, Ordering::Relaxed);
                    // Another replica counts now; our first sightings would be stale when
                    // we lead again.
                    self.unreported_since.clear();
                }
                Err(error) => tracing::warn!(%error, "sweeper election failed"),
            }
        }
    }

    /// Becomes or stays the leader: the leader key exists on our current lease.
    async fn lead(&self) -> crate::registry::Result<bool> {
        match self.store.lead("sweeper").await? {
            Leadership::Became => {
                tracing::info!(replica_id = %self.store.replica_id(), "became the idle sweeper");
                Ok(true)
            }
            Leadership::Kept => Ok(true),
            Leadership::Other => Ok(false),
        }
    }

    async fn sweep(&mut self) {
        let idle_ttl_ms = self.idle_ttl.as_millis() as i64;
        let mut still_unreported = HashMap::new();
        for record in self.store.workspaces() {
            if self.store.effective_state(&record) != EffectiveState::Ready {
                continue;
            }
            let idle_ms = match self.store.reported_use(&record) {
                Some((reported, _)) if reported.in_use() => continue,
                Some((reported, reported_at_ms)) => reported.idle_at_report_ms(reported_at_ms),
                None => {
                    let key = (record.id.to_string(), record.generation);
                    let first_seen = self.unreported_since.get(&key).copied().unwrap_or_else(Instant::now);
                    still_unreported.insert(key, first_seen);
                    first_seen.elapsed().as_millis() as i64
                }
            };
            if idle_ms < idle_ttl_ms {
                continue;
            }
            match self.idle(&record).await {
                Ok(true) => {
                    self.stats.idled.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        ws_id = %record.id,
                        node_id = %record.node_id.as_deref().unwrap_or_default(),
                        replica_id = %self.store.replica_id(),
                        idle_ms,
                        "workspace idle; runtime released"
                    );
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(ws_id = %record.id, %error, "releasing an idle workspace failed"),
            }
        }
        // Forget workspaces that were reported, changed or went away meanwhile.
        self.unreported_since = still_unreported;
    }

    /// Releases one workspace under its bind lock; `false` when it changed meanwhile or
    /// someone else holds the lock (the next sweep looks again).
    async fn idle(&self, seen: &WorkspaceRecord) -> crate::error::Result<bool> {
        let store = &self.store;
        let Some(fence) = store.try_lock(&seen.id).await? else { return Ok(false) };
        let mut record = match store.load(&seen.id).await? {
            Some(record) if record.generation == seen.generation && record.state == StoredState::Ready => record,
            _ => {
                store.release_lock(&seen.id, fence).await;
                return Ok(false);
            }
        };
        if let Some(node) = record.node_id.as_deref().and_then(|node_id| store.node(node_id)) {
            let released = async {
                let mut client = self.nodes.get(&node.node_id, &node.address)?;
                let request = v1::ReleaseRequest { workspace_id: record.id.to_string() };
                let response = client.release(node_request(request, record.generation, self.node_call_timeout)).await?;
                Ok::<_, tonic::Status>(response.into_inner())
            }
            .await;
            match released {
                // The snapshot taken on Release goes into the record under this lock.
                Ok(response) => crate::snapshots::apply_taken(&mut record, &node.node_id, response.snapshot),
                Err(status) => {
                    store.release_lock(&seen.id, fence).await;
                    return Err(status.into());
                }
            }
        }
        record.state = StoredState::Idle;
        record.updated_at_ms = now_ms();
        record.changed_by = store.replica_id().to_owned();
        store.write_fenced(&record, fence).await?;
        Ok(true)
    }
}
