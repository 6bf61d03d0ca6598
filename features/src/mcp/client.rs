//! Starting one live MCP client: a stdio server spawned inside the workspace's sandbox
//! through [`Backend::spawn`] (MCP over its stdin/stdout), or a streamable-HTTP server
//! connected from the node agent.
//!
//! A stdio server that receives a secret is spawned as [`SpawnRole::SecretHolder`]: the
//! backend keeps it from the workspace's processes (another identity, a private `HOME` and
//! cwd), and a program from the workspace runs only as a copy checked against the
//! declaration's `sha256` pin ([`McpServerConfig::program_pin`]). It gets exactly the
//! declaration's env (bound to its hash), nothing of the workspace's. An HTTP server is
//! reached only through the SSRF guard ([`super::ssrf`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::model::ClientConfig;
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use tokio::io::AsyncReadExt;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::secrets::SecretStore;
use super::ssrf::{TargetPolicy, guarded_client};
use berth_workspace::backend::{BackendRef, ExitInfo, SpawnRole, SpawnSpec};
use berth_workspace::error::{McpRefusal, Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;
use berth_workspace::mcp::config::{ConfigValue, McpServerConfig, McpTransport};
use berth_workspace::path::RelPath;

/// Bytes of a stdio server's stderr kept for error messages.
/// Installs ring as the process's rustls provider unless one is installed already (the
/// streamable-HTTP client needs one; docs/dependencies.md: one provider for the whole tree).
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

const STDERR_TAIL_BYTES: usize = 4096;

/// How long a server whose handshake failed gets to exit and close its stderr before the
/// error is reported.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(2);

/// A connected MCP client and what keeps its server alive.
pub struct LiveClient {
    pub service: RunningService<RoleClient, ClientConfig>,
    /// The declaration's binding when it started: a changed `.mcp` entry restarts it.
    pub fingerprint: String,
    pub process: Option<ServerProcess>,
}

impl LiveClient {
    /// Whether the client can still take calls.
    pub fn is_usable(&self) -> bool {
        !self.service.is_closed()
            && !self.service.peer().is_transport_closed()
            && self.process.as_ref().is_none_or(|process| process.exit().is_none())
    }

    /// Why the server is gone, for an error message.
    pub fn failure_detail(&self) -> String {
        match &self.process {
            Some(process) => process.describe(),
            None => "the connection to the server closed".into(),
        }
    }
}

/// A stdio server's process: its exit (once it happened) and the tail of its stderr.
/// Dropping it kills the process tree (the backend's `ProcessControl` drop contract).
pub struct ServerProcess {
    exit: Arc<Mutex<Option<ExitInfo>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// Set once the server's stderr reached its end (everything it wrote is in `stderr`).
    stderr_done: Arc<std::sync::atomic::AtomicBool>,
    _stop: DropGuard,
}

impl ServerProcess {
    pub fn exit(&self) -> Option<ExitInfo> {
        *self.exit.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn describe(&self) -> String {
        let status = match self.exit() {
            Some(ExitInfo { code: Some(code), .. }) => format!("the server exited with code {code}"),
            Some(ExitInfo { signal: Some(signal), .. }) => format!("the server was killed by signal {signal}"),
            Some(_) => "the server exited".to_owned(),
            None => "the connection to the server closed".to_owned(),
        };
        let stderr = self.stderr.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let tail = String::from_utf8_lossy(&stderr);
        let tail = tail.trim();
        if tail.is_empty() { status } else { format!("{status}; stderr: {tail}") }
    }
}

/// Starts the server of `config` and completes the MCP handshake within `start_timeout`.
pub async fn start(
    backend: &BackendRef,
    workspace: &WorkspaceId,
    config: &McpServerConfig,
    secrets: &SecretStore,
    targets: &Arc<TargetPolicy>,
    start_timeout: Duration,
) -> Result<LiveClient> {
    let binding = config.binding();
    let failed = |reason: String| WorkspaceError::McpServerFailed { server: config.name.clone(), reason };
    match &config.transport {
        McpTransport::Stdio { command, args, env, cwd, .. } => {
            let mut spawn = SpawnSpec::new(std::iter::once(command.clone()).chain(args.iter().cloned()).collect());
            spawn.cwd = RelPath::parse(cwd)?;
            if config.holds_secrets() {
                // Refused before any secret is read: an unpinned workspace program.
                spawn.program_sha256 = config.program_pin()?;
                spawn.role = SpawnRole::SecretHolder;
                if spawn.program_sha256.is_some() {
                    // A pinned program is named from the workspace root (the cwd of a
                    // secret holder is private, not the declared one).
                    spawn.argv[0] = spawn.cwd.join(command)?.as_str().to_owned();
                    spawn.cwd = RelPath::root();
                }
            }
            spawn.env =
                resolve_all(workspace, env, secrets, &binding).await.map_err(|error| failed(error.to_string()))?;
            let spawned = backend.spawn(&spawn).await.map_err(|error| match error {
                WorkspaceError::SpawnFailed { .. } => failed(error.to_string()),
                other => other,
            })?;
            let process = watch(spawned.control, spawned.stderr);
            let transport = AsyncRwTransport::new_client(spawned.stdout, spawned.stdin);
            let handshake = tokio::time::timeout(start_timeout, ClientConfig::default().serve(transport)).await;
            let service = match handshake {
                Ok(Ok(service)) => service,
                Ok(Err(error)) => {
                    // Give a dying process a moment to be reaped and its stderr to be read to
                    // the end, so the message says why (its exit can be seen before the
                    // last of its stderr is).
                    let _ = tokio::time::timeout(SETTLE_TIMEOUT, process.settled()).await;
                    return Err(failed(format!("initialize failed: {error}; {}", process.describe())));
                }
                Err(_) => {
                    return Err(WorkspaceError::Timeout {
                        operation: "mcp server start",
                        millis: start_timeout.as_millis() as u64,
                    });
                }
            };
            Ok(LiveClient { service, fingerprint: binding, process: Some(process) })
        }
        McpTransport::Http { url, headers } => {
            install_crypto_provider();
            // Only what the tenant declared through the API: an entry the agent wrote into
            // `.mcp` would make the node connect for it, from where the sandbox cannot.
            if !secrets.is_declared(workspace, &config.name, &binding).await? {
                return Err(WorkspaceError::McpRefused {
                    server: config.name.clone(),
                    reason: McpRefusal::NotDeclared,
                });
            }
            // Before any secret is read; the connection is guarded again by the resolver.
            targets.check_url(&config.name, url).await?;
            let resolved =
                resolve_all(workspace, headers, secrets, &binding).await.map_err(|error| failed(error.to_string()))?;
            let mut custom = HashMap::new();
            for (name, value) in resolved {
                let name = http::HeaderName::from_bytes(name.as_bytes())
                    .map_err(|_| failed(format!("header name {name:?} is not valid")))?;
                let value = http::HeaderValue::from_str(&value)
                    .map_err(|_| failed(format!("value of header {name} is not valid")))?;
                custom.insert(name, value);
            }
            let transport = StreamableHttpClientTransport::with_client(
                guarded_client(Arc::clone(targets))?,
                StreamableHttpClientTransportConfig::with_uri(url.clone()).custom_headers(custom),
            );
            let service = match tokio::time::timeout(start_timeout, ClientConfig::default().serve(transport)).await {
                Ok(Ok(service)) => service,
                Ok(Err(error)) => return Err(failed(format!("initialize failed: {error}"))),
                Err(_) => {
                    return Err(WorkspaceError::Timeout {
                        operation: "mcp server start",
                        millis: start_timeout.as_millis() as u64,
                    });
                }
            };
            Ok(LiveClient { service, fingerprint: binding, process: None })
        }
    }
}

async fn resolve_all(
    workspace: &WorkspaceId,
    values: &BTreeMap<String, ConfigValue>,
    secrets: &SecretStore,
    binding: &str,
) -> Result<BTreeMap<String, String>> {
    let mut resolved = BTreeMap::new();
    for (key, value) in values {
        let text = match value {
            ConfigValue::Plain(text) => text.clone(),
            ConfigValue::Secret { secret_ref } => secrets.resolve(workspace, secret_ref, binding).await?,
        };
        resolved.insert(key.clone(), text);
    }
    Ok(resolved)
}

/// Watches a stdio server: records its exit, keeps the tail of its stderr, and kills the
/// tree when the returned value is dropped.
fn watch(
    mut control: Box<dyn berth_workspace::backend::ProcessControl>,
    mut stderr: berth_workspace::backend::BoxedReader,
) -> ServerProcess {
    let exit = Arc::new(Mutex::new(None));
    let tail = Arc::new(Mutex::new(Vec::new()));
    let stop = CancellationToken::new();
    let recorded = Arc::clone(&exit);
    let cancelled = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            status = control.wait() => {
                if let Ok(status) = status {
                    *recorded.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(status);
                }
            }
            () = cancelled.cancelled() => {}
        }
        // Dropping an un-reaped control kills the process tree.
        drop(control);
    });
    let kept = Arc::clone(&tail);
    let cancelled = stop.clone();
    let stderr_done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let done = Arc::clone(&stderr_done);
    tokio::spawn(async move {
        let mut buffer = vec![0u8; 4096];
        loop {
            let read = tokio::select! {
                read = stderr.read(&mut buffer) => read,
                () = cancelled.cancelled() => return,
            };
            match read {
                Ok(0) | Err(_) => {
                    done.store(true, std::sync::atomic::Ordering::Release);
                    return;
                }
                Ok(read) => {
                    let mut tail = kept.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                    tail.extend_from_slice(&buffer[..read]);
                    if tail.len() > STDERR_TAIL_BYTES {
                        let excess = tail.len() - STDERR_TAIL_BYTES;
                        tail.drain(..excess);
                    }
                }
            }
        }
    });
    ServerProcess { exit, stderr: tail, stderr_done, _stop: stop.drop_guard() }
}

