//! Agent processes through the workspace's resident supervisor (crate `berth-supervisor`).
//!
//! One sandbox per workspace, built by the same host chain and the same bwrap options as a
//! per-exec sandbox (namespaces, mounts, uid, cgroup, network namespace), runs the
//! supervisor in place of a command; each spawn is then one message to it, and it forks
//! the command inside. What differs for the command, and why isolation does not:
//!
//! - **Same namespaces, uid, mounts, env, limits.** The supervisor forks the command in
//!   the sandbox bwrap built; the env is exactly the per-exec env ([`super::launch`]'s
//!   `PATH`, `HOME`, `LANG`, spec, exec), sent in the request, never in an argv; the
//!   rlimits are the prlimit options as `setrlimit` calls; `/tmp` and `/dev/shm` are
//!   fresh size-capped tmpfs per exec in a mount namespace of the exec's own (so `/tmp`
//!   is still private to one exec).
//! - **Capabilities.** The supervisor keeps `CAP_SYS_ADMIN` and `CAP_SETPCAP` *in the
//!   sandbox's user namespace* (for those tmpfs mounts and to empty the bounding set);
//!   the command drops the bounding, ambient, effective, permitted and inheritable sets
//!   before exec and runs with `NoNewPrivs`, exactly like bwrap's `--cap-drop ALL`. The
//!   supervisor and its shims are undumpable, so a command (same uid, no capabilities)
//!   cannot ptrace them or open their fds.
//! - **The socket.** A `socketpair`: no path on any file system, nothing to connect to.
//!   The node agent holds one end, the supervisor the other (inherited at fd 4; bwrap's
//!   pid 1 closes it, the supervisor marks it close-on-exec). Another workspace's
//!   commands live in another pid namespace and cannot see the process, let alone its fds.
//! - **Process trees.** Each exec gets a shim that is a child subreaper: when the command
//!   ends or is killed, its group and everything it left (even after `setsid`) is killed
//!   before the exit is reported, as when bwrap's init ended the sandbox.
//! - **What is shared now:** concurrent execs of one workspace share the pid namespace
//!   (they can see and signal each other, as in one container) and, without a cgroup, one
//!   `RLIMIT_NPROC` count. The boundary between workspaces is unchanged.
//!
//! Failure: a supervisor that dies (idle exit, SIGKILL, a command killing it) takes its
//! sandbox down; running execs get a typed error (`Backend`, never retried: the command may
//! have run), and the next spawn starts a fresh one.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{Seek as _, SeekFrom, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt as _;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{FcntlArg, SealFlag, fcntl};
use nix::sys::memfd::{MFdFlags, memfd_create};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt as _;
use tokio::net::UnixStream;
use tokio::process::Child;

use super::launch::Launcher;
use super::process::{LiveProcesses, kill_tree};
use berth_supervisor::wire::{self, Request};
use berth_supervisor::{client, node};
use berth_workspace::backend::Spawned;
use berth_workspace::error::{Result, WorkspaceError};

/// How long a fresh supervisor may take to say it is ready.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Spawns sent to a supervisor that turned out to be gone before it looked at them.
const SPAWN_ATTEMPTS: usize = 3;
/// Where bwrap finds the supervisor: its inherited memfd, through the sandbox's `/proc`.
const SUPERVISOR_PROGRAM: &str = "/proc/self/fd/5";
/// Bytes of a supervisor's stderr kept for an error message.
const STDERR_BYTES: usize = 2000;

/// The supervisor binary as a sealed memfd, made once per driver and passed to every
/// supervisor sandbox (nothing is written to any file system).
#[derive(Debug)]
pub struct SupervisorImage {
    memfd: OwnedFd,
}

