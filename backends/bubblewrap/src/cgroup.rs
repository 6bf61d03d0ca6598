//! One cgroup per workspace: memory, CPU and process limits that hold for the workspace as
//! a whole (every exec, every child, the tmpfs pages they write), unlike the per-process
//! `RLIMIT_AS` / `RLIMIT_NPROC` of `prlimit`.
//!
//! # Where the cgroups live
//!
//! Under the node agent's own cgroup (read from `/proc/self/cgroup`), in a child named
//! [`CgroupSettings::name`] (`berth-sandboxes`), one directory per workspace, so a node
//! agent in a container or a systemd unit never places sandboxes outside its own limits.
//! cgroup v1 (one hierarchy per controller: `memory`, `cpu`, `pids`) and v2 (the unified
//! hierarchy) are both supported; a hybrid host uses v1 for the controllers mounted there.
//! On v2 the parent must be delegated: its `cgroup.subtree_control` must accept
//! `+memory +cpu +pids`, which the kernel refuses for a cgroup that holds processes itself
//! (the "no internal processes" rule). Give the node agent a delegated cgroup
//! (`--sandbox-cgroup-parent`, e.g. a systemd unit with `Delegate=yes` whose main process
//! lives in a child) when its own cgroup cannot be used.
//!
//! # Joining without a race
//!
//! A process must be in the cgroup before the command runs, or a fork could escape. The
//! host-side launch chain therefore starts with [`WorkspaceCgroup::join_prefix`]: a fixed
//! `sh` script that writes its own pid into every `cgroup.procs` file and then `exec`s the
//! rest of the chain, so bwrap and everything below it are born inside. It runs as root
//! with a fixed environment; nothing of the caller reaches it.
//!
//! Blocking: every function here does file I/O; call it on the blocking pool.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use berth_workspace::error::{Result, WorkspaceError};

/// The shell that joins the cgroup (`/bin/sh` exists on every host bwrap runs on).
pub const JOIN_SHELL: &str = "/bin/sh";
/// Writes `$$` into each file argument up to `--`, then execs the rest. `set -e`: a failed
/// write stops the chain (the exec fails) rather than running the command unconfined.
const JOIN_SCRIPT: &str = r#"set -e; while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; exec "$@""#;
/// Name of the join script's `$0` (shows in `ps` for the instant before the exec).
const JOIN_NAME: &str = "berth-cgroup-join";
/// CFS period used for the CPU quota (100 ms, the kernel default).
const CPU_PERIOD_US: u64 = 100_000;
/// How long [`WorkspaceCgroup::remove`] waits for killed processes to leave.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(5);

/// Whether cgroups are used.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CgroupMode {
    /// Use them when a writable hierarchy is found; otherwise warn once at start and keep
    /// the per-process rlimits only.
    #[default]
    Auto,
    /// Refuse to start without them.
    Required,
    /// Never (per-process rlimits only).
    Off,
}

impl std::str::FromStr for CgroupMode {
    type Err = String;
    fn from_str(text: &str) -> std::result::Result<Self, String> {
        match text {
            "auto" => Ok(Self::Auto),
            "required" => Ok(Self::Required),
            "off" => Ok(Self::Off),
            other => Err(format!("cgroup mode {other:?} is not one of auto, required, off")),
        }
    }
}

/// Cgroup settings of a driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CgroupSettings {
    pub mode: CgroupMode,
    /// A delegated cgroup to create workspace cgroups in, as a path inside the hierarchy
    /// (`/system.slice/berth.service/sandboxes`); `None`: the agent's own cgroup.
    pub parent: Option<String>,
    /// Name of the directory under the parent that holds the workspace cgroups.
    pub name: String,
}

impl Default for CgroupSettings {
    fn default() -> Self {
        Self { mode: CgroupMode::Auto, parent: None, name: "berth-sandboxes".into() }
    }
}

/// What one workspace's cgroup enforces; 0 means no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    pub memory_bytes: u64,
    /// CPU in thousandths of a core (1000 = one core).
    pub cpu_millis: u64,
    pub pids: u64,
}

