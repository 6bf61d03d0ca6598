//! `berth mcp add | rm | ls | tools | call`: MCP servers of a workspace.
//!
//! Secrets (`--secret-env`, `--secret-header`) go to the node's private store; the
//! workspace's `.mcp` keeps only a reference, and listings show `<secret>`.

use std::collections::HashMap;
use std::time::Duration;

use berth_proto::v1::{
    AddMcpRequest, CallMcpToolRequest, ListMcpToolsRequest, ListMcpsRequest, McpHttp, McpServer, McpStdio, McpValue,
    RemoveMcpRequest, mcp_server,
};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::client::{RpcResultExt, connect};
use crate::commands::parse_key_value;
use crate::global::GlobalArgs;
use crate::io::Io;
use crate::output::{Table, emit, emit_message};

#[derive(Debug, Subcommand)]
pub enum McpCommand {
    /// Declare an MCP server: `--command` (stdio, started inside the sandbox) or `--url`
    /// (streamable HTTP, connected from the node).
    Add(Box<AddArgs>),
    /// Remove a server, its secrets and its live client.
    Rm { workspace: String, name: String },
    /// List the declared servers.
    Ls { workspace: String },
    /// List a server's tools (starts it if needed).
    Tools {
        workspace: String,
        name: String,
        #[arg(long, value_parser = crate::commands::server::parse_duration_arg)]
        timeout: Option<Duration>,
    },
    /// Call a tool with JSON arguments; prints its text output (exit 1 if the tool reports
    /// an error).
    Call {
        workspace: String,
        name: String,
        tool: String,
        /// Arguments as a JSON object (default `{}`).
        #[arg(default_value = "{}")]
        arguments: String,
        #[arg(long, value_parser = crate::commands::server::parse_duration_arg)]
        timeout: Option<Duration>,
    },
}

#[derive(Debug, Args)]
pub struct AddArgs {
    pub workspace: String,
    pub name: String,
    /// Program of a stdio server (a path inside the sandbox, or relative to --cwd).
    #[arg(long, conflicts_with = "url", required_unless_present = "url")]
    pub command: Option<String>,
    /// Argument of the stdio server (repeatable).
    #[arg(long = "arg", allow_hyphen_values = true)]
    pub args: Vec<String>,
    /// Env variable of the stdio server (repeatable).
    #[arg(long = "env", value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// Secret env variable: stored on the node, never in the workspace (repeatable). On the
    /// command line it shows in `ps`: prefer --secret-env-file or --secret-env-from.
    #[arg(long = "secret-env", value_parser = parse_key_value)]
    pub secret_env: Vec<(String, String)>,
    /// File of secret env variables, one KEY=VALUE per line (blank lines and # comments
    /// skipped; repeatable).
    #[arg(long = "secret-env-file")]
    pub secret_env_files: Vec<std::path::PathBuf>,
    /// Secret env variable taken from this CLI's own environment: `--secret-env-from
    /// API_KEY` sends API_KEY=$API_KEY (repeatable).
    #[arg(long = "secret-env-from")]
    pub secret_env_from: Vec<String>,
    /// Working directory of the stdio server, relative to the workspace root.
    #[arg(long, default_value = "")]
    pub cwd: String,
    /// SHA-256 of the stdio program (64 lowercase hex digits); required when --command is
    /// a workspace path and the server gets a --secret-env.
    #[arg(long, conflicts_with = "url")]
    pub sha256: Option<String>,
    /// URL of a streamable-HTTP server.
    #[arg(long)]
    pub url: Option<String>,
    /// HTTP header (repeatable).
    #[arg(long = "header", value_parser = parse_key_value)]
    pub headers: Vec<(String, String)>,
    /// Secret HTTP header, e.g. Authorization=Bearer... (repeatable). On the command line
    /// it shows in `ps`: prefer --secret-header-file.
    #[arg(long = "secret-header", value_parser = parse_key_value)]
    pub secret_headers: Vec<(String, String)>,
    /// File of secret HTTP headers, one Name=Value per line (repeatable).
    #[arg(long = "secret-header-file")]
    pub secret_header_files: Vec<std::path::PathBuf>,
    /// Replace a server of the same name.
    #[arg(long)]
    pub replace: bool,
}

