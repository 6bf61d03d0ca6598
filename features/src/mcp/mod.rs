//! MCP servers of a workspace: declarations in `.mcp` ([`config`]), secrets in the node's
//! private store ([`secrets`]), live clients in a per-node pool ([`pool`], [`client`]).
//!
//! Everything goes through the [`Backend`] primitives: `.mcp` is read and written with
//! `read_file`/`write_file`, and a stdio server is started inside the workspace's sandbox
//! with `spawn` — so every backend runs MCP servers the same way.

pub mod client;
pub mod pool;
pub mod secrets;
pub mod ssrf;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rmcp::model::CallToolRequestParams;
use rmcp::{Peer, RoleClient, ServiceError};

pub use self::client::install_crypto_provider;
pub use self::pool::{McpPool, McpPoolConfig};
pub use self::secrets::SecretStore;
pub use self::ssrf::{Cidr, TargetPolicy};
use berth_workspace::backend::{Backend, BackendRef};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;
pub use berth_workspace::mcp::{
    ConfigValue, McpCallOutput, McpServerConfig, McpServerSpec, McpServerStatus, McpToolInfo, McpTransport,
    SpecTransport, SpecValue, config, secret_ref, spec, validate_server_name,
};

/// Node-wide settings of the MCP service.
#[derive(Clone, Debug)]
pub struct McpServiceConfig {
    pub pool: McpPoolConfig,
    /// Deadline of starting a server and completing the MCP handshake.
    pub start_timeout: Duration,
    /// Deadline of one tool call when the request gives none.
    pub default_call_timeout: Duration,
    /// Longest call timeout a request may ask for.
    pub max_call_timeout: Duration,
    /// Declarations a corrupt `.mcp` is re-seeded with.
    pub defaults: Vec<McpServerConfig>,
    /// Address ranges an HTTP server may be reached at besides public addresses
    /// (`--mcp-allow-cidr`); loopback, private, link-local... are refused otherwise.
    pub allowed_cidrs: Vec<Cidr>,
}

impl Default for McpServiceConfig {
    fn default() -> Self {
        Self {
            pool: McpPoolConfig::default(),
            start_timeout: Duration::from_secs(30),
            default_call_timeout: Duration::from_secs(60),
            max_call_timeout: Duration::from_secs(3600),
            defaults: Vec::new(),
            allowed_cidrs: Vec::new(),
        }
    }
}

/// The MCP part of the workspace contract on one node.
pub struct McpService {
    config: McpServiceConfig,
    pool: McpPool,
    secrets: Arc<SecretStore>,
    targets: Arc<TargetPolicy>,
    /// Serialises read-modify-writes of each workspace's `.mcp`.
    config_locks: Mutex<HashMap<WorkspaceId, Arc<tokio::sync::Mutex<()>>>>,
}

impl McpService {
    pub fn new(config: McpServiceConfig, secrets: Arc<SecretStore>) -> Self {
        install_crypto_provider();
        let targets = Arc::new(TargetPolicy::new(config.allowed_cidrs.clone()));
        Self { pool: McpPool::new(config.pool), config, secrets, targets, config_locks: Mutex::new(HashMap::new()) }
    }

    pub fn pool(&self) -> &McpPool {
        &self.pool
    }

    pub fn secrets(&self) -> &SecretStore {
        &self.secrets
    }

    fn config_lock(&self, workspace: &WorkspaceId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.config_locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(locks.entry(workspace.clone()).or_default())
    }

