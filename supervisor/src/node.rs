//! The node agent's half of one exec through a supervisor, shared by every backend that
//! runs one (bubblewrap: a control socket inherited by the sandbox; Docker: a connection
//! from the supervisor in the container to the node agent's socket). How a backend starts its supervisor and
//! finds its control socket is its own; from the control socket on, an exec is this.

use std::os::fd::{AsFd as _, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, Interest};
use tokio::net::UnixStream;
use tokio::net::unix::pipe;

use super::client;
use super::wire::{self, Reply, Request, Stage};
use berth_workspace::backend::{ExitInfo, ProcessControl, Spawned};
use berth_workspace::error::{Result, WorkspaceError};

/// Where a backend keeps its running execs (for a kill of all of them), told when one
/// starts and when it ends.
pub trait ExecTracker: Send + Sync {
    /// An exec started; `killed` is set when the backend kills it. Returns its key.
    fn register(&self, killed: Arc<AtomicBool>) -> u64;
    /// The exec of `key` ended or was dropped.
    fn forget(&self, key: u64);
}

/// Tracks nothing: for a backend whose sandbox teardown ends every exec anyway.
pub struct Untracked;

impl ExecTracker for Untracked {
    fn register(&self, _killed: Arc<AtomicBool>) -> u64 {
        0
    }

    fn forget(&self, _key: u64) {}
}

/// Waits for the supervisor's one `READY` byte on a fresh control socket.
pub async fn wait_ready(control: &UnixStream) -> std::io::Result<()> {
    let mut byte = [0u8; 1];
    let read = control.async_io(Interest::READABLE, || client::recv_no_fds(control.as_fd(), &mut byte)).await?;
    if read == 1 && byte[0] == wire::READY {
        Ok(())
    } else {
        Err(std::io::Error::other("the supervisor exited or said something else than ready"))
    }
}

/// One spawn on `control`; `Ok(None)` when the supervisor was gone before the command
/// started (nothing ran: the caller may ask a fresh one). `backend` names the backend in
/// errors.
pub async fn try_spawn(
    control: &Arc<UnixStream>,
    request: &Request,
    backend: &'static str,
    tracker: Arc<dyn ExecTracker>,
) -> Result<Option<Spawned>> {
    let io_failed =
        |op: &'static str| move |source: std::io::Error| WorkspaceError::Io { op, path: "supervisor".into(), source };
    let (ours, theirs) = client::connection_pair().map_err(io_failed("create an exec connection"))?;
    let (stdin_read, stdin_write) = pipe_pair()?;
    let (stdout_read, stdout_write) = pipe_pair()?;
    let (stderr_read, stderr_write) = pipe_pair()?;
    let fds = [theirs.as_fd(), stdin_read.as_fd(), stdout_write.as_fd(), stderr_write.as_fd()];
    let sent =
        control.async_io(Interest::WRITABLE, || client::send_with_fds(control.as_fd(), &[wire::SPAWN], &fds)).await;
    if let Err(error) = sent {
        return if is_gone(&error) { Ok(None) } else { Err(io_failed("send a spawn to the supervisor")(error)) };
    }
    // The kernel holds the passed fds now; ours go, so end of file reaches both sides.
    drop((theirs, stdin_read, stdout_write, stderr_write));
    let stream = std::os::unix::net::UnixStream::from(ours);
    stream.set_nonblocking(true).map_err(io_failed("set up an exec connection"))?;
    let mut connection = UnixStream::from_std(stream).map_err(io_failed("set up an exec connection"))?;
    if let Err(error) = connection.write_all(&request.encode()).await {
        return if is_gone(&error) { Ok(None) } else { Err(io_failed("send a request to the supervisor")(error)) };
    }
    let mut reply = [0u8; wire::REPLY_BYTES];
    match connection.read_exact(&mut reply).await {
        Ok(_) => {}
        Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof || is_gone(&error) => return Ok(None),
        Err(error) => return Err(io_failed("read the supervisor's answer")(error)),
    }
    match Reply::decode(&reply) {
        Some(Reply::Started { .. }) => {}
        Some(Reply::Retry) => return Ok(None),
        Some(Reply::Failed { stage, errno }) => return Err(failure(stage, errno, request, backend)),
        Some(Reply::Exited { .. }) | None => {
            return Err(WorkspaceError::Backend { backend, message: "the supervisor answered out of turn".into() });
        }
    }
    let stdin = pipe::Sender::from_owned_fd(stdin_write).map_err(io_failed("set up stdin"))?;
    let stdout = pipe::Receiver::from_owned_fd(stdout_read).map_err(io_failed("set up stdout"))?;
    let stderr = pipe::Receiver::from_owned_fd(stderr_read).map_err(io_failed("set up stderr"))?;
    let killed = Arc::new(AtomicBool::new(false));
    let key = tracker.register(killed.clone());
    Ok(Some(Spawned {
        stdin: Box::pin(stdin),
        stdout: Box::pin(stdout),
        stderr: Box::pin(stderr),
        control: Box::new(SupervisedProcess {
            connection,
            reply: [0; wire::REPLY_BYTES],
            filled: 0,
            exit: None,
            killed,
            tracker,
            key,
            backend,
        }),
    }))
}

