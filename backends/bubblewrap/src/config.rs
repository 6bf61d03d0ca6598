//! Settings of the bubblewrap backend, fixed for the life of a driver.

use std::path::PathBuf;
use std::time::Duration;

use super::cgroup::CgroupPolicy;
use super::identity::{DEFAULT_UID_RANGE, UidRange};
use berth_backend_host::netns::SandboxNetConfig;
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::spec::WorkspaceSpec;

/// Where processes see the workspace root unless configured otherwise.
pub const DEFAULT_WORKSPACE_DIR: &str = "/workspace";
/// The uid/gid a process sees for itself inside the sandbox. Not 65534: in a user namespace
/// every unmapped host owner shows as the overflow id 65534.
pub const SANDBOX_INNER_ID: u32 = 1000;
/// Size of the private `/tmp` and `/dev/shm` of one exec (each).
pub const DEFAULT_TMP_SIZE_BYTES: u64 = 512 * 1024 * 1024;
/// Process limit when the spec says 0: stops a fork bomb, roomy for builds.
pub const DEFAULT_PIDS: u32 = 512;
/// How long an idle supervisor lives on ([`BubblewrapConfig::supervisor_idle`]).
pub const DEFAULT_SUPERVISOR_IDLE: Duration = Duration::from_secs(30);

/// Host directories bound read-only at the same path, when present. A directory that is a
/// symlink on the host (merged /usr: `/bin -> usr/bin`) becomes the same symlink inside.
pub const DEFAULT_SYSTEM_DIRS: &[&str] = &["/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"];

/// Entries of the host `/etc` bound read-only, when present. An allowlist, not all of
/// `/etc`: host configuration (service configs, tokens of the node agent, ssh keys, the
/// machine id) stays invisible. What is here is what ordinary tools need: the dynamic
/// linker cache, Debian alternatives (`awk`, `editor`…), TLS trust, name resolution,
/// time zone, and `passwd`/`group` (world-readable on the host anyway; tools such as
/// `whoami`, `ssh` and Python's `pwd` look users up there).
pub const DEFAULT_ETC_ENTRIES: &[&str] = &[
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "alternatives",
    "ssl",
    "ca-certificates",
    "ca-certificates.conf",
    "pki",
    "crypto-policies",
    "resolv.conf",
    "hosts",
    "nsswitch.conf",
    "host.conf",
    "gai.conf",
    "services",
    "protocols",
    "localtime",
    "timezone",
    "passwd",
    "group",
    "os-release",
    "debian_version",
    "mime.types",
    "magic",
    "magic.mime",
];

/// Configuration of [`super::BubblewrapDriver`]. `Default` gives a working setup on a
/// Debian/Ubuntu host with `bubblewrap` and `util-linux` installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BubblewrapConfig {
    /// The `bwrap` binary (bubblewrap ≥ 0.8: `--size`, `--disable-userns`).
    pub bwrap_path: PathBuf,
    /// util-linux `prlimit`, run *inside* the sandbox to set the resource limits right
    /// before the command, so it must be visible there (under one of `system_dirs`).
    pub prlimit_path: PathBuf,
    /// util-linux `setsid`, run on the host in front of `bwrap` (see the module docs).
    pub setsid_path: PathBuf,
    /// util-linux `setpriv`, run on the host by root to drop to the workspace's uid right
    /// before `bwrap` (see [`super::launch`]).
    pub setpriv_path: PathBuf,
    /// Host uids (and gids) of sandboxes when the node agent runs as root: two per
    /// workspace ([`super::identity`]). Never 0: `RLIMIT_NPROC` is not enforced for host
    /// uid 0, and a root-owned sandbox could read root-only files in the mounted system
    /// dirs. Ignored when the agent is not root (sandboxes then run as the agent's user).
    pub sandbox_uid_range: UidRange,
    /// Host directories bound read-only (see [`DEFAULT_SYSTEM_DIRS`]).
    pub system_dirs: Vec<PathBuf>,
    /// Names under the host `/etc` bound read-only (see [`DEFAULT_ETC_ENTRIES`]).
    pub etc_entries: Vec<String>,
    /// Absolute path at which processes see the workspace root; also their `HOME`.
    pub workspace_dir: String,
    /// Further host paths bound into every sandbox of this driver (shared read-only
    /// toolchains or caches), mounted before the workspace.
    pub extra_binds: Vec<ExtraBind>,
    /// Size cap of the private `/tmp` and of `/dev/shm` (tmpfs: it is memory, and not
    /// counted by `RLIMIT_AS`).
    pub tmp_size_bytes: u64,
    /// Host name inside the sandbox (the node's own name is not shown).
    pub hostname: String,
    /// Limits used where a workspace spec says 0.
    pub default_limits: ResourceLimits,
    /// Tools and address policy of networked workspaces (see [`super::network`]).
    pub network: SandboxNetConfig,
    /// Whether memory, CPU and process count are limited per workspace by a cgroup
    /// ([`super::cgroup`]); without one, memory is `RLIMIT_AS` per process and CPU share
    /// is not limited.
    pub cgroups: CgroupPolicy,
    /// Whether agent processes are started by the workspace's resident supervisor
    /// ([`super::supervised`]): one sandbox per workspace, built on its first exec, that
    /// forks each command inside (about the cost of a plain spawn). `false`: every spawn
    /// builds a fresh sandbox (`--no-supervisor` of the node agent).
    pub supervisor: bool,
    /// How long a supervisor with no running command waits before it exits (the next
    /// spawn starts a fresh one).
    pub supervisor_idle: Duration,
}