    /// Declares a server (replacing one of the same name only with `replace`): secrets go
    /// to the node's store, the declaration with references to `.mcp`. A live client of
    /// the old declaration is closed.
    pub async fn add(
        &self,
        backend: &dyn Backend,
        workspace: &WorkspaceId,
        spec: &McpServerSpec,
        replace: bool,
    ) -> Result<McpServerConfig> {
        let (config, secret_values) = spec.split_secrets()?;
        let lock = self.config_lock(workspace);
        let _guard = lock.lock().await;
        let mut loaded = config::load(backend, &self.config.defaults).await?;
        match loaded.servers.iter().position(|server| server.name == config.name) {
            Some(_) if !replace => return Err(WorkspaceError::NameExists { kind: "mcp server", name: config.name }),
            Some(index) => loaded.servers[index] = config.clone(),
            None => loaded.servers.push(config.clone()),
        }
        config::validate_all(&loaded.servers)?;
        // Secrets first: a crash between the two leaves an unused secret, never a
        // declaration whose secret is missing.
        self.secrets.put_server(workspace, &config.name, &config.binding(), secret_values).await?;
        config::save(backend, &loaded.servers).await?;
        self.pool.discard(workspace, &config.name);
        Ok(config)
    }

    /// Removes a declaration, its secrets and its live client. Returns whether it existed.
    pub async fn remove(&self, backend: &dyn Backend, workspace: &WorkspaceId, name: &str) -> Result<bool> {
        validate_server_name(name)?;
        let lock = self.config_lock(workspace);
        let _guard = lock.lock().await;
        let mut loaded = config::load(backend, &self.config.defaults).await?;
        let before = loaded.servers.len();
        loaded.servers.retain(|server| server.name != name);
        let existed = loaded.servers.len() != before;
        if existed {
            config::save(backend, &loaded.servers).await?;
        }
        self.secrets.remove_server(workspace, name).await?;
        self.pool.discard(workspace, name);
        Ok(existed)
    }

    /// The declarations (secrets as references) and which have a live client; `true` when
    /// `.mcp` was corrupt and re-seeded.
    pub async fn list(&self, backend: &dyn Backend, workspace: &WorkspaceId) -> Result<(Vec<McpServerStatus>, bool)> {
        let loaded = config::load(backend, &self.config.defaults).await?;
        let live = self.pool.live_servers(workspace);
        let servers = loaded
            .servers
            .into_iter()
            .map(|config| McpServerStatus { live: live.contains(&config.name), config })
            .collect();
        Ok((servers, loaded.reseeded))
    }

    fn call_timeout(&self, requested: Option<Duration>) -> Result<Duration> {
        match requested {
            None => Ok(self.config.default_call_timeout),
            Some(timeout) if timeout > self.config.max_call_timeout => Err(WorkspaceError::LimitExceeded {
                limit: "mcp call timeout (ms)",
                size: timeout.as_millis() as u64,
                max: self.config.max_call_timeout.as_millis() as u64,
            }),
            Some(timeout) => Ok(timeout),
        }
    }

    /// A peer for the server `name` of the workspace, started if needed.
    async fn peer(
        &self,
        backend: &BackendRef,
        workspace: &WorkspaceId,
        name: &str,
    ) -> Result<(Peer<RoleClient>, bool)> {
        validate_server_name(name)?;
        let loaded = config::load(backend.as_ref(), &self.config.defaults).await?;
        let Some(config) = loaded.servers.into_iter().find(|server| server.name == name) else {
            return Err(WorkspaceError::NameNotFound { kind: "mcp server", name: name.to_owned() });
        };
        let (secrets, targets) = (&self.secrets, &self.targets);
        let start_timeout = self.config.start_timeout;
        self.pool
            .peer(workspace, name, &config.binding(), || {
                client::start(backend, workspace, &config, secrets, targets, start_timeout)
            })
            .await
    }

    /// Maps a failed request; a broken connection drops the client so the next call
    /// starts the server again.
    async fn call_failed(&self, workspace: &WorkspaceId, name: &str, error: ServiceError) -> WorkspaceError {
        match error {
            ServiceError::McpError(data) => WorkspaceError::InvalidArgument(format!(
                "mcp server {name:?} refused the request: {} (code {})",
                data.message, data.code.0
            )),
            ServiceError::Timeout { timeout } => {
                WorkspaceError::Timeout { operation: "mcp call", millis: timeout.as_millis() as u64 }
            }
            other => {
                let detail = self.describe_failure(workspace, name).await;
                self.pool.discard(workspace, name);
                WorkspaceError::McpServerFailed {
                    server: name.to_owned(),
                    reason: format!("{other}; {detail}; it is started again on the next call"),
                }
            }
        }
    }

