//! The `berth` CLI as a library: flag definitions and [`run`], which `main` calls and
//! tests drive directly.
//!
//! Client commands talk to a control plane over gRPC (`client.rs`) and print through
//! `output.rs`; server commands (`berth up`, `control-plane`, `node-agent`) live in
//! `commands/server/`; `config_file.rs` fills their flags from `--config FILE`. Every
//! command returns the process exit code instead of exiting, so `berth exec`'s exit-code mapping is testable without spawning a process.

pub mod client;
pub mod commands;
pub mod config_file;
pub mod format;
pub mod global;
pub mod io;
pub mod output;
pub mod telemetry;

use clap::{Parser, Subcommand};

pub use crate::global::{DEFAULT_ENDPOINT, GlobalArgs};
pub use crate::io::Io;

/// Berth: workspaces for AI agents.
#[derive(Debug, Parser)]
#[command(name = "berth", version, about)]
pub struct Cli {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create, show and close sessions.
    #[command(subcommand)]
    Session(commands::session::SessionCommand),
    /// Run a command in a workspace; exits with the command's exit code.
    Exec(commands::exec::ExecArgs),
    /// Read, write and list files in a workspace.
    #[command(subcommand)]
    Fs(commands::fs::FsCommand),
    /// Declare MCP servers of a workspace, list their tools, call them.
    #[command(subcommand)]
    Mcp(commands::mcp::McpCommand),
    /// Add, list, show and remove skills of a workspace.
    #[command(subcommand)]
    Skills(commands::skills::SkillsCommand),
    /// Show, list and close workspaces.
    #[command(subcommand)]
    Ws(commands::ws::WsCommand),
    /// Inspect, drain and undrain the node agents of the cluster.
    #[command(subcommand)]
    Nodes(commands::nodes::NodesCommand),
    /// One screen for an operator: replicas, nodes, workspaces by state, registry health.
    Status,
    /// Whether an endpoint's gRPC health service serves (exit 0) — a probe for TLS listeners.
    Health(commands::health::HealthArgs),
    /// Run control plane, node agent and an embedded registry in one process.
    Up(commands::server::UpArgs),
    /// Run one control-plane replica.
    ControlPlane(commands::server::ControlPlaneArgs),
    /// Run a node agent that hosts workspaces on this machine.
    NodeAgent(commands::server::NodeAgentArgs),
    /// Make one node's own credential from the replicas' node credential key.
    NodeCredential(commands::server::NodeCredentialArgs),
}

impl Command {
    /// The observability flags and OTLP service name of a server command.
    pub fn telemetry(&self) -> Option<(&telemetry::TelemetryFlags, &'static str)> {
        match self {
            Command::Up(args) => Some((&args.telemetry, "berth-up")),
            Command::ControlPlane(args) => Some((&args.telemetry, "berth-control-plane")),
            Command::NodeAgent(args) => Some((&args.telemetry, "berth-node-agent")),
            _ => None,
        }
    }

    /// Log level used when `RUST_LOG` is unset: servers report what they do, client
    /// commands stay quiet so their stdout/stderr are only the command's output.
    pub fn default_log_level(&self) -> &'static str {
        match self {
            Command::Up(_) | Command::ControlPlane(_) | Command::NodeAgent(_) => "info",
            _ => "warn",
        }
    }
}

/// Runs one parsed command line against the process's stdin, stdout and stderr.
/// Returns the exit code; an `Err` is a failure to report as one `error:` line, exit 1.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    let mut stdin = tokio::io::stdin();
    let mut stdout = tokio::io::stdout();
    let mut stderr = tokio::io::stderr();
    let io = Io { stdin: &mut stdin, stdout: &mut stdout, stderr: &mut stderr };
    run_with_io(cli, io).await
}

/// [`run`] with the standard streams supplied by the caller (tests pass buffers).
pub async fn run_with_io(cli: Cli, mut io: Io<'_>) -> anyhow::Result<i32> {
    let result = dispatch(cli, &mut io).await;
    // Flush even after a failure: output written before the error must not be lost.
    let flushed = io.flush().await;
    let code = result?;
    flushed?;
    Ok(code)
}