impl Default for BubblewrapConfig {
    fn default() -> Self {
        Self {
            bwrap_path: PathBuf::from("/usr/bin/bwrap"),
            prlimit_path: PathBuf::from("/usr/bin/prlimit"),
            setsid_path: PathBuf::from("/usr/bin/setsid"),
            setpriv_path: PathBuf::from("/usr/bin/setpriv"),
            sandbox_uid_range: DEFAULT_UID_RANGE,
            system_dirs: DEFAULT_SYSTEM_DIRS.iter().map(PathBuf::from).collect(),
            etc_entries: DEFAULT_ETC_ENTRIES.iter().map(|entry| (*entry).to_owned()).collect(),
            workspace_dir: DEFAULT_WORKSPACE_DIR.to_owned(),
            extra_binds: Vec::new(),
            tmp_size_bytes: DEFAULT_TMP_SIZE_BYTES,
            hostname: "workspace".to_owned(),
            default_limits: ResourceLimits::default(),
            network: SandboxNetConfig::default(),
            cgroups: CgroupPolicy::default(),
            supervisor: true,
            supervisor_idle: DEFAULT_SUPERVISOR_IDLE,
        }
    }
}

/// A host path bound into every sandbox.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExtraBind {
    pub host_path: PathBuf,
    /// Absolute path inside the sandbox.
    pub sandbox_path: String,
    pub writable: bool,
}

/// Per-process resource limits (`setrlimit`); `None` is unlimited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ResourceLimits {
    /// `RLIMIT_AS`: address space of each process, in bytes.
    pub memory_bytes: Option<u64>,
    /// `RLIMIT_NPROC`: processes and threads of the sandbox together (including bwrap's
    /// own init, which is pid 1 inside).
    pub pids: Option<u32>,
    /// `RLIMIT_FSIZE`: largest file a process may write, in bytes.
    pub file_size_bytes: Option<u64>,
    /// `RLIMIT_CPU`: CPU seconds of each process (SIGXCPU, then SIGKILL a second later).
    pub cpu_time_secs: Option<u32>,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        Self { memory_bytes: None, pids: Some(DEFAULT_PIDS), file_size_bytes: None, cpu_time_secs: None }
    }
}

impl ResourceLimits {
    /// The spec's limits, falling back to `self` (the node defaults) where the spec says 0.
    pub fn for_spec(&self, spec: &WorkspaceSpec) -> Self {
        let nonzero_u64 = |value: u64| (value > 0).then_some(value);
        let nonzero_u32 = |value: u32| (value > 0).then_some(value);
        Self {
            memory_bytes: nonzero_u64(spec.memory_bytes).or(self.memory_bytes),
            pids: nonzero_u32(spec.pids).or(self.pids),
            file_size_bytes: nonzero_u64(spec.file_size_bytes).or(self.file_size_bytes),
            cpu_time_secs: nonzero_u32(spec.cpu_time_secs).or(self.cpu_time_secs),
        }
    }

    /// The same limits as `setrlimit` calls (what the supervisor applies); in step with
    /// [`Self::prlimit_args`].
    pub fn rlimits(&self) -> Vec<berth_supervisor::wire::Rlimit> {
        use berth_supervisor::wire::{RLIMIT_AS, RLIMIT_CPU, RLIMIT_FSIZE, RLIMIT_NPROC, Rlimit};
        let mut limits = Vec::new();
        let both = |resource, value| Rlimit { resource, soft: value, hard: value };
        if let Some(bytes) = self.memory_bytes {
            limits.push(both(RLIMIT_AS, bytes));
        }
        if let Some(pids) = self.pids {
            limits.push(both(RLIMIT_NPROC, u64::from(pids)));
        }
        if let Some(bytes) = self.file_size_bytes {
            limits.push(both(RLIMIT_FSIZE, bytes));
        }
        if let Some(secs) = self.cpu_time_secs {
            limits.push(Rlimit { resource: RLIMIT_CPU, soft: u64::from(secs), hard: u64::from(secs) + 1 });
        }
        limits
    }

