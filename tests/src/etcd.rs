//! Real etcd processes for cross-process tests: one member ([`EtcdProcess`]), a cluster
//! ([`EtcdCluster`]), and one lazily started process shared by a test binary ([`shared`]).
//!
//! Each etcd is a [`ManagedProcess`]: killed by PID on drop, and by its supervisor when
//! the test process dies, so no etcd outlives `cargo test`, even the shared one. A failed
//! start keeps the log (not the 100+ MB of preallocated WAL).
//!
//! A test that cannot start etcd fails loudly with the tail of etcd's log; it never skips.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow, bail};
use berth_control_plane::registry::etcd::{EtcdConfig, EtcdRegistry};

use crate::process::{ManagedProcess, ProcessSpec};

/// How long a fresh etcd (or cluster) may take to answer `/health`.
const READY_DEADLINE: Duration = Duration::from_secs(20);
/// Attempts with fresh ports when etcd dies at start (a port taken between our probe bind
/// and etcd's bind is the usual cause).
const START_ATTEMPTS: usize = 3;

/// The etcd binary: `$BERTH_ETCD_BIN`, else `/usr/bin/etcd`, else `etcd` on `PATH`.
pub fn etcd_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("BERTH_ETCD_BIN") {
        return PathBuf::from(path);
    }
    let packaged = Path::new("/usr/bin/etcd");
    if packaged.exists() {
        return packaged.to_path_buf();
    }
    PathBuf::from("etcd")
}

pub use crate::process::free_port;

/// Where one member listens and whom it starts a cluster with.
struct MemberSpec {
    binary: PathBuf,
    name: String,
    client_port: u16,
    peer_port: u16,
    initial_cluster: String,
    cluster_token: String,
}

impl MemberSpec {
    fn peer_url(name: &str, peer_port: u16) -> String {
        format!("{name}=http://127.0.0.1:{peer_port}")
    }

    fn args(&self, data_dir: &Path) -> Vec<String> {
        let client_url = format!("http://127.0.0.1:{}", self.client_port);
        let peer_url = format!("http://127.0.0.1:{}", self.peer_port);
        vec![
            format!("--name={}", self.name),
            format!("--data-dir={}", data_dir.display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster={}", self.initial_cluster),
            format!("--initial-cluster-token={}", self.cluster_token),
            "--initial-cluster-state=new".into(),
        ]
    }
}

/// One etcd process. Killed (SIGKILL by PID) on drop.
pub struct EtcdProcess {
    name: String,
    client_port: u16,
    process: ManagedProcess,
}

impl EtcdProcess {
    /// Starts a single-member etcd and waits until it is healthy; panics with the tail of
    /// its log otherwise.
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|error| panic!("etcd did not start: {error:#}"))
    }

    pub fn try_start() -> anyhow::Result<Self> {
        let mut last_error = None;
        for _ in 0..START_ATTEMPTS {
            let name = "berth-test".to_owned();
            let client_port = free_port()?;
            let peer_port = free_port()?;
            let spec = MemberSpec {
                binary: etcd_binary(),
                initial_cluster: MemberSpec::peer_url(&name, peer_port),
                cluster_token: format!("berth-{:x}", rand::random::<u64>()),
                name,
                client_port,
                peer_port,
            };
            let process = Self::spawn(&spec)?;
            match process.wait_ready(Instant::now() + READY_DEADLINE) {
                Ok(()) => return Ok(process),
                Err(error) => last_error = Some((process, error)),
            }
        }
        match last_error {
            // Keep the last attempt's log so the path in the error exists.
            Some((process, error)) => {
                process.keep_log();
                Err(error)
            }
            None => Err(anyhow!("no start attempt made")),
        }
    }

    /// Kills etcd and leaves its log on disk (the data directory, 100+ MB of preallocated
    /// WAL, goes).
    fn keep_log(self) {
        self.process.kill();
        let kept = self.process.keep_dir();
        let _ = std::fs::remove_dir_all(kept.join("data"));
    }

    fn spawn(spec: &MemberSpec) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("berth-etcd-").tempdir().context("create etcd temp dir")?;
        let data_dir = dir.path().join("data");
        let process_spec = ProcessSpec {
            env_remove_prefixes: vec!["ETCD_".into()],
            ..ProcessSpec::new(format!("etcd-{}", spec.name), &spec.binary).args(spec.args(&data_dir))
        };
        let process = ManagedProcess::spawn_in(process_spec, dir)?;
        Ok(Self { name: spec.name.clone(), client_port: spec.client_port, process })
    }

    /// Polls `/health` until it reports healthy (which needs a leader), etcd exits, or the
    /// deadline passes.
    fn wait_ready(&self, deadline: Instant) -> anyhow::Result<()> {
        loop {
            if !self.is_running() {
                bail!(
                    "etcd {} exited during start; log {}:\n{}",
                    self.name,
                    self.process.log_path().display(),
                    self.log_tail(30)
                );
            }
            if self.is_healthy() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "etcd {} not healthy after {READY_DEADLINE:?}; log {}:\n{}",
                    self.name,
                    self.process.log_path().display(),
                    self.log_tail(30)
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The client URL, e.g. `http://127.0.0.1:41234`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn log_path(&self) -> &Path {
        self.process.log_path()
    }

    /// The last `lines` lines of etcd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        self.process.log_tail(lines)
    }

    /// Whether etcd still runs.
    pub fn is_running(&self) -> bool {
        self.process.is_running()
    }

    /// SIGKILLs etcd by PID and waits until it is gone. Idempotent.
    pub fn kill(&self) {
        self.process.kill();
    }

    /// Sends `signal` to etcd by PID (SIGSTOP / SIGCONT pause and resume a member).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        self.process.signal(signal);
    }

    /// `GET /health` over plain HTTP on the client port; true when etcd reports healthy.
    pub fn is_healthy(&self) -> bool {
        http_request(self.client_port, "GET", "/health", "").is_ok_and(|body| body.contains(r#""health":"true""#))
    }

    /// The Prometheus text of `GET /metrics` on the client port (counters such as
    /// `etcd_mvcc_put_total`, `etcd_server_proposals_committed_total`).
    pub fn metrics(&self) -> anyhow::Result<String> {
        http_request(self.client_port, "GET", "/metrics", "")
    }

    /// This member's id and the leader's id as it sees them (`/v3/maintenance/status`).
    pub fn status(&self) -> anyhow::Result<MemberStatus> {
        let body = http_request(self.client_port, "POST", "/v3/maintenance/status", "{}")?;
        let json: serde_json::Value = serde_json::from_str(&body).with_context(|| format!("status body {body:?}"))?;
        let field = |value: &serde_json::Value| value.as_str().map(str::to_owned);
        Ok(MemberStatus {
            member_id: field(&json["header"]["member_id"]).ok_or_else(|| anyhow!("no member_id in {body}"))?,
            leader_id: field(&json["leader"]).ok_or_else(|| anyhow!("no leader in {body}"))?,
        })
    }
}

impl Drop for EtcdProcess {
    /// A failing test keeps its processes' directories for their logs; for etcd that would
    /// include 100+ MB of preallocated WAL per member, so the data directory goes (after
    /// etcd is dead) and the log stays.
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.process.kill();
            let _ = std::fs::remove_dir_all(self.process.dir().join("data"));
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub member_id: String,
    pub leader_id: String,
}

/// A minimal HTTP/1.1 exchange with etcd's client port (which also speaks HTTP/JSON) or a
/// Berth `/metrics` endpoint, so the harness needs no async runtime and works inside any
/// test.
pub fn http_request(port: u16, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
    let address = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut request = String::new();
    write!(
        request,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    stream.write_all(request.as_bytes())?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) =
        response.split_once("\r\n\r\n").ok_or_else(|| anyhow!("malformed HTTP response {response:?}"))?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!("{method} {path}: {head}");
    }
    let chunked = head.lines().any(|line| {
        line.split_once(':').is_some_and(|(name, value)| {
            name.trim().eq_ignore_ascii_case("transfer-encoding") && value.trim().eq_ignore_ascii_case("chunked")
        })
    });
    if chunked { dechunk(body) } else { Ok(body.to_owned()) }
}

