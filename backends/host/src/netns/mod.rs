//! Network namespaces for networked sandboxes, shared by the bubblewrap and Docker backends.
//!
//! A workspace with `spec.network` never sees the host's network. It gets a namespace of its
//! own (`/run/netns/<name>`: a new one for bubblewrap, the container's own for Docker,
//! attached by pid), outbound access through pasta (a user-mode TCP/UDP stack: connections
//! leave from host sockets, so the namespace needs no route to the host), and policy-routing
//! rules ([`policy`]) that refuse host loopback (`--no-map-gw`: pasta does not map the
//! gateway to the host), every address of the host, private, link-local, CGNAT, multicast
//! and reserved ranges, and all of IPv6 (the namespace has IPv6 switched off), except what
//! the operator allows (`--sandbox-allow-cidr`) and DNS to the host's resolvers.
//!
//! The sandbox cannot change the rules: bubblewrap runs it in its own user namespace with
//! every capability dropped, Docker with `cap_drop: ALL`; the namespace belongs to the
//! host's user namespace, so neither holds `CAP_NET_ADMIN` over it.
//!
//! State on the host, per namespace: the bind mount `/run/netns/<name>`, pasta's pid file
//! `<state_dir>/<name>.pid` and `<state_dir>/<name>.owner` (whose namespace it is, so a
//! restarted agent can tear down what an earlier one built).

pub mod policy;

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::Command;
use tokio::sync::Mutex;

use berth_workspace::error::{Result, WorkspaceError};
pub use policy::{Cidr, CidrError};

/// Where `ip netns` keeps named namespaces.
pub const NETNS_DIR: &str = "/run/netns";
/// How long pasta may take to configure a namespace.
const PASTA_READY: Duration = Duration::from_secs(10);
/// How long pasta may take to exit after SIGTERM before it gets SIGKILL.
const PASTA_EXIT: Duration = Duration::from_secs(3);

/// Tools and policy of a node's networked sandboxes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxNetConfig {
    pub ip_path: PathBuf,
    pub pasta_path: PathBuf,
    pub nsenter_path: PathBuf,
    pub sysctl_path: PathBuf,
    /// pasta's pid files and the owner files.
    pub state_dir: PathBuf,
    /// Host resolv.conf: its non-loopback IPv4 nameservers stay reachable on port 53.
    pub resolv_conf: PathBuf,
    /// Ranges reachable although the default policy blocks them (`--sandbox-allow-cidr`).
    pub allow: Vec<Cidr>,
}

impl Default for SandboxNetConfig {
    fn default() -> Self {
        Self {
            ip_path: "/usr/sbin/ip".into(),
            pasta_path: "/usr/bin/pasta".into(),
            nsenter_path: "/usr/bin/nsenter".into(),
            sysctl_path: "/usr/sbin/sysctl".into(),
            state_dir: "/run/berth/netns".into(),
            resolv_conf: "/etc/resolv.conf".into(),
            allow: Vec::new(),
        }
    }
}

/// Which namespace to give a policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attach {
    /// A new, empty namespace (bubblewrap runs its sandboxes in it).
    Fresh,
    /// The namespace of a running process (a Docker container started with `--network none`).
    Process(u32),
}

/// Builds and tears down the namespaces of one driver. Calls are serialised: setting up
/// one takes a few tens of milliseconds, and two provisions of one workspace must not race.
#[derive(Debug)]
pub struct SandboxNetworks {
    config: SandboxNetConfig,
    backend: &'static str,
    serial: Mutex<()>,
}

impl SandboxNetworks {
    pub fn new(config: SandboxNetConfig, backend: &'static str) -> Self {
        Self { config, backend, serial: Mutex::new(()) }
    }

    pub fn config(&self) -> &SandboxNetConfig {
        &self.config
    }