impl SupervisorImage {
    pub fn new() -> Result<Self> {
        let failed =
            |source: std::io::Error| WorkspaceError::Io { op: "load sandbox supervisor", path: "memfd".into(), source };
        let fd = memfd_create(c"berth-supervisor", MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING)
            .map_err(|errno| failed(errno.into()))?;
        let mut file = std::fs::File::from(fd);
        file.write_all(berth_supervisor::BINARY).map_err(failed)?;
        file.seek(SeekFrom::Start(0)).map_err(failed)?;
        let seals = SealFlag::F_SEAL_WRITE | SealFlag::F_SEAL_GROW | SealFlag::F_SEAL_SHRINK | SealFlag::F_SEAL_SEAL;
        fcntl(&file, FcntlArg::F_ADD_SEALS(seals)).map_err(|errno| failed(errno.into()))?;
        Ok(Self { memfd: file.into() })
    }
}

/// A live supervisor: the control socket and the host chain's process (its pid leads the
/// sandbox's process group).
struct Running {
    control: Arc<UnixStream>,
    child: Child,
    group: Pid,
}

/// What starting a supervisor needs from the backend: the whole host command line (host
/// chain, bwrap options, program) and the sandbox env (empty: commands get theirs per
/// request).
pub struct StartLine {
    pub line: Vec<OsString>,
}

/// The supervisor of one workspace, started on first use.
pub struct Supervisor {
    running: tokio::sync::Mutex<Option<Running>>,
    /// The live supervisor's process group, for [`Self::kill`] (sync: `kill_all` and drop).
    group: std::sync::Mutex<Option<Pid>>,
    image: Arc<SupervisorImage>,
    launcher: Arc<Launcher>,
    idle: Duration,
    live: Arc<LiveProcesses>,
}

impl std::fmt::Debug for Supervisor {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Supervisor").field("idle", &self.idle).finish_non_exhaustive()
    }
}

impl Supervisor {
    pub(super) fn new(
        image: Arc<SupervisorImage>,
        launcher: Arc<Launcher>,
        idle: Duration,
        live: Arc<LiveProcesses>,
    ) -> Self {
        Self { running: tokio::sync::Mutex::new(None), group: std::sync::Mutex::new(None), image, launcher, idle, live }
    }

    /// The supervisor's arguments after bwrap's `--`.
    pub fn program_args(&self) -> Vec<OsString> {
        vec![SUPERVISOR_PROGRAM.into(), "--idle-ms".into(), self.idle.as_millis().to_string().into()]
    }

    /// Starts `request` in the sandbox (starting the supervisor first when none runs);
    /// `start` gives the host command line of a fresh supervisor sandbox.
    pub async fn spawn(&self, request: &Request, start: impl Fn() -> Result<StartLine>) -> Result<Spawned> {
        for _ in 0..SPAWN_ATTEMPTS {
            let control = self.control(&start).await?;
            match node::try_spawn(&control, request, "bubblewrap", self.live.clone()).await? {
                Some(spawned) => return Ok(spawned),
                // The supervisor went away before it looked at the request (idle exit,
                // killed): nothing ran; forget it and ask a fresh one.
                None => self.forget(&control).await,
            }
        }
        Err(unavailable("the sandbox supervisor went away before it could start the command, several times".into()))
    }

    /// The live supervisor's control socket, starting one when none runs.
    async fn control(&self, start: &impl Fn() -> Result<StartLine>) -> Result<Arc<UnixStream>> {
        let mut running = self.running.lock().await;
        if let Some(current) = running.as_mut() {
            match current.child.try_wait() {
                Ok(None) => return Ok(current.control.clone()),
                _ => {
                    tracing::debug!(group = %current.group, "sandbox supervisor gone; starting a fresh one");
                    *running = None;
                }
            }
        }
        let fresh = self.start(start()?).await?;
        let control = fresh.control.clone();
        *self.lock_group() = Some(fresh.group);
        *running = Some(fresh);
        Ok(control)
    }

