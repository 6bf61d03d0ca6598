//! Execs through the container's resident supervisor (crate `berth-supervisor`) instead of
//! one Docker exec each: a Docker exec costs several daemon round trips (create, start
//! with a hijacked connection, inspect), the supervisor a fork and a message.
//!
//! - **Where it runs.** Started on first use by one Docker exec of its binary, bound
//!   read-only at [`CONTAINER_BINARY`], as the workspace user: the same user, namespaces,
//!   cgroup, capabilities (none), seccomp profile and `no-new-privileges` as any exec of
//!   the container, which its commands inherit. It exits after an idle period, or when the
//!   node agent closes its connection; the next exec starts a fresh one.
//! - **The socket is the node's.** The node agent listens on `node.sock` in a directory of
//!   its own (`<supervisor dir>/run/<container>`, root's, mode 0711) that the container
//!   sees read-only at [`CONTAINER_RUN_DIR`]: a workspace cannot write there (no planted
//!   links or files, nothing filling the host's `/run`), only connect. The supervisor
//!   connects to it; the node serves only the connection whose peer (`SO_PEERCRED`) is the
//!   process of the Docker exec it just started, so a command of the workspace that
//!   connects, even running a copy of the supervisor, is closed unanswered.
//! - **What goes through it.** Everything the workspace user runs: spawned commands,
//!   file scripts, kill sweeps. Secret-holding processes (another user) keep their own
//!   Docker exec, and a container created without the supervisor's mounts (by an older
//!   agent, or with the supervisor off) uses Docker exec for everything.
//! - **Failure.** A supervisor that cannot start (the binary missing, a node agent in
//!   another pid namespace than the engine's) makes execs fall back to Docker exec for a
//!   while, with a warning. One that dies under a running command leaves the command to
//!   its shim, which still reports its exit; the next exec starts a fresh supervisor.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use futures::StreamExt as _;
use tokio::net::{UnixListener, UnixStream};

use berth_supervisor::node::{self, Untracked};
use berth_supervisor::wire::Request;
use berth_workspace::backend::Spawned;
use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;
use super::errors::docker_error;
use super::exec_api::{Target, start_docker_exec};

/// Where the supervisor binary is bound in a container (read-only).
pub const CONTAINER_BINARY: &str = "/.berth/supervisor";
/// Where the node's socket directory is bound in a container (read-only).
pub const CONTAINER_RUN_DIR: &str = "/.berth/run";
/// The node's socket in a container.
pub const CONTAINER_SOCKET: &str = "/.berth/run/node.sock";
/// Its file name.
const SOCKET_NAME: &str = "node.sock";
/// How long a fresh supervisor may take to connect.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long execs use Docker exec after a supervisor could not be started.
const RETRY_START_AFTER: Duration = Duration::from_secs(60);
/// Spawns sent to a supervisor that turned out to be gone before it looked at them.
const SPAWN_ATTEMPTS: usize = 3;
/// Bytes of a failed start's output kept for the warning.
const START_OUTPUT_BYTES: usize = 2000;

/// What a container's supervisor connection is now.
#[derive(Debug, Default)]
struct State {
    /// The node's socket, bound on the first start.
    listener: Option<UnixListener>,
    control: Option<Arc<UnixStream>>,
    /// After a failed start: Docker exec until then.
    paused_until: Option<Instant>,
}

/// The supervisor of one container, as the node sees it.
#[derive(Debug)]
pub(crate) struct DockerSupervisor {
    /// The host directory bound at [`CONTAINER_RUN_DIR`].
    run_dir: PathBuf,
    /// The workspace user, who may connect to the socket.
    user: (u32, u32),
    idle: Duration,
    state: tokio::sync::Mutex<State>,
    /// Cleared once the container's supervisor could not use `openat2` (an old kernel, a
    /// seccomp profile without it): the workspace user's commands then start under
    /// `spawn.sh`, which resolves the working directory itself.
    beneath: AtomicBool,
}

impl DockerSupervisor {
    pub fn new(run_dir: PathBuf, user: (u32, u32), idle: Duration) -> Self {
        Self { run_dir, user, idle, state: tokio::sync::Mutex::new(State::default()), beneath: AtomicBool::new(true) }
    }

    /// Whether commands may be started in a working directory the supervisor resolves.
    pub fn resolves_beneath(&self) -> bool {
        self.beneath.load(Ordering::Relaxed)
    }

    pub fn stop_resolving_beneath(&self) {
        self.beneath.store(false, Ordering::Relaxed);
    }

