//! `AdminService`: operator calls. Every handler starts with `require_admin`.
//!
//! Drain (`DrainNode` / `UndrainNode`): the drain is its own registry key
//! (`/drains/<node>`, no lease), so it survives the node's lease, node restarts and replica
//! restarts, and every replica learns it through its view. A drained node gets no new
//! placements (`placement.rs`) and a workspace recorded on it counts as LOST
//! (`ReplicaView::node_holds_workspaces`): its next access re-places it at a new generation
//! on another node, exactly like a workspace whose node died, and the node then removes its
//! superseded copy through the heartbeat reconciliation. Without snapshots that copy's data
//! is lost: a drain of a node holding workspaces needs `force`. With a snapshot store on
//! the replicas and the node, a drain without `force` migrates (`admin/drain.rs`): every
//! workspace is snapshotted, the drain key written, and each one moved and restored.
//!
//! A bind that chose the node just before its replica saw the drain still records it there;
//! every replica treats that workspace as LOST too, so it moves on its next access (it is
//! brand new, so nothing is lost with it).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use berth_proto::convert::timestamp_from_unix_ms;
use berth_proto::v1::admin_service_server::AdminService;
use berth_proto::v1::{self, NodeState};
use tonic::{Request, Response, Status};

use crate::authz::{Caller, require_admin};
use crate::error::ControlPlaneError;
use crate::keys::Keys;
use crate::node_client::{NodeClients, node_request};
use crate::records::{self, DrainRecord, NodeRecord, RECORD_VERSION, ReplicaRecord, StoredState, now_ms};
use crate::registry::{RegistryError, RegistryRef, Txn, TxnOp, TxnOpResponse};
use crate::store::WorkspaceStoreRef;
use crate::view::ReplicaView;

/// Most workspace ids a refused drain names in its message (the count is always exact).
const REFUSAL_LISTS_AT_MOST: usize = 50;

/// Workspaces are read through the store; nodes, drains and replicas (cluster state, not
/// workspace state) through the view and the registry.
#[derive(Clone)]
pub struct AdminApi {
    store: WorkspaceStoreRef,
    nodes: Arc<NodeClients>,
    node_call_timeout: std::time::Duration,
    view: Arc<ReplicaView>,
    registry: RegistryRef,
    keys: Keys,
    replica_id: String,
    /// Moves workspaces off a draining node (set by `with_migration`).
    migration: Option<Migration>,
}

pub mod drain;
use drain::Migration;

impl AdminApi {
    pub fn new(
        store: WorkspaceStoreRef,
        nodes: Arc<NodeClients>,
        node_call_timeout: std::time::Duration,
        view: Arc<ReplicaView>,
        registry: RegistryRef,
        keys: Keys,
        replica_id: String,
    ) -> Self {
        Self { store, nodes, node_call_timeout, view, registry, keys, replica_id, migration: None }
    }

    /// A drain without `force` migrates workspaces through snapshots in `snapshots` (when
    /// it is enabled and the node takes snapshots), binding each through `binder`.
    pub fn with_migration(
        mut self,
        binder: Arc<crate::binding::Binder>,
        snapshots: crate::snapshots::SnapshotsRef,
        snapshot_timeout: std::time::Duration,
    ) -> Self {
        self.migration = Some(Migration {
            binder,
            snapshots,
            snapshot_timeout,
            store: Arc::clone(&self.store),
            nodes: Arc::clone(&self.nodes),
        });
        self
    }

    fn migrates(&self, node_id: &str) -> bool {
        self.migration.as_ref().is_some_and(|migration| migration.migrates(node_id))
    }

    /// The migrating drain of `node_id` (`admin/drain.rs`).
    async fn migrate(
        &self,
        by: &str,
        node_id: &str,
        workspaces: Vec<v1::DrainedWorkspace>,
        progress: tokio::sync::mpsc::Sender<v1::DrainProgress>,
    ) -> Result<(), Status> {
        let Some(migration) = &self.migration else {
            return Err(ControlPlaneError::SnapshotsDisabled { what: format!("migrating node {node_id}") }.into());
        };
        let ids = workspaces.iter().map(|workspace| workspace.workspace_id.clone()).collect();
        migration.migrate(by, node_id, workspaces, progress, self.write_drain(node_id, by, ids)).await
    }

