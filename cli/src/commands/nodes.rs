//! `berth nodes list`: the node agents the control plane currently sees (AdminService).

use std::collections::BTreeMap;
use std::time::SystemTime;

use berth_proto::v1::{ListNodesRequest, NodeInfo};
use clap::Subcommand;
use serde::Serialize;

use crate::GlobalArgs;
use crate::client::{RpcResultExt, connect};
use crate::format::{age, node_state_name, rfc3339_opt};
use crate::io::Io;
use crate::output::{Table, emit};

#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// List live nodes with their load and last heartbeat.
    List,
}

/// JSON form of a node.
#[derive(Debug, Serialize)]
pub struct NodeView {
    pub node_id: String,
    pub address: String,
    pub backends: Vec<String>,
    pub labels: BTreeMap<String, String>,
    pub workspaces: u32,
    pub last_heartbeat: Option<String>,
    pub state: String,
    pub load: Option<LoadView>,
    pub version: String,
    pub node_generation: u64,
    pub replica_id: String,
}

#[derive(Debug, Serialize)]
pub struct LoadView {
    pub workspaces: u32,
    pub running: u32,
    pub execs_in_flight: u32,
    pub load_avg_1m: f64,
    pub mem_available_bytes: u64,
}

impl From<&NodeInfo> for NodeView {
    fn from(node: &NodeInfo) -> Self {
        NodeView {
            node_id: node.node_id.clone(),
            address: node.address.clone(),
            backends: node.backends.clone(),
            labels: node.labels.clone().into_iter().collect(),
            workspaces: node.workspaces,
            last_heartbeat: rfc3339_opt(node.last_heartbeat.as_ref()),
            state: node_state_name(node.state),
            load: node.load.as_ref().map(|load| LoadView {
                workspaces: load.workspaces,
                running: load.running,
                execs_in_flight: load.execs_in_flight,
                load_avg_1m: load.load_avg_1m,
                mem_available_bytes: load.mem_available_bytes,
            }),
            version: node.version.clone(),
            node_generation: node.node_generation,
            replica_id: node.replica_id.clone(),
        }
    }
}

/// Ages are relative to `now`, a parameter so tests do not depend on the clock.
pub fn nodes_table(nodes: &[NodeInfo], now: SystemTime) -> Table {
    let mut table = Table::new(["ID", "ADDRESS", "BACKENDS", "WORKSPACES", "LAST HEARTBEAT", "STATE"]).align_right(3);
    for node in nodes {
        table.push_row(vec![
            node.node_id.clone(),
            node.address.clone(),
            node.backends.join(","),
            node.workspaces.to_string(),
            age(node.last_heartbeat.as_ref(), now),
            node_state_name(node.state),
        ]);
    }
    table
}

pub async fn run(command: NodesCommand, global: &GlobalArgs, io: &mut Io<'_>) -> anyhow::Result<i32> {
    match command {
        NodesCommand::List => {
            let mut client = connect(global).await?.admin();
            let mut nodes =
                client.list_nodes(ListNodesRequest {}).await.rpc_context(|| "list nodes")?.into_inner().nodes;
            nodes.sort_by(|left, right| left.node_id.cmp(&right.node_id));
            let views: Vec<NodeView> = nodes.iter().map(NodeView::from).collect();
            emit(io, global.output, &views, || nodes_table(&nodes, SystemTime::now())).await?;
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    #[test]
    fn nodes_list_parses() {
        let cli = Cli::try_parse_from(["berth", "nodes", "list", "-o", "json"]).unwrap();
        assert!(matches!(cli.command, Command::Nodes(NodesCommand::List)));
        assert!(Cli::try_parse_from(["berth", "nodes"]).is_err());
    }

    #[test]
    fn table_shows_heartbeat_age_and_state() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let node = NodeInfo {
            node_id: "node-a".into(),
            address: "10.0.0.1:7071".into(),
            backends: vec!["local".into(), "docker".into()],
            workspaces: 12,
            last_heartbeat: Some(prost_types::Timestamp { seconds: 998, nanos: 0 }),
            state: berth_proto::v1::NodeState::Live as i32,
            ..NodeInfo::default()
        };
        assert_eq!(
            nodes_table(&[node], now).render(),
            "ID      ADDRESS        BACKENDS      WORKSPACES  LAST HEARTBEAT  STATE\n\
             node-a  10.0.0.1:7071  local,docker          12  2s ago          live\n"
        );
    }
}