    /// Starts `request` through the supervisor; `Ok(None)` when no supervisor could be had
    /// (the caller uses a Docker exec then).
    pub async fn spawn(&self, container: Target<'_>, user: &str, request: &Request) -> Result<Option<Spawned>> {
        for _ in 0..SPAWN_ATTEMPTS {
            let Some(control) = self.control(container, user).await else {
                return Ok(None);
            };
            match node::try_spawn(&control, request, BACKEND_NAME, Arc::new(Untracked)).await? {
                Some(spawned) => return Ok(Some(spawned)),
                // Gone before it looked at the request (idle exit, killed): nothing ran.
                None => self.forget(&control).await,
            }
        }
        Err(WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: "the container's supervisor went away before it could start the command, several times".into(),
        })
    }

    /// Starts the supervisor now, before any exec (a warm-pool container's).
    pub async fn warm_up(&self, container: Target<'_>, user: &str) {
        let _ = self.control(container, user).await;
    }

    /// The live control connection, starting a supervisor when none is connected. `None`
    /// when none could be had.
    async fn control(&self, container: Target<'_>, user: &str) -> Option<Arc<UnixStream>> {
        let mut state = self.state.lock().await;
        if let Some(control) = state.control.as_ref() {
            return Some(control.clone());
        }
        if state.paused_until.is_some_and(|until| Instant::now() < until) {
            return None;
        }
        match self.start(container, user, &mut state).await {
            Ok(control) => {
                let control = Arc::new(control);
                state.control = Some(control.clone());
                state.paused_until = None;
                Some(control)
            }
            Err(error) => {
                tracing::warn!(container = %container.container_name, error = %error, "cannot start the container's supervisor; using docker exec for {RETRY_START_AFTER:?}");
                state.paused_until = Some(Instant::now() + RETRY_START_AFTER);
                None
            }
        }
    }

    async fn forget(&self, control: &Arc<UnixStream>) {
        let mut state = self.state.lock().await;
        if state.control.as_ref().is_some_and(|current| Arc::ptr_eq(current, control)) {
            state.control = None;
        }
    }

    /// The node's socket, bound on first use (a stale one of an earlier agent is replaced:
    /// the directory is the agent's alone).
    fn listener<'a>(&self, state: &'a mut State) -> Result<&'a UnixListener> {
        if state.listener.is_none() {
            let shown = self.run_dir.join(SOCKET_NAME).display().to_string();
            let failed = |op: &'static str, error: std::io::Error| WorkspaceError::from_io(op, &shown, error);
            // A socket path must fit in 108 bytes, and the directory's (a container name under
            // the supervisor directory) is longer: the socket is named through a handle on
            // the directory instead.
            let dir = nix::fcntl::open(
                &self.run_dir,
                nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|errno| failed("open the supervisor socket directory", errno.into()))?;
            let path = PathBuf::from(format!("/proc/self/fd/{}/{SOCKET_NAME}", std::os::fd::AsRawFd::as_raw_fd(&dir)));
            match std::fs::remove_file(&path) {
                Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                    return Err(failed("remove a stale supervisor socket", error));
                }
                _ => {}
            }
            let listener = UnixListener::bind(&path).map_err(|error| failed("bind the supervisor socket", error))?;
            let (uid, gid) = self.user;
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)))
                .map_err(|error| failed("hand the supervisor socket to the workspace user", error))?;
            state.listener = Some(listener);
        }
        Ok(state.listener.as_ref().expect("bound above"))
    }

    /// Starts a supervisor with one Docker exec and takes its connection: the one whose
    /// peer is that exec's process.
    async fn start(&self, container: Target<'_>, user: &str, state: &mut State) -> Result<UnixStream> {
        let listener = self.listener(state)?;
        let cmd = vec![
            CONTAINER_BINARY.to_owned(),
            "--connect".to_owned(),
            CONTAINER_SOCKET.to_owned(),
            "--idle-ms".to_owned(),
            self.idle.as_millis().to_string(),
        ];
        let (exec_id, mut output, _input) = start_docker_exec(container, user, cmd, Vec::new(), false).await?;
        let pid = exec_pid(container, &exec_id).await?;
        let unavailable = |reason: String| WorkspaceError::BackendUnavailable { backend: BACKEND_NAME, reason };
        let mut said = Vec::new();
        let mut output_open = true;
        let taken = tokio::time::timeout(START_TIMEOUT, async {
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((connection, _)) = accepted else { continue };
                        let peer = connection.peer_cred().ok().and_then(|credentials| credentials.pid());
                        if peer != Some(pid) {
                            // Not the process just started: a command of the workspace.
                            tracing::warn!(container = %container.container_name, ?peer, expected = pid, "refused a connection to the supervisor socket from another process");
                            continue;
                        }
                        node::wait_ready(&connection)
                            .await
                            .map_err(|error| unavailable(format!("the supervisor did not say it is ready: {error}")))?;
                        return Ok(connection);
                    }
                    frame = output.next(), if output_open => match frame {
                        Some(Ok(LogOutput::StdOut { message } | LogOutput::StdErr { message } | LogOutput::Console { message })) => {
                            let room = START_OUTPUT_BYTES.saturating_sub(said.len());
                            said.extend_from_slice(&message[..message.len().min(room)]);
                        }
                        Some(Ok(LogOutput::StdIn { .. })) => {}
                        // Its output ends when it puts /dev/null on it after connecting,
                        // or when it exits: only the latter ends the wait at once.
                        Some(Err(_)) | None => {
                            output_open = false;
                            let inspected = container.docker.inspect_exec(&exec_id).await.map_err(|error| docker_error("inspecting an exec", error))?;
                            if let ExecProgress::Exited(code) = exec_progress(inspected.running, inspected.pid, inspected.exit_code) {
                                return Err(unavailable(format!(
                                    "the supervisor exited (code {code}) before it connected: {}",
                                    String::from_utf8_lossy(&said).trim()
                                )));
                            }
                        }
                    },
                }
            }
        })
        .await;
        taken.unwrap_or_else(|_| Err(unavailable(format!("the supervisor did not connect within {START_TIMEOUT:?}"))))
    }
}

