//! `berth ws get | list | close | share | unshare | snapshot | snapshots | restore`:
//! workspaces as the control plane records them (snapshots in `snapshots.rs`).

use std::collections::{BTreeMap, HashSet};

use berth_proto::v1::{
    CloseWorkspaceRequest, GetWorkspaceRequest, ListWorkspacesRequest, ShareWorkspaceRequest, UnshareWorkspaceRequest,
    Workspace, WorkspaceSpec,
};
use clap::Subcommand;
use serde::Serialize;

use crate::client::{RpcResultExt, connect};
use crate::format::{policy_name, rfc3339_opt, rfc3339_seconds_cell, workspace_origin_name, workspace_state_name};
use crate::global::GlobalArgs;
use crate::io::Io;
use crate::output::{Table, emit, emit_message};

/// Workspaces asked for per ListWorkspaces page (the server caps pages at 1000).
const LIST_PAGE_SIZE: u32 = 500;

#[derive(Debug, Subcommand)]
pub enum WsCommand {
    /// Show one workspace, including its spec.
    Get {
        /// Workspace id.
        workspace: String,
    },
    /// List workspaces, all pages.
    List {
        /// Only workspaces owned by this user.
        #[arg(long)]
        user: Option<String>,
        /// Only workspaces of this agent.
        #[arg(long)]
        agent: Option<String>,
    },
    /// Stop a workspace's runtime (data kept), or with --destroy remove it entirely.
    Close {
        /// Remove the runtime, the data and the record; cannot be undone.
        #[arg(long)]
        destroy: bool,
        /// Workspace id.
        workspace: String,
    },
    /// Let another user use a workspace (owner or admin only).
    Share {
        /// Workspace id.
        workspace: String,
        /// User to share it with.
        user: String,
    },
    /// Take back a share.
    Unshare {
        /// Workspace id.
        workspace: String,
        /// User to take it from.
        user: String,
    },
    /// Snapshot a workspace's files now and record it as its latest (owner or admin).
    Snapshot {
        /// Workspace id.
        workspace: String,
    },
    /// List a workspace's snapshots, newest first.
    Snapshots {
        /// Workspace id.
        workspace: String,
    },
    /// Replace a workspace's files with a snapshot's (the latest by default); the copy it
    /// replaces is kept in its node's quarantine.
    Restore {
        /// Workspace id.
        workspace: String,
        /// Snapshot id (see `berth ws snapshots`).
        #[arg(long)]
        snapshot: Option<String>,
    },
}

/// JSON form of a workspace.
#[derive(Debug, Serialize)]
pub struct WorkspaceView {
    pub workspace_id: String,
    pub owner_user_id: String,
    pub agent_id: String,
    pub policy: String,
    pub backend: String,
    pub state: String,
    pub node_id: String,
    pub generation: u64,
    pub created_at: Option<String>,
    pub updated_at: Option<String>,
    pub failure: String,
    pub spec: Option<SpecView>,
    pub shared_with: Vec<String>,
    /// How the files came to be: fresh, recreated_empty, restored (or resumed / unspecified
    /// for records older than origins).
    pub origin: String,
    pub origin_reason: String,
    pub origin_generation: u64,
    pub origin_snapshot_id: String,
    pub origin_snapshot_time: Option<String>,
}

/// JSON form of a workspace spec; maps sorted so output is stable between runs.
#[derive(Debug, Serialize)]
pub struct SpecView {
    pub image: String,
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    pub pids: u32,
    pub network: bool,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub read_only_root: bool,
    pub file_size_bytes: u64,
    pub cpu_time_secs: u32,
}

impl From<&WorkspaceSpec> for SpecView {
    fn from(spec: &WorkspaceSpec) -> Self {
        SpecView {
            image: spec.image.clone(),
            cpu_millis: spec.cpu_millis,
            memory_bytes: spec.memory_bytes,
            pids: spec.pids,
            network: spec.network,
            env: spec.env.clone().into_iter().collect(),
            labels: spec.labels.clone().into_iter().collect(),
            read_only_root: spec.read_only_root,
            file_size_bytes: spec.file_size_bytes,
            cpu_time_secs: spec.cpu_time_secs,
        }
    }
}

