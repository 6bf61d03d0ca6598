//! `berth nodes list | drain | undrain | quarantine`: the node agents the control plane
//! currently sees, taking one out of placement, and the copies a node moved aside instead of
//! deleting (AdminService).

use std::collections::BTreeMap;
use std::time::SystemTime;

use berth_proto::v1::{
    AdminListQuarantineRequest, AdminRestoreQuarantineRequest, DrainNodeRequest, ListNodesRequest, NodeInfo,
    UndrainNodeRequest,
};
use clap::Subcommand;
use serde::Serialize;

use crate::client::{RpcResultExt, connect};
use crate::format::{age, node_state_name, rfc3339_opt};
use crate::global::GlobalArgs;
use crate::io::Io;
use crate::output::{Table, emit, emit_message};

#[derive(Debug, Subcommand)]
pub enum NodesCommand {
    /// List live nodes with their load and last heartbeat.
    List,
    /// Stop placing workspaces on NODE and move the ones it holds. With snapshots
    /// (`--snapshot-store` on replicas and node), each workspace is snapshotted, moved to
    /// another node and restored there, one progress line per workspace. Without them the
    /// data would stay behind: a node holding workspaces is then drained only with --force
    /// (the command otherwise lists what would be lost and changes nothing).
    Drain {
        node_id: String,
        /// Release the workspaces without moving their data (it stays on the node).
        #[arg(long)]
        force: bool,
    },
    /// Let a drained NODE receive new workspaces again.
    Undrain { node_id: String },
    /// List the copies NODE moved to its quarantine instead of deleting them (superseded
    /// by a newer placement, orphaned, or of a workspace deleted while the node was away);
    /// with --restore, move one back into the live workspace of the same id on that node,
    /// as `restored-<ENTRY>/` in its root.
    Quarantine {
        node_id: String,
        #[arg(long, value_name = "ENTRY")]
        restore: Option<String>,
    },
}

/// JSON form of a quarantine entry.
#[derive(Debug, Serialize)]
pub struct QuarantineView {
    pub entry: String,
    pub workspace_id: String,
    pub generation: u64,
    pub backend: String,
    pub reason: String,
    pub quarantined_at: Option<String>,
    pub bytes: u64,
}

/// JSON form of a restore.
#[derive(Debug, Serialize)]
pub struct RestoreView {
    pub node_id: String,
    pub entry: String,
    pub workspace_id: String,
    pub path: String,
}

/// JSON form of a drain.
#[derive(Debug, Serialize)]
pub struct DrainView {
    pub node_id: String,
    pub released: Vec<String>,
    /// Workspaces a migrating drain moved (or failed to: `error`).
    pub moved: Vec<MovedView>,
}

/// One workspace of a migrating drain.
#[derive(Debug, Serialize)]
pub struct MovedView {
    pub workspace_id: String,
    pub to_node_id: String,
    pub snapshot_id: String,
    pub bytes: u64,
    pub duration_ms: u64,
    pub error: String,
}

impl From<&berth_proto::v1::DrainProgress> for MovedView {
    fn from(progress: &berth_proto::v1::DrainProgress) -> Self {
        MovedView {
            workspace_id: progress.workspace_id.clone(),
            to_node_id: progress.to_node_id.clone(),
            snapshot_id: progress.snapshot_id.clone(),
            bytes: progress.bytes,
            duration_ms: progress.duration_ms,
            error: progress.error.clone(),
        }
    }
}

/// One progress line of a migrating drain.
fn progress_line(progress: &berth_proto::v1::DrainProgress) -> String {
    let head = format!("[{}/{}] {}", progress.index, progress.total, progress.workspace_id);
    if progress.error.is_empty() {
        format!(
            "{head} -> {} restored from {} ({} bytes) in {} ms\n",
            progress.to_node_id, progress.snapshot_id, progress.bytes, progress.duration_ms
        )
    } else {
        format!("{head}: {} ({} ms)\n", progress.error, progress.duration_ms)
    }
}