    /// The node-agent client of a live node.
    fn live_node(&self, node_id: &str) -> Result<crate::node_client::NodeAgentClient, Status> {
        node_id_of(node_id)?;
        let node =
            self.store.node(node_id).ok_or_else(|| ControlPlaneError::NodeNotFound { node_id: node_id.to_owned() })?;
        Ok(self.nodes.get(&node.node_id, &node.address)?)
    }

    fn node_info(&self, node: &NodeRecord) -> v1::NodeInfo {
        // The drain key decides; the record's `draining` flag lags it by up to a refresh.
        let draining = self.view.is_draining(&node.node_id);
        v1::NodeInfo {
            node_id: node.node_id.clone(),
            address: node.address.clone(),
            backends: node.backends.clone(),
            labels: node.labels.clone().into_iter().collect(),
            workspaces: node.load.workspaces,
            last_heartbeat: Some(timestamp_from_unix_ms(node.last_heartbeat_ms)),
            state: if draining { NodeState::Draining } else { NodeState::Live } as i32,
            load: Some(v1::NodeLoad {
                workspaces: node.load.workspaces,
                running: node.load.running,
                execs_in_flight: node.load.execs_in_flight,
                load_avg_1m: node.load.load_avg_1m,
                mem_available_bytes: node.load.mem_available_bytes,
            }),
            version: node.agent_version.clone(),
            node_generation: node.node_generation,
            replica_id: node.replica_id.clone(),
        }
    }

    fn sorted_nodes(&self) -> Vec<v1::NodeInfo> {
        let mut nodes: Vec<v1::NodeInfo> = self.view.live_nodes().iter().map(|node| self.node_info(node)).collect();
        nodes.sort_by(|left, right| left.node_id.cmp(&right.node_id));
        nodes
    }

    /// Replicas from their lease-bound keys, and the registry's health from that same read
    /// (linearizable, so it needs a quorum).
    async fn replicas_and_health(&self) -> (Vec<v1::ReplicaInfo>, v1::RegistryHealth) {
        let started = Instant::now();
        let listed = self.registry.range_page(&self.keys.replicas_prefix(), "", 1000).await;
        let mut health = v1::RegistryHealth {
            registry: self.registry.name().to_owned(),
            healthy: listed.is_ok(),
            read_latency_micros: u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX),
            error: String::new(),
        };
        let page = match listed {
            Ok(page) => page,
            Err(error) => {
                health.error = error.to_string();
                return (Vec::new(), health);
            }
        };
        let replicas = page
            .kvs
            .iter()
            .filter_map(|kv| records::decode::<ReplicaRecord>(&kv.key, &kv.value).ok())
            .map(|replica| v1::ReplicaInfo {
                replica_id: replica.replica_id,
                address: replica.address,
                started_at: Some(timestamp_from_unix_ms(replica.started_at_ms)),
            })
            .collect();
        (replicas, health)
    }

    fn workspace_counts(&self) -> Vec<v1::WorkspaceCount> {
        let mut counts: BTreeMap<(&'static str, String), u64> = BTreeMap::new();
        for record in self.store.workspaces() {
            let state = crate::metrics::state_label(self.store.effective_state(&record));
            *counts.entry((state, record.backend.clone())).or_default() += 1;
        }
        counts
            .into_iter()
            .map(|((state, backend), count)| v1::WorkspaceCount { state: state.to_owned(), backend, count })
            .collect()
    }

    /// Workspaces whose placement (runtime or kept data) is on `node_id`, as this replica
    /// sees them.
    fn workspaces_on(&self, node_id: &str) -> Vec<v1::DrainedWorkspace> {
        self.store
            .workspaces()
            .into_iter()
            .filter(|record| {
                record.node_id.as_deref() == Some(node_id)
                    && matches!(record.state, StoredState::Ready | StoredState::Idle)
            })
            .map(|record| v1::DrainedWorkspace {
                workspace_id: record.id.to_string(),
                state: crate::metrics::state_label(self.store.effective_state(&record)).to_owned(),
                owner: record.owner.clone(),
            })
            .collect()
    }

    /// The drain of a node whose workspaces are not migrated (`force`, or no snapshots):
    /// refused without `force` when workspaces would lose their data.
    async fn drain_without_migration(
        &self,
        by: &str,
        message: &v1::DrainNodeRequest,
        released: Vec<v1::DrainedWorkspace>,
    ) -> Result<v1::DrainNodeResponse, Status> {
        if !self.view.node_is_live(&message.node_id) && released.is_empty() && !self.view.is_draining(&message.node_id)
        {
            return Err(ControlPlaneError::NodeNotFound { node_id: message.node_id.clone() }.into());
        }
        if !released.is_empty() && !message.force && !self.view.is_draining(&message.node_id) {
            let mut named: Vec<&str> = released.iter().map(|workspace| workspace.workspace_id.as_str()).collect();
            named.sort_unstable();
            let more = named.len().saturating_sub(REFUSAL_LISTS_AT_MOST);
            named.truncate(REFUSAL_LISTS_AT_MOST);
            return Err(ControlPlaneError::DrainLosesData {
                node_id: message.node_id.clone(),
                count: released.len(),
                named: named.into_iter().map(str::to_owned).collect(),
                more,
            }
            .into());
        }
        let workspace_ids = released.iter().map(|workspace| workspace.workspace_id.clone()).collect();
        self.write_drain(&message.node_id, by, workspace_ids).await?;
        tracing::info!(node_id = %message.node_id, released = released.len(), by, "node drained");
        Ok(v1::DrainNodeResponse { released, moved: Vec::new() })
    }

    /// Writes the drain key (no lease) and reads it back into this replica's view.
    async fn write_drain(&self, node_id: &str, by: &str, released: Vec<String>) -> Result<(), Status> {
        let key = self.keys.drain(node_id);
        let record = DrainRecord {
            version: RECORD_VERSION,
            node_id: node_id.to_owned(),
            drained_by: by.to_owned(),
            drained_at_ms: now_ms(),
            released,
        };
        let response = self
            .registry
            .txn(Txn::new().and_then([TxnOp::put(&key, records::encode(&record))]))
            .await
            .map_err(registry_status)?;
        self.refresh_drain(&key, response.revision).await.map_err(registry_status)?;
        Ok(())
    }

    /// Reads the drain key back into this replica's view, so the caller's next request to
    /// this replica already sees it (other replicas follow through their watch).
    async fn refresh_drain(&self, key: &str, revision: i64) -> Result<(), RegistryError> {
        match self.registry.get(key).await? {
            Some(kv) => self.view.drains.apply_put(&kv),
            None => self.view.drains.apply_delete(key, revision),
        }
        Ok(())
    }
}

