//! Berth processes: `berth control-plane` replicas and `berth node-agent`s started from the
//! real binary, ready when their gRPC health service says SERVING.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use berth_proto::v1;
use berth_proto::v1::admin_service_client::AdminServiceClient;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use futures::StreamExt;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use berth_testkit::wait_until;

use crate::process::{ManagedProcess, ProcessSpec, free_port};

/// How long a process may take to become ready.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// The log filter `BerthProcess::start` gives every process.
pub const DEFAULT_LOG_FILTER: &str = "info,berth=debug";

/// The `berth` binary: `$BERTH_BIN`, else next to the running executable (a binary in
/// `target/<profile>/`, e.g. `berth-bench`), else next to the test executable's `deps/`
/// directory (`target/<profile>/berth`, built by `cargo build --bins` or by the test run
/// itself).
pub fn berth_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("BERTH_BIN") {
        return PathBuf::from(path);
    }
    let executable = std::env::current_exe().unwrap_or_default();
    let executable_dir = executable.parent().map(Path::to_path_buf).unwrap_or_default();
    let sibling = executable_dir.join("berth");
    if sibling.is_file() {
        return sibling;
    }
    let profile_dir = executable_dir.parent().map(Path::to_path_buf).unwrap_or_default();
    let candidate = profile_dir.join("berth");
    assert!(
        candidate.exists(),
        "the berth binary is not at {} — run `cargo build --bins` first or set BERTH_BIN",
        candidate.display()
    );
    candidate
}

/// A lazily connected channel to `endpoint` with short connect timeouts.
pub fn channel(endpoint: &str) -> Channel {
    Endpoint::from_shared(endpoint.to_owned())
        .expect("valid endpoint")
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect_lazy()
}

/// True when the gRPC health service at `endpoint` answers SERVING.
pub async fn is_serving(endpoint: &str) -> bool {
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(endpoint));
    let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
    let Ok(Ok(response)) = tokio::time::timeout(Duration::from_secs(2), health.check(request)).await else {
        return false;
    };
    response.into_inner().status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
}

/// One running `berth` server process.
pub struct BerthProcess {
    pub process: ManagedProcess,
    /// `http://127.0.0.1:<port>` it serves on.
    pub endpoint: String,
    /// One lazily connected channel shared by every client of this process (made on the
    /// test's runtime, like the process handle itself).
    channel: Channel,
    /// The data directory of a `berth up` ([`start_up`]): its Docker workspaces are removed
    /// when this process is dropped (`crate::leftovers`).
    data_dir: Option<std::path::PathBuf>,
}

impl Drop for BerthProcess {
    fn drop(&mut self) {
        if let Some(data_dir) = &self.data_dir {
            self.process.kill();
            crate::leftovers::remove_workspace_containers_under(data_dir);
        }
    }
}

impl BerthProcess {
    /// Starts `berth <args> --listen 127.0.0.1:<free port>` and waits until it serves. A port
    /// taken by another process between our probe and the bind (tests run in parallel) is
    /// retried with a fresh one.
    pub async fn start(name: &str, args: Vec<String>) -> anyhow::Result<Self> {
        Self::start_with_log(name, args, DEFAULT_LOG_FILTER).await
    }

    /// [`BerthProcess::start`] with `RUST_LOG=<log_filter>` (benchmarks log less).
    pub async fn start_with_log(name: &str, args: Vec<String>, log_filter: &str) -> anyhow::Result<Self> {
        const ATTEMPTS: usize = 3;
        let mut attempt = 1;
        loop {
            let started = Self::spawn(name, args.clone(), log_filter)?;
            match started.wait_serving().await {
                Ok(()) => return Ok(started),
                Err(_) if attempt < ATTEMPTS && started.log().contains("Address already in use") => attempt += 1,
                Err(error) => return Err(error),
            }
        }
    }

    /// Starts `berth <args> --listen 127.0.0.1:<free port>` without waiting for it to serve
    /// (for callers that time the start-up themselves; see [`BerthProcess::wait_serving`]).
    pub fn spawn(name: &str, args: Vec<String>, log_filter: &str) -> anyhow::Result<Self> {
        Self::spawn_on(name, args, log_filter, free_port()?)
    }

    /// Starts `berth <args> --listen 127.0.0.1:<port>` on a given port (a restarted process
    /// taking its predecessor's place, so proxies and peers that name the port reach it) and
    /// waits until it serves.
    pub async fn start_on(name: &str, args: Vec<String>, log_filter: &str, port: u16) -> anyhow::Result<Self> {
        let started = Self::spawn_on(name, args, log_filter, port)?;
        started.wait_serving().await?;
        Ok(started)
    }

    fn spawn_on(name: &str, args: Vec<String>, log_filter: &str, port: u16) -> anyhow::Result<Self> {
        let mut all = args;
        all.push("--listen".into());
        all.push(format!("127.0.0.1:{port}"));
        let spec = ProcessSpec::new(name, berth_binary()).args(all).env("RUST_LOG", log_filter);
        let process = ManagedProcess::spawn(spec)?;
        let endpoint = format!("http://127.0.0.1:{port}");
        Ok(Self { channel: channel(&endpoint), process, endpoint, data_dir: None })
    }

    /// Waits until the process serves (or fails with its log tail when it exits or takes
    /// longer than [`READY_TIMEOUT`]).
    pub async fn wait_serving(&self) -> anyhow::Result<()> {
        let endpoint = self.endpoint.clone();
        let process = &self.process;
        let ready = wait_until(READY_TIMEOUT, || {
            let endpoint = endpoint.clone();
            async move { !process.is_running() || is_serving(&endpoint).await }
        })
        .await;
        if !ready || !self.process.is_running() {
            bail!(
                "{} did not start serving on {}; log:\n{}",
                self.process.name(),
                self.endpoint,
                self.process.log_tail(40)
            );
        }
        Ok(())
    }