/// A close-on-exec pipe, both ends blocking until the node's end is handed to tokio.
fn pipe_pair() -> Result<(OwnedFd, OwnedFd)> {
    client::pipe_pair().map_err(|source| WorkspaceError::Io { op: "create a pipe", path: "supervisor".into(), source })
}

/// The typed error of a command that never ran.
fn failure(stage: Stage, errno: i32, request: &Request, backend: &'static str) -> WorkspaceError {
    let program = String::from_utf8_lossy(request.argv.first().map(Vec::as_slice).unwrap_or_default()).into_owned();
    let error = std::io::Error::from_raw_os_error(errno);
    match stage {
        Stage::Exec if errno == ENOENT && program.contains('/') => {
            WorkspaceError::SpawnFailed { program, reason: "no such file in the sandbox".into() }
        }
        Stage::Exec if errno == ENOENT && request.search_path.is_empty() => {
            WorkspaceError::SpawnFailed { program, reason: "not found in the command's PATH in the sandbox".into() }
        }
        Stage::Exec if errno == ENOENT => {
            let search_path = String::from_utf8_lossy(&request.search_path);
            WorkspaceError::SpawnFailed { program, reason: format!("not found in the sandbox's PATH ({search_path})") }
        }
        Stage::Exec => WorkspaceError::SpawnFailed { program, reason: error.to_string() },
        Stage::Resolve => {
            let path = String::from_utf8_lossy(&request.beneath).into_owned();
            match errno {
                ENOENT => WorkspaceError::NotFound { path },
                ENOTDIR => WorkspaceError::NotADirectory { path },
                EXDEV | ELOOP => WorkspaceError::PathEscapesRoot { path },
                ENOSYS | EPERM => WorkspaceError::Unsupported { backend, capability: RESOLVE_BENEATH },
                _ => WorkspaceError::SpawnFailed {
                    program,
                    reason: format!("cannot enter the working directory {path:?}: {error}"),
                },
            }
        }
        Stage::Chdir => {
            WorkspaceError::SpawnFailed { program, reason: format!("cannot enter the working directory: {error}") }
        }
        other => WorkspaceError::Backend {
            backend,
            message: format!("the supervisor could not start the command ({}): {error}", other.describe()),
        },
    }
}

const ENOENT: i32 = 2;
const EPERM: i32 = 1;
const EXDEV: i32 = 18;
const ENOTDIR: i32 = 20;
const ENOSYS: i32 = 38;
const ELOOP: i32 = 40;

/// What a sandbox without `openat2(2)` (Linux before 5.6, or a seccomp filter that refuses
/// it) cannot do: [`Request::beneath`]. The error naming it is
/// `WorkspaceError::Unsupported { capability: RESOLVE_BENEATH, .. }`; the caller resolves
/// the path some other way then.
pub const RESOLVE_BENEATH: &str = "resolving a working directory below the root inside the sandbox (openat2)";

/// The supervisor or the exec's shim is gone (a send to a closed socket).
pub fn is_gone(error: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionRefused, ConnectionReset, NotConnected};
    matches!(error.kind(), BrokenPipe | ConnectionReset | ConnectionRefused | NotConnected)
}