fn registry_status(error: RegistryError) -> Status {
    Status::from(ControlPlaneError::from(error))
}

fn node_id_of(node_id: &str) -> Result<(), Status> {
    Ok(berth_workspace::validate_id("node id", node_id).map_err(ControlPlaneError::from)?)
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn list_nodes(
        &self,
        request: Request<v1::ListNodesRequest>,
    ) -> Result<Response<v1::ListNodesResponse>, Status> {
        require_admin(Caller::of(&request)?.principal())?;
        Ok(Response::new(v1::ListNodesResponse { nodes: self.sorted_nodes() }))
    }

    async fn get_cluster_status(
        &self,
        request: Request<v1::GetClusterStatusRequest>,
    ) -> Result<Response<v1::ClusterStatus>, Status> {
        require_admin(Caller::of(&request)?.principal())?;
        let (mut replicas, registry) = self.replicas_and_health().await;
        replicas.sort_by(|left, right| left.replica_id.cmp(&right.replica_id));
        let mut drained_nodes: Vec<String> =
            self.view.drains.all().into_iter().map(|entry| entry.record.node_id.clone()).collect();
        drained_nodes.sort();
        Ok(Response::new(v1::ClusterStatus {
            answered_by: self.replica_id.clone(),
            replicas,
            nodes: self.sorted_nodes(),
            workspaces: self.workspace_counts(),
            registry: Some(registry),
            drained_nodes,
        }))
    }

    async fn drain_node(
        &self,
        request: Request<v1::DrainNodeRequest>,
    ) -> Result<Response<v1::DrainNodeResponse>, Status> {
        let caller = Caller::of(&request)?;
        require_admin(caller.principal())?;
        let message = request.get_ref();
        node_id_of(&message.node_id)?;
        let by = caller.principal().name.clone();
        let released = self.workspaces_on(&message.node_id);
        if !released.is_empty() && !message.force && self.migrates(&message.node_id) {
            let (sender, mut receiver) = tokio::sync::mpsc::channel(64);
            let migrated = self.migrate(&by, &message.node_id, released, sender);
            let mut moved = Vec::new();
            let collect = async {
                while let Some(progress) = receiver.recv().await {
                    moved.push(progress);
                }
            };
            let (outcome, ()) = tokio::join!(migrated, collect);
            outcome?;
            return Ok(Response::new(v1::DrainNodeResponse { released: Vec::new(), moved }));
        }
        Ok(Response::new(self.drain_without_migration(&by, message, released).await?))
    }

    type DrainNodeProgressStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<v1::DrainProgress, Status>> + Send + 'static>>;

    async fn drain_node_progress(
        &self,
        request: Request<v1::DrainNodeRequest>,
    ) -> Result<Response<Self::DrainNodeProgressStream>, Status> {
        let caller = Caller::of(&request)?;
        require_admin(caller.principal())?;
        let message = request.into_inner();
        node_id_of(&message.node_id)?;
        let workspaces = self.workspaces_on(&message.node_id);
        let by = caller.principal().name.clone();
        if message.force || workspaces.is_empty() || !self.migrates(&message.node_id) {
            // Nothing to migrate (or not migrating): the plain drain, streamed as one
            // progress line per released workspace.
            let released = self.drain_without_migration(&by, &message, workspaces).await?.released;
            let total = released.len() as u32;
            let lines = released.into_iter().enumerate().map(move |(index, workspace)| {
                Ok(v1::DrainProgress {
                    index: index as u32 + 1,
                    total,
                    workspace_id: workspace.workspace_id,
                    error: "released; its data stays on the node (--force)".to_owned(),
                    ..Default::default()
                })
            });
            return Ok(Response::new(Box::pin(futures::stream::iter(lines.collect::<Vec<_>>()))));
        }
        let (sender, receiver) = tokio::sync::mpsc::channel(64);
        let (lines, outcome_receiver) = tokio::sync::mpsc::channel::<Result<v1::DrainProgress, Status>>(64);
        let node_id = message.node_id.clone();
        let this = self.clone();
        tokio::spawn(async move {
            let forward_lines = lines.clone();
            let forward = async move {
                let mut receiver = receiver;
                while let Some(progress) = receiver.recv().await {
                    if forward_lines.send(Ok(progress)).await.is_err() {
                        return;
                    }
                }
            };
            let (outcome, ()) = tokio::join!(this.migrate(&by, &node_id, workspaces, sender), forward);
            if let Err(error) = outcome {
                let _ = lines.send(Err(error)).await;
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(outcome_receiver))))
    }

    async fn undrain_node(
        &self,
        request: Request<v1::UndrainNodeRequest>,
    ) -> Result<Response<v1::UndrainNodeResponse>, Status> {
        let caller = Caller::of(&request)?;
        require_admin(caller.principal())?;
        let node_id = &request.get_ref().node_id;
        node_id_of(node_id)?;
        let key = self.keys.drain(node_id);
        let response = self.registry.txn(Txn::new().and_then([TxnOp::delete(&key)])).await.map_err(registry_status)?;
        let was_drained = matches!(response.responses.first(), Some(TxnOpResponse::Delete(deleted)) if *deleted > 0);
        self.refresh_drain(&key, response.revision).await.map_err(registry_status)?;
        tracing::info!(node_id = %node_id, was_drained, by = %caller.principal().name, "node undrained");
        Ok(Response::new(v1::UndrainNodeResponse { was_drained }))
    }

    async fn list_quarantine(
        &self,
        request: Request<v1::AdminListQuarantineRequest>,
    ) -> Result<Response<v1::ListQuarantineResponse>, Status> {
        require_admin(Caller::of(&request)?.principal())?;
        let mut client = self.live_node(&request.get_ref().node_id)?;
        let call = node_request(v1::ListQuarantineRequest {}, 0, self.node_call_timeout);
        Ok(Response::new(client.list_quarantine(call).await?.into_inner()))
    }

    async fn restore_quarantine(
        &self,
        request: Request<v1::AdminRestoreQuarantineRequest>,
    ) -> Result<Response<v1::RestoreQuarantineResponse>, Status> {
        let caller = Caller::of(&request)?;
        require_admin(caller.principal())?;
        let message = request.get_ref();
        let mut client = self.live_node(&message.node_id)?;
        let call =
            node_request(v1::RestoreQuarantineRequest { entry: message.entry.clone() }, 0, self.node_call_timeout);
        let restored = client.restore_quarantine(call).await?.into_inner();
        tracing::info!(
            node_id = %message.node_id,
            entry = %message.entry,
            ws_id = %restored.workspace_id,
            by = %caller.principal().name,
            "quarantined copy restored"
        );
        Ok(Response::new(restored))
    }
}
