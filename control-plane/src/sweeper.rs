//! Idle sweeper (DESIGN.md §4.5): one replica at a time — the holder of
//! `/leader/sweeper`, a key on its lease — releases the runtime of workspaces idle past the
//! TTL and marks them IDLE. Last access comes from the nodes' heartbeats (in the node
//! records), never from a registry write per request.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use berth_proto::v1;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::binding::Binder;
use crate::node_client::node_request;
use crate::records::{StoredState, WorkspaceRecord, now_ms};
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
    binder: Arc<Binder>,
    pub stats: Arc<SweeperStats>,
}

impl Sweeper {
    pub fn new(binder: Arc<Binder>) -> Self {
        Self { binder, stats: Arc::new(SweeperStats::default()) }
    }

    pub async fn run(self, cancel: CancellationToken) {
        let interval = self.binder.config.sweep_interval();
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
                }
                Ok(false) => self.stats.leader.store(0, Ordering::Relaxed),
                Err(error) => tracing::warn!(%error, "sweeper election failed"),
            }
        }
    }

    /// Becomes or stays the leader: the leader key exists on our current lease.
    async fn lead(&self) -> crate::registry::Result<bool> {
        let binder = &self.binder;
        let key = binder.keys.leader("sweeper");
        let lease = binder.lease.id();
        let holder = Bytes::from(binder.config.replica_id.clone());
        match binder.registry.create_if_absent(&key, holder.clone(), lease).await? {
            Ok(_) => {
                tracing::info!(replica_id = %binder.config.replica_id, "became the idle sweeper");
                Ok(true)
            }
            Err(existing) => Ok(existing.value == holder && existing.lease == lease),
        }
    }

    async fn sweep(&self) {
        let binder = &self.binder;
        let idle_ttl_ms = binder.config.idle_ttl.as_millis() as i64;
        let now = now_ms();
        for entry in binder.view.workspaces.all() {
            let record = entry.record;
            if binder.view.effective_state(&record) != EffectiveState::Ready {
                continue;
            }
            let node_id = record.node_id.clone().unwrap_or_default();
            let reported =
                binder.view.node(&node_id).and_then(|node| node.last_access_ms.get(record.id.as_str()).copied());
            let last_access = reported.unwrap_or(0).max(record.updated_at_ms);
            if now - last_access < idle_ttl_ms {
                continue;
            }
            match self.idle(&record).await {
                Ok(true) => {
                    self.stats.idled.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(
                        ws_id = %record.id,
                        node_id = %node_id,
                        replica_id = %binder.config.replica_id,
                        idle_ms = now - last_access,
                        "workspace idle; runtime released"
                    );
                }
                Ok(false) => {}
                Err(error) => tracing::warn!(ws_id = %record.id, %error, "releasing an idle workspace failed"),
            }
        }
    }

    /// Releases one workspace under its bind lock; `false` when it changed meanwhile or
    /// someone else holds the lock (the next sweep looks again).
    async fn idle(&self, seen: &WorkspaceRecord) -> crate::error::Result<bool> {
        let binder = &self.binder;
        let Some(fence) = binder.try_lock(&seen.id).await? else { return Ok(false) };
        let lock_key = binder.keys.lock(&seen.id);
        let (found, _) = binder.read_record(&binder.keys.workspace(&seen.id)).await?;
        let mut record = match found {
            Some((record, _)) if record.generation == seen.generation && record.state == StoredState::Ready => record,
            _ => {
                binder.release_lock(&lock_key, fence).await;
                return Ok(false);
            }
        };
        if let Some(node) = record.node_id.as_deref().and_then(|node_id| binder.view.node(node_id)) {
            let released = async {
                let mut client = binder.nodes.get(&node.address)?;
                let request = v1::ReleaseRequest { workspace_id: record.id.to_string() };
                client.release(node_request(request, record.generation, binder.config.node_call_timeout)).await?;
                Ok::<_, tonic::Status>(())
            }
            .await;
            if let Err(status) = released {
                binder.release_lock(&lock_key, fence).await;
                return Err(status.into());
            }
        }
        record.state = StoredState::Idle;
        record.updated_at_ms = now_ms();
        record.changed_by = binder.config.replica_id.clone();
        binder.write_fenced(&record.id, &record, fence).await?;
        Ok(true)
    }
}