/// `KEY=VALUE` lines of a secrets file; blank lines and `#` comments are skipped. Errors
/// name the file and line, never the value.
fn secret_file(path: &std::path::Path) -> anyhow::Result<Vec<(String, String)>> {
    let text = std::fs::read_to_string(path).map_err(|error| anyhow::anyhow!("reading {}: {error}", path.display()))?;
    let mut pairs = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let pair = parse_key_value(line).map_err(|_| {
            anyhow::anyhow!("{} line {}: expected KEY=VALUE (value not shown)", path.display(), number + 1)
        })?;
        pairs.push(pair);
    }
    Ok(pairs)
}

/// The secret env of `mcp add`: flags, files and variables of this process's environment.
fn secret_env(args: &AddArgs) -> anyhow::Result<Vec<(String, String)>> {
    let mut pairs = args.secret_env.clone();
    for path in &args.secret_env_files {
        pairs.extend(secret_file(path)?);
    }
    for name in &args.secret_env_from {
        let value = std::env::var(name)
            .map_err(|_| anyhow::anyhow!("--secret-env-from {name}: {name} is not set in this environment"))?;
        pairs.push((name.clone(), value));
    }
    Ok(pairs)
}

fn secret_headers(args: &AddArgs) -> anyhow::Result<Vec<(String, String)>> {
    let mut pairs = args.secret_headers.clone();
    for path in &args.secret_header_files {
        pairs.extend(secret_file(path)?);
    }
    Ok(pairs)
}

fn values(plain: Vec<(String, String)>, secret: Vec<(String, String)>) -> HashMap<String, McpValue> {
    let plain = plain.into_iter().map(|(key, value)| (key, McpValue { value, secret: false }));
    let secret = secret.into_iter().map(|(key, value)| (key, McpValue { value, secret: true }));
    plain.chain(secret).collect()
}

/// JSON form of a server (secrets shown as `<secret>`).
#[derive(Debug, Serialize)]
pub struct McpServerView {
    pub name: String,
    pub transport: String,
    pub target: String,
    pub env_or_headers: Vec<String>,
    pub live: bool,
}

impl McpServerView {
    fn new(server: &McpServer, live: bool) -> Self {
        let show = |map: &HashMap<String, McpValue>| {
            let mut shown: Vec<String> = map
                .iter()
                .map(
                    |(key, value)| {
                        if value.secret { format!("{key}=<secret>") } else { format!("{key}={}", value.value) }
                    },
                )
                .collect();
            shown.sort();
            shown
        };
        let (transport, target, env_or_headers) = match &server.transport {
            Some(mcp_server::Transport::Stdio(stdio)) => {
                let mut line = vec![stdio.command.clone()];
                line.extend(stdio.args.iter().cloned());
                ("stdio", line.join(" "), show(&stdio.env))
            }
            Some(mcp_server::Transport::Http(http)) => ("http", http.url.clone(), show(&http.headers)),
            None => ("unknown", String::new(), Vec::new()),
        };
        McpServerView { name: server.name.clone(), transport: transport.into(), target, env_or_headers, live }
    }
}