/// Decodes an HTTP/1.1 chunked body (etcd streams `/metrics` that way).
fn dechunk(mut body: &str) -> anyhow::Result<String> {
    let mut decoded = String::with_capacity(body.len());
    loop {
        let (size_line, rest) = body.split_once("\r\n").ok_or_else(|| anyhow!("truncated chunked body"))?;
        let size_text = size_line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16).with_context(|| format!("chunk size {size_line:?}"))?;
        if size == 0 {
            return Ok(decoded);
        }
        let chunk = rest.get(..size).ok_or_else(|| anyhow!("chunk of {size} bytes is truncated"))?;
        decoded.push_str(chunk);
        body = rest.get(size..).unwrap_or_default().trim_start_matches("\r\n");
    }
}

/// A multi-member etcd cluster on loopback.
pub struct EtcdCluster {
    members: Vec<EtcdProcess>,
}

impl EtcdCluster {
    /// Starts `size` members and waits until every one is healthy; panics with their log
    /// tails otherwise.
    pub fn start(size: usize) -> Self {
        Self::try_start(size).unwrap_or_else(|error| panic!("etcd cluster did not start: {error:#}"))
    }

    /// Up to [`START_ATTEMPTS`] tries with fresh ports. A failed try that is followed by
    /// another goes entirely (its members' directories too: only the last failure's logs
    /// are kept, where the error points), so a retried start leaves nothing in the temp dir.
    pub fn try_start(size: usize) -> anyhow::Result<Self> {
        Self::try_start_with(size, &etcd_binary())
    }

