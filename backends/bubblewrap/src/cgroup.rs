//! One cgroup per workspace for memory, CPU and process count: limits that hold for the
//! workspace as a whole, where `RLIMIT_AS` only bounds each process's address space.
//!
//! Detected once per driver ([`Cgroups::detect`]): cgroup v2 when `/sys/fs/cgroup` is the
//! unified hierarchy (`cgroup.controllers` at its root), else v1 with the `memory`, `cpu`
//! and `pids` hierarchies mounted under it. The workspace cgroups go below the node
//! agent's *own* cgroup (from `/proc/self/cgroup`), in `berth/<workspace id>`, so whatever
//! limit the agent itself runs under still covers its sandboxes.
//!
//! Joining without a race: the host chain ([`super::launch`]) starts with a root shell
//! that writes its own pid into each `cgroup.procs` and then execs `setsid` (same pid), so
//! the process is in the cgroup before bwrap or the command exist, and all its
//! descendants are born there.
//!
//! Blocking (a few writes to cgroupfs): run on the blocking pool.

use std::io;
use std::path::{Path, PathBuf};

use berth_workspace::error::WorkspaceError;

/// The cgroup hierarchy root.
const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// CFS period the CPU quota is expressed in (100 ms, the kernel default).
const CPU_PERIOD_MICROS: u64 = 100_000;
/// Directory under the agent's own cgroup holding the workspace cgroups.
const PARENT_NAME: &str = "berth";
/// Age after which an empty workspace cgroup is someone's leftover.
const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

/// Whether the driver uses cgroups.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CgroupPolicy {
    /// Use them when the agent is root and they are writable; otherwise log a warning and
    /// keep the per-process rlimits only.
    #[default]
    Auto,
    /// Refuse to start without them.
    Required,
    /// Never: per-process rlimits only.
    Off,
}

impl CgroupPolicy {
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "auto" => Ok(Self::Auto),
            "required" => Ok(Self::Required),
            "off" => Ok(Self::Off),
            other => Err(format!("cgroups {other:?}: expected auto, required or off")),
        }
    }
}

/// What a workspace cgroup limits; `None` leaves a resource unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupLimits {
    pub memory_bytes: Option<u64>,
    /// 1000 = one CPU.
    pub cpu_millis: Option<u32>,
    pub pids: Option<u32>,
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("no usable cgroups: {reason}")]
    Unavailable { reason: String },
    #[error("cgroup {op} {path}: {source}")]
    Io { op: &'static str, path: String, source: io::Error },
}

impl From<CgroupError> for WorkspaceError {
    fn from(error: CgroupError) -> Self {
        match error {
            CgroupError::Unavailable { .. } => {
                WorkspaceError::BackendUnavailable { backend: "bubblewrap", reason: error.to_string() }
            }
            CgroupError::Io { op, path, source } => WorkspaceError::Io { op, path, source },
        }
    }
}

fn io_error(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> CgroupError {
    let path = path.display().to_string();
    move |source| CgroupError::Io { op, path, source }
}

/// The cgroup version found on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Layout {
    /// The `berth` directory of the unified hierarchy.
    V2 { parent: PathBuf },
    /// The `berth` directories in the memory, cpu and pids hierarchies.
    V1 { memory: PathBuf, cpu: PathBuf, pids: PathBuf },
}

/// The cgroups of one driver.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cgroups {
    layout: Layout,
}

/// One workspace's cgroup (one directory per v1 hierarchy).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkspaceCgroup {
    dirs: Vec<PathBuf>,
    limits: CgroupLimits,
    v2: bool,
}

impl Cgroups {
    /// Finds the hierarchy and prepares `berth/` under the agent's own cgroup, checking that
    /// it is writable and (v2) that the memory, cpu and pids controllers can be delegated.
    pub fn detect() -> Result<Self, CgroupError> {
        let root = Path::new(CGROUP_ROOT);
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .map_err(|error| CgroupError::Unavailable { reason: format!("cannot read /proc/self/cgroup: {error}") })?;
        let layout = if root.join("cgroup.controllers").exists() {
            let path = own_path(&own, |controllers| controllers.is_empty()).unwrap_or_default();
            let parent = root.join(path.trim_start_matches('/')).join(PARENT_NAME);
            Layout::V2 { parent }
        } else {
            let mut found = Vec::new();
            for controller in ["memory", "cpu", "pids"] {
                let mount = root.join(controller);
                if !mount.join("cgroup.procs").exists() {
                    return Err(CgroupError::Unavailable {
                        reason: format!("cgroup v1 without the {controller} hierarchy at {}", mount.display()),
                    });
                }
                let path = own_path(&own, |controllers| controllers.split(',').any(|name| name == controller))
                    .unwrap_or_default();
                found.push(mount.join(path.trim_start_matches('/')).join(PARENT_NAME));
            }
            let [memory, cpu, pids] = <[PathBuf; 3]>::try_from(found)
                .map_err(|_| CgroupError::Unavailable { reason: "cgroup v1 hierarchies".into() })?;
            Layout::V1 { memory, cpu, pids }
        };
        let cgroups = Self { layout };
        cgroups.prepare_parent()?;
        cgroups.sweep_stale();
        Ok(cgroups)
    }