pub async fn run(command: McpCommand, global: &GlobalArgs, io: &mut Io<'_>) -> anyhow::Result<i32> {
    let mut client = connect(global).await?.contract();
    match command {
        McpCommand::Add(args) => {
            let (secret_env, secret_headers) = (secret_env(&args)?, secret_headers(&args)?);
            let transport = match (args.command, args.url) {
                (Some(command), None) => mcp_server::Transport::Stdio(McpStdio {
                    command,
                    args: args.args,
                    env: values(args.env, secret_env),
                    cwd: args.cwd,
                    sha256: args.sha256.unwrap_or_default(),
                }),
                (None, Some(url)) => {
                    mcp_server::Transport::Http(McpHttp { url, headers: values(args.headers, secret_headers) })
                }
                _ => anyhow::bail!("give either --command or --url"),
            };
            let request = AddMcpRequest {
                workspace_id: args.workspace.clone(),
                server: Some(McpServer { name: args.name.clone(), transport: Some(transport) }),
                replace: args.replace,
            };
            let added = client
                .add_mcp(request)
                .await
                .rpc_context(|| format!("add mcp server {} to {}", args.name, args.workspace))?
                .into_inner();
            let view = added.server.as_ref().map(|server| McpServerView::new(server, false));
            emit_message(io, global.output, &view, &format!("added mcp server {} to {}", args.name, args.workspace))
                .await?;
        }
        McpCommand::Rm { workspace, name } => {
            let request = RemoveMcpRequest { workspace_id: workspace.clone(), name: name.clone() };
            let existed = client
                .remove_mcp(request)
                .await
                .rpc_context(|| format!("remove mcp server {name} from {workspace}"))?
                .into_inner()
                .existed;
            let json = serde_json::json!({"name": name, "existed": existed});
            let message =
                if existed { format!("removed mcp server {name}") } else { format!("mcp server {name} did not exist") };
            emit_message(io, global.output, &json, &message).await?;
        }
        McpCommand::Ls { workspace } => {
            let listed = client
                .list_mcps(ListMcpsRequest { workspace_id: workspace.clone() })
                .await
                .rpc_context(|| format!("list mcp servers of {workspace}"))?
                .into_inner();
            if listed.reseeded {
                io.warn(".mcp was corrupt and was re-seeded from the node's defaults").await?;
            }
            let views: Vec<McpServerView> = listed
                .servers
                .iter()
                .filter_map(|status| status.server.as_ref().map(|server| McpServerView::new(server, status.live)))
                .collect();
            emit(io, global.output, &views, || {
                let mut table = Table::new(["NAME", "TRANSPORT", "LIVE", "TARGET", "ENV/HEADERS"]);
                for view in &views {
                    table.push_row(vec![
                        view.name.clone(),
                        view.transport.clone(),
                        if view.live { "yes" } else { "no" }.into(),
                        view.target.clone(),
                        view.env_or_headers.join(","),
                    ]);
                }
                table
            })
            .await?;
        }
        McpCommand::Tools { workspace, name, timeout } => {
            let request = ListMcpToolsRequest {
                workspace_id: workspace.clone(),
                server: name.clone(),
                timeout_ms: timeout.map_or(0, |timeout| timeout.as_millis() as u64),
            };
            let tools = client
                .list_mcp_tools(request)
                .await
                .rpc_context(|| format!("list tools of mcp server {name} in {workspace}"))?
                .into_inner()
                .tools;
            let json: Vec<serde_json::Value> = tools
                .iter()
                .map(|tool| {
                    let schema: serde_json::Value = serde_json::from_str(&tool.input_schema_json).unwrap_or_default();
                    serde_json::json!({"name": tool.name, "description": tool.description, "input_schema": schema})
                })
                .collect();
            emit(io, global.output, &json, || {
                let mut table = Table::new(["TOOL", "DESCRIPTION"]);
                for tool in &tools {
                    table.push_row(vec![tool.name.clone(), tool.description.clone()]);
                }
                table
            })
            .await?;
        }
        McpCommand::Call { workspace, name, tool, arguments, timeout } => {
            let request = CallMcpToolRequest {
                workspace_id: workspace.clone(),
                server: name.clone(),
                tool: tool.clone(),
                arguments_json: arguments,
                timeout_ms: timeout.map_or(0, |timeout| timeout.as_millis() as u64),
            };
            let result = client
                .call_mcp_tool(request)
                .await
                .rpc_context(|| format!("call {name}/{tool} in {workspace}"))?
                .into_inner();
            match global.output {
                crate::output::OutputFormat::Json => {
                    let content: serde_json::Value = serde_json::from_str(&result.content_json).unwrap_or_default();
                    let json = serde_json::json!({"is_error": result.is_error, "content": content, "text": result.text,
                        "started": result.started, "duration_ms": result.duration_ms});
                    io.write_stdout(crate::output::json_text(&json)?.as_bytes()).await?;
                }
                crate::output::OutputFormat::Table => {
                    let mut text = result.text.clone();
                    if !text.ends_with('\n') {
                        text.push('\n');
                    }
                    if result.is_error {
                        io.write_stderr(text.as_bytes()).await?;
                    } else {
                        io.write_stdout(text.as_bytes()).await?;
                    }
                }
            }
            return Ok(if result.is_error { 1 } else { 0 });
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn parse(args: &[&str]) -> Result<McpCommand, clap::Error> {
        let cli = Cli::try_parse_from(["berth", "mcp"].into_iter().chain(args.iter().copied()))?;
        match cli.command {
            Command::Mcp(command) => Ok(command),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn mcp_commands_parse() {
        let add = parse(&[
            "add",
            "ws",
            "echo",
            "--command",
            "bin/x",
            "--arg",
            "-v",
            "--env",
            "A=1",
            "--secret-env",
            "TOKEN=s",
        ])
        .unwrap();
        let McpCommand::Add(args) = add else { panic!("not add") };
        assert_eq!(args.args, ["-v"]);
        let env = values(args.env, args.secret_env);
        assert!(!env["A"].secret && env["TOKEN"].secret);
        assert!(parse(&["add", "ws", "x"]).is_err(), "needs --command or --url");
        assert!(parse(&["add", "ws", "x", "--command", "c", "--url", "http://h"]).is_err());
        assert!(parse(&["add", "ws", "x", "--url", "http://h", "--secret-header", "Authorization=Bearer t"]).is_ok());
        assert!(
            matches!(parse(&["call", "ws", "echo", "echo"]).unwrap(), McpCommand::Call { arguments, .. } if arguments == "{}")
        );
        assert!(matches!(
            parse(&["call", "ws", "echo", "sleep", "{\"ms\":1}", "--timeout", "2s"]).unwrap(),
            McpCommand::Call { timeout: Some(timeout), .. } if timeout == Duration::from_secs(2)
        ));
        assert!(matches!(parse(&["tools", "ws", "echo"]).unwrap(), McpCommand::Tools { .. }));
        assert!(matches!(parse(&["ls", "ws"]).unwrap(), McpCommand::Ls { .. }));
        assert!(matches!(parse(&["rm", "ws", "echo"]).unwrap(), McpCommand::Rm { .. }));
    }

    #[test]
    fn secrets_come_from_files_and_the_environment() {
        let dir = tempfile::tempdir().unwrap();
        let env_file = dir.path().join("mcp.env");
        std::fs::write(&env_file, "# the server's keys\nAPI_KEY=k-123\n\nOTHER=a=b\n").unwrap();
        let header_file = dir.path().join("mcp.headers");
        std::fs::write(&header_file, "Authorization=Bearer t-456\n").unwrap();
        // A variable no test sets: its absence is the refusal checked below.
        let name = "BERTH_TEST_MCP_SECRET_FROM_ENV";
        let env_path = env_file.display().to_string();
        let add = parse(&["add", "ws", "x", "--command", "c", "--secret-env-file", &env_path]).unwrap();
        let McpCommand::Add(args) = add else { panic!("not add") };
        let secret = secret_env(&args).unwrap();
        assert_eq!(secret, [("API_KEY".into(), "k-123".into()), ("OTHER".into(), "a=b".into())]);
        let add = parse(&["add", "ws", "x", "--command", "c", "--secret-env-from", name]).unwrap();
        let McpCommand::Add(args) = add else { panic!("not add") };
        assert!(secret_env(&args).unwrap_err().to_string().contains("is not set"));
        let header_path = header_file.display().to_string();
        let add = parse(&["add", "ws", "x", "--url", "http://h", "--secret-header-file", &header_path]).unwrap();
        let McpCommand::Add(args) = add else { panic!("not add") };
        assert_eq!(secret_headers(&args).unwrap(), [("Authorization".into(), "Bearer t-456".into())]);
        // A malformed line names the file and line, not its value.
        std::fs::write(&env_file, "not-a-pair-secret-value\n").unwrap();
        let add = parse(&["add", "ws", "x", "--command", "c", "--secret-env-file", &env_path]).unwrap();
        let McpCommand::Add(args) = add else { panic!("not add") };
        let error = secret_env(&args).unwrap_err().to_string();
        assert!(error.contains("line 1") && !error.contains("secret-value"), "{error}");
    }

    #[test]
    fn listings_hide_secrets() {
        let server = McpServer {
            name: "s".into(),
            transport: Some(mcp_server::Transport::Http(McpHttp {
                url: "https://h/mcp".into(),
                headers: [("authorization".to_owned(), McpValue { value: String::new(), secret: true })].into(),
            })),
        };
        let view = McpServerView::new(&server, true);
        assert_eq!(view.env_or_headers, ["authorization=<secret>"]);
        assert_eq!(view.transport, "http");
    }
}