impl From<&Workspace> for WorkspaceView {
    fn from(workspace: &Workspace) -> Self {
        WorkspaceView {
            workspace_id: workspace.workspace_id.clone(),
            owner_user_id: workspace.owner_user_id.clone(),
            agent_id: workspace.agent_id.clone(),
            policy: policy_name(workspace.policy),
            backend: workspace.backend.clone(),
            state: workspace_state_name(workspace.state),
            node_id: workspace.node_id.clone(),
            generation: workspace.generation,
            created_at: rfc3339_opt(workspace.created_at.as_ref()),
            updated_at: rfc3339_opt(workspace.updated_at.as_ref()),
            failure: workspace.failure.clone(),
            spec: workspace.spec.as_ref().map(SpecView::from),
            shared_with: workspace.shared_with.clone(),
            origin: workspace_origin_name(workspace.origin),
            origin_reason: workspace.origin_reason.clone(),
            origin_generation: workspace.origin_generation,
            origin_snapshot_id: workspace.origin_snapshot_id.clone(),
            origin_snapshot_time: rfc3339_opt(workspace.origin_snapshot_time.as_ref()),
        }
    }
}

/// `-` for an empty cell, so columns never look shifted.
fn cell(text: &str) -> String {
    if text.is_empty() { "-".to_string() } else { text.to_string() }
}

pub fn workspaces_table(workspaces: &[Workspace]) -> Table {
    let mut table = Table::new(["WORKSPACE", "USER", "AGENT", "POLICY", "BACKEND", "STATE", "NODE", "CREATED"]);
    for workspace in workspaces {
        table.push_row(vec![
            workspace.workspace_id.clone(),
            cell(&workspace.owner_user_id),
            cell(&workspace.agent_id),
            policy_name(workspace.policy),
            cell(&workspace.backend),
            workspace_state_name(workspace.state),
            cell(&workspace.node_id),
            rfc3339_seconds_cell(workspace.created_at.as_ref()),
        ]);
    }
    table
}

/// `ws get`: one field per row, since a single workspace has more fields than fit a line.
fn workspace_detail_table(workspace: &Workspace) -> Table {
    let view = WorkspaceView::from(workspace);
    let mut table = Table::new(["FIELD", "VALUE"]);
    let mut field = |name: &str, value: String| table.push_row(vec![name.to_string(), value]);
    field("workspace", view.workspace_id);
    field("user", cell(&view.owner_user_id));
    field("agent", cell(&view.agent_id));
    field("policy", view.policy);
    field("backend", cell(&view.backend));
    field("state", view.state);
    field("node", cell(&view.node_id));
    field("generation", view.generation.to_string());
    field("origin", format!("{} (since generation {})", view.origin, view.origin_generation));
    if !view.origin_reason.is_empty() {
        field("origin reason", view.origin_reason);
    }
    if !view.origin_snapshot_id.is_empty() {
        let taken = view.origin_snapshot_time.unwrap_or_else(|| "-".into());
        field("origin snapshot", format!("{} taken {taken}", view.origin_snapshot_id));
    }
    field("created", rfc3339_seconds_cell(workspace.created_at.as_ref()));
    field("updated", rfc3339_seconds_cell(workspace.updated_at.as_ref()));
    if !view.failure.is_empty() {
        field("failure", view.failure);
    }
    if !view.shared_with.is_empty() {
        field("shared with", view.shared_with.join(","));
    }
    if let Some(spec) = view.spec {
        field("image", cell(&spec.image));
        field("network", spec.network.to_string());
        let joined = |map: &BTreeMap<String, String>| {
            map.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join(",")
        };
        field("labels", cell(&joined(&spec.labels)));
        // Values of env may be secrets; the table names the keys, `-o json` has the values.
        field("env", cell(&spec.env.keys().cloned().collect::<Vec<_>>().join(",")));
    }
    table
}

