//! The `.mcp` file: a JSON array of MCP server declarations, config-as-file in the
//! workspace root (the agent may read and edit it).
//!
//! ```json
//! [{"name": "echo", "transport": "stdio", "command": "bin/echo", "args": [],
//!   "env": {"TOKEN": {"secret_ref": "mcp/echo/env/TOKEN"}}, "cwd": "",
//!   "sha256": "<64 hex digits of bin/echo>"},
//!  {"name": "docs", "transport": "http", "url": "https://example.com/mcp",
//!   "headers": {"Authorization": {"secret_ref": "mcp/docs/header/authorization"}}}]
//! ```
//!
//! Secret values never appear here: a secret env value or header is a `secret_ref` into the
//! node's private secret store (in `berth-features`). A stdio server given a secret whose
//! command is a workspace path must carry the program's `sha256`; it runs only as a copy
//! with that digest ([`McpServerConfig::program_pin`]). Written atomically (the backend's
//! `write_file`), validated on every load; a file that fails to parse or validate is
//! replaced by the node's defaults with a warning, never a crash.

use std::collections::{BTreeMap, HashSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backend::Backend;
use crate::error::{McpRefusal, Result, WorkspaceError};
use crate::id::validate_id;
use crate::layout::MCP_FILE;
use crate::path::RelPath;
use crate::spec::validate_env;

/// Largest `.mcp` read.
pub const MAX_MCP_FILE_BYTES: u64 = 1024 * 1024;
/// Most servers one workspace may declare.
pub const MAX_SERVERS: usize = 128;

/// A value of an env variable or header: plain, or a reference to a secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ConfigValue {
    Plain(String),
    Secret { secret_ref: String },
}

/// How to reach a server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "transport", rename_all = "lowercase")]
pub enum McpTransport {
    /// A process started inside the workspace's sandbox, speaking MCP on stdin/stdout.
    Stdio {
        command: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, ConfigValue>,
        /// Working directory relative to the workspace root; empty = root.
        #[serde(default)]
        cwd: String,
        /// SHA-256 (64 lowercase hex digits) of the program when `command` is a workspace
        /// path: a server that receives secrets runs only a copy of the program with this
        /// digest (see [`McpServerConfig::program_pin`]). Part of the binding. Absent from
        /// the file when unset, so older declarations keep their binding.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        sha256: Option<String>,
    },
    /// A streamable-HTTP server, connected from the node agent.
    Http {
        url: String,
        #[serde(default)]
        headers: BTreeMap<String, ConfigValue>,
    },
}

/// One declaration of `.mcp`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpServerConfig {
    pub name: String,
    #[serde(flatten)]
    pub transport: McpTransport,
}

/// The secret reference of one env variable (`kind` "env") or header ("header").
pub fn secret_ref(server: &str, kind: &str, key: &str) -> String {
    format!("mcp/{server}/{kind}/{key}")
}

/// Checks an MCP server name (an id: `[A-Za-z0-9._@:-]`, not starting with `.` or `-`).
pub fn validate_server_name(name: &str) -> Result<()> {
    validate_id("mcp server name", name)
}