    async fn start(&self, start: StartLine) -> Result<Running> {
        let (ours, theirs) = client::control_pair().map_err(|source| WorkspaceError::Io {
            op: "create the supervisor socket",
            path: "socketpair".into(),
            source,
        })?;
        let binary = self.image.memfd.try_clone().map_err(|source| WorkspaceError::Io {
            op: "pass the supervisor binary",
            path: "memfd".into(),
            source,
        })?;
        let mut child = self.launcher.start_with(
            start.line,
            &BTreeMap::new(),
            [Stdio::null(), Stdio::null(), Stdio::piped()],
            vec![(theirs, wire::CONTROL_FD), (binary, wire::BINARY_FD)],
        )?;
        let group = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .map(Pid::from_raw)
            .ok_or_else(|| unavailable("the supervisor sandbox exited at once".into()))?;
        let control = std::os::unix::net::UnixStream::from(ours);
        let control = control.set_nonblocking(true).and_then(|()| UnixStream::from_std(control)).map_err(|source| {
            WorkspaceError::Io { op: "watch the supervisor socket", path: "socketpair".into(), source }
        })?;
        let control = Arc::new(control);
        let ready = tokio::time::timeout(START_TIMEOUT, node::wait_ready(&control)).await;
        match ready {
            Ok(Ok(())) => {
                tracing::debug!(%group, "sandbox supervisor ready");
                Ok(Running { control, child, group })
            }
            outcome => {
                let _ = kill_tree(group);
                let mut stderr = String::new();
                if let Some(mut pipe) = child.stderr.take() {
                    let mut bytes = Vec::new();
                    let _ = tokio::time::timeout(Duration::from_secs(2), pipe.read_to_end(&mut bytes)).await;
                    stderr = String::from_utf8_lossy(&bytes).trim().chars().take(STDERR_BYTES).collect();
                }
                let _ = child.wait().await;
                let why = match outcome {
                    Err(_) => format!("it did not answer within {START_TIMEOUT:?}"),
                    _ => "it exited before it was ready".to_owned(),
                };
                Err(unavailable(format!("cannot start the sandbox supervisor: {why}: {stderr}")))
            }
        }
    }

    /// Drops the supervisor behind `control` if it is still the current one.
    async fn forget(&self, control: &Arc<UnixStream>) {
        let mut running = self.running.lock().await;
        if running.as_ref().is_some_and(|current| Arc::ptr_eq(&current.control, control))
            && let Some(mut gone) = running.take()
        {
            let _ = kill_tree(gone.group);
            let _ = gone.child.try_wait();
            self.lock_group().take();
        }
    }

    /// Kills the supervisor and its sandbox (every command in it); the next spawn starts a
    /// fresh one.
    pub fn kill(&self) {
        if let Some(group) = self.lock_group().take() {
            let _ = kill_tree(group);
        }
    }

    fn lock_group(&self) -> std::sync::MutexGuard<'_, Option<Pid>> {
        // Single assignments: a panic cannot leave it half-updated.
        self.group.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// The host pid of the supervisor process itself (the sandbox's pid 2), for tests and
    /// diagnostics.
    pub async fn pid(&self) -> Option<u32> {
        let running = self.running.lock().await;
        let group = running.as_ref()?.group.as_raw();
        // The host chain's pid is bwrap's; its child is the sandbox's pid 1 (bwrap's
        // init), whose child is the supervisor.
        let init = first_child(group)?;
        first_child(init).map(|pid| pid as u32)
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if let Some(gone) = self.running.get_mut().take() {
            let _ = kill_tree(gone.group);
        }
        self.kill();
    }
}

fn first_child(pid: i32) -> Option<i32> {
    let listed = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).ok()?;
    listed.split_whitespace().next()?.parse().ok()
}

fn unavailable(reason: String) -> WorkspaceError {
    WorkspaceError::BackendUnavailable { backend: "bubblewrap", reason }
}

/// The bytes of a sandbox path for a request.
pub fn path_bytes(path: &str) -> Vec<u8> {
    std::ffi::OsStr::new(path).as_bytes().to_vec()
}