pub async fn run(command: WsCommand, global: &GlobalArgs, io: &mut Io<'_>) -> anyhow::Result<i32> {
    let mut client = connect(global).await?.workspace();
    match command {
        WsCommand::Get { workspace } => {
            let found = client
                .get_workspace(GetWorkspaceRequest { workspace_id: workspace.clone() })
                .await
                .rpc_context(|| format!("get workspace {workspace}"))?
                .into_inner();
            emit(io, global.output, &WorkspaceView::from(&found), || workspace_detail_table(&found)).await?;
        }
        WsCommand::List { user, agent } => {
            let mut workspaces = Vec::new();
            let mut page_token = String::new();
            // A server that hands back a token it already gave would loop us forever.
            let mut seen_tokens = HashSet::new();
            loop {
                let request = ListWorkspacesRequest {
                    user_id: user.clone().unwrap_or_default(),
                    agent_id: agent.clone().unwrap_or_default(),
                    page_size: LIST_PAGE_SIZE,
                    page_token: page_token.clone(),
                };
                let page = client.list_workspaces(request).await.rpc_context(|| "list workspaces")?.into_inner();
                workspaces.extend(page.workspaces);
                if page.next_page_token.is_empty() {
                    break;
                }
                if !seen_tokens.insert(page.next_page_token.clone()) {
                    anyhow::bail!("list workspaces: server repeated page token {:?}", page.next_page_token);
                }
                page_token = page.next_page_token;
            }
            let views: Vec<WorkspaceView> = workspaces.iter().map(WorkspaceView::from).collect();
            emit(io, global.output, &views, || workspaces_table(&workspaces)).await?;
        }
        WsCommand::Close { destroy, workspace } => {
            client
                .close_workspace(CloseWorkspaceRequest { workspace_id: workspace.clone(), destroy })
                .await
                .rpc_context(|| format!("close workspace {workspace}"))?;
            let json = serde_json::json!({ "workspace_id": workspace, "closed": true, "destroyed": destroy });
            let message = if destroy {
                format!("destroyed workspace {workspace}")
            } else {
                format!("closed workspace {workspace} (data kept; the next access restarts it)")
            };
            emit_message(io, global.output, &json, &message).await?;
        }
        WsCommand::Share { workspace, user } => {
            let updated = client
                .share_workspace(ShareWorkspaceRequest { workspace_id: workspace.clone(), user_id: user.clone() })
                .await
                .rpc_context(|| format!("share workspace {workspace} with {user}"))?
                .into_inner();
            emit(io, global.output, &WorkspaceView::from(&updated), || workspace_detail_table(&updated)).await?;
        }
        WsCommand::Unshare { workspace, user } => {
            let updated = client
                .unshare_workspace(UnshareWorkspaceRequest { workspace_id: workspace.clone(), user_id: user.clone() })
                .await
                .rpc_context(|| format!("unshare workspace {workspace} from {user}"))?
                .into_inner();
            emit(io, global.output, &WorkspaceView::from(&updated), || workspace_detail_table(&updated)).await?;
        }
        WsCommand::Snapshot { workspace } => super::snapshots::snapshot(&mut client, &workspace, global, io).await?,
        WsCommand::Snapshots { workspace } => super::snapshots::list(&mut client, &workspace, global, io).await?,
        WsCommand::Restore { workspace, snapshot } => {
            super::snapshots::restore(&mut client, &workspace, snapshot, global, io).await?
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn parse_ws(args: &[&str]) -> Result<WsCommand, clap::Error> {
        let cli = Cli::try_parse_from(["berth", "ws"].into_iter().chain(args.iter().copied()))?;
        match cli.command {
            Command::Ws(command) => Ok(command),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn every_ws_command_parses() {
        assert!(matches!(parse_ws(&["get", "ws-1"]), Ok(WsCommand::Get { workspace }) if workspace == "ws-1"));
        assert!(matches!(
            parse_ws(&["share", "ws-1", "bob"]),
            Ok(WsCommand::Share { workspace, user }) if workspace == "ws-1" && user == "bob"
        ));
        assert!(matches!(parse_ws(&["unshare", "ws-1", "bob"]), Ok(WsCommand::Unshare { .. })));
        assert!(matches!(parse_ws(&["list"]), Ok(WsCommand::List { user: None, agent: None })));
        assert!(matches!(
            parse_ws(&["list", "--user", "u", "--agent", "a"]),
            Ok(WsCommand::List { user: Some(user), agent: Some(agent) }) if user == "u" && agent == "a"
        ));
        assert!(matches!(parse_ws(&["close", "--destroy", "ws-1"]), Ok(WsCommand::Close { destroy: true, .. })));
        assert!(matches!(parse_ws(&["close", "ws-1"]), Ok(WsCommand::Close { destroy: false, .. })));
        assert!(parse_ws(&["get"]).is_err());
    }

    #[test]
    fn workspace_json_uses_short_enum_names() {
        let workspace = Workspace {
            workspace_id: "ws-1".into(),
            policy: berth_proto::v1::IsolationPolicy::PerAgent as i32,
            state: berth_proto::v1::WorkspaceState::Ready as i32,
            created_at: Some(prost_types::Timestamp { seconds: 0, nanos: 0 }),
            ..Workspace::default()
        };
        let json = serde_json::to_value(WorkspaceView::from(&workspace)).unwrap();
        assert_eq!(json["policy"], "per-agent");
        assert_eq!(json["state"], "ready");
        assert_eq!(json["created_at"], "1970-01-01T00:00:00Z");
        assert_eq!(json["updated_at"], serde_json::Value::Null);
    }

    #[test]
    fn empty_cells_print_a_dash() {
        let workspace = Workspace { workspace_id: "ws-1".into(), ..Workspace::default() };
        let text = workspaces_table(&[workspace]).render();
        let row = text.lines().nth(1).unwrap();
        assert!(row.starts_with("ws-1       -     -      unspecified"), "{row}");
    }
}
