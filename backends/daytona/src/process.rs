//! Processes in a Daytona sandbox.
//!
//! The toolbox has no call that streams a process's stdout and stderr apart and takes
//! binary stdin (`process/execute` answers once, with both streams merged into one text;
//! session logs are text too), so a spawn runs `scripts/spawn.sh` as an asynchronous
//! command of a toolbox session of its own: it runs argv with stdout and stderr in two
//! files of a per-process directory and stdin from a FIFO. Output is read by polling
//! `poll.sh` through `process/execute` (state plus new bytes of each file since the last
//! offsets, base64), so streams stay apart, binary-safe and in order per stream
//! (`Capabilities::separate_stderr`). Stdin is streamed through the session's `input` call
//! as base64 lines the wrapper decodes, and a "." line closes it
//! (`Capabilities::streaming_stdin`), which MCP stdio servers need.
//!
//! Killing: `kill.sh` sweeps the process's session (argv runs as a session leader) and
//! every process carrying the exec's `BERTH_EXEC_ID` marker; the wrapper then records the
//! wait status. A dropped `Spawned` without `wait` kills the same way. Exit status: the
//! shell's wait status, so a status above 128 reads as a signal (a program that exits 130
//! by itself is reported as SIGINT — the one ambiguity of this transport).

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot, watch};

use berth_workspace::backend::{BoxedReader, BoxedWriter, ExitInfo, ProcessControl, Spawned};
use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;
use super::http::Retry;
use super::scripts::{self, command_line, quote};
use super::toolbox::Toolbox;

/// How long a spawn may take to report that argv started.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Output chunks buffered per stream for a slow reader.
const CHANNEL_CHUNKS: usize = 16;
/// Raw stdin bytes per `input` call (base64 makes a line of 64 KiB of them).
const STDIN_CHUNK: usize = 48 * 1024;
/// Most bytes of each stream one poll fetches.
const POLL_BYTES: u64 = 1024 * 1024;
/// The first and the longest pause between polls that found nothing new.
const FIRST_POLL_PAUSE: Duration = Duration::from_millis(5);
const MAX_POLL_PAUSE: Duration = Duration::from_millis(100);
/// Deadline of the internal commands (poll, kill sweep, cleanup).
pub const INTERNAL_TIMEOUT: Duration = Duration::from_secs(60);

fn unavailable(reason: String) -> WorkspaceError {
    WorkspaceError::BackendUnavailable { backend: BACKEND_NAME, reason }
}

/// What to start.
pub struct Launch {
    pub argv: Vec<String>,
    /// The cwd relative to the workspace root (resolved inside it by the wrapper).
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    pub generation: u64,
    pub generation_file: String,
    pub workspace_id: String,
}

enum Handshake {
    Started,
    Refused(String),
    Ended(String),
}