    /// Removes workspace cgroups left empty for a while (by a handle that went away while
    /// its processes were still dying, or an agent that died). Recent ones are left alone:
    /// another driver on this host may be between creating and joining one.
    fn sweep_stale(&self) {
        let now = std::time::SystemTime::now();
        for parent in self.parents() {
            let Ok(entries) = std::fs::read_dir(parent) else { continue };
            for entry in entries.flatten() {
                let path = entry.path();
                let stale = entry
                    .metadata()
                    .and_then(|metadata| metadata.modified())
                    .is_ok_and(|modified| now.duration_since(modified).is_ok_and(|age| age > STALE_AFTER));
                if path.is_dir() && stale && pids_in(&path).is_empty() && std::fs::remove_dir(&path).is_ok() {
                    tracing::debug!(path = %path.display(), "removed a stale workspace cgroup");
                }
            }
        }
    }

    /// `v1` or `v2`, for logs.
    pub fn version(&self) -> &'static str {
        match self.layout {
            Layout::V2 { .. } => "v2",
            Layout::V1 { .. } => "v1",
        }
    }

    fn parents(&self) -> Vec<&Path> {
        match &self.layout {
            Layout::V2 { parent } => vec![parent],
            Layout::V1 { memory, cpu, pids } => vec![memory, cpu, pids],
        }
    }

    fn prepare_parent(&self) -> Result<(), CgroupError> {
        for parent in self.parents() {
            create_dir(parent).map_err(|error| CgroupError::Unavailable {
                reason: format!("cannot create {}: {error}", parent.display()),
            })?;
        }
        if let Layout::V2 { parent } = &self.layout {
            // The agent's own cgroup must hand the controllers down to `berth/`, and `berth/`
            // to the workspaces (no processes live in either, so this is allowed).
            let own = parent.parent().unwrap_or(parent);
            for dir in [own, parent.as_path()] {
                let control = dir.join("cgroup.subtree_control");
                std::fs::write(&control, "+memory +cpu +pids").map_err(|error| CgroupError::Unavailable {
                    reason: format!(
                        "cannot enable memory, cpu and pids in {} ({error}); run the node agent in a \
                         delegated cgroup (systemd: Delegate=yes) or use --sandbox-cgroups off",
                        control.display()
                    ),
                })?;
            }
        }
        Ok(())
    }

    /// The cgroup of `workspace_id` (not created yet: see [`WorkspaceCgroup::ensure`]).
    pub fn workspace(&self, workspace_id: &str, limits: CgroupLimits) -> WorkspaceCgroup {
        WorkspaceCgroup {
            dirs: self.parents().into_iter().map(|parent| parent.join(workspace_id)).collect(),
            limits,
            v2: matches!(self.layout, Layout::V2 { .. }),
        }
    }
}

/// The path of the agent's cgroup in the hierarchy whose controller list matches.
fn own_path(proc_self_cgroup: &str, matches: impl Fn(&str) -> bool) -> Option<String> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        matches(controllers).then(|| path.to_owned())
    })
}

fn create_dir(path: &Path) -> io::Result<()> {
    match std::fs::create_dir(path) {
        Err(error) if error.kind() == io::ErrorKind::AlreadyExists => Ok(()),
        other => other,
    }
}

