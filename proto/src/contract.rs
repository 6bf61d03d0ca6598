//! Conversions of the contract messages (contract.proto) to and from the domain types of
//! `berth_workspace::{mcp, skills, offload, tree}`. Each `*_from_proto` also validates, so
//! a replica refuses bad input before forwarding and a node refuses it again on arrival.

use std::time::Duration;

use berth_workspace::mcp::{
    ConfigValue, McpCallOutput, McpServerConfig, McpServerSpec, McpServerStatus, McpToolInfo, McpTransport,
    SpecTransport, SpecValue,
};
use berth_workspace::offload::{ContextOffloaded, MAX_MESSAGE_BYTES, MAX_MESSAGES, ToolResultOffloaded};
use berth_workspace::skills::SkillInfo;
use berth_workspace::tree::ExtractStats;
use berth_workspace::{RelPath, WorkspaceError};

use crate::v1;

type Result<T> = std::result::Result<T, WorkspaceError>;

/// Largest `arguments_json` of a tool call.
pub const MAX_ARGUMENTS_BYTES: usize = 16 * 1024 * 1024;

fn spec_value(value: v1::McpValue) -> SpecValue {
    SpecValue { value: value.value, secret: value.secret }
}

/// The AddMcp declaration, validated (names, command, URL, env and header names).
pub fn mcp_spec_from_proto(server: Option<v1::McpServer>) -> Result<McpServerSpec> {
    use v1::mcp_server::Transport;
    let Some(server) = server else {
        return Err(WorkspaceError::InvalidArgument("an mcp server declaration is required".into()));
    };
    let transport = match server.transport {
        Some(Transport::Stdio(stdio)) => SpecTransport::Stdio {
            command: stdio.command,
            args: stdio.args,
            env: stdio.env.into_iter().map(|(key, value)| (key, spec_value(value))).collect(),
            cwd: stdio.cwd,
            sha256: (!stdio.sha256.is_empty()).then_some(stdio.sha256),
        },
        Some(Transport::Http(http)) => SpecTransport::Http {
            url: http.url,
            headers: http.headers.into_iter().map(|(key, value)| (key, spec_value(value))).collect(),
        },
        None => return Err(WorkspaceError::InvalidArgument("an mcp server needs a stdio or http transport".into())),
    };
    let spec = McpServerSpec { name: server.name, transport };
    spec.split_secrets()?;
    Ok(spec)
}

fn value_to_proto(value: &ConfigValue) -> v1::McpValue {
    match value {
        ConfigValue::Plain(text) => v1::McpValue { value: text.clone(), secret: false },
        ConfigValue::Secret { .. } => v1::McpValue { value: String::new(), secret: true },
    }
}

/// A stored declaration for listings: secrets with empty values.
pub fn mcp_server_to_proto(config: &McpServerConfig) -> v1::McpServer {
    use v1::mcp_server::Transport;
    let transport = match &config.transport {
        McpTransport::Stdio { command, args, env, cwd, sha256 } => Transport::Stdio(v1::McpStdio {
            command: command.clone(),
            args: args.clone(),
            env: env.iter().map(|(key, value)| (key.clone(), value_to_proto(value))).collect(),
            cwd: cwd.clone(),
            sha256: sha256.clone().unwrap_or_default(),
        }),
        McpTransport::Http { url, headers } => Transport::Http(v1::McpHttp {
            url: url.clone(),
            headers: headers.iter().map(|(key, value)| (key.clone(), value_to_proto(value))).collect(),
        }),
    };
    v1::McpServer { name: config.name.clone(), transport: Some(transport) }
}

pub fn mcp_status_to_proto(status: &McpServerStatus) -> v1::McpServerStatus {
    v1::McpServerStatus { server: Some(mcp_server_to_proto(&status.config)), live: status.live }
}

pub fn mcp_tool_to_proto(tool: McpToolInfo) -> v1::McpTool {
    v1::McpTool { name: tool.name, description: tool.description, input_schema_json: tool.input_schema_json }
}

pub fn mcp_call_to_proto(output: McpCallOutput) -> v1::CallMcpToolResponse {
    v1::CallMcpToolResponse {
        is_error: output.is_error,
        content_json: output.content_json,
        structured_content_json: output.structured_json,
        text: output.text,
        started: output.started,
        duration_ms: output.duration.as_millis() as u64,
    }
}