impl McpServerConfig {
    /// Checks everything a declaration can get wrong, whether it came from a client or from
    /// the `.mcp` file.
    pub fn validate(&self) -> Result<()> {
        validate_server_name(&self.name)?;
        let invalid = |reason: String| WorkspaceError::InvalidArgument(format!("mcp server {:?}: {reason}", self.name));
        let check_ref = |kind: &str, key: &str, value: &ConfigValue| -> Result<()> {
            match value {
                ConfigValue::Plain(text) if text.contains('\0') => Err(invalid(format!("{kind} {key} contains NUL"))),
                ConfigValue::Plain(_) => Ok(()),
                // A server can only reference its own secrets.
                ConfigValue::Secret { secret_ref: reference } if *reference == secret_ref(&self.name, kind, key) => {
                    Ok(())
                }
                ConfigValue::Secret { secret_ref: reference } => Err(invalid(format!(
                    "{kind} {key} references secret {reference:?}; expected {:?}",
                    secret_ref(&self.name, kind, key)
                ))),
            }
        };
        match &self.transport {
            McpTransport::Stdio { command, args, env, cwd, sha256 } => {
                if let Some(digest) = sha256 {
                    if parse_sha256(digest).is_none() {
                        return Err(invalid(format!("sha256 {digest:?} must be 64 lowercase hex digits")));
                    }
                    if !is_workspace_command(command) {
                        return Err(invalid(format!(
                            "sha256 pins a workspace program (a relative path with a /); {command:?} is a system command"
                        )));
                    }
                }
                if command.trim().is_empty() || command.contains('\0') {
                    return Err(invalid("command must be non-empty and free of NUL".into()));
                }
                if args.iter().any(|arg| arg.contains('\0')) {
                    return Err(invalid("an argument contains NUL".into()));
                }
                let names: BTreeMap<String, String> = env.keys().map(|key| (key.clone(), String::new())).collect();
                validate_env(&names).map_err(|error| invalid(error.to_string()))?;
                for (key, value) in env {
                    check_ref("env", key, value)?;
                }
                RelPath::parse(cwd).map_err(|error| invalid(format!("cwd: {error}")))?;
            }
            McpTransport::Http { url, headers } => {
                let rest = url.strip_prefix("https://").or_else(|| url.strip_prefix("http://"));
                let host = rest.map(|rest| rest.split(['/', '?', '#']).next().unwrap_or_default());
                if host.is_none_or(str::is_empty) || url.chars().any(char::is_whitespace) {
                    return Err(invalid(format!("url {url:?} must be an http:// or https:// URL with a host")));
                }
                for (key, value) in headers {
                    http::HeaderName::from_bytes(key.as_bytes())
                        .map_err(|_| invalid(format!("header name {key:?} is not valid")))?;
                    if let ConfigValue::Plain(text) = value {
                        http::HeaderValue::from_str(text)
                            .map_err(|_| invalid(format!("value of header {key} is not valid")))?;
                    }
                    check_ref("header", &key.to_ascii_lowercase(), value)?;
                }
            }
        }
        Ok(())
    }

    /// What a secret of this server is bound to: the SHA-256 of the declaration as stored
    /// (secrets as references). A secret is only handed to the exact declaration it was
    /// added with, so an agent editing `.mcp` (another command, another URL) cannot have a
    /// secret sent somewhere else.
    pub fn binding(&self) -> String {
        let canonical = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&canonical))
    }

    /// Whether the server receives a secret (a `secret_ref` env value or header): such a
    /// stdio server runs as a `SpawnRole::SecretHolder`.
    pub fn holds_secrets(&self) -> bool {
        let values = match &self.transport {
            McpTransport::Stdio { env, .. } => env.values(),
            McpTransport::Http { headers, .. } => headers.values(),
        };
        values.into_iter().any(|value| matches!(value, ConfigValue::Secret { .. }))
    }

    /// The program digest a secret-holding stdio server must be spawned with: `Some` when
    /// its command is a workspace path (then the declaration must pin it), `None` for a
    /// system command (an absolute path or a name looked up in `PATH`) and for servers
    /// without secrets (they run as the agent anyway).
    ///
    /// Errors: `McpRefused(UnpinnedProgram)` for a secret holder whose workspace command
    /// has no `sha256`.
    pub fn program_pin(&self) -> Result<Option<[u8; 32]>> {
        let McpTransport::Stdio { command, sha256, .. } = &self.transport else {
            return Ok(None);
        };
        if !self.holds_secrets() {
            return Ok(None);
        }
        match sha256.as_deref().and_then(parse_sha256) {
            Some(pin) => Ok(Some(pin)),
            None if is_workspace_command(command) => Err(WorkspaceError::McpRefused {
                server: self.name.clone(),
                reason: McpRefusal::UnpinnedProgram { command: command.clone() },
            }),
            None => Ok(None),
        }
    }

    pub fn transport_name(&self) -> &'static str {
        match self.transport {
            McpTransport::Stdio { .. } => "stdio",
            McpTransport::Http { .. } => "http",
        }
    }
}

