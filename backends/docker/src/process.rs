//! One process inside a workspace container. Through the container's supervisor the
//! command is started by the supervisor itself (cwd resolved with `openat2`, see
//! [`spawn_supervised`]) and its pipes and exit come from it. Otherwise: a Docker exec of
//! `spawn.sh`, with its multiplexed output split into two readers, and a [`ProcessControl`]
//! that can kill the exec's whole process tree, as below.
//!
//! Killing: Docker has no API to signal an exec. runc makes every exec process the leader
//! of a new session, and `spawn.sh` reports that pid (in the container's pid namespace)
//! before it execs argv; it also carries a random `BERTH_EXEC_ID` in its environment.
//! `kill()` runs a second exec, `kill.sh`, which SIGKILLs every process of that session and
//! every process carrying the marker (so a child that called `setsid` still dies), sweeping
//! until none is left. It uses shell builtins only, so it works while a fork bomb holds
//! every pid of the limit; starting it may need the limit lifted briefly (`kill.rs`). A
//! process that both leaves the session and clears its environment escapes the sweep; it
//! still dies with the container (`release`).
//! All of this happens inside the container as the workspace user, so it works the same
//! when the daemon is remote.
//!
//! Exit status: Docker reports `128 + n` for a process killed by signal `n`, so exit codes
//! 129..=192 are reported as that signal (a program that *exits* 137 looks killed).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use async_trait::async_trait;
use bollard::container::LogOutput;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::io::StreamReader;

use berth_workspace::backend::{BoxedReader, BoxedWriter, ExitInfo, ProcessControl, Spawned};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use berth_supervisor::node;
use berth_supervisor::wire::Request;

use super::config::SECRET_HOLDER_USER;
use super::container::{ContainerHandle, Exec, start_exec};
use super::exec_api::OutputStream;
use super::kill::kill_session;
use super::scripts;

/// How long a spawn may take to report that argv started (container frozen, daemon stuck).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Output chunks buffered per stream between the demultiplexer and a slow reader; past it
/// the demultiplexer stops reading (back-pressure like a full pipe).
const CHANNEL_CHUNKS: usize = 16;
/// Largest handshake line / diagnostic output kept from a failed start.
const HANDSHAKE_MAX_BYTES: usize = 64 * 1024;
/// Most program stdout held back while the handshake line is still on its way.
const EARLY_STDOUT_MAX_BYTES: usize = 16 * 1024 * 1024;

/// Env variable carrying an exec's kill marker; `kill.sh` matches `BERTH_EXEC_ID=<nonce>`.
pub(crate) const EXEC_MARKER_ENV: &str = "BERTH_EXEC_ID";

/// Who a spawned process runs as and how it is wrapped.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Launch<'a> {
    /// The workspace user, under `spawn.sh`, in `cwd`.
    Agent,
    /// [`SECRET_HOLDER_USER`] under `secret.sh`: a private 0700 `HOME` and cwd under
    /// `/tmp`; with a pin, argv[0] (a workspace path relative to `cwd`) runs as a checked
    /// copy in that directory, without one it must be a root-owned program outside the
    /// workspace.
    SecretHolder { pin: Option<&'a [u8; 32]> },
}

/// Starts `argv` in `cwd` (relative to the workspace) with `env` (`NAME=value` entries).
///
/// Errors: `NotFound` / `NotADirectory` / `PathEscapesRoot` for a bad cwd, `SpawnFailed`
/// when argv[0] is not found or the runtime refuses to start it (or a secret holder's
/// unpinned program is in the workspace or not a root-owned system file),
/// `InvalidArgument` when a secret holder's program does not match its pin,
/// `BackendUnavailable` when the container is not running or the daemon is unreachable.
pub(crate) async fn spawn(
    container: &Arc<ContainerHandle>,
    argv: Vec<String>,
    cwd: &RelPath,
    env: Vec<String>,
) -> Result<Spawned> {
    spawn_as(container, Launch::Agent, argv, cwd, env).await
}