/// The hierarchy found at start: where workspace cgroups are created.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Layout {
    /// One parent directory per controller; a controller that is not mounted is `None`.
    V1 { memory: Option<PathBuf>, cpu: Option<PathBuf>, pids: Option<PathBuf> },
    /// One parent directory with the controllers enabled for its children.
    V2 { parent: PathBuf },
}

/// The cgroup hierarchy of a driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroups {
    layout: Layout,
}

fn unavailable(reason: String) -> WorkspaceError {
    WorkspaceError::BackendUnavailable { backend: "bubblewrap", reason }
}

fn io_error(op: &'static str, path: &Path, error: io::Error) -> WorkspaceError {
    WorkspaceError::from_io(op, &path.display().to_string(), error)
}

impl Cgroups {
    /// Finds a writable hierarchy for `settings`. `Ok(None)`: mode `off`, or mode `auto`
    /// and none usable (logged with the reason); mode `required` fails instead.
    pub fn detect(settings: &CgroupSettings) -> Result<Option<Self>> {
        if settings.mode == CgroupMode::Off {
            return Ok(None);
        }
        let found = read_to_string(Path::new("/proc/self/mountinfo")).and_then(|mountinfo| {
            let membership = read_to_string(Path::new("/proc/self/cgroup"))?;
            Self::from_tables(&mountinfo, &membership, settings)
        });
        let found = found.and_then(|cgroups| cgroups.prepare().map(|()| cgroups));
        match (found, settings.mode) {
            (Ok(cgroups), _) => Ok(Some(cgroups)),
            (Err(error), CgroupMode::Required) => Err(unavailable(format!(
                "no usable cgroup hierarchy for sandbox limits ({error}); \
                 give the node agent a delegated cgroup (--sandbox-cgroup-parent) or run with \
                 --sandbox-cgroups auto|off"
            ))),
            (Err(error), _) => {
                tracing::warn!(
                    %error,
                    "no usable cgroup hierarchy: bubblewrap limits are per process only (RLIMIT_AS, RLIMIT_NPROC)"
                );
                Ok(None)
            }
        }
    }