/// Whether a stdio command names a file of the workspace: a relative path with a `/`
/// (`bin/server`, `./server`), resolved against the server's cwd in the workspace. A bare
/// name is looked up in `PATH` and an absolute path is the sandbox's own (a backend refuses
/// one inside the workspace for a secret holder).
pub fn is_workspace_command(command: &str) -> bool {
    !command.starts_with('/') && command.contains('/')
}

/// Parses a pin: exactly 64 lowercase hex digits.
pub fn parse_sha256(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 || !text.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let mut digest = [0u8; 32];
    hex::decode_to_slice(text, &mut digest).ok()?;
    Some(digest)
}

/// Validates a whole list: every declaration, unique names, the count.
pub fn validate_all(servers: &[McpServerConfig]) -> Result<()> {
    if servers.len() > MAX_SERVERS {
        return Err(WorkspaceError::LimitExceeded {
            limit: "mcp servers",
            size: servers.len() as u64,
            max: MAX_SERVERS as u64,
        });
    }
    let mut names = HashSet::new();
    for server in servers {
        server.validate()?;
        if !names.insert(server.name.as_str()) {
            return Err(WorkspaceError::InvalidArgument(format!("mcp server {:?} is declared twice", server.name)));
        }
    }
    Ok(())
}

/// The declarations of a workspace, and whether the file had to be re-seeded.
#[derive(Clone, Debug, Default)]
pub struct Loaded {
    pub servers: Vec<McpServerConfig>,
    pub reseeded: bool,
}

/// Reads and validates `.mcp`. A missing file is an empty list; a corrupt one (not JSON, not
/// an array of valid declarations) is replaced by `defaults`, with a warning.
pub async fn load<B: Backend + ?Sized>(backend: &B, defaults: &[McpServerConfig]) -> Result<Loaded> {
    let path = RelPath::parse(MCP_FILE)?;
    let bytes = match backend.read_to_bytes(&path, MAX_MCP_FILE_BYTES).await {
        Ok(bytes) => bytes,
        Err(WorkspaceError::NotFound { .. }) => return Ok(Loaded::default()),
        Err(error @ (WorkspaceError::LimitExceeded { .. } | WorkspaceError::IsADirectory { .. })) => {
            return reseed(backend, defaults, &error.to_string()).await;
        }
        Err(error) => return Err(error),
    };
    let parsed = serde_json::from_slice::<Vec<McpServerConfig>>(&bytes)
        .map_err(|error| error.to_string())
        .and_then(|servers| validate_all(&servers).map(|()| servers).map_err(|error| error.to_string()));
    match parsed {
        Ok(servers) => Ok(Loaded { servers, reseeded: false }),
        Err(reason) => reseed(backend, defaults, &reason).await,
    }
}

async fn reseed<B: Backend + ?Sized>(backend: &B, defaults: &[McpServerConfig], reason: &str) -> Result<Loaded> {
    tracing::warn!(%reason, servers = defaults.len(), "corrupt .mcp; re-seeding it from the node's defaults");
    if backend.stat(&RelPath::parse(MCP_FILE)?).await.is_ok_and(|info| info.kind == crate::FileKind::Directory) {
        backend.remove(&RelPath::parse(MCP_FILE)?, true).await?;
    }
    save(backend, defaults).await?;
    Ok(Loaded { servers: defaults.to_vec(), reseeded: true })
}

