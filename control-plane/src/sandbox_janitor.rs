//! Sandbox janitor (docs/design.md §4.7): one replica at a time — the holder of
//! `/leader/sandbox-janitor` — asks a live gateway of every portable backend for the
//! provider's sandboxes carrying this cluster's labels, and removes those whose workspace
//! has no registry record and no bind in flight, once they are older than the grace. Such a
//! sandbox was made behind Berth's back, by a bind that never recorded it, or belongs to a
//! workspace deleted while its gateway was away. Every removal is logged (`berth::audit`)
//! and counted.
//!
//! Safe against races: a sandbox younger than the grace is never touched (a bind creating
//! it has its lock and writes the record within its deadline); the record and the lock are
//! read linearizably just before the removal; and the gateway refuses to remove a sandbox
//! of a workspace it holds at that generation or newer.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use berth_proto::v1;
use berth_workspace::WorkspaceId;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::node_client::{NodeClients, node_request};
use crate::records::now_ms;
use crate::store::{Leadership, WorkspaceStoreRef};

/// What the janitor did on this replica (metrics and tests read it).
#[derive(Debug, Default)]
pub struct JanitorStats {
    pub passes: AtomicU64,
    pub removed: AtomicU64,
}

pub struct SandboxJanitor {
    store: WorkspaceStoreRef,
    nodes: Arc<NodeClients>,
    interval: Duration,
    grace: Duration,
    node_call_timeout: Duration,
    /// Sandboxes without a creation time, by provider id: when this janitor first saw each.
    first_seen: HashMap<String, Instant>,
    pub stats: Arc<JanitorStats>,
}

impl SandboxJanitor {
    pub fn new(
        store: WorkspaceStoreRef,
        nodes: Arc<NodeClients>,
        interval: Duration,
        grace: Duration,
        node_call_timeout: Duration,
    ) -> Self {
        Self {
            store,
            nodes,
            interval,
            grace,
            node_call_timeout,
            first_seen: HashMap::new(),
            stats: Arc::new(JanitorStats::default()),
        }
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(self.interval) => {}
            }
            match self.store.lead("sandbox-janitor").await {
                Ok(Leadership::Became | Leadership::Kept) => {
                    self.stats.passes.fetch_add(1, Ordering::Relaxed);
                    self.pass().await;
                }
                Ok(Leadership::Other) => self.first_seen.clear(),
                Err(error) => tracing::debug!(%error, "sandbox janitor election failed; trying again"),
            }
        }
    }

    /// One gateway per portable backend: the live node offering it with the smallest id (any
    /// would do; all see the same provider account under this cluster's labels).
    fn gateways(&self) -> BTreeMap<String, (String, String)> {
        let mut gateways: BTreeMap<String, (String, String)> = BTreeMap::new();
        for node in self.store.live_nodes() {
            for backend in node.backends.iter().filter(|backend| berth_proto::backends::is_portable(backend)) {
                let candidate = (node.node_id.clone(), node.address.clone());
                let chosen = gateways.entry(backend.clone()).or_insert_with(|| candidate.clone());
                if candidate.0 < chosen.0 {
                    *chosen = candidate;
                }
            }
        }
        gateways
    }

    async fn pass(&mut self) {
        let mut still_seen = BTreeSet::new();
        for (backend, (node_id, address)) in self.gateways() {
            let Ok(mut client) = self.nodes.get(&node_id, &address) else { continue };
            let request = node_request(v1::ListLabelledRequest { backend: backend.clone() }, 0, self.node_call_timeout);
            let sandboxes = match client.list_labelled(request).await {
                Ok(response) => response.into_inner().sandboxes,
                Err(status) => {
                    tracing::debug!(%backend, %node_id, error = %status.message(), "listing labelled sandboxes failed");
                    continue;
                }
            };
            for sandbox in sandboxes {
                still_seen.insert(sandbox.provider_id.clone());
                if self.young(&sandbox) {
                    continue;
                }
                match self.orphaned(&sandbox).await {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(error) => {
                        tracing::debug!(%error, sandbox = sandbox.provider_id, "checking a sandbox's record failed");
                        continue;
                    }
                }
                let removal = v1::RemoveLabelledRequest { backend: backend.clone(), sandbox: Some(sandbox.clone()) };
                match client.remove_labelled(node_request(removal, 0, self.node_call_timeout)).await {
                    Ok(_) => {
                        self.stats.removed.fetch_add(1, Ordering::Relaxed);
                        crate::metrics::sandbox_removed(&backend);
                        tracing::info!(
                            target: "berth::audit",
                            %backend,
                            gateway = %node_id,
                            sandbox = sandbox.provider_id,
                            workspace = sandbox.workspace_id,
                            generation = sandbox.generation,
                            "removed a labelled sandbox without a workspace record"
                        );
                    }
                    Err(status) => tracing::warn!(
                        %backend,
                        sandbox = sandbox.provider_id,
                        error = %status.message(),
                        "removing an orphan sandbox failed; trying again next pass"
                    ),
                }
            }
        }
        self.first_seen.retain(|provider_id, _| still_seen.contains(provider_id));
    }

    /// Younger than the grace (by the provider's creation time, else by when first seen).
    fn young(&mut self, sandbox: &v1::LabelledSandbox) -> bool {
        if sandbox.created_at_unix_ms > 0 {
            return now_ms().saturating_sub(sandbox.created_at_unix_ms) < self.grace.as_millis() as i64;
        }
        let first = *self.first_seen.entry(sandbox.provider_id.clone()).or_insert_with(Instant::now);
        first.elapsed() < self.grace
    }

    /// No record and no bind lock for its workspace, read linearizably in one transaction (a
    /// sandbox whose labels name no valid id is an orphan too).
    async fn orphaned(&self, sandbox: &v1::LabelledSandbox) -> crate::error::Result<bool> {
        let Ok(id) = WorkspaceId::new(sandbox.workspace_id.clone()) else { return Ok(true) };
        Ok(!self.store.record_or_lock_exists(&id).await?)
    }
}