    /// `v1` or `v2`, for logs and status.
    pub fn version(&self) -> &'static str {
        match self.layout {
            Layout::V1 { .. } => "v1",
            Layout::V2 { .. } => "v2",
        }
    }

    /// Picks the hierarchy from `/proc/self/mountinfo` and `/proc/self/cgroup` (pure, so
    /// it is tested on recorded tables).
    fn from_tables(mountinfo: &str, membership: &str, settings: &CgroupSettings) -> Result<Self> {
        let mounts = parse_mounts(mountinfo);
        let own = |controller: Option<&str>| -> Option<PathBuf> {
            let mount = mounts.iter().find(|mount| match controller {
                Some(name) => mount.v1_controllers.iter().any(|each| each == name),
                None => mount.unified,
            })?;
            let inside = match &settings.parent {
                Some(parent) => parent.clone(),
                None => own_path(membership, controller)?,
            };
            let relative = inside.strip_prefix(&mount.root).unwrap_or(&inside).trim_start_matches('/').to_owned();
            Some(mount.point.join(relative).join(&settings.name))
        };
        let (memory, cpu, pids) = (own(Some("memory")), own(Some("cpu")), own(Some("pids")));
        if memory.is_some() || cpu.is_some() || pids.is_some() {
            return Ok(Self { layout: Layout::V1 { memory, cpu, pids } });
        }
        match own(None) {
            Some(parent) => Ok(Self { layout: Layout::V2 { parent } }),
            None => Err(unavailable("no cgroup v1 memory/cpu/pids mount and no cgroup v2 mount".into())),
        }
    }

    /// Creates the parent directories and, on v2, enables the controllers for children.
    fn prepare(&self) -> Result<()> {
        match &self.layout {
            Layout::V1 { memory, cpu, pids } => {
                for dir in [memory, cpu, pids].into_iter().flatten() {
                    create_dir(dir)?;
                }
            }
            Layout::V2 { parent } => {
                create_dir(parent)?;
                let available = read_to_string(&parent.join("cgroup.controllers"))?;
                let wanted: Vec<&str> = ["memory", "cpu", "pids"]
                    .into_iter()
                    .filter(|name| available.split_whitespace().any(|each| each == *name))
                    .collect();
                if wanted.is_empty() {
                    return Err(unavailable(format!(
                        "{} offers none of memory, cpu, pids (cgroup.controllers: {available:?})",
                        parent.display()
                    )));
                }
                let enable: Vec<String> = wanted.iter().map(|name| format!("+{name}")).collect();
                write(&parent.join("cgroup.subtree_control"), &enable.join(" "))?;
            }
        }
        Ok(())
    }

    /// Creates (or reuses) the cgroup named `key` with `limits`. `key` must be a plain
    /// name (a workspace id), never a path.
    pub fn create(&self, key: &str, limits: &CgroupLimits) -> Result<WorkspaceCgroup> {
        if key.is_empty()
            || key.starts_with('.')
            || !key.bytes().all(|byte| byte.is_ascii_alphanumeric() || b"-_.".contains(&byte))
        {
            return Err(WorkspaceError::InvalidArgument(format!("cgroup name {key:?} is not a plain name")));
        }
        let group = match &self.layout {
            Layout::V1 { memory, cpu, pids } => {
                let dirs: Vec<PathBuf> =
                    [memory, cpu, pids].into_iter().flatten().map(|parent| parent.join(key)).collect();
                for dir in &dirs {
                    create_dir(dir)?;
                }
                if let Some(dir) = memory.as_ref().map(|parent| parent.join(key)) {
                    let bytes =
                        if limits.memory_bytes == 0 { "-1".to_owned() } else { limits.memory_bytes.to_string() };
                    // Swap too, where the kernel accounts it: the limit must not spill to
                    // swap. The kernel keeps memory <= memory+swap at every step, so a
                    // raise writes memsw first and a cut writes memory first.
                    let memory_file = dir.join("memory.limit_in_bytes");
                    let memsw = dir.join("memory.memsw.limit_in_bytes");
                    if !memsw.exists() {
                        write(&memory_file, &bytes)?;
                    } else if write(&memory_file, &bytes).is_ok() {
                        write(&memsw, &bytes)?;
                    } else {
                        write(&memsw, &bytes)?;
                        write(&memory_file, &bytes)?;
                    }
                }
                if let Some(dir) = cpu.as_ref().map(|parent| parent.join(key)) {
                    write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
                    write(
                        &dir.join("cpu.cfs_quota_us"),
                        &cpu_quota(limits.cpu_millis).map_or("-1".into(), |quota| quota.to_string()),
                    )?;
                }
                if let Some(dir) = pids.as_ref().map(|parent| parent.join(key)) {
                    write(&dir.join("pids.max"), &max_or(limits.pids))?;
                }
                WorkspaceCgroup { dirs, v2: false }
            }
            Layout::V2 { parent } => {
                let dir = parent.join(key);
                create_dir(&dir)?;
                let controllers = read_to_string(&dir.join("cgroup.controllers"))?;
                let has = |name: &str| controllers.split_whitespace().any(|each| each == name);
                if has("memory") {
                    write(&dir.join("memory.max"), &max_or(limits.memory_bytes))?;
                    if dir.join("memory.swap.max").exists() {
                        write(&dir.join("memory.swap.max"), if limits.memory_bytes == 0 { "max" } else { "0" })?;
                    }
                }
                if has("cpu") {
                    let quota = cpu_quota(limits.cpu_millis).map_or("max".into(), |quota| quota.to_string());
                    write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
                }
                if has("pids") {
                    write(&dir.join("pids.max"), &max_or(limits.pids))?;
                }
                WorkspaceCgroup { dirs: vec![dir], v2: true }
            }
        };
        Ok(group)
    }
}

/// CFS quota in µs per [`CPU_PERIOD_US`] for `millis` thousandths of a core.
fn cpu_quota(millis: u64) -> Option<u64> {
    (millis > 0).then(|| (millis.saturating_mul(CPU_PERIOD_US) / 1000).max(1000))
}