impl ServerProcess {
    /// Returns once the process exited and its stderr was read to the end.
    async fn settled(&self) {
        while self.exit().is_none() || !self.stderr_done.load(std::sync::atomic::Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use async_trait::async_trait;
    use berth_workspace::backend::ProcessControl;
    use tokio::io::{AsyncRead, ReadBuf};

    use super::*;

    /// A process that has exited already.
    struct Exited;

    #[async_trait]
    impl ProcessControl for Exited {
        async fn wait(&mut self) -> Result<ExitInfo> {
            Ok(ExitInfo { code: Some(0), signal: None })
        }
        async fn kill(&mut self) -> Result<()> {
            Ok(())
        }
    }

    /// Stderr whose bytes arrive `delay` after the first read (a loaded machine: the exit is
    /// reaped before the last write is read).
    struct LateStderr {
        delay: Pin<Box<tokio::time::Sleep>>,
        text: Option<&'static [u8]>,
    }

    impl AsyncRead for LateStderr {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<std::io::Result<()>> {
            if self.delay.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            if let Some(text) = self.text.take() {
                buf.put_slice(text);
            }
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_failed_start_reports_stderr_that_arrives_after_the_exit() {
        let stderr = LateStderr {
            delay: Box::pin(tokio::time::sleep(Duration::from_millis(300))),
            text: Some(b"ld.so: object from LD_PRELOAD cannot be preloaded"),
        };
        let process = watch(Box::new(Exited), Box::pin(stderr));
        tokio::time::timeout(SETTLE_TIMEOUT, process.settled()).await.expect("settles");
        let described = process.describe();
        assert!(described.contains("exited with code 0"), "{described}");
        assert!(described.contains("cannot be preloaded"), "the late stderr is missing: {described}");
    }
}