/// What one poll saw.
struct Polled {
    state: String,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

async fn poll(toolbox: &Toolbox, dir: &str, stdout_offset: u64, stderr_offset: u64) -> Result<Polled> {
    let (out, err, max) = (stdout_offset.to_string(), stderr_offset.to_string(), POLL_BYTES.to_string());
    let line = command_line(scripts::POLL, "berth-poll", &[dir, &out, &err, &max]);
    let (code, text) = toolbox.execute(&line, INTERNAL_TIMEOUT, Retry::Idempotent).await?;
    let mut lines = text.split('\n');
    let (Some(state), Some(stdout), Some(stderr)) = (lines.next(), lines.next(), lines.next()) else {
        return Err(unavailable(format!(
            "a process poll answered {code}: {}",
            text.chars().take(300).collect::<String>()
        )));
    };
    let decode = |text: &str| {
        STANDARD
            .decode(text.trim())
            .map_err(|error| unavailable(format!("a process poll answered bad base64: {error}")))
    };
    Ok(Polled { state: state.trim().to_owned(), stdout: decode(stdout)?, stderr: decode(stderr)? })
}

/// The exit of a wait status.
fn exit_of(status: i32, killed: bool) -> ExitInfo {
    if killed && status > 128 {
        return ExitInfo { code: None, signal: Some(9) };
    }
    if status > 128 && status < 128 + 65 {
        ExitInfo { code: None, signal: Some(status - 128) }
    } else {
        ExitInfo { code: Some(status), signal: None }
    }
}

/// Shared between the pump and the control.
struct Tracker {
    /// argv's pid (its session id) once known.
    pid: watch::Sender<Option<u32>>,
    killed: std::sync::atomic::AtomicBool,
}

/// Starts a process (see the module docs).
pub async fn spawn(toolbox: &Toolbox, spawn_script: &str, launch: Launch) -> Result<Spawned> {
    let program = launch.argv.first().cloned().unwrap_or_default();
    let nonce = scripts::nonce();
    let dir = format!("/tmp/berth-exec-{nonce}");
    let session = format!("berth-{nonce}");
    let mut words = Vec::new();
    if !launch.env.is_empty() {
        words.push(quote("env"));
        words.extend(launch.env.iter().map(|(key, value)| quote(&format!("{key}={value}"))));
    }
    let generation = launch.generation.to_string();
    let mut args: Vec<&str> = vec![&nonce, &generation, &launch.generation_file, &dir, &launch.cwd];
    args.extend(launch.argv.iter().map(String::as_str));
    words.push(command_line(spawn_script, "berth-spawn", &args));
    toolbox.create_session(&session).await?;
    let command_id = match toolbox.session_exec(&session, &words.join(" ")).await {
        Ok(command_id) => command_id,
        Err(error) => {
            let _ = toolbox.delete_session(&session).await;
            return Err(error);
        }
    };
    let (handshake_sender, handshake) = oneshot::channel();
    let (stdout_sender, stdout_receiver) = mpsc::channel(CHANNEL_CHUNKS);
    let (stderr_sender, stderr_receiver) = mpsc::channel(CHANNEL_CHUNKS);
    let (exit_sender, exit) = watch::channel(None);
    let tracker = Arc::new(Tracker { pid: watch::channel(None).0, killed: Default::default() });
    let process = Arc::new(Remote {
        toolbox: toolbox.clone(),
        stdin_written: tokio::sync::Notify::new(),
        dir,
        session,
        command_id,
        nonce,
    });
    tokio::spawn(pump(process.clone(), tracker.clone(), handshake_sender, stdout_sender, stderr_sender, exit_sender));
    let mut control = DaytonaControl { process: process.clone(), tracker, exit, finished: false };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(Handshake::Started)) => {}
        Ok(Ok(Handshake::Refused(kind))) => {
            control.finished = true;
            if let Some(held) = kind.strip_prefix("fenced ").and_then(|held| held.parse().ok()) {
                return Err(WorkspaceError::SandboxFenced {
                    workspace_id: launch.workspace_id,
                    held,
                    asked: launch.generation,
                });
            }
            return Err(match kind.as_str() {
                "notfound" => WorkspaceError::NotFound { path: launch.cwd },
                "notdir" => WorkspaceError::NotADirectory { path: launch.cwd },
                "escape" => WorkspaceError::PathEscapesRoot { path: launch.cwd },
                "noprogram" => WorkspaceError::SpawnFailed { program, reason: "not found or not executable".into() },
                other => WorkspaceError::SpawnFailed { program, reason: format!("the wrapper failed: {other}") },
            });
        }
        Ok(Ok(Handshake::Ended(reason))) => {
            control.finished = true;
            return Err(WorkspaceError::SpawnFailed { program, reason });
        }
        Ok(Err(_)) => {
            control.finished = true;
            return Err(WorkspaceError::SpawnFailed { program, reason: "the process ended before it started".into() });
        }
        Err(_) => {
            return Err(WorkspaceError::Timeout {
                operation: "starting a daytona process",
                millis: HANDSHAKE_TIMEOUT.as_millis() as u64,
            });
        }
    }
    let (stdin, stdin_pipe) = tokio::io::duplex(STDIN_CHUNK);
    tokio::spawn(feed_stdin(process, stdin_pipe));
    Ok(Spawned {
        stdin: Box::pin(stdin) as BoxedWriter,
        stdout: reader(stdout_receiver),
        stderr: reader(stderr_receiver),
        control: Box::new(control),
    })
}