    async fn describe_failure(&self, workspace: &WorkspaceId, name: &str) -> String {
        // The exit watcher records the exit shortly after the pipe closes.
        let deadline = Instant::now() + Duration::from_millis(500);
        loop {
            let detail = self.pool.failure_detail(workspace, name).await;
            if detail.as_deref().is_some_and(|text| !text.starts_with("the connection")) || Instant::now() > deadline {
                return detail.unwrap_or_else(|| "the server is gone".into());
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The tools of a server (starting it if needed).
    pub async fn list_tools(
        &self,
        backend: &BackendRef,
        workspace: &WorkspaceId,
        name: &str,
        timeout: Option<Duration>,
    ) -> Result<Vec<McpToolInfo>> {
        let timeout = self.call_timeout(timeout)?;
        let (peer, _) = self.peer(backend, workspace, name).await?;
        let tools = match tokio::time::timeout(timeout, peer.list_all_tools()).await {
            Ok(Ok(tools)) => tools,
            Ok(Err(error)) => return Err(self.call_failed(workspace, name, error).await),
            Err(_) => {
                return Err(WorkspaceError::Timeout {
                    operation: "mcp list tools",
                    millis: timeout.as_millis() as u64,
                });
            }
        };
        Ok(tools
            .into_iter()
            .map(|tool| McpToolInfo {
                name: tool.name.to_string(),
                description: tool.description.map(|text| text.to_string()).unwrap_or_default(),
                input_schema_json: serde_json::to_string(&*tool.input_schema).unwrap_or_default(),
            })
            .collect())
    }

    /// Calls a tool with JSON object `arguments` within `timeout` (DEADLINE_EXCEEDED past
    /// it; the server keeps running).
    pub async fn call_tool(
        &self,
        backend: &BackendRef,
        workspace: &WorkspaceId,
        name: &str,
        tool: &str,
        arguments: serde_json::Map<String, serde_json::Value>,
        timeout: Option<Duration>,
    ) -> Result<McpCallOutput> {
        if tool.is_empty() || tool.len() > 256 {
            return Err(WorkspaceError::InvalidArgument("a tool name must be 1-256 bytes".into()));
        }
        let timeout = self.call_timeout(timeout)?;
        let started_at = Instant::now();
        let (peer, started) = self.peer(backend, workspace, name).await?;
        let request = CallToolRequestParams::new(tool.to_owned()).with_arguments(arguments);
        let result = match tokio::time::timeout(timeout, peer.call_tool(request)).await {
            Ok(Ok(result)) => result,
            Ok(Err(error)) => return Err(self.call_failed(workspace, name, error).await),
            Err(_) => {
                return Err(WorkspaceError::Timeout { operation: "mcp tool call", millis: timeout.as_millis() as u64 });
            }
        };
        let content = serde_json::to_value(&result.content).unwrap_or_default();
        let text = content
            .as_array()
            .map(|blocks| {
                blocks
                    .iter()
                    .filter(|block| block.get("type").and_then(|kind| kind.as_str()) == Some("text"))
                    .filter_map(|block| block.get("text").and_then(|text| text.as_str()))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        Ok(McpCallOutput {
            is_error: result.is_error.unwrap_or(false),
            content_json: content.to_string(),
            structured_json: result.structured_content.map(|value| value.to_string()).unwrap_or_default(),
            text,
            started,
            duration: started_at.elapsed(),
        })
    }

    /// Closes the workspace's clients; with `destroyed`, removes its secrets too.
    pub async fn forget_workspace(&self, workspace: &WorkspaceId, destroyed: bool) -> Result<()> {
        self.pool.forget_workspace(workspace);
        if destroyed {
            self.config_locks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(workspace);
            self.secrets.destroy(workspace).await?;
        }
        Ok(())
    }
}
