//! MCP servers as clients declare them (AddMcp) and as the node reports them: the
//! declaration with its secret values, server status, tools and call results.

use std::collections::BTreeMap;
use std::time::Duration;

use super::config::{ConfigValue, McpServerConfig, McpTransport, secret_ref};
use crate::error::{Result, WorkspaceError};

/// A value of an env variable or header as a client sends it: secret or not.
#[derive(Clone, PartialEq, Eq)]
pub struct SpecValue {
    pub value: String,
    pub secret: bool,
}

impl std::fmt::Debug for SpecValue {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.secret { formatter.write_str("<secret>") } else { write!(formatter, "{:?}", self.value) }
    }
}

/// A server declaration as a client sends it (AddMcp).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpServerSpec {
    pub name: String,
    pub transport: SpecTransport,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpecTransport {
    /// `sha256`: the program's pin (see `McpTransport::Stdio`).
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, SpecValue>,
        cwd: String,
        sha256: Option<String>,
    },
    Http {
        url: String,
        headers: BTreeMap<String, SpecValue>,
    },
}

impl McpServerSpec {
    /// The declaration to store (secrets replaced by references) and the secret values by
    /// reference. Validates everything.
    pub fn split_secrets(&self) -> Result<(McpServerConfig, BTreeMap<String, String>)> {
        let mut secrets = BTreeMap::new();
        let mut convert = |kind: &str, key: &str, value: &SpecValue| {
            if value.secret {
                let reference = secret_ref(&self.name, kind, key);
                secrets.insert(reference.clone(), value.value.clone());
                ConfigValue::Secret { secret_ref: reference }
            } else {
                ConfigValue::Plain(value.value.clone())
            }
        };
        let transport = match &self.transport {
            SpecTransport::Stdio { command, args, env, cwd, sha256 } => McpTransport::Stdio {
                command: command.clone(),
                args: args.clone(),
                env: env.iter().map(|(key, value)| (key.clone(), convert("env", key, value))).collect(),
                cwd: cwd.clone(),
                sha256: sha256.clone(),
            },
            SpecTransport::Http { url, headers } => McpTransport::Http {
                url: url.clone(),
                // Header names are case-insensitive: stored lowercase.
                headers: headers
                    .iter()
                    .map(|(key, value)| {
                        let key = key.to_ascii_lowercase();
                        let converted = convert("header", &key, value);
                        (key, converted)
                    })
                    .collect(),
            },
        };
        for value in secrets.values() {
            if value.contains('\0') {
                return Err(WorkspaceError::InvalidArgument("a secret value contains NUL".into()));
            }
        }
        let config = McpServerConfig { name: self.name.clone(), transport };
        config.validate()?;
        // A declaration whose secrets could reach a swappable program is refused up front.
        config.program_pin()?;
        Ok((config, secrets))
    }
}

/// A server with whether it has a live client.
#[derive(Clone, Debug)]
pub struct McpServerStatus {
    pub config: McpServerConfig,
    pub live: bool,
}

/// One tool a server offers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpToolInfo {
    pub name: String,
    pub description: String,
    pub input_schema_json: String,
}

/// The result of one tool call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct McpCallOutput {
    /// The tool reported an error (a result, not a failed call).
    pub is_error: bool,
    /// The content blocks, as the JSON array the server sent.
    pub content_json: String,
    /// The structured content, if any, as JSON.
    pub structured_json: String,
    /// The text blocks joined by newlines (convenience for text tools).
    pub text: String,
    /// This call started the server (first call, or after a crash / change).
    pub started: bool,
    pub duration: Duration,
}