/// JSON form of an undrain.
#[derive(Debug, Serialize)]
pub struct UndrainView {
    pub node_id: String,
    pub was_drained: bool,
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
        NodesCommand::Drain { node_id, force: false } => {
            let mut client = connect(global).await?.admin();
            let request = DrainNodeRequest { node_id: node_id.clone(), force: false };
            let mut stream =
                client.drain_node_progress(request).await.rpc_context(|| format!("drain node {node_id}"))?.into_inner();
            let mut moved = Vec::new();
            let table = global.output == crate::output::OutputFormat::Table;
            while let Some(progress) = stream.message().await.rpc_context(|| format!("drain node {node_id}"))? {
                if table {
                    io.write_stdout(progress_line(&progress).as_bytes()).await?;
                    io.flush_stdout().await?;
                }
                moved.push(progress);
            }
            let failed = moved.iter().filter(|progress| !progress.error.is_empty()).count();
            let message = match moved.len() {
                0 => format!("drained node {node_id}; it held no workspaces"),
                total => format!("drained node {node_id}; moved {} of {total} workspace(s)", total - failed),
            };
            let view = DrainView { node_id, released: Vec::new(), moved: moved.iter().map(MovedView::from).collect() };
            emit_message(io, global.output, &view, &message).await?;
            if failed > 0 {
                return Ok(1);
            }
        }
        NodesCommand::Drain { node_id, force: true } => {
            let force = true;
            let mut client = connect(global).await?.admin();
            let request = DrainNodeRequest { node_id: node_id.clone(), force };
            let released: Vec<String> = client
                .drain_node(request)
                .await
                .rpc_context(|| format!("drain node {node_id}"))?
                .into_inner()
                .released
                .into_iter()
                .map(|workspace| workspace.workspace_id)
                .collect();
            let message = match released.len() {
                0 => format!("drained node {node_id}; it held no workspaces"),
                count => format!(
                    "drained node {node_id}; {count} workspace(s) will be re-placed on their next access \
                     (their data on {node_id} is lost): {}",
                    released.join(", ")
                ),
            };
            emit_message(io, global.output, &DrainView { node_id, released, moved: Vec::new() }, &message).await?;
        }
        NodesCommand::Undrain { node_id } => {
            let mut client = connect(global).await?.admin();
            let request = UndrainNodeRequest { node_id: node_id.clone() };
            let was_drained = client
                .undrain_node(request)
                .await
                .rpc_context(|| format!("undrain node {node_id}"))?
                .into_inner()
                .was_drained;
            let message = if was_drained {
                format!("node {node_id} receives workspaces again")
            } else {
                format!("node {node_id} was not drained")
            };
            emit_message(io, global.output, &UndrainView { node_id, was_drained }, &message).await?;
        }
        NodesCommand::Quarantine { node_id, restore: None } => {
            let mut client = connect(global).await?.admin();
            let request = AdminListQuarantineRequest { node_id: node_id.clone() };
            let entries = client
                .list_quarantine(request)
                .await
                .rpc_context(|| format!("list the quarantine of node {node_id}"))?
                .into_inner()
                .entries;
            let views: Vec<QuarantineView> = entries
                .iter()
                .map(|entry| QuarantineView {
                    entry: entry.entry.clone(),
                    workspace_id: entry.workspace_id.clone(),
                    generation: entry.generation,
                    backend: entry.backend.clone(),
                    reason: entry.reason.clone(),
                    quarantined_at: rfc3339_opt(entry.quarantined_at.as_ref()),
                    bytes: entry.bytes,
                })
                .collect();
            emit(io, global.output, &views, || {
                let mut table = Table::new(["ENTRY", "WORKSPACE", "GENERATION", "BYTES", "QUARANTINED", "REASON"])
                    .align_right(2)
                    .align_right(3);
                for view in &views {
                    table.push_row(vec![
                        view.entry.clone(),
                        view.workspace_id.clone(),
                        view.generation.to_string(),
                        view.bytes.to_string(),
                        view.quarantined_at.clone().unwrap_or_default(),
                        view.reason.clone(),
                    ]);
                }
                table
            })
            .await?;
        }
        NodesCommand::Quarantine { node_id, restore: Some(entry) } => {
            let mut client = connect(global).await?.admin();
            let request = AdminRestoreQuarantineRequest { node_id: node_id.clone(), entry: entry.clone() };
            let restored = client
                .restore_quarantine(request)
                .await
                .rpc_context(|| format!("restore quarantine entry {entry} on node {node_id}"))?
                .into_inner();
            let message = format!("restored {entry} into workspace {} as {}", restored.workspace_id, restored.path);
            let view = RestoreView { node_id, entry, workspace_id: restored.workspace_id, path: restored.path };
            emit_message(io, global.output, &view, &message).await?;
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
        let drain = Cli::try_parse_from(["berth", "nodes", "drain", "node-a", "--force"]).unwrap();
        assert!(
            matches!(drain.command, Command::Nodes(NodesCommand::Drain { ref node_id, force: true }) if node_id == "node-a")
        );
        let undrain = Cli::try_parse_from(["berth", "nodes", "undrain", "node-a"]).unwrap();
        assert!(matches!(undrain.command, Command::Nodes(NodesCommand::Undrain { .. })));
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