/// Writes `.mcp` atomically.
pub async fn save<B: Backend + ?Sized>(backend: &B, servers: &[McpServerConfig]) -> Result<()> {
    let mut text = serde_json::to_vec_pretty(servers)
        .map_err(|error| WorkspaceError::Corrupt { what: ".mcp".into(), reason: error.to_string() })?;
    text.push(b'\n');
    backend.write_bytes(&RelPath::parse(MCP_FILE)?, Bytes::from(text), 0o644).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio(name: &str) -> McpServerConfig {
        McpServerConfig {
            name: name.into(),
            transport: McpTransport::Stdio {
                command: "bin/x".into(),
                args: vec![],
                env: BTreeMap::from([("K".into(), ConfigValue::Secret { secret_ref: secret_ref(name, "env", "K") })]),
                cwd: String::new(),
                sha256: None,
            },
        }
    }

    #[test]
    fn round_trips_and_validates() {
        let servers = vec![
            stdio("a"),
            McpServerConfig {
                name: "b".into(),
                transport: McpTransport::Http { url: "https://h/mcp".into(), headers: BTreeMap::new() },
            },
        ];
        let text = serde_json::to_string(&servers).unwrap();
        assert!(text.contains(r#""secret_ref":"mcp/a/env/K""#), "{text}");
        let back: Vec<McpServerConfig> = serde_json::from_str(&text).unwrap();
        assert_eq!(back, servers);
        validate_all(&back).unwrap();
        assert!(validate_all(&[stdio("a"), stdio("a")]).is_err());
        // Another server's secret cannot be referenced.
        let mut stolen = stdio("b");
        if let McpTransport::Stdio { env, .. } = &mut stolen.transport {
            env.insert("K".into(), ConfigValue::Secret { secret_ref: secret_ref("a", "env", "K") });
        }
        assert!(stolen.validate().is_err());
        for url in ["ftp://x", "http://", "https:///a", "http://a b"] {
            let server = McpServerConfig {
                name: "h".into(),
                transport: McpTransport::Http { url: url.into(), headers: BTreeMap::new() },
            };
            assert!(server.validate().is_err(), "{url}");
        }
        assert_ne!(stdio("a").binding(), stdio("b").binding());
    }

    #[test]
    fn secret_holders_in_the_workspace_are_pinned() {
        let pin = "ab".repeat(32);
        let mut server = stdio("a");
        // bin/x receives a secret and is a workspace path: refused without a pin.
        assert!(matches!(
            server.program_pin(),
            Err(WorkspaceError::McpRefused { reason: McpRefusal::UnpinnedProgram { .. }, .. })
        ));
        let unpinned_binding = server.binding();
        if let McpTransport::Stdio { sha256, .. } = &mut server.transport {
            *sha256 = Some(pin.clone());
        }
        server.validate().unwrap();
        assert_eq!(server.program_pin().unwrap(), Some([0xab; 32]));
        // The pin is part of the binding: another pin cannot receive the secret.
        assert_ne!(server.binding(), unpinned_binding);
        let pinned_binding = server.binding();
        if let McpTransport::Stdio { sha256, .. } = &mut server.transport {
            *sha256 = Some("cd".repeat(32));
        }
        assert_ne!(server.binding(), pinned_binding);
        for bad in ["AB".repeat(32), "ab".repeat(31), "zz".repeat(32)] {
            if let McpTransport::Stdio { sha256, .. } = &mut server.transport {
                *sha256 = Some(bad.clone());
            }
            assert!(server.validate().is_err(), "{bad}");
        }
        // A pin is for workspace programs only.
        let mut pinned_system = server.clone();
        if let McpTransport::Stdio { command, sha256, .. } = &mut pinned_system.transport {
            *command = "/usr/bin/python3".into();
            *sha256 = Some(pin.clone());
        }
        assert!(pinned_system.validate().is_err());
        // System commands need no pin; servers without secrets need none either.
        for command in ["/usr/bin/python3", "npx"] {
            let mut system = stdio("s");
            if let McpTransport::Stdio { command: program, .. } = &mut system.transport {
                *program = command.into();
            }
            assert_eq!(system.program_pin().unwrap(), None, "{command}");
        }
        let mut plain = stdio("p");
        if let McpTransport::Stdio { env, .. } = &mut plain.transport {
            env.clear();
        }
        assert_eq!(plain.program_pin().unwrap(), None);
        // An unset pin is absent from the file, so older declarations keep their binding.
        assert!(!serde_json::to_string(&stdio("a")).unwrap().contains("sha256"));
    }
}