/// A command started by a supervisor: its exit arrives on the exec's connection.
struct SupervisedProcess {
    connection: UnixStream,
    /// The `Exited` reply read so far (kept here so `wait` is cancel-safe).
    reply: [u8; wire::REPLY_BYTES],
    filled: usize,
    exit: Option<ExitInfo>,
    /// Set by `kill` and by the backend's kill of all execs: a supervisor that vanishes
    /// after it is a kill that worked, not an error.
    killed: Arc<AtomicBool>,
    tracker: Arc<dyn ExecTracker>,
    key: u64,
    backend: &'static str,
}

#[async_trait]
impl ProcessControl for SupervisedProcess {
    async fn wait(&mut self) -> Result<ExitInfo> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        while self.filled < self.reply.len() {
            // One read per poll: cancel-safe, progress is in `self`.
            let read = self.connection.read(&mut self.reply[self.filled..]).await;
            match read {
                Ok(0) | Err(_) => {
                    let exit = if self.killed.load(Ordering::SeqCst) {
                        ExitInfo { code: None, signal: Some(SIGKILL) }
                    } else {
                        self.tracker.forget(self.key);
                        return Err(WorkspaceError::Backend {
                            backend: self.backend,
                            message: "the sandbox supervisor died while the command ran; the next exec starts a \
                                      fresh one"
                                .into(),
                        });
                    };
                    return Ok(self.finish(exit));
                }
                Ok(read) => self.filled += read,
            }
        }
        match Reply::decode(&self.reply) {
            // Folded like a per-exec sandbox's status (bwrap and Docker report a command
            // killed by signal n as 128+n, which `unfold_exit` undoes), so a command reads
            // the same with and without the supervisor: `sh -c` whose child was OOM-killed
            // (137) is SIGKILL either way.
            Some(Reply::Exited { code, signal }) => Ok(self.finish(unfold_exit(code, signal))),
            _ => Err(WorkspaceError::Backend {
                backend: self.backend,
                message: "the supervisor sent a malformed exit".into(),
            }),
        }
    }

    async fn kill(&mut self) -> Result<()> {
        if self.exit.is_some() {
            return Ok(());
        }
        self.killed.store(true, Ordering::SeqCst);
        // A full or closed connection both mean the shim is past caring; dropping the
        // connection would kill too, but `wait` still needs it.
        let _ = self.connection.try_write(&[wire::KILL]);
        Ok(())
    }
}

const SIGKILL: i32 = 9;

impl SupervisedProcess {
    fn finish(&mut self, exit: ExitInfo) -> ExitInfo {
        self.exit = Some(exit);
        self.tracker.forget(self.key);
        exit
    }
}

impl Drop for SupervisedProcess {
    /// Dropping the connection is the kill (the shim sees end of file).
    fn drop(&mut self) {
        if self.exit.is_none() {
            self.tracker.forget(self.key);
        }
    }
}

/// Highest signal number a folded exit can name (SIGRTMAX on Linux).
const MAX_SIGNAL: i32 = 64;

/// bwrap and Docker report a command that died of signal n as exit 128+n; undo that, so a
/// sandboxed `kill -9 $$` reads like it does on the host. The price: a command that calls
/// `exit(137)` on purpose is reported as killed by SIGKILL too.
pub fn unfold_exit(code: Option<i32>, signal: Option<i32>) -> ExitInfo {
    match code {
        Some(code) if code > 128 && code <= 128 + MAX_SIGNAL => ExitInfo { code: None, signal: Some(code - 128) },
        _ => ExitInfo { code, signal },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_unfolded() {
        assert_eq!(unfold_exit(Some(137), None), ExitInfo { code: None, signal: Some(9) });
        assert_eq!(unfold_exit(Some(128), None), ExitInfo { code: Some(128), signal: None });
        assert_eq!(unfold_exit(Some(255), None), ExitInfo { code: Some(255), signal: None });
        assert_eq!(unfold_exit(None, Some(9)), ExitInfo { code: None, signal: Some(9) });
    }
}