    /// The options for util-linux `prlimit`; empty when nothing is limited.
    pub fn prlimit_args(&self) -> Vec<String> {
        let mut args = Vec::new();
        if let Some(bytes) = self.memory_bytes {
            args.push(format!("--as={bytes}"));
        }
        if let Some(pids) = self.pids {
            args.push(format!("--nproc={pids}"));
        }
        if let Some(bytes) = self.file_size_bytes {
            args.push(format!("--fsize={bytes}"));
        }
        if let Some(secs) = self.cpu_time_secs {
            // Soft limit first: SIGXCPU names the cause in the exit status; the hard limit a
            // second later kills a process that ignores it.
            args.push(format!("--cpu={secs}:{}", u64::from(secs) + 1));
        }
        args
    }
}

impl BubblewrapConfig {
    /// Checks what can be checked without touching the host.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| WorkspaceError::InvalidArgument(format!("bubblewrap config: {reason}"));
        self.sandbox_uid_range.validate().map_err(invalid)?;
        if !is_clean_absolute(&self.workspace_dir) || self.workspace_dir == "/" {
            return Err(invalid(format!(
                "workspace_dir {:?} must be an absolute path below /, without . or ..",
                self.workspace_dir
            )));
        }
        for bind in &self.extra_binds {
            if !is_clean_absolute(&bind.sandbox_path) || !bind.host_path.is_absolute() {
                return Err(invalid(format!(
                    "extra bind {:?} -> {:?} needs absolute paths without . or ..",
                    bind.host_path, bind.sandbox_path
                )));
            }
        }
        for entry in &self.etc_entries {
            if entry.is_empty() || entry.contains('/') || entry == "." || entry == ".." {
                return Err(invalid(format!("etc entry {entry:?} must be a single name")));
            }
        }
        for dir in &self.system_dirs {
            if !dir.is_absolute() {
                return Err(invalid(format!("system dir {dir:?} must be absolute")));
            }
        }
        if self.supervisor_idle.is_zero() {
            return Err(invalid("supervisor_idle must be positive".into()));
        }
        if self.tmp_size_bytes == 0 {
            return Err(invalid("tmp_size_bytes must be positive".into()));
        }
        let hostname_ok = !self.hostname.is_empty()
            && self.hostname.len() <= 64
            && self.hostname.bytes().all(|byte| byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'.');
        if !hostname_ok {
            return Err(invalid(format!("hostname {:?} is not a valid host name", self.hostname)));
        }
        Ok(())
    }
}

/// `/a/b`: absolute, no empty, `.` or `..` components, no trailing slash.
fn is_clean_absolute(path: &str) -> bool {
    let Some(rest) = path.strip_prefix('/') else {
        return false;
    };
    rest.is_empty() || rest.split('/').all(|component| !component.is_empty() && component != "." && component != "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_zero_means_node_default() {
        let defaults = ResourceLimits::default();
        let spec = WorkspaceSpec { memory_bytes: 64 << 20, cpu_time_secs: 5, ..WorkspaceSpec::default() };
        let limits = defaults.for_spec(&spec);
        assert_eq!(limits.memory_bytes, Some(64 << 20));
        assert_eq!(limits.pids, Some(DEFAULT_PIDS));
        assert_eq!(limits.file_size_bytes, None);
        assert_eq!(limits.prlimit_args(), ["--as=67108864", "--nproc=512", "--cpu=5:6"]);
        let unlimited = ResourceLimits { pids: None, ..ResourceLimits::default() };
        assert!(unlimited.for_spec(&WorkspaceSpec::default()).prlimit_args().is_empty());
    }

    #[test]
    fn validation() {
        BubblewrapConfig::default().validate().unwrap();
        for broken in [
            BubblewrapConfig { sandbox_uid_range: UidRange { first: 0, last: 9 }, ..BubblewrapConfig::default() },
            BubblewrapConfig { workspace_dir: "/a/../b".into(), ..BubblewrapConfig::default() },
            BubblewrapConfig { workspace_dir: "/".into(), ..BubblewrapConfig::default() },
            BubblewrapConfig { etc_entries: vec!["../shadow".into()], ..BubblewrapConfig::default() },
            BubblewrapConfig { hostname: "bad name".into(), ..BubblewrapConfig::default() },
        ] {
            assert!(broken.validate().is_err(), "{broken:?} accepted");
        }
    }
}