/// [`spawn`] as `launch` says.
pub(crate) async fn spawn_as(
    container: &Arc<ContainerHandle>,
    launch: Launch<'_>,
    argv: Vec<String>,
    cwd: &RelPath,
    mut env: Vec<String>,
) -> Result<Spawned> {
    let program = argv.first().cloned().unwrap_or_default();
    let nonce = scripts::nonce();
    env.push(format!("{EXEC_MARKER_ENV}={nonce}"));
    if let Launch::Agent = launch
        && let Some(spawned) = spawn_supervised(container, &argv, cwd, &env).await?
    {
        // Shutting stdin down closes it, as for every other spawn of this backend (a
        // pipe's own shutdown leaves it open, and `write.sh` waits for its end).
        return Ok(Spawned { stdin: Box::pin(ClosingWriter { inner: Some(spawned.stdin) }), ..spawned });
    }
    let mut cmd = vec![scripts::SHELL.to_owned(), "-c".to_owned()];
    let user = match launch {
        Launch::Agent => {
            cmd.extend([container.scripts.spawn.clone(), "berth-spawn".to_owned()]);
            cmd.extend([nonce.clone(), cwd.as_str().to_owned()]);
            container.user.clone()
        }
        Launch::SecretHolder { pin } => {
            cmd.extend([container.scripts.secret.clone(), "berth-secret".to_owned()]);
            cmd.extend([nonce.clone(), cwd.as_str().to_owned(), pin.map_or_else(|| "-".to_owned(), hex::encode)]);
            secret_holder_user(container)?
        }
    };
    cmd.extend(argv);
    let (exec, output, input) = start_exec(container, &user, cmd, env, true).await?;

    let (handshake_sender, handshake_receiver) = oneshot::channel();
    let (stdout_sender, stdout_receiver) = mpsc::channel(CHANNEL_CHUNKS);
    let (stderr_sender, stderr_receiver) = mpsc::channel(CHANNEL_CHUNKS);
    let (finished_sender, finished_receiver) = watch::channel(false);
    tokio::spawn(demultiplex(output, nonce.clone(), handshake_sender, stdout_sender, stderr_sender, finished_sender));

    let handshake = match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake_receiver).await {
        Ok(Ok(handshake)) => handshake,
        // The demultiplexer ended without a verdict: only when the stream ended, same case.
        Ok(Err(_)) => Handshake::Ended { output: String::new() },
        Err(_) => {
            // Whatever did start must not linger: sweep by marker (no pid is known).
            let container = container.clone();
            let marker = nonce.clone();
            let killer = user.clone();
            tokio::spawn(async move {
                if let Err(error) = kill_session(&container, &killer, None, &marker).await {
                    tracing::warn!(container = %container.container_name, %error, "could not kill an exec that never reported");
                }
            });
            return Err(WorkspaceError::Timeout {
                operation: "starting a docker exec",
                millis: HANDSHAKE_TIMEOUT.as_millis() as u64,
            });
        }
    };
    let pid = match handshake {
        Handshake::Started { pid } => pid,
        Handshake::Refused { kind } => {
            let path = cwd.as_fs_str().to_owned();
            return Err(match kind.as_str() {
                "notfound" => WorkspaceError::NotFound { path },
                "notdir" => WorkspaceError::NotADirectory { path },
                "escape" => WorkspaceError::PathEscapesRoot { path },
                "pinmismatch" => WorkspaceError::InvalidArgument(format!(
                    "the SHA-256 of {program:?} does not match the pin of the declaration"
                )),
                "inworkspace" => WorkspaceError::SpawnFailed {
                    program,
                    reason: "a secret-holding process runs a workspace program only with a sha256 pin".into(),
                },
                "notsystem" => WorkspaceError::SpawnFailed {
                    program,
                    reason: "an unpinned secret-holding program must be owned by root and writable by no one else"
                        .into(),
                },
                "noexec" => WorkspaceError::SpawnFailed {
                    program,
                    reason: "the container's /tmp is mounted noexec, so the checked program copy cannot run".into(),
                },
                "private" => WorkspaceError::Backend {
                    backend: super::config::BACKEND_NAME,
                    message: "cannot make the private directory of a secret-holding process under /tmp".into(),
                },
                _ => WorkspaceError::SpawnFailed {
                    program,
                    reason: "not found in PATH, or not an executable file".into(),
                },
            });
        }
        Handshake::Ended { output } => {
            return Err(WorkspaceError::SpawnFailed {
                program,
                reason: format!("the container runtime did not start it: {}", output.trim()),
            });
        }
    };

    let control = DockerControl {
        container: container.clone(),
        user,
        exec,
        pid,
        nonce,
        finished: finished_receiver,
        status: None,
        killed: false,
    };
    Ok(Spawned {
        stdin: Box::pin(ClosingWriter { inner: Some(input) }),
        stdout: channel_reader(stdout_receiver),
        stderr: channel_reader(stderr_receiver),
        control: Box::new(control),
    })
}

