//! `berth session create | get | close`.

use berth_proto::v1::{CloseSessionRequest, CreateSessionRequest, GetSessionRequest, Session, WorkspaceSpec};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::client::{RpcResultExt, connect};
use crate::commands::{key_values_to_map, parse_key_value};
use crate::format::{rfc3339_opt, rfc3339_seconds_cell};
use crate::global::GlobalArgs;
use crate::io::Io;
use crate::output::{Table, emit, emit_message};

#[derive(Debug, Subcommand)]
pub enum SessionCommand {
    /// Bind (user, agent, session) to a workspace and wait until it is ready.
    Create(CreateArgs),
    /// Show a session.
    Get {
        /// Session id.
        session: String,
    },
    /// Close a session (its workspace stays, per the isolation policy).
    Close {
        /// Session id.
        session: String,
    },
}

#[derive(Debug, Args)]
pub struct CreateArgs {
    /// User the session belongs to (default: the caller's own user, or --act-as).
    #[arg(long)]
    pub user: Option<String>,
    /// Agent the session belongs to.
    #[arg(long)]
    pub agent: String,
    /// Session id; the server mints one when omitted.
    #[arg(long)]
    pub session: Option<String>,
    /// Use this workspace instead of the one the isolation policy picks.
    #[arg(long)]
    pub workspace: Option<String>,
    /// Backend to place a new workspace on (e.g. local, docker); default: the node's.
    #[arg(long)]
    pub backend: Option<String>,
    /// Container image of a new workspace (docker backend).
    #[arg(long)]
    pub image: Option<String>,
    /// Give the sandbox network access (off by default).
    #[arg(long)]
    pub network: bool,
    /// Environment of every exec in the workspace, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// Workspace label, KEY=VALUE (repeatable); also a placement selector.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub labels: Vec<(String, String)>,
}

impl CreateArgs {
    pub fn to_request(&self) -> CreateSessionRequest {
        CreateSessionRequest {
            user_id: self.user.clone().unwrap_or_default(),
            agent_id: self.agent.clone(),
            session_id: self.session.clone().unwrap_or_default(),
            workspace_id: self.workspace.clone().unwrap_or_default(),
            backend: self.backend.clone().unwrap_or_default(),
            spec: Some(WorkspaceSpec {
                image: self.image.clone().unwrap_or_default(),
                network: self.network,
                env: key_values_to_map(self.env.clone()),
                labels: key_values_to_map(self.labels.clone()),
                ..WorkspaceSpec::default()
            }),
        }
    }
}

/// JSON form of a session.
#[derive(Debug, Serialize)]
pub struct SessionView {
    pub session_id: String,
    pub workspace_id: String,
    pub user_id: String,
    pub agent_id: String,
    pub created_at: Option<String>,
}

impl From<&Session> for SessionView {
    fn from(session: &Session) -> Self {
        SessionView {
            session_id: session.session_id.clone(),
            workspace_id: session.workspace_id.clone(),
            user_id: session.user_id.clone(),
            agent_id: session.agent_id.clone(),
            created_at: rfc3339_opt(session.created_at.as_ref()),
        }
    }
}

fn session_table(session: &Session) -> Table {
    let mut table = Table::new(["SESSION", "WORKSPACE", "USER", "AGENT", "CREATED"]);
    table.push_row(vec![
        session.session_id.clone(),
        session.workspace_id.clone(),
        session.user_id.clone(),
        session.agent_id.clone(),
        rfc3339_seconds_cell(session.created_at.as_ref()),
    ]);
    table
}

pub async fn run(command: SessionCommand, global: &GlobalArgs, io: &mut Io<'_>) -> anyhow::Result<i32> {
    let mut client = connect(global).await?.workspace();
    match command {
        SessionCommand::Create(args) => {
            let session = client
                .create_session(args.to_request())
                .await
                .rpc_context(|| {
                    format!(
                        "create session for user {} agent {}",
                        args.user.as_deref().unwrap_or("(caller)"),
                        args.agent
                    )
                })?
                .into_inner();
            emit(io, global.output, &SessionView::from(&session), || session_table(&session)).await?;
        }
        SessionCommand::Get { session } => {
            let found = client
                .get_session(GetSessionRequest { session_id: session.clone() })
                .await
                .rpc_context(|| format!("get session {session}"))?
                .into_inner();
            emit(io, global.output, &SessionView::from(&found), || session_table(&found)).await?;
        }
        SessionCommand::Close { session } => {
            client
                .close_session(CloseSessionRequest { session_id: session.clone() })
                .await
                .rpc_context(|| format!("close session {session}"))?;
            let json = serde_json::json!({ "session_id": session, "closed": true });
            emit_message(io, global.output, &json, &format!("closed session {session}")).await?;
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("berth").chain(args.iter().copied()))
    }

    #[test]
    fn create_takes_spec_flags() {
        let cli = parse(&[
            "session",
            "create",
            "--user",
            "u1",
            "--agent",
            "a1",
            "--session",
            "s1",
            "--backend",
            "docker",
            "--image",
            "debian:13",
            "--network",
            "--env",
            "A=1",
            "--env",
            "B=x=y",
            "--label",
            "team=red",
            "-o",
            "json",
        ])
        .unwrap();
        assert_eq!(cli.global.output, crate::output::OutputFormat::Json);
        let Command::Session(SessionCommand::Create(args)) = cli.command else {
            panic!("parsed as {:?}", cli.command);
        };
        let request = args.to_request();
        assert_eq!((request.user_id.as_str(), request.agent_id.as_str()), ("u1", "a1"));
        assert_eq!(request.session_id, "s1");
        assert_eq!(request.workspace_id, "");
        assert_eq!(request.backend, "docker");
        let spec = request.spec.unwrap();
        assert_eq!(spec.image, "debian:13");
        assert!(spec.network);
        assert_eq!(spec.env.get("B").map(String::as_str), Some("x=y"));
        assert_eq!(spec.labels.get("team").map(String::as_str), Some("red"));
    }

    #[test]
    fn create_requires_user_and_agent() {
        let error = parse(&["session", "create", "--user", "u1"]).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::MissingRequiredArgument);
    }

    #[test]
    fn malformed_env_is_a_usage_error() {
        let error = parse(&["session", "create", "--user", "u", "--agent", "a", "--env", "A"]).unwrap_err();
        assert_eq!(error.kind(), clap::error::ErrorKind::ValueValidation);
        assert!(error.to_string().contains("expected KEY=VALUE"), "{error}");
        assert_eq!(error.exit_code(), 2);
    }

    #[test]
    fn get_and_close_take_a_session_id() {
        let cli = parse(&["session", "get", "s1"]).unwrap();
        assert!(matches!(cli.command, Command::Session(SessionCommand::Get { session }) if session == "s1"));
        let cli = parse(&["session", "close", "s1"]).unwrap();
        assert!(matches!(cli.command, Command::Session(SessionCommand::Close { session }) if session == "s1"));
    }

    #[test]
    fn session_json_has_rfc3339_created_at() {
        let session = Session {
            session_id: "s1".into(),
            workspace_id: "ws-1".into(),
            user_id: "u1".into(),
            agent_id: "a1".into(),
            created_at: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 }),
        };
        let json = serde_json::to_value(SessionView::from(&session)).unwrap();
        assert_eq!(json["created_at"], "2023-11-14T22:13:20Z");
        assert_eq!(json["workspace_id"], "ws-1");
    }
}
