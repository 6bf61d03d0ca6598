//! `berth status`: one screen for an operator — replicas, nodes (state, load, last
//! heartbeat), workspaces by state and backend, registry health (AdminService
//! GetClusterStatus, answered from one replica's view).

use std::time::SystemTime;

use berth_proto::v1::{ClusterStatus, GetClusterStatusRequest};
use serde::Serialize;

use crate::client::{RpcResultExt, connect};
use crate::commands::nodes::NodeView;
use crate::format::{age, node_state_name, rfc3339_opt};
use crate::global::GlobalArgs;
use crate::io::Io;
use crate::output::{Table, emit_message};

/// JSON form of the status.
#[derive(Debug, Serialize)]
pub struct StatusView {
    pub answered_by: String,
    pub registry: RegistryView,
    pub replicas: Vec<ReplicaView>,
    pub nodes: Vec<NodeView>,
    pub drained_nodes: Vec<String>,
    pub workspaces: Vec<WorkspaceCountView>,
}

#[derive(Debug, Serialize)]
pub struct RegistryView {
    pub registry: String,
    pub healthy: bool,
    pub read_latency_micros: u64,
    pub error: String,
}

#[derive(Debug, Serialize)]
pub struct ReplicaView {
    pub replica_id: String,
    pub address: String,
    pub started_at: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct WorkspaceCountView {
    pub state: String,
    pub backend: String,
    pub count: u64,
}

impl From<&ClusterStatus> for StatusView {
    fn from(status: &ClusterStatus) -> Self {
        let registry = status.registry.clone().unwrap_or_default();
        StatusView {
            answered_by: status.answered_by.clone(),
            registry: RegistryView {
                registry: registry.registry,
                healthy: registry.healthy,
                read_latency_micros: registry.read_latency_micros,
                error: registry.error,
            },
            replicas: status
                .replicas
                .iter()
                .map(|replica| ReplicaView {
                    replica_id: replica.replica_id.clone(),
                    address: replica.address.clone(),
                    started_at: rfc3339_opt(replica.started_at.as_ref()),
                })
                .collect(),
            nodes: status.nodes.iter().map(NodeView::from).collect(),
            drained_nodes: status.drained_nodes.clone(),
            workspaces: status
                .workspaces
                .iter()
                .map(|count| WorkspaceCountView {
                    state: count.state.clone(),
                    backend: count.backend.clone(),
                    count: count.count,
                })
                .collect(),
        }
    }
}

/// The whole screen; ages relative to `now` so tests do not depend on the clock.
pub fn status_text(status: &ClusterStatus, now: SystemTime) -> String {
    let registry = status.registry.clone().unwrap_or_default();
    let health = if registry.healthy {
        format!("healthy (linearizable read {:.1} ms)", registry.read_latency_micros as f64 / 1000.0)
    } else {
        format!("UNHEALTHY: {}", registry.error)
    };
    let mut text = format!("answered by {}\nregistry    {} {}\n", status.answered_by, registry.registry, health);

    let mut replicas = Table::new(["REPLICA", "ADDRESS", "STARTED"]);
    for replica in &status.replicas {
        replicas.push_row(vec![
            replica.replica_id.clone(),
            replica.address.clone(),
            age(replica.started_at.as_ref(), now),
        ]);
    }
    text.push('\n');
    text.push_str(&replicas.render());

    let mut nodes =
        Table::new(["NODE", "STATE", "BACKENDS", "WORKSPACES", "RUNNING", "EXECS", "LOAD 1M", "LAST HEARTBEAT"])
            .align_right(3)
            .align_right(4)
            .align_right(5)
            .align_right(6);
    for node in &status.nodes {
        let load = node.load.unwrap_or_default();
        nodes.push_row(vec![
            node.node_id.clone(),
            node_state_name(node.state),
            node.backends.join(","),
            node.workspaces.to_string(),
            load.running.to_string(),
            load.execs_in_flight.to_string(),
            format!("{:.2}", load.load_avg_1m),
            age(node.last_heartbeat.as_ref(), now),
        ]);
    }
    text.push('\n');
    text.push_str(&nodes.render());
    let gone_but_drained: Vec<&str> = status
        .drained_nodes
        .iter()
        .filter(|drained| !status.nodes.iter().any(|node| &node.node_id == *drained))
        .map(String::as_str)
        .collect();
    if !gone_but_drained.is_empty() {
        text.push_str(&format!("drained, not live: {}\n", gone_but_drained.join(", ")));
    }

    let mut workspaces = Table::new(["WORKSPACES", "BACKEND", "COUNT"]).align_right(2);
    for count in &status.workspaces {
        let backend = if count.backend.is_empty() { "-".to_owned() } else { count.backend.clone() };
        workspaces.push_row(vec![count.state.clone(), backend, count.count.to_string()]);
    }
    text.push('\n');
    text.push_str(&workspaces.render());
    text
}

pub async fn run(global: &GlobalArgs, io: &mut Io<'_>) -> anyhow::Result<i32> {
    let mut client = connect(global).await?.admin();
    let status =
        client.get_cluster_status(GetClusterStatusRequest {}).await.rpc_context(|| "cluster status")?.into_inner();
    let view = StatusView::from(&status);
    let screen = status_text(&status, SystemTime::now());
    emit_message(io, global.output, &view, screen.trim_end()).await?;
    // Unhealthy registry: the screen is printed, and scripts see it in the exit code.
    Ok(if status.registry.is_some_and(|registry| registry.healthy) { 0 } else { 2 })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use berth_proto::v1::{NodeInfo, NodeLoad, NodeState, RegistryHealth, ReplicaInfo, WorkspaceCount};

    use super::*;

    #[test]
    fn screen_shows_every_section() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let status = ClusterStatus {
            answered_by: "replica-0".into(),
            replicas: vec![ReplicaInfo {
                replica_id: "replica-0".into(),
                address: "http://10.0.0.1:7070".into(),
                started_at: Some(prost_types::Timestamp { seconds: 880, nanos: 0 }),
            }],
            nodes: vec![NodeInfo {
                node_id: "node-a".into(),
                backends: vec!["local".into()],
                workspaces: 3,
                state: NodeState::Draining as i32,
                last_heartbeat: Some(prost_types::Timestamp { seconds: 999, nanos: 0 }),
                load: Some(NodeLoad { running: 2, execs_in_flight: 1, load_avg_1m: 0.5, ..NodeLoad::default() }),
                ..NodeInfo::default()
            }],
            workspaces: vec![WorkspaceCount { state: "ready".into(), backend: "local".into(), count: 3 }],
            registry: Some(RegistryHealth {
                registry: "etcd".into(),
                healthy: true,
                read_latency_micros: 600,
                error: String::new(),
            }),
            drained_nodes: vec!["node-a".into(), "node-gone".into()],
        };
        assert_eq!(
            status_text(&status, now),
            "answered by replica-0\n\
             registry    etcd healthy (linearizable read 0.6 ms)\n\
             \n\
             REPLICA    ADDRESS               STARTED\n\
             replica-0  http://10.0.0.1:7070  2m ago\n\
             \n\
             NODE    STATE     BACKENDS  WORKSPACES  RUNNING  EXECS  LOAD 1M  LAST HEARTBEAT\n\
             node-a  draining  local              3        2      1     0.50  1s ago\n\
             drained, not live: node-gone\n\
             \n\
             WORKSPACES  BACKEND  COUNT\n\
             ready       local        3\n"
        );
    }
}