/// The workspace user's command started by the container's supervisor itself: it enters
/// `cwd` below the mount point with `openat2(RESOLVE_BENEATH)` (the confinement
/// `resolve.sh` gives the wrapper) and finds the program in the command's own `PATH`, so
/// no shell runs before the command and no handshake is parsed. `None` when the container
/// has no supervisor, none could be started, or its kernel / seccomp profile lacks
/// `openat2` (then `spawn.sh` does it, from then on for this container).
async fn spawn_supervised(
    container: &Arc<ContainerHandle>,
    argv: &[String],
    cwd: &RelPath,
    env: &[String],
) -> Result<Option<Spawned>> {
    let Some(supervisor) = container.supervisor.as_ref().filter(|supervisor| supervisor.resolves_beneath()) else {
        return Ok(None);
    };
    let mut env: Vec<Vec<u8>> = env.iter().map(|pair| pair.clone().into_bytes()).collect();
    // The shell of spawn.sh exports the directory it entered; so does this path.
    if !env.iter().any(|pair| pair.starts_with(b"PWD=")) {
        env.push(format!("PWD={}", cwd.under(&container.scripts.mount_point)).into_bytes());
    }
    let request = Request {
        argv: argv.iter().map(|arg| arg.clone().into_bytes()).collect(),
        env,
        cwd: container.scripts.mount_point.clone().into_bytes(),
        beneath: cwd.as_str().as_bytes().to_vec(),
        // The command's own PATH (the image's unless `env` sets one), as `exec` in spawn.sh.
        search_path: Vec::new(),
        rlimits: Vec::new(),
        private_tmp_bytes: None,
    };
    match supervisor.spawn(container.target(), &container.user, &request).await {
        Err(WorkspaceError::Unsupported { capability, .. }) if capability == node::RESOLVE_BENEATH => {
            tracing::warn!(container = %container.container_name, "the container cannot resolve a working directory with openat2; its execs use spawn.sh");
            supervisor.stop_resolving_beneath();
            Ok(None)
        }
        result => result,
    }
}

/// `uid:gid` of secret-holding execs; refused when it is the workspace user's (the agent
/// could then read their environment).
fn secret_holder_user(container: &ContainerHandle) -> Result<String> {
    let (uid, gid) = SECRET_HOLDER_USER;
    let user = format!("{uid}:{gid}");
    let workspace_uid = container.user.split(':').next().unwrap_or_default();
    if workspace_uid == uid.to_string() || workspace_uid == "0" || workspace_uid == "root" {
        return Err(WorkspaceError::BackendUnavailable {
            backend: super::config::BACKEND_NAME,
            reason: format!(
                "workspace processes run as {}, so a secret-holding process cannot be kept from them",
                container.user
            ),
        });
    }
    Ok(user)
}

fn exit_info(code: i64) -> ExitInfo {
    if (129..=192).contains(&code) {
        ExitInfo { code: None, signal: Some((code - 128) as i32) }
    } else {
        ExitInfo { code: Some(code as i32), signal: None }
    }
}

/// The first stderr line of `spawn.sh`.
enum Handshake {
    Started {
        pid: u32,
    },
    Refused {
        kind: String,
    },
    /// The stream ended before the line: the runtime could not start the exec at all.
    Ended {
        output: String,
    },
}