fn max_or(value: u64) -> String {
    if value == 0 { "max".into() } else { value.to_string() }
}

/// The cgroup of one workspace (one directory per controller on v1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceCgroup {
    dirs: Vec<PathBuf>,
    v2: bool,
}

impl WorkspaceCgroup {
    /// The host programs that put the rest of the launch chain into this cgroup before it
    /// runs: `sh -c <join script> berth-cgroup-join <procs files…> --`.
    pub fn join_prefix(&self) -> Vec<OsString> {
        let mut prefix: Vec<OsString> = vec![JOIN_SHELL.into(), "-c".into(), JOIN_SCRIPT.into(), JOIN_NAME.into()];
        prefix.extend(self.dirs.iter().map(|dir| dir.join("cgroup.procs").into_os_string()));
        prefix.push("--".into());
        prefix
    }

    /// The directories (one per v1 controller, one on v2).
    pub fn dirs(&self) -> &[PathBuf] {
        &self.dirs
    }

    /// Pids in the cgroup (read from the first directory: on v1 every controller holds
    /// the same processes, since they joined all at once).
    pub fn pids(&self) -> Result<Vec<i32>> {
        let Some(dir) = self.dirs.first() else { return Ok(Vec::new()) };
        match fs::read_to_string(dir.join("cgroup.procs")) {
            Ok(text) => Ok(text.lines().filter_map(|line| line.trim().parse().ok()).collect()),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(error) => Err(io_error("read cgroup.procs", dir, error)),
        }
    }

    /// How many times the memory limit killed a process (v2 `memory.events` `oom_kill`,
    /// v1 `memory.oom_control` `oom_kill`); `None` when the kernel does not say.
    pub fn oom_kills(&self) -> Option<u64> {
        let file = if self.v2 { "memory.events" } else { "memory.oom_control" };
        self.dirs.iter().find_map(|dir| {
            let text = fs::read_to_string(dir.join(file)).ok()?;
            text.lines().find_map(|line| line.strip_prefix("oom_kill ")?.trim().parse().ok())
        })
    }