/// A request's timeout: 0 means the node's default.
pub fn timeout_from_ms(millis: u64) -> Option<Duration> {
    (millis > 0).then(|| Duration::from_millis(millis))
}

/// Tool arguments: a JSON object (empty text = `{}`).
pub fn tool_arguments(json: &str) -> Result<serde_json::Map<String, serde_json::Value>> {
    if json.trim().is_empty() {
        return Ok(serde_json::Map::new());
    }
    if json.len() > MAX_ARGUMENTS_BYTES {
        return Err(WorkspaceError::LimitExceeded {
            limit: "tool arguments size",
            size: json.len() as u64,
            max: MAX_ARGUMENTS_BYTES as u64,
        });
    }
    match serde_json::from_str::<serde_json::Value>(json) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(_) => Err(WorkspaceError::InvalidArgument("arguments_json must be a JSON object".into())),
        Err(error) => Err(WorkspaceError::InvalidArgument(format!("arguments_json is not JSON: {error}"))),
    }
}

/// Checks a CallMcpTool / ListMcpTools target.
pub fn check_mcp_target(server: &str, tool: Option<&str>) -> Result<()> {
    berth_workspace::mcp::validate_server_name(server)?;
    if let Some(tool) = tool
        && (tool.is_empty() || tool.len() > 256)
    {
        return Err(WorkspaceError::InvalidArgument("a tool name must be 1-256 bytes".into()));
    }
    Ok(())
}

pub fn skill_info_to_proto(info: &SkillInfo) -> v1::SkillInfo {
    v1::SkillInfo {
        name: info.name.clone(),
        description: info.description.clone(),
        sha256: info.sha256.clone(),
        path: info.path.as_str().to_owned(),
    }
}

/// Checks an optional skill name (empty = taken from the front matter).
pub fn check_skill_name(name: &str, required: bool) -> Result<()> {
    if name.is_empty() && !required {
        return Ok(());
    }
    berth_workspace::skills::validate_skill_name(name)
}

/// The messages of an OffloadContext call, parsed.
pub fn context_messages(messages: &[String]) -> Result<Vec<serde_json::Value>> {
    if messages.len() > MAX_MESSAGES {
        return Err(WorkspaceError::LimitExceeded {
            limit: "messages per call",
            size: messages.len() as u64,
            max: MAX_MESSAGES as u64,
        });
    }
    messages
        .iter()
        .enumerate()
        .map(|(index, text)| {
            if text.len() > MAX_MESSAGE_BYTES {
                return Err(WorkspaceError::LimitExceeded {
                    limit: "message size",
                    size: text.len() as u64,
                    max: MAX_MESSAGE_BYTES as u64,
                });
            }
            serde_json::from_str(text)
                .map_err(|error| WorkspaceError::InvalidArgument(format!("message {index} is not JSON: {error}")))
        })
        .collect()
}

pub fn context_offloaded_to_proto(done: ContextOffloaded) -> v1::OffloadContextResponse {
    v1::OffloadContextResponse {
        path: done.path.as_str().to_owned(),
        messages: done.messages as u32,
        bytes_appended: done.bytes_appended,
        data_refs: done.data_refs,
    }
}

pub fn tool_result_to_proto(done: ToolResultOffloaded) -> v1::OffloadToolResultResponse {
    v1::OffloadToolResultResponse {
        offloaded: done.offloaded,
        path: done.path.map(|path| path.as_str().to_owned()).unwrap_or_default(),
        size_bytes: done.size_bytes,
        head: done.head,
        tail: done.tail,
        preview: done.preview,
    }
}

pub fn upload_stats_to_proto(stats: ExtractStats) -> v1::UploadTreeResponse {
    v1::UploadTreeResponse {
        files: stats.files,
        directories: stats.directories,
        symlinks: stats.symlinks,
        bytes: stats.bytes,
    }
}

/// A tree destination: any directory but the root (a tree cannot replace the root).
pub fn tree_destination(path: &str) -> Result<RelPath> {
    RelPath::parse(path)
}