/// Splits the exec's multiplexed output into the two channels. Before that it consumes the
/// handshake line, the first thing `spawn.sh` writes to stderr. Docker copies stdout and
/// stderr with separate goroutines, so the program's first stdout bytes can arrive before
/// the handshake; they are held back until it has been read.
async fn demultiplex(
    mut output: OutputStream,
    nonce: String,
    handshake: oneshot::Sender<Handshake>,
    stdout: mpsc::Sender<io::Result<Bytes>>,
    stderr: mpsc::Sender<io::Result<Bytes>>,
    finished: watch::Sender<bool>,
) {
    let mut stdout = Some(stdout);
    let mut stderr = Some(stderr);
    let mut handshake = Some(handshake);
    let mut early_stderr = BytesMut::new();
    let mut early_stdout: Vec<Bytes> = Vec::new();
    let mut early_stdout_bytes = 0usize;
    while let Some(frame) = output.next().await {
        let frame = match frame {
            Ok(frame) => frame,
            Err(error) => {
                let message = format!("docker exec stream failed: {error}");
                forward(&mut stdout, Err(io::Error::other(message.clone()))).await;
                forward(&mut stderr, Err(io::Error::other(message))).await;
                break;
            }
        };
        match frame {
            LogOutput::StdErr { message } if handshake.is_some() => {
                early_stderr.extend_from_slice(&message);
                let Some(newline) = early_stderr.iter().position(|byte| *byte == b'\n') else {
                    if early_stderr.len() > HANDSHAKE_MAX_BYTES {
                        break;
                    }
                    continue;
                };
                let line = early_stderr.split_to(newline + 1);
                let verdict = parse_handshake(&line, &nonce);
                if !matches!(verdict, Handshake::Started { .. }) {
                    early_stderr = line;
                    break;
                }
                if let Some(sender) = handshake.take() {
                    let _ = sender.send(verdict);
                }
                for chunk in std::mem::take(&mut early_stdout) {
                    forward(&mut stdout, Ok(chunk)).await;
                }
                if !early_stderr.is_empty() {
                    forward(&mut stderr, Ok(early_stderr.split().freeze())).await;
                }
            }
            LogOutput::StdOut { message } | LogOutput::Console { message } if handshake.is_some() => {
                // Held, not dropped: reading on is the only way to reach the handshake.
                early_stdout_bytes += message.len();
                if early_stdout_bytes > EARLY_STDOUT_MAX_BYTES {
                    break;
                }
                early_stdout.push(message);
            }
            LogOutput::StdErr { message } => forward(&mut stderr, Ok(message)).await,
            LogOutput::StdOut { message } | LogOutput::Console { message } => forward(&mut stdout, Ok(message)).await,
            LogOutput::StdIn { .. } => {}
        }
    }
    if let Some(sender) = handshake.take() {
        // No (valid) handshake: what the runtime or the wrapper said is the diagnostic.
        let mut said = early_stderr;
        for chunk in early_stdout {
            said.extend_from_slice(&chunk[..chunk.len().min(HANDSHAKE_MAX_BYTES)]);
        }
        let verdict = match parse_handshake(&said, &nonce) {
            Handshake::Ended { .. } => Handshake::Ended { output: String::from_utf8_lossy(&said).into_owned() },
            verdict => verdict,
        };
        let _ = sender.send(verdict);
    }
    // Dropping the senders gives the readers EOF; `finished` wakes `wait`.
    drop(stdout);
    drop(stderr);
    finished.send_replace(true);
}

fn parse_handshake(line: &[u8], nonce: &str) -> Handshake {
    let text = String::from_utf8_lossy(line);
    let mut words = text.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some(seen), Some("ok"), Some(pid)) if seen == nonce => match pid.parse() {
            Ok(pid) => Handshake::Started { pid },
            Err(_) => Handshake::Ended { output: text.into_owned() },
        },
        (Some(seen), Some("fail"), Some(kind)) if seen == nonce => Handshake::Refused { kind: kind.to_owned() },
        _ => Handshake::Ended { output: text.into_owned() },
    }
}

/// Sends to a reader; a reader that was dropped is forgotten and its output discarded, so
/// an uninterested consumer never blocks the other stream.
async fn forward(sender: &mut Option<mpsc::Sender<io::Result<Bytes>>>, item: io::Result<Bytes>) {
    if let Some(channel) = sender
        && channel.send(item).await.is_err()
    {
        *sender = None;
    }
}

fn channel_reader(receiver: mpsc::Receiver<io::Result<Bytes>>) -> BoxedReader {
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        let item = receiver.recv().await?;
        Some((item, receiver))
    });
    Box::pin(StreamReader::new(Box::pin(stream)))
}