    /// Kills every process in the cgroup, waits until it is empty (bounded) and removes
    /// the directories. A missing cgroup is already removed.
    pub fn remove(&self) -> Result<()> {
        let deadline = Instant::now() + DRAIN_TIMEOUT;
        loop {
            let pids = self.pids()?;
            if pids.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                return Err(unavailable(format!(
                    "cgroup {} still holds {} process(es) after SIGKILL",
                    self.dirs[0].display(),
                    pids.len()
                )));
            }
            for pid in pids {
                // ESRCH: gone meanwhile, which is the point.
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        for dir in &self.dirs {
            match fs::remove_dir(dir) {
                Ok(()) => {}
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(io_error("remove cgroup", dir, error)),
            }
        }
        Ok(())
    }
}

/// A cgroup mount of `/proc/self/mountinfo`.
#[derive(Debug, PartialEq, Eq)]
struct CgroupMount {
    /// The path inside the hierarchy that is mounted (`/` unless in a cgroup namespace
    /// or a bind mount).
    root: String,
    point: PathBuf,
    v1_controllers: Vec<String>,
    unified: bool,
}

/// The cgroup mounts of a mountinfo table (fields: id parent dev root point opts … - type
/// source super-opts).
fn parse_mounts(mountinfo: &str) -> Vec<CgroupMount> {
    mountinfo
        .lines()
        .filter_map(|line| {
            let (before, after) = line.split_once(" - ")?;
            let fields: Vec<&str> = before.split(' ').collect();
            let mut tail = after.split(' ');
            let fstype = tail.next()?;
            let _source = tail.next()?;
            let super_options = tail.next().unwrap_or_default();
            let root = unescape(fields.get(3)?);
            let point = PathBuf::from(unescape(fields.get(4)?));
            match fstype {
                "cgroup2" => Some(CgroupMount { root, point, v1_controllers: Vec::new(), unified: true }),
                "cgroup" => Some(CgroupMount {
                    root,
                    point,
                    v1_controllers: super_options.split(',').map(str::to_owned).collect(),
                    unified: false,
                }),
                _ => None,
            }
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\'
            && index + 3 < bytes.len()
            && bytes[index + 1..index + 4].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let value = (bytes[index + 1] - b'0') * 64 + (bytes[index + 2] - b'0') * 8 + (bytes[index + 3] - b'0');
            out.push(value);
            index += 4;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// This process's path in the hierarchy of `controller` (`None`: the v2 line `0::`).
fn own_path(membership: &str, controller: Option<&str>) -> Option<String> {
    membership.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let _id = parts.next()?;
        let controllers = parts.next()?;
        let path = parts.next()?;
        let matches = match controller {
            Some(name) => controllers.split(',').any(|each| each == name),
            None => controllers.is_empty(),
        };
        matches.then(|| path.to_owned())
    })
}

fn read_to_string(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|error| io_error("read", path, error))
}

fn write(path: &Path, value: &str) -> Result<()> {
    fs::write(path, value).map_err(|error| io_error("write cgroup setting", path, error))
}

fn create_dir(dir: &Path) -> Result<()> {
    match fs::create_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(error) => Err(io_error("create cgroup", dir, error)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_MEMBERSHIP: &str = "8:pids:/\n4:memory:/agents/a1\n1:cpu:/\n0::/\n";

    #[test]
    fn hybrid_hosts_use_v1_under_the_agents_own_cgroup() {
        let cgroups = Cgroups::from_tables(HYBRID_MOUNTS, HYBRID_MEMBERSHIP, &CgroupSettings::default()).unwrap();
        assert_eq!(
            cgroups.layout,
            Layout::V1 {
                memory: Some("/sys/fs/cgroup/memory/agents/a1/berth-sandboxes".into()),
                cpu: Some("/sys/fs/cgroup/cpu/berth-sandboxes".into()),
                pids: Some("/sys/fs/cgroup/pids/berth-sandboxes".into()),
            }
        );
        assert_eq!(cgroups.version(), "v1");
    }

    #[test]
    fn unified_hosts_use_v2_and_a_configured_parent_wins() {
        let mounts = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let membership = "0::/system.slice/berth.service\n";
        let own = Cgroups::from_tables(mounts, membership, &CgroupSettings::default()).unwrap();
        assert_eq!(
            own.layout,
            Layout::V2 { parent: "/sys/fs/cgroup/system.slice/berth.service/berth-sandboxes".into() }
        );
        let settings = CgroupSettings { parent: Some("/berth.slice".into()), ..CgroupSettings::default() };
        let delegated = Cgroups::from_tables(mounts, membership, &settings).unwrap();
        assert_eq!(delegated.layout, Layout::V2 { parent: "/sys/fs/cgroup/berth.slice/berth-sandboxes".into() });
    }

    #[test]
    fn a_cgroup_namespace_root_is_stripped() {
        let mounts = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n";
        let membership = "4:memory:/docker/abc\n";
        let cgroups = Cgroups::from_tables(mounts, membership, &CgroupSettings::default()).unwrap();
        assert_eq!(
            cgroups.layout,
            Layout::V1 { memory: Some("/sys/fs/cgroup/memory/berth-sandboxes".into()), cpu: None, pids: None }
        );
    }

    #[test]
    fn no_cgroup_mount_is_an_error() {
        let error = Cgroups::from_tables("22 1 0:21 / /proc rw - proc proc rw\n", "", &CgroupSettings::default());
        assert!(error.is_err());
    }

    #[test]
    fn quotas_and_names() {
        assert_eq!(cpu_quota(0), None);
        assert_eq!(cpu_quota(500), Some(50_000));
        assert_eq!(cpu_quota(2000), Some(200_000));
        assert_eq!(cpu_quota(1), Some(1000), "the kernel refuses a quota under 1 ms");
        assert_eq!(unescape(r"/a\040b"), "/a b");
        let cgroups = Cgroups { layout: Layout::V2 { parent: "/nonexistent".into() } };
        for bad in ["", "..", "a/b", ".hidden", "a b"] {
            assert!(cgroups.create(bad, &CgroupLimits::default()).is_err(), "{bad:?} accepted");
        }
    }
}