/// One spawned process's handles in the sandbox.
struct Remote {
    toolbox: Toolbox,
    /// Woken when stdin was written: an answer is likely soon, so the next poll is not
    /// left to the idle backoff.
    stdin_written: tokio::sync::Notify,
    /// Its directory (`out`, `err`, `in`, `pid`, `status`, `fail`).
    dir: String,
    /// The toolbox session running the wrapper, and the wrapper's command id.
    session: String,
    command_id: String,
    nonce: String,
}

impl Remote {
    /// Removes the process's directory and session (after its end).
    async fn clean_up(&self) {
        let line = format!("rm -rf -- {}", quote(&self.dir));
        let _ = self.toolbox.execute(&line, INTERNAL_TIMEOUT, Retry::Idempotent).await;
        let _ = self.toolbox.delete_session(&self.session).await;
    }
}

fn reader(receiver: mpsc::Receiver<Bytes>) -> BoxedReader {
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (Ok::<Bytes, io::Error>(chunk), receiver))
    });
    Box::pin(tokio_util::io::StreamReader::new(stream.boxed()))
}

/// Polls the process: the handshake, output to the two channels, the exit to the watch.
async fn pump(
    process: Arc<Remote>,
    tracker: Arc<Tracker>,
    handshake: oneshot::Sender<Handshake>,
    stdout: mpsc::Sender<Bytes>,
    stderr: mpsc::Sender<Bytes>,
    exit: watch::Sender<Option<std::result::Result<ExitInfo, String>>>,
) {
    let mut handshake = Some(handshake);
    let (mut stdout_offset, mut stderr_offset) = (0u64, 0u64);
    let mut pause = FIRST_POLL_PAUSE;
    let started = tokio::time::Instant::now();
    let mut polls_without_wrapper = 0u32;
    let outcome = loop {
        let polled = match poll(&process.toolbox, &process.dir, stdout_offset, stderr_offset).await {
            Ok(polled) => polled,
            Err(error) => break Err(format!("polling the process failed: {error}")),
        };
        let fresh = !polled.stdout.is_empty() || !polled.stderr.is_empty();
        let mut words = polled.state.split(' ');
        let kind = words.next().unwrap_or("");
        let detail = words.collect::<Vec<_>>().join(" ");
        match kind {
            "fail" => {
                if let Some(sender) = handshake.take() {
                    let _ = sender.send(Handshake::Refused(detail.clone()));
                }
                break Err(format!("the process could not start: {detail}"));
            }
            "running" | "exit" => {
                if let Some(sender) = handshake.take() {
                    let _ = sender.send(Handshake::Started);
                }
            }
            _ => {
                // "starting" / "gone": the wrapper has not got far yet — or died.
                polls_without_wrapper += 1;
                if polls_without_wrapper.is_multiple_of(8)
                    && let Ok(Some(code)) = process.toolbox.command_exit(&process.session, &process.command_id).await
                {
                    let reason = format!("the wrapper ended with {code} before the process started");
                    if let Some(sender) = handshake.take() {
                        let _ = sender.send(Handshake::Ended(reason.clone()));
                    }
                    break Err(reason);
                }
                if started.elapsed() > HANDSHAKE_TIMEOUT {
                    break Err("the process did not start".to_owned());
                }
            }
        }
        if kind == "running" && tracker.pid.borrow().is_none() {
            tracker.pid.send_replace(detail.parse().ok());
        }
        stdout_offset += polled.stdout.len() as u64;
        stderr_offset += polled.stderr.len() as u64;
        let complete = polled.stdout.len() < POLL_BYTES as usize && polled.stderr.len() < POLL_BYTES as usize;
        // A reader that went away no longer needs the bytes; the process still runs on.
        if !polled.stdout.is_empty() {
            let _ = stdout.send(Bytes::from(polled.stdout)).await;
        }
        if !polled.stderr.is_empty() {
            let _ = stderr.send(Bytes::from(polled.stderr)).await;
        }
        if kind == "exit" && complete {
            let killed = tracker.killed.load(std::sync::atomic::Ordering::Relaxed);
            match detail.parse::<i32>() {
                Ok(status) => break Ok(exit_of(status, killed)),
                Err(_) => break Err(format!("the process reported the status {detail:?}")),
            }
        }
        if fresh {
            pause = FIRST_POLL_PAUSE;
        } else {
            tokio::select! {
                () = tokio::time::sleep(pause) => pause = (pause * 2).min(MAX_POLL_PAUSE),
                () = process.stdin_written.notified() => pause = FIRST_POLL_PAUSE,
            }
        }
    };
    if let Some(sender) = handshake.take() {
        let reason = match &outcome {
            Err(reason) => reason.clone(),
            Ok(_) => "the process ended before it started".to_owned(),
        };
        let _ = sender.send(Handshake::Ended(reason));
    }
    drop((stdout, stderr));
    let _ = exit.send(Some(outcome));
    process.clean_up().await;
}

