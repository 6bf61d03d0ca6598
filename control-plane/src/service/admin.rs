//! `AdminService`: operator calls.

use std::sync::Arc;

use berth_proto::convert::timestamp_from_unix_ms;
use berth_proto::v1::admin_service_server::AdminService;
use berth_proto::v1::{self, NodeState};
use tonic::{Request, Response, Status};

use crate::authz::{Caller, require_admin};
use crate::view::ReplicaView;

pub struct AdminApi {
    view: Arc<ReplicaView>,
}

impl AdminApi {
    pub fn new(view: Arc<ReplicaView>) -> Self {
        Self { view }
    }
}

#[tonic::async_trait]
impl AdminService for AdminApi {
    async fn list_nodes(
        &self,
        request: Request<v1::ListNodesRequest>,
    ) -> Result<Response<v1::ListNodesResponse>, Status> {
        require_admin(Caller::of(&request)?.principal())?;
        let mut nodes: Vec<v1::NodeInfo> = self
            .view
            .live_nodes()
            .iter()
            .map(|node| v1::NodeInfo {
                node_id: node.node_id.clone(),
                address: node.address.clone(),
                backends: node.backends.clone(),
                labels: node.labels.clone().into_iter().collect(),
                workspaces: node.load.workspaces,
                last_heartbeat: Some(timestamp_from_unix_ms(node.last_heartbeat_ms)),
                state: if node.draining { NodeState::Draining } else { NodeState::Live } as i32,
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
            })
            .collect();
        nodes.sort_by(|left, right| left.node_id.cmp(&right.node_id));
        Ok(Response::new(v1::ListNodesResponse { nodes }))
    }
}
