//! Berth processes: `berth control-plane` replicas and `berth node-agent`s started from the
//! real binary, ready when their gRPC health service says SERVING.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use berth_proto::v1::admin_service_client::AdminServiceClient;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use tonic::transport::{Channel, Endpoint};

use crate::process::{ManagedProcess, ProcessSpec, free_port, wait_until};

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
}

impl BerthProcess {
    /// Starts `berth <args> --listen 127.0.0.1:<free port>` and waits until it serves.
    pub async fn start(name: &str, args: Vec<String>) -> anyhow::Result<Self> {
        Self::start_with_log(name, args, DEFAULT_LOG_FILTER).await
    }

    /// [`BerthProcess::start`] with `RUST_LOG=<log_filter>` (benchmarks log less).
    pub async fn start_with_log(name: &str, args: Vec<String>, log_filter: &str) -> anyhow::Result<Self> {
        let started = Self::spawn(name, args, log_filter)?;
        started.wait_serving().await?;
        Ok(started)
    }

    /// Starts `berth <args> --listen 127.0.0.1:<free port>` without waiting for it to serve
    /// (for callers that time the start-up themselves; see [`BerthProcess::wait_serving`]).
    pub fn spawn(name: &str, args: Vec<String>, log_filter: &str) -> anyhow::Result<Self> {
        let port = free_port()?;
        let mut all = args;
        all.push("--listen".into());
        all.push(format!("127.0.0.1:{port}"));
        let spec = ProcessSpec::new(name, berth_binary()).args(all).env("RUST_LOG", log_filter);
        let process = ManagedProcess::spawn(spec)?;
        let endpoint = format!("http://127.0.0.1:{port}");
        Ok(Self { process, endpoint })
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

    pub fn workspace_client(&self) -> WorkspaceServiceClient<Channel> {
        WorkspaceServiceClient::new(channel(&self.endpoint)).max_decoding_message_size(64 * 1024 * 1024)
    }

    pub fn admin_client(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::new(channel(&self.endpoint))
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
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

/// Starts `berth up` on a free port with `data_dir` and extra flags.
pub async fn start_up(data_dir: &Path, extra: &[&str]) -> anyhow::Result<BerthProcess> {
    let mut args = vec!["up".to_owned(), "--data-dir".to_owned(), data_dir.display().to_string()];
    args.extend(extra.iter().map(|flag| (*flag).to_owned()));
    BerthProcess::start("up", args).await.context("berth up")
}