/// The host pid of a started exec's process. The daemon answers the start (switching the
/// connection to the exec's stream) before it starts the process: until then an inspect
/// shows the exec neither running nor exited, which is not a failure.
async fn exec_pid(container: Target<'_>, exec_id: &str) -> Result<i32> {
    let deadline = Instant::now() + START_TIMEOUT;
    let mut delay = Duration::from_millis(2);
    loop {
        let inspected =
            container.docker.inspect_exec(exec_id).await.map_err(|error| docker_error("inspecting an exec", error))?;
        match exec_progress(inspected.running, inspected.pid, inspected.exit_code) {
            ExecProgress::Started(pid) => return Ok(pid),
            ExecProgress::Exited(code) => {
                return Err(WorkspaceError::BackendUnavailable {
                    backend: BACKEND_NAME,
                    reason: format!("the supervisor's exec exited (code {code}) before it could be seen running"),
                });
            }
            ExecProgress::NotYet if Instant::now() >= deadline => {
                return Err(WorkspaceError::BackendUnavailable {
                    backend: BACKEND_NAME,
                    reason: format!("the supervisor's exec did not start within {START_TIMEOUT:?}"),
                });
            }
            ExecProgress::NotYet => {}
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(100));
    }
}

/// Where a started exec is, as an inspect shows it.
#[derive(Debug, PartialEq, Eq)]
enum ExecProgress {
    /// Its process runs: the host pid.
    Started(i32),
    /// It ran and exited.
    Exited(i64),
    /// Neither yet: the daemon has not started its process.
    NotYet,
}

fn exec_progress(running: Option<bool>, pid: Option<i64>, exit_code: Option<i64>) -> ExecProgress {
    match (pid.and_then(|pid| i32::try_from(pid).ok()).filter(|pid| *pid > 0), exit_code) {
        (Some(pid), None) if running == Some(true) => ExecProgress::Started(pid),
        (_, Some(code)) if running != Some(true) => ExecProgress::Exited(code),
        _ => ExecProgress::NotYet,
    }
}

#[cfg(test)]
mod tests {
    use super::{ExecProgress, exec_progress};

    #[test]
    fn an_exec_not_yet_started_is_waited_for() {
        // The state an inspect shows between the start's answer and the process.
        assert_eq!(exec_progress(Some(false), Some(0), None), ExecProgress::NotYet);
        assert_eq!(exec_progress(None, None, None), ExecProgress::NotYet);
        assert_eq!(exec_progress(Some(true), Some(0), None), ExecProgress::NotYet);
        assert_eq!(exec_progress(Some(true), Some(4242), None), ExecProgress::Started(4242));
        assert_eq!(exec_progress(Some(false), Some(4242), Some(1)), ExecProgress::Exited(1));
        assert_eq!(exec_progress(Some(false), Some(0), Some(127)), ExecProgress::Exited(127));
    }
}