    /// [`EtcdCluster::try_start`] with another etcd binary (the harness's own tests wrap
    /// etcd in a script that fails a start).
    pub fn try_start_with(size: usize, binary: &Path) -> anyhow::Result<Self> {
        for attempt in 1..=START_ATTEMPTS {
            match Self::start_once(size, binary) {
                Ok(cluster) => return Ok(cluster),
                Err((error, members)) if attempt == START_ATTEMPTS => {
                    // Keep every member's log; the one that failed may be a victim of another.
                    members.into_iter().for_each(EtcdProcess::keep_log);
                    return Err(error);
                }
                Err((error, members)) => {
                    eprintln!("etcd cluster start {attempt}/{START_ATTEMPTS} failed, retrying: {error:#}");
                    drop(members);
                }
            }
        }
        Err(anyhow!("no start attempt made"))
    }

    /// One try; on failure, the error and the members started so far (still running).
    fn start_once(size: usize, binary: &Path) -> Result<Self, (anyhow::Error, Vec<EtcdProcess>)> {
        let token = format!("berth-{:x}", rand::random::<u64>());
        let mut ports = Vec::with_capacity(size);
        for _ in 0..size {
            let client_port = free_port().map_err(|error| (error, Vec::new()))?;
            let peer_port = free_port().map_err(|error| (error, Vec::new()))?;
            ports.push((client_port, peer_port));
        }
        let names: Vec<String> = (0..size).map(|index| format!("member{index}")).collect();
        let initial_cluster = names
            .iter()
            .zip(&ports)
            .map(|(name, (_, peer_port))| MemberSpec::peer_url(name, *peer_port))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::with_capacity(size);
        for (name, (client_port, peer_port)) in names.into_iter().zip(ports) {
            let spec = MemberSpec {
                binary: binary.to_path_buf(),
                name,
                client_port,
                peer_port,
                initial_cluster: initial_cluster.clone(),
                cluster_token: token.clone(),
            };
            match EtcdProcess::spawn(&spec) {
                Ok(member) => members.push(member),
                Err(error) => return Err((error, members)),
            }
        }
        let deadline = Instant::now() + READY_DEADLINE;
        match members.iter().find_map(|member| member.wait_ready(deadline).err()) {
            Some(error) => Err((error, members)),
            None => Ok(Self { members }),
        }
    }

    pub fn members(&self) -> &[EtcdProcess] {
        &self.members
    }

    /// Client URLs of all members, dead ones included.
    pub fn endpoints(&self) -> Vec<String> {
        self.members.iter().map(EtcdProcess::endpoint).collect()
    }

    /// SIGKILLs member `index` and waits until it is gone.
    pub fn kill_member(&self, index: usize) {
        self.members[index].kill();
    }

    /// Waits until the live members agree on a leader and returns its index; panics after
    /// `deadline` with every member's log tail.
    pub fn wait_for_leader(&self, deadline: Duration) -> usize {
        let until = Instant::now() + deadline;
        loop {
            if let Some(leader) = self.leader_index() {
                return leader;
            }
            if Instant::now() >= until {
                let logs: String = self
                    .members
                    .iter()
                    .map(|member| format!("--- {}:\n{}\n", member.name(), member.log_tail(15)))
                    .collect();
                panic!("etcd members did not agree on a leader within {deadline:?}\n{logs}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The index of the member every live member agrees is leader, if they agree.
    pub fn leader_index(&self) -> Option<usize> {
        let statuses: Vec<MemberStatus> = self
            .members
            .iter()
            .filter(|member| member.is_running())
            .filter_map(|member| member.status().ok())
            .collect();
        let leader = &statuses.first()?.leader_id;
        if statuses.iter().any(|status| &status.leader_id != leader) {
            return None;
        }
        self.members.iter().position(|member| member.status().is_ok_and(|status| &status.member_id == leader))
    }
}

/// One etcd for the whole test binary, started on first use. Never dropped: the supervisor
/// kills it when the test process exits (see the module docs).
pub fn shared() -> &'static EtcdProcess {
    static SHARED: OnceLock<EtcdProcess> = OnceLock::new();
    SHARED.get_or_init(EtcdProcess::start)
}

/// A registry client for `endpoints` with test-friendly timeouts; panics if it cannot
/// connect.
pub async fn connect(endpoints: Vec<String>) -> Arc<EtcdRegistry> {
    let config = EtcdConfig { endpoints: endpoints.clone(), ..EtcdConfig::default() };
    match EtcdRegistry::connect(config).await {
        Ok(registry) => registry,
        Err(error) => panic!("cannot connect to etcd at {endpoints:?}: {error}"),
    }
}

/// A registry client on the shared etcd. Each test gets its own client, because a client
/// belongs to the runtime it was created on and every `#[tokio::test]` has its own runtime.
pub async fn shared_registry() -> Arc<EtcdRegistry> {
    let etcd = shared();
    let config = EtcdConfig::new([etcd.endpoint()]);
    match EtcdRegistry::connect(config).await {
        Ok(registry) => registry,
        Err(error) => panic!(
            "cannot connect to the shared etcd at {}: {error}; log {}:\n{}",
            etcd.endpoint(),
            etcd.log_path().display(),
            etcd.log_tail(30)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::dechunk;

    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(dechunk("5\r\nhello\r\n7;ext=1\r\n, world\r\n0\r\n\r\n").unwrap(), "hello, world");
        assert!(dechunk("5\r\nhel").is_err());
    }
}