impl WorkspaceCgroup {
    /// The `cgroup.procs` files a process writes its pid into to join.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|dir| dir.join("cgroup.procs")).collect()
    }

    /// Creates the cgroup if it is missing (writing its limits then). Cheap when it exists:
    /// called before every spawn, in case a release removed it while a handle lived on.
    pub fn ensure(&self) -> Result<(), CgroupError> {
        if self.dirs.iter().all(|dir| dir.is_dir()) {
            return Ok(());
        }
        self.apply()
    }

    /// Creates the cgroup if it is missing and writes every limit, including "unlimited"
    /// for one that has none: a workspace provisioned again (a node restart, a new
    /// generation) gets today's limits, not those its cgroup was made with. Idempotent.
    pub fn apply(&self) -> Result<(), CgroupError> {
        for dir in &self.dirs {
            create_dir(dir).map_err(io_error("create", dir))?;
        }
        let CgroupLimits { memory_bytes, cpu_millis, pids } = self.limits;
        // The kernel refuses a quota under 1 ms.
        let quota = cpu_millis.map(|millis| (u64::from(millis) * CPU_PERIOD_MICROS / 1000).max(1000));
        if self.v2 {
            let dir = &self.dirs[0];
            write(dir, "memory.max", &memory_bytes.map_or("max".into(), |bytes| bytes.to_string()))?;
            // No swap to spill into: the limit is the limit.
            write_if_present(dir, "memory.swap.max", if memory_bytes.is_some() { "0" } else { "max" })?;
            let quota = quota.map_or("max".into(), |quota| quota.to_string());
            write(dir, "cpu.max", &format!("{quota} {CPU_PERIOD_MICROS}"))?;
            write(dir, "pids.max", &pids.map_or("max".into(), |pids| pids.to_string()))?;
        } else {
            let (memory, cpu, pid_dir) = (&self.dirs[0], &self.dirs[1], &self.dirs[2]);
            let bytes = memory_bytes.map_or("-1".into(), |bytes| bytes.to_string());
            // The kernel keeps memory <= memory+swap at every step: a cut writes memory
            // first, a raise memory+swap first.
            if !memory.join("memory.memsw.limit_in_bytes").exists() {
                write(memory, "memory.limit_in_bytes", &bytes)?;
            } else if write(memory, "memory.limit_in_bytes", &bytes).is_ok() {
                write(memory, "memory.memsw.limit_in_bytes", &bytes)?;
            } else {
                write(memory, "memory.memsw.limit_in_bytes", &bytes)?;
                write(memory, "memory.limit_in_bytes", &bytes)?;
            }
            write(cpu, "cpu.cfs_period_us", &CPU_PERIOD_MICROS.to_string())?;
            write(cpu, "cpu.cfs_quota_us", &quota.map_or("-1".into(), |quota| quota.to_string()))?;
            write(pid_dir, "pids.max", &pids.map_or("max".into(), |pids| pids.to_string()))?;
        }
        Ok(())
    }

    /// Kills what is left in the cgroup and removes it, waiting up to `patience` for the
    /// kernel to let go of the dying processes. Missing is fine.
    pub fn remove(&self, patience: std::time::Duration) -> Result<(), CgroupError> {
        let deadline = std::time::Instant::now() + patience;
        for dir in &self.dirs {
            loop {
                for pid in pids_in(dir) {
                    // ESRCH (gone meanwhile) is what we want anyway.
                    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
                }
                match std::fs::remove_dir(dir) {
                    Ok(()) => break,
                    Err(error) if error.kind() == io::ErrorKind::NotFound => break,
                    Err(error) if std::time::Instant::now() < deadline => {
                        tracing::trace!(path = %dir.display(), %error, "cgroup still busy");
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    Err(error) => return Err(io_error("remove", dir)(error)),
                }
            }
        }
        Ok(())
    }

    /// Removes the cgroup if nothing runs in it any more; leaves it otherwise (best effort,
    /// for a handle going away without a release).
    pub fn remove_if_empty(&self) {
        for dir in &self.dirs {
            if let Err(error) = std::fs::remove_dir(dir)
                && error.kind() != io::ErrorKind::NotFound
            {
                tracing::debug!(path = %dir.display(), %error, "cgroup left in place");
            }
        }
    }

    /// Peak memory use so far (v1 `memory.max_usage_in_bytes`, v2 `memory.peak`), if known.
    pub fn memory_peak_bytes(&self) -> Option<u64> {
        let file = if self.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" };
        std::fs::read_to_string(self.dirs[0].join(file)).ok()?.trim().parse().ok()
    }
}

fn pids_in(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.trim().parse().ok())
        .collect()
}

fn write(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    let path = dir.join(file);
    std::fs::write(&path, value).map_err(io_error("write", &path))
}

fn write_if_present(dir: &Path, file: &str, value: &str) -> Result<(), CgroupError> {
    if dir.join(file).exists() { write(dir, file, value) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_paths_by_controller() {
        let text = "9:name=systemd:/\n4:memory:/jobs/a\n1:cpu,cpuacct:/c\n0::/unified/x\n";
        assert_eq!(own_path(text, |names| names.split(',').any(|name| name == "memory")).as_deref(), Some("/jobs/a"));
        assert_eq!(own_path(text, |names| names.split(',').any(|name| name == "cpu")).as_deref(), Some("/c"));
        assert_eq!(own_path(text, str::is_empty).as_deref(), Some("/unified/x"));
        assert_eq!(own_path(text, |names| names == "pids"), None);
    }

    #[test]
    fn policies_parse() {
        assert_eq!(CgroupPolicy::parse("auto"), Ok(CgroupPolicy::Auto));
        assert_eq!(CgroupPolicy::parse("off"), Ok(CgroupPolicy::Off));
        assert!(CgroupPolicy::parse("on").is_err());
    }
}