async fn dispatch(cli: Cli, io: &mut Io<'_>) -> anyhow::Result<i32> {
    let global = cli.global;
    match cli.command {
        Command::Session(command) => commands::session::run(command, &global, io).await,
        Command::Exec(args) => commands::exec::run(args, &global, io).await,
        Command::Fs(command) => commands::fs::run(command, &global, io).await,
        Command::Ws(command) => commands::ws::run(command, &global, io).await,
        Command::Mcp(command) => commands::mcp::run(command, &global, io).await,
        Command::Skills(command) => commands::skills::run(command, &global, io).await,
        Command::Nodes(command) => commands::nodes::run(command, &global, io).await,
        Command::Status => commands::status::run(&global, io).await,
        Command::Health(args) => commands::health::run(args, &global, io).await,
        Command::Up(args) => commands::server::up(args).await,
        Command::ControlPlane(args) => commands::server::control_plane(args).await,
        Command::NodeAgent(args) => commands::server::node_agent(args).await,
        Command::NodeCredential(args) => commands::server::node_credential(args),
    }
}

/// The single line `main` prints for a failed command (without the `error: ` prefix):
/// the context chain joined by `: `, with any embedded newlines folded so a multi-line
/// server message cannot break the one-line contract.
pub fn error_line(error: &anyhow::Error) -> String {
    format!("{error:#}").lines().map(str::trim).filter(|line| !line.is_empty()).collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_line_joins_context_on_one_line() {
        let error = anyhow::anyhow!("workspace\nws-1 not found").context("exec on ws-1");
        assert_eq!(error_line(&error), "exec on ws-1: workspace ws-1 not found");
    }

    #[test]
    fn global_flags_go_before_or_after_the_subcommand() {
        let before = Cli::try_parse_from(["berth", "-o", "json", "--endpoint", "h:1", "ws", "list"]).unwrap();
        let after = Cli::try_parse_from(["berth", "ws", "list", "--endpoint", "h:1", "-o", "json"]).unwrap();
        for cli in [before, after] {
            assert_eq!(cli.global.output, crate::output::OutputFormat::Json);
            assert_eq!(cli.global.endpoint, "h:1");
        }
    }

    #[test]
    fn tokens_are_never_debug_printed() {
        let cli =
            Cli::try_parse_from(["berth", "--token", "very-secret-token", "--act-as", "alice", "ws", "list"]).unwrap();
        assert_eq!(cli.global.token.as_ref().map(|token| token.expose()), Some("very-secret-token"));
        assert!(!format!("{cli:?}").contains("very-secret-token"));
    }

    #[test]
    fn the_token_comes_from_a_file_and_secret_flags_are_warned_about() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "file-token-0123456789\n").unwrap();
        let path = file.display().to_string();
        let cli = Cli::try_parse_from(["berth", "--token-file", &path, "ws", "list"]).unwrap();
        assert_eq!(cli.global.token().unwrap().unwrap().expose(), "file-token-0123456789");
        std::fs::write(&file, "\n").unwrap();
        assert!(cli.global.token().unwrap_err().to_string().contains("is empty"));

        let warned = crate::global::secrets_on_the_command_line([
            "--token=t",
            "mcp",
            "add",
            "--secret-env",
            "K=v",
            "--secret-header",
            "A=b",
            "--token",
            "t",
        ]);
        assert_eq!(warned.len(), 3, "{warned:?}");
        assert!(warned[0].starts_with("--token ") && warned[0].contains("--token-file"), "{warned:?}");
        assert!(warned.iter().all(|warning| !warning.contains("K=v")), "{warned:?}");
        assert!(crate::global::secrets_on_the_command_line(["--token-file", "f", "exec", "--", "--token"]).is_empty());
    }

    #[test]
    fn unknown_output_format_is_a_usage_error() {
        let error = Cli::try_parse_from(["berth", "-o", "yaml", "ws", "list"]).unwrap_err();
        assert_eq!(error.exit_code(), 2);
    }

    #[test]
    fn servers_log_at_info_and_clients_at_warn() {
        let up = Cli::try_parse_from(["berth", "up"]).unwrap();
        assert_eq!(up.command.default_log_level(), "info");
        let list = Cli::try_parse_from(["berth", "ws", "list"]).unwrap();
        assert_eq!(list.command.default_log_level(), "warn");
    }
}