    /// The shared channel to this process (for clients of other services).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    pub fn workspace_client(&self) -> WorkspaceServiceClient<Channel> {
        WorkspaceServiceClient::new(self.channel.clone()).max_decoding_message_size(64 * 1024 * 1024)
    }

    pub fn admin_client(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::new(self.channel.clone())
    }

    /// `CreateSession` for `(user, agent)` with the node's default backend.
    pub async fn create_session(&self, user: &str, agent: &str) -> Result<v1::Session, Status> {
        let request = v1::CreateSessionRequest { user_id: user.into(), agent_id: agent.into(), ..Default::default() };
        Ok(self.workspace_client().create_session(request).await?.into_inner())
    }

    pub async fn get_workspace(&self, workspace_id: &str) -> Result<v1::Workspace, Status> {
        let request = v1::GetWorkspaceRequest { workspace_id: workspace_id.into() };
        Ok(self.workspace_client().get_workspace(request).await?.into_inner())
    }

    /// The state of a workspace as this replica reports it.
    pub async fn workspace_state(&self, workspace_id: &str) -> Result<v1::WorkspaceState, Status> {
        Ok(self.get_workspace(workspace_id).await?.state())
    }

    pub async fn exec(&self, workspace_id: &str, argv: &[&str]) -> Result<v1::ExecResult, Status> {
        let request = v1::ExecRequest {
            workspace_id: workspace_id.into(),
            argv: argv.iter().map(|arg| (*arg).to_owned()).collect(),
            timeout_ms: 10_000,
            ..Default::default()
        };
        Ok(self.workspace_client().exec(request).await?.into_inner())
    }

    /// Writes `data` to `path` in one chunk.
    pub async fn write_file(&self, workspace_id: &str, path: &str, data: &[u8]) -> Result<u64, Status> {
        let header = v1::WriteFileHeader { workspace_id: workspace_id.into(), path: path.into(), mode: 0 };
        let messages = berth_proto::convert::write_file_messages(header, data, data.len().max(1));
        Ok(self.workspace_client().write_file(futures::stream::iter(messages)).await?.into_inner().bytes_written)
    }

    pub async fn read_file(&self, workspace_id: &str, path: &str) -> Result<Vec<u8>, Status> {
        let request = v1::ReadFileRequest { workspace_id: workspace_id.into(), path: path.into(), chunk_size: 0 };
        let mut chunks = self.workspace_client().read_file(request).await?.into_inner();
        let mut data = Vec::new();
        while let Some(chunk) = chunks.next().await {
            data.extend_from_slice(&chunk?.data);
        }
        Ok(data)
    }

    /// The nodes this replica lists (its view of live nodes), sorted by id.
    pub async fn list_nodes(&self) -> Result<Vec<v1::NodeInfo>, Status> {
        Ok(self.admin_client().list_nodes(v1::ListNodesRequest {}).await?.into_inner().nodes)
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// The port of [`BerthProcess::endpoint`].
    pub fn port(&self) -> u16 {
        self.endpoint.rsplit(':').next().and_then(|port| port.parse().ok()).unwrap_or(0)
    }

    pub fn kill(&self) {
        self.process.kill();
    }

    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    pub fn log(&self) -> String {
        self.process.log()
    }
}

/// Runs the `berth` CLI against `endpoint` with no token or act-as from the environment.
pub fn cli(endpoint: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(berth_binary())
        .arg("--endpoint")
        .arg(endpoint)
        .args(args)
        .env_remove("BERTH_TOKEN")
        .env_remove("BERTH_ACT_AS")
        .output()
        .expect("run the berth cli")
}

/// Whether a failed call may succeed when tried again: the server marked it retryable, or
/// the transport could not deliver it or did not hear back in time.
pub fn is_transient(status: &Status) -> bool {
    berth_proto::meta::is_retryable(status)
        || matches!(status.code(), Code::Unavailable | Code::DeadlineExceeded | Code::Aborted)
}

/// Calls `call` until it succeeds, a non-transient error comes back, or `window` has passed
/// since the first attempt (then the last error). Returns the outcome and the number of
/// attempts. Pauses 100 ms between attempts.
pub async fn retry_transient<T, F, Fut>(window: Duration, mut call: F) -> (Result<T, Status>, u32)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Status>>,
{
    let deadline = tokio::time::Instant::now() + window;
    let mut attempts = 0;
    loop {
        attempts += 1;
        match call().await {
            Err(status) if is_transient(&status) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            outcome => return (outcome, attempts),
        }
    }
}

/// Starts `berth up` on a free port with `data_dir` and extra flags.
pub async fn start_up(data_dir: &Path, extra: &[&str]) -> anyhow::Result<BerthProcess> {
    let mut args = vec!["up".to_owned(), "--data-dir".to_owned(), data_dir.display().to_string()];
    args.extend(extra.iter().map(|flag| (*flag).to_owned()));
    let mut up = BerthProcess::start("up", args).await.context("berth up")?;
    up.data_dir = Some(data_dir.to_path_buf());
    // The replica serves a moment before its in-process node agent has registered (under
    // load, long enough for a first CreateSession to find no live node).
    let registered =
        wait_until(READY_TIMEOUT, || async { up.list_nodes().await.is_ok_and(|nodes| !nodes.is_empty()) }).await;
    if !registered {
        bail!("berth up serves but its node agent never registered; log:\n{}", up.process.log_tail(40));
    }
    Ok(up)
}