/// Forwards the caller's stdin writes as base64 lines, then "." at EOF.
async fn feed_stdin(process: Arc<Remote>, mut pipe: tokio::io::DuplexStream) {
    let mut buffer = vec![0u8; STDIN_CHUNK];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(count) => {
                let line = format!("{}\n", STANDARD.encode(&buffer[..count]));
                if process.toolbox.send_input(&process.session, &process.command_id, &line).await.is_err() {
                    // The process is gone: the writer sees a broken pipe.
                    return;
                }
                process.stdin_written.notify_one();
            }
        }
    }
    let _ = process.toolbox.send_input(&process.session, &process.command_id, ".\n").await;
}

struct DaytonaControl {
    process: Arc<Remote>,
    tracker: Arc<Tracker>,
    exit: watch::Receiver<Option<std::result::Result<ExitInfo, String>>>,
    finished: bool,
}

/// The sweep of argv's session (when its pid is known) and of its marker.
async fn kill_tree(toolbox: &Toolbox, pid: Option<u32>, nonce: &str) -> Result<()> {
    // "-" matches no session: before argv runs only its marker can be swept.
    let sid = pid.map_or_else(|| "-".to_owned(), |pid| pid.to_string());
    let line = command_line(scripts::KILL, "berth-kill", &[&sid, nonce]);
    let (code, output) = toolbox.execute(&line, INTERNAL_TIMEOUT, Retry::Idempotent).await?;
    if code != 0 || !output.contains("berth-killed") {
        return Err(WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("the kill sweep of process {sid} did not finish: {}", output.trim()),
        });
    }
    Ok(())
}

#[async_trait]
impl ProcessControl for DaytonaControl {
    async fn wait(&mut self) -> Result<ExitInfo> {
        loop {
            if let Some(outcome) = self.exit.borrow().clone() {
                self.finished = true;
                return outcome.map_err(unavailable);
            }
            if self.exit.changed().await.is_err() {
                self.finished = true;
                return Err(unavailable("lost the process".into()));
            }
        }
    }

    async fn kill(&mut self) -> Result<()> {
        self.tracker.killed.store(true, std::sync::atomic::Ordering::Relaxed);
        let pid = *self.tracker.pid.borrow();
        kill_tree(&self.process.toolbox, pid, &self.process.nonce).await
    }
}

impl Drop for DaytonaControl {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        self.tracker.killed.store(true, std::sync::atomic::Ordering::Relaxed);
        let pid = *self.tracker.pid.borrow();
        let process = self.process.clone();
        runtime.spawn(async move {
            if let Err(error) = kill_tree(&process.toolbox, pid, &process.nonce).await {
                tracing::warn!(%error, "could not kill an abandoned daytona process");
            }
        });
    }
}