/// Controls one exec (see the module docs for how kill works).
struct DockerControl {
    container: Arc<ContainerHandle>,
    /// The exec's user: the kill sweep runs as it (only it may signal the processes).
    user: String,
    exec: Exec,
    /// Pid of the exec in the container's pid namespace, also its session id.
    pid: u32,
    nonce: String,
    finished: watch::Receiver<bool>,
    status: Option<ExitInfo>,
    killed: bool,
}

#[async_trait]
impl ProcessControl for DockerControl {
    /// Cancel-safe: the only state is `finished` (a watch) and `status`.
    async fn wait(&mut self) -> Result<ExitInfo> {
        if let Some(status) = self.status {
            return Ok(status);
        }
        // The stream ends once the process has exited: its pipes closed, or the daemon
        // stopped draining them (about 2 s after the exit when an orphan still holds them).
        // A closed channel means the demultiplexer is gone, which also means that.
        let _ = self.finished.wait_for(|done| *done).await;
        let code = self.exec.exit_code(&self.container.docker).await?;
        let status = exit_info(code);
        self.status = Some(status);
        Ok(status)
    }

    async fn kill(&mut self) -> Result<()> {
        if self.status.is_some() || self.killed {
            return Ok(());
        }
        // A supervised command's shim kills its whole tree itself.
        if !self.exec.kill_supervised().await? {
            kill_session(&self.container, &self.user, Some(self.pid), &self.nonce).await?;
        }
        self.killed = true;
        Ok(())
    }
}

impl Drop for DockerControl {
    fn drop(&mut self) {
        // A supervised command dies with its connection, which is dropped with `exec`.
        if self.status.is_some() || self.killed || matches!(self.exec, Exec::Supervised(_)) {
            return;
        }
        // Dropped without a completed wait (a cancelled request): the tree must not outlive
        // it. Killing needs the daemon, so it runs as a task of its own.
        let container = self.container.clone();
        let user = std::mem::take(&mut self.user);
        let pid = self.pid;
        let nonce = std::mem::take(&mut self.nonce);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = kill_session(&container, &user, Some(pid), &nonce).await {
                        tracing::warn!(container = %container.container_name, pid, %error, "could not kill a dropped exec");
                    }
                });
            }
            Err(_) => {
                tracing::warn!(container = %self.container.container_name, pid, "exec dropped outside a runtime; it was not killed");
            }
        }
    }
}

/// The exec's stdin. Dropping it half-closes the connection like closing a pipe, so a
/// program reading stdin sees EOF even when the caller never called `shutdown`.
struct ClosingWriter {
    inner: Option<BoxedWriter>,
}

impl AsyncWrite for ClosingWriter {
    fn poll_write(mut self: Pin<&mut Self>, context: &mut Context<'_>, buffer: &[u8]) -> Poll<io::Result<usize>> {
        match self.inner.as_mut() {
            Some(inner) => inner.as_mut().poll_write(context, buffer),
            None => Poll::Ready(Err(io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.inner.as_mut() {
            Some(inner) => inner.as_mut().poll_flush(context),
            None => Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<io::Result<()>> {
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let result = std::task::ready!(inner.as_mut().poll_shutdown(context));
        self.inner = None;
        Poll::Ready(result)
    }
}

impl Drop for ClosingWriter {
    fn drop(&mut self) {
        if let Some(mut inner) = self.inner.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                let _ = inner.shutdown().await;
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_handshakes() {
        assert!(matches!(parse_handshake(b"abc ok 42\n", "abc"), Handshake::Started { pid: 42 }));
        assert!(matches!(
            parse_handshake(b"abc fail escape\n", "abc"),
            Handshake::Refused { kind } if kind == "escape"
        ));
        // A line without our nonce is not ours (e.g. a runtime error message).
        assert!(matches!(parse_handshake(b"xyz ok 42\n", "abc"), Handshake::Ended { .. }));
    }

    #[test]
    fn maps_signal_exit_codes() {
        assert_eq!(exit_info(137).signal, Some(9));
        assert_eq!(exit_info(137).code, None);
        assert_eq!(exit_info(1).code, Some(1));
        assert_eq!(exit_info(128).code, Some(128));
    }
}