    /// A valid namespace name for `key` (a workspace root, a container name): `berth-<kind>-`
    /// and 16 hex digits of a hash that is stable across builds and restarts (FNV-1a; std's
    /// hasher is not promised to be), so a restarted agent finds the namespace again.
    pub fn name_for(kind: &str, key: &[u8]) -> String {
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in key {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("berth-{kind}-{hash:016x}")
    }

    /// Path of the named namespace (what `nsenter --net=` and pasta take).
    pub fn path(name: &str) -> PathBuf {
        Path::new(NETNS_DIR).join(name)
    }

    /// Makes namespace `name` exist with pasta running and the current policy installed;
    /// returns its path. An existing one is kept when pasta still serves it (and, for
    /// [`Attach::Process`], it is that process's namespace); its rules are replaced without
    /// a moment of open access. Anything else under that name is torn down first.
    ///
    /// Errors: `BackendUnavailable` when the agent is not root or a tool is missing;
    /// `Backend` when a step fails (the half-built namespace is removed).
    pub async fn ensure(&self, name: &str, owner: &str, attach: Attach) -> Result<PathBuf> {
        self.check_name(name)?;
        if !nix::unistd::geteuid().is_root() {
            return Err(
                self.unavailable("networked sandboxes need a root node agent (network namespaces, pasta)".into())
            );
        }
        for (what, path) in [
            ("ip", &self.config.ip_path),
            ("pasta", &self.config.pasta_path),
            ("nsenter", &self.config.nsenter_path),
            ("sysctl", &self.config.sysctl_path),
        ] {
            if !path.is_file() {
                return Err(
                    self.unavailable(format!("{what} not found at {} (networked sandboxes need it)", path.display()))
                );
            }
        }
        let _serial = self.serial.lock().await;
        let path = Self::path(name);
        if path.exists() && self.pasta_pid(name).is_some() && same_namespace(&path, attach) {
            self.install_rules(name).await?;
            return Ok(path);
        }
        self.remove_locked(name).await?;
        match self.build(name, owner, attach).await {
            Ok(()) => Ok(path),
            Err(error) => {
                if let Err(cleanup) = self.remove_locked(name).await {
                    tracing::warn!(netns = name, error = %cleanup, "cannot remove a half-built sandbox namespace");
                }
                Err(error)
            }
        }
    }

    async fn build(&self, name: &str, owner: &str, attach: Attach) -> Result<()> {
        let path = Self::path(name);
        tokio::fs::create_dir_all(&self.config.state_dir)
            .await
            .map_err(|error| self.failed(format!("creating {}: {error}", self.config.state_dir.display())))?;
        tokio::fs::write(self.owner_file(name), owner)
            .await
            .map_err(|error| self.failed(format!("writing the owner of {name}: {error}")))?;
        match attach {
            Attach::Fresh => self.ip(&["netns", "add", name]).await?,
            Attach::Process(pid) => self.ip(&["netns", "attach", name, &pid.to_string()]).await?,
        }
        // Closed before anything can leave: the gate blocks all until the rules are in.
        self.close_gate(name).await?;
        self.ip(&["-n", name, "link", "set", "lo", "up"]).await?;
        let net = format!("--net={}", path.display());
        let sysctl = self.config.sysctl_path.to_string_lossy().into_owned();
        self.run(
            &self.config.nsenter_path,
            &[
                &net,
                "--",
                &sysctl,
                "-q",
                "-w",
                "net.ipv6.conf.all.disable_ipv6=1",
                "net.ipv6.conf.default.disable_ipv6=1",
            ],
        )
        .await?;
        let pid_file = self.pid_file(name);
        let pid_file = pid_file.to_string_lossy();
        let netns = path.to_string_lossy();
        // As root, this pasta must keep uid 0 (`--runas 0`) or it cannot join the namespace.
        // No port forwarding in either direction; IPv4 only; no host loopback via the gateway.
        self.run(
            &self.config.pasta_path,
            &[
                "--runas",
                "0",
                "--quiet",
                "--netns",
                &netns,
                "-4",
                "-t",
                "none",
                "-u",
                "none",
                "-T",
                "none",
                "-U",
                "none",
                "--no-map-gw",
                "--config-net",
                "-P",
                &pid_file,
            ],
        )
        .await?;
        let deadline = Instant::now() + PASTA_READY;
        loop {
            let routes = self.ip_output(&["-n", name, "route", "show", "default"]).await?;
            if self.pasta_pid(name).is_some() && !routes.trim().is_empty() {
                break;
            }
            if Instant::now() > deadline {
                return Err(self.failed(format!("pasta did not configure {name} within {PASTA_READY:?}")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.install_rules(name).await
    }

    /// The gate: every TCP, UDP and ICMP packet prohibited, whatever the other rules say.
    /// By protocol, not a bare `prohibit`: the kernel checks a new route's gateway with a
    /// rule lookup of protocol 0, and pasta must be able to add the default route while the
    /// gate is closed (a raw socket for other protocols needs `CAP_NET_RAW`, which no
    /// sandbox has, and pasta forwards nothing else).
    async fn close_gate(&self, name: &str) -> Result<()> {
        let gate = policy::GATE_PRIORITY.to_string();
        for protocol in ["tcp", "udp", "icmp"] {
            match self.ip(&["-n", name, "rule", "add", "prohibit", "ipproto", protocol, "priority", &gate]).await {
                Ok(()) => {}
                // Already closed (rules are being replaced on a running namespace).
                Err(error) if error.to_string().contains("File exists") => {}
                Err(error) => return Err(error),
            }
        }
        Ok(())
    }

    /// Deletes every rule of `name` at `priority` (one per `ip rule del`).
    async fn delete_rules(&self, family: &str, name: &str, priority: u32) {
        let priority = priority.to_string();
        for _ in 0..10_000 {
            if self.ip(&[family, "-n", name, "rule", "del", "priority", &priority]).await.is_err() {
                break;
            }
        }
    }

    /// Replaces the allow and block rules of `name`, the gate closed meanwhile.
    async fn install_rules(&self, name: &str) -> Result<()> {
        self.close_gate(name).await?;
        for family in ["-4", "-6"] {
            for priority in [policy::ALLOW_PRIORITY, policy::BLOCK_PRIORITY] {
                self.delete_rules(family, name, priority).await;
            }
        }
        let resolv_conf = tokio::fs::read_to_string(&self.config.resolv_conf).await.unwrap_or_default();
        let host_addresses = policy::addresses(&self.ip_output(&["-o", "addr", "show"]).await?);
        let rules = policy::rules(&self.config.allow, &policy::resolvers(&resolv_conf), &host_addresses);
        for (family, list) in [("-4", &rules.v4), ("-6", &rules.v6)] {
            for rule in list {
                let mut args = vec![family, "-n", name, "rule", "add"];
                args.extend(rule.iter().map(String::as_str));
                self.ip(&args).await?;
            }
        }
        self.delete_rules("-4", name, policy::GATE_PRIORITY).await;
        Ok(())
    }

    /// Tears down namespace `name`: stops its pasta, unmounts it, forgets its files.
    /// Nothing to do for a name that does not exist.
    pub async fn remove(&self, name: &str) -> Result<()> {
        self.check_name(name)?;
        let _serial = self.serial.lock().await;
        self.remove_locked(name).await
    }

    /// Tears down every namespace recorded with this owner (after an agent restart the
    /// driver may not know the names any more).
    pub async fn remove_owned(&self, owner: &str) -> Result<()> {
        for name in self.names_owned_by(owner).await {
            self.remove(&name).await?;
        }
        Ok(())
    }

    /// Names of the namespaces recorded with this owner.
    pub async fn names_owned_by(&self, owner: &str) -> Vec<String> {
        let mut names = Vec::new();
        let Ok(mut entries) = tokio::fs::read_dir(&self.config.state_dir).await else {
            return names;
        };
        while let Ok(Some(entry)) = entries.next_entry().await {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            let Some(name) = file_name.strip_suffix(".owner") else { continue };
            if tokio::fs::read_to_string(entry.path()).await.is_ok_and(|recorded| recorded == owner) {
                names.push(name.to_owned());
            }
        }
        names
    }

    async fn remove_locked(&self, name: &str) -> Result<()> {
        if let Some(pid) = self.pasta_pid(name) {
            stop(pid).await;
        }
        if Self::path(name).exists() {
            self.ip(&["netns", "delete", name]).await?;
        }
        for file in [self.pid_file(name), self.owner_file(name)] {
            match tokio::fs::remove_file(&file).await {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(self.failed(format!("removing {}: {error}", file.display()))),
            }
        }
        Ok(())
    }

    /// pasta's pid when its pid file names a live pasta process (not a recycled pid).
    pub fn pasta_pid(&self, name: &str) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.pid_file(name)).ok()?.trim().parse().ok()?;
        is_live_pasta(pid).then_some(pid)
    }

    fn pid_file(&self, name: &str) -> PathBuf {
        self.config.state_dir.join(format!("{name}.pid"))
    }

    fn owner_file(&self, name: &str) -> PathBuf {
        self.config.state_dir.join(format!("{name}.owner"))
    }

    fn check_name(&self, name: &str) -> Result<()> {
        let valid = !name.is_empty()
            && name.len() <= 64
            && name.starts_with("berth-")
            && name.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_');
        if valid { Ok(()) } else { Err(self.failed(format!("invalid sandbox namespace name {name:?}"))) }
    }

    async fn ip(&self, args: &[&str]) -> Result<()> {
        self.run(&self.config.ip_path, args).await
    }

    async fn ip_output(&self, args: &[&str]) -> Result<String> {
        let output = self
            .command(&self.config.ip_path, args)
            .output()
            .await
            .map_err(|error| self.unavailable(format!("cannot run {}: {error}", self.config.ip_path.display())))?;
        if !output.status.success() {
            return Err(self.failed(format!(
                "ip {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    async fn run(&self, program: &Path, args: &[&str]) -> Result<()> {
        let output = self
            .command(program, args)
            .output()
            .await
            .map_err(|error| self.unavailable(format!("cannot run {}: {error}", program.display())))?;
        if output.status.success() {
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        Err(self.failed(format!("{} {} failed: {}", program.display(), args.join(" "), stderr.trim())))
    }

    /// A host tool with a fixed environment: nothing of a caller reaches it.
    fn command(&self, program: &Path, args: &[&str]) -> Command {
        let mut command = Command::new(program);
        command
            .args(args)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }

    fn unavailable(&self, reason: String) -> WorkspaceError {
        WorkspaceError::BackendUnavailable { backend: self.backend, reason }
    }

    fn failed(&self, message: String) -> WorkspaceError {
        WorkspaceError::Backend { backend: self.backend, message: format!("sandbox network: {message}") }
    }
}

/// Whether `path` is the namespace `attach` asks for.
fn same_namespace(path: &Path, attach: Attach) -> bool {
    match attach {
        Attach::Fresh => true,
        Attach::Process(pid) => {
            let process = std::fs::metadata(format!("/proc/{pid}/ns/net"));
            let named = std::fs::metadata(path);
            matches!((process, named), (Ok(process), Ok(named)) if process.ino() == named.ino() && process.dev() == named.dev())
        }
    }
}

/// A running (not zombie) process whose command is pasta.
pub fn is_live_pasta(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // "<pid> (<comm>) <state> ...": comm may hold spaces, so split at the last ')'.
    let Some((head, tail)) = stat.rsplit_once(')') else {
        return false;
    };
    let comm = head.split_once('(').map(|(_, comm)| comm).unwrap_or_default();
    let state = tail.split_whitespace().next().unwrap_or_default();
    matches!(comm, "pasta" | "passt" | "pasta.avx2" | "passt.avx2") && state != "Z" && state != "X"
}

/// SIGTERM, then SIGKILL if pasta has not gone after [`PASTA_EXIT`].
async fn stop(pid: u32) {
    let Ok(raw) = i32::try_from(pid) else { return };
    let _ = kill(Pid::from_raw(raw), Signal::SIGTERM);
    let deadline = Instant::now() + PASTA_EXIT;
    while is_live_pasta(pid) {
        if Instant::now() > deadline {
            let _ = kill(Pid::from_raw(raw), Signal::SIGKILL);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
