//! Processes in an E2B sandbox through envd's `process.Process` service.
//!
//! `Start` streams start / data / end events; the wrapper (`scripts::SPAWN`) reports a
//! handshake line on stderr before it execs argv as a session leader with the same pid.
//! Stdin is streamed: each chunk written to the process's stdin becomes one `SendInput`
//! (in order, one at a time), and closing it sends `CloseStdin`, so MCP stdio servers work
//! (`Capabilities::streaming_stdin`). Killing: envd's `SendSignal` reaches only the process
//! itself, so `kill()` also runs `scripts::KILL`, which sweeps the session and every
//! process carrying the exec's `BERTH_EXEC_ID` marker. A process outlives its `Start`
//! stream at envd, so dropping a `Spawned` without waiting kills it the same way.
//!
//! Exit status: envd reports `exitCode` (-1 when killed) and Go's `ProcessState` string;
//! a signal is read back from its name (`signal: killed` → 9).

use std::collections::BTreeMap;
use std::io;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot, watch};

use berth_workspace::backend::{BoxedReader, BoxedWriter, ExitInfo, ProcessControl, Spawned};
use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;
use super::envd::{Envd, EnvdError, EnvdResult, ROOT, USER, decode_bytes, encode_bytes, json_u64};
use super::http::Retry;
use super::scripts;

/// The env variable carrying an exec's kill marker.
pub const EXEC_MARKER_ENV: &str = "BERTH_EXEC_ID";
/// How long a spawn may take to report that argv started.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);
/// Output chunks buffered per stream for a slow reader.
const CHANNEL_CHUNKS: usize = 16;
/// Largest stdin chunk per `SendInput`.
const STDIN_CHUNK: usize = 64 * 1024;
/// Deadline of the internal commands (readlink, chmod, kill sweeps).
const INTERNAL_TIMEOUT: Duration = Duration::from_secs(60);
/// Go's names of the Linux signals, as envd's status strings spell them.
const SIGNALS: [(&str, i32); 15] = [
    ("hangup", 1),
    ("interrupt", 2),
    ("quit", 3),
    ("illegal instruction", 4),
    ("trace/breakpoint trap", 5),
    ("aborted", 6),
    ("bus error", 7),
    ("floating point exception", 8),
    ("killed", 9),
    ("user defined signal 1", 10),
    ("segmentation fault", 11),
    ("user defined signal 2", 12),
    ("broken pipe", 13),
    ("alarm clock", 14),
    ("terminated", 15),
];

fn unavailable(reason: String) -> WorkspaceError {
    WorkspaceError::BackendUnavailable { backend: BACKEND_NAME, reason }
}

/// The exit of an end event.
pub fn exit_of(end: &Value) -> ExitInfo {
    let exited = end.get("exited").and_then(Value::as_bool).unwrap_or(false);
    let code = end.get("exitCode").and_then(Value::as_i64).unwrap_or(0) as i32;
    if exited {
        return ExitInfo { code: Some(code), signal: None };
    }
    let status = end.get("status").and_then(Value::as_str).unwrap_or("");
    let name = status.strip_prefix("signal: ").unwrap_or("").trim_end_matches(" (core dumped)");
    let signal = SIGNALS
        .iter()
        .find(|(known, _)| *known == name)
        .map(|(_, number)| *number)
        .or_else(|| name.strip_prefix("signal ").and_then(|number| number.parse().ok()));
    match signal {
        Some(signal) => ExitInfo { code: None, signal: Some(signal) },
        None if code >= 0 => ExitInfo { code: Some(code), signal: None },
        None => ExitInfo { code: None, signal: Some(9) },
    }
}

/// A process's pid from the first event of a `Start` stream.
async fn start_pid(events: &mut BoxStream<'static, EnvdResult<Value>>) -> Result<u32> {
    loop {
        match events.next().await {
            Some(Ok(message)) => {
                let event = message.get("event").cloned().unwrap_or(Value::Null);
                if event.get("keepalive").is_some() {
                    continue;
                }
                return json_u64(event.get("start").and_then(|start| start.get("pid")))
                    .and_then(|pid| u32::try_from(pid).ok())
                    .ok_or_else(|| unavailable(format!("envd opened a process stream with {event}")));
            }
            Some(Err(error)) => return Err(error.into_error("start a process", "")),
            None => return Err(unavailable("envd ended a process stream before it started".into())),
        }
    }
}

/// Runs an internal command to completion: (exit, stdout, stderr).
pub async fn run_internal(envd: &Envd, argv: &[&str], cwd: &str) -> Result<(ExitInfo, Vec<u8>, Vec<u8>)> {
    run_internal_as(envd, argv, cwd, USER).await
}

/// [`run_internal`] as `user`.
pub async fn run_internal_as(
    envd: &Envd,
    argv: &[&str],
    cwd: &str,
    user: &str,
) -> Result<(ExitInfo, Vec<u8>, Vec<u8>)> {
    let (cmd, args) = argv.split_first().ok_or_else(|| WorkspaceError::InvalidArgument("empty argv".into()))?;
    let message = json!({"process": {"cmd": cmd, "args": args, "envs": {"LC_ALL": "C"}, "cwd": cwd}, "stdin": false});
    let mut events = envd
        .server_stream("process.Process/Start", &message, Some(INTERNAL_TIMEOUT), user)
        .await
        .map_err(|error| error.into_error("run a command", cwd))?;
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    while let Some(message) = events.next().await {
        let message = message.map_err(|error| error.into_error("run a command", cwd))?;
        let event = message.get("event").cloned().unwrap_or(Value::Null);
        if let Some(data) = event.get("data") {
            if let Some(chunk) = data.get("stdout").and_then(decode_bytes) {
                stdout.extend_from_slice(&chunk);
            }
            if let Some(chunk) = data.get("stderr").and_then(decode_bytes) {
                stderr.extend_from_slice(&chunk);
            }
        } else if let Some(end) = event.get("end") {
            return Ok((exit_of(end), stdout, stderr));
        }
    }
    Err(unavailable("a command's stream ended without its exit".into()))
}

/// What to start.
pub struct Launch {
    pub argv: Vec<String>,
    /// Absolute cwd inside the sandbox (resolved inside the workspace root).
    pub cwd: String,
    pub env: BTreeMap<String, String>,
    pub generation: u64,
    pub generation_file: String,
    /// `Some(pin or "-")` for a secret holder: run as root in a private directory (see
    /// `scripts::SECRET`), argv[0] absolute (a resolved workspace path when pinned).
    pub secret_holder: Option<String>,
}

enum Handshake {
    Started,
    Refused(String),
    Ended,
}

/// Starts a process (see the module docs).
pub async fn spawn(envd: &Envd, launch: Launch) -> Result<Spawned> {
    let program = launch.argv.first().cloned().unwrap_or_default();
    let nonce = hex::encode(rand::random::<[u8; 12]>());
    let mut env = launch.env;
    env.insert(EXEC_MARKER_ENV.to_owned(), nonce.clone());
    let (script, name, user) = match &launch.secret_holder {
        Some(_) => (scripts::SECRET, "berth-secret", ROOT),
        None => (scripts::SPAWN, "berth-spawn", USER),
    };
    let mut args = vec!["-c".to_owned(), script.to_owned(), name.to_owned(), nonce.clone()];
    args.extend([launch.generation.to_string(), launch.generation_file]);
    if let Some(pin) = &launch.secret_holder {
        args.push(pin.clone());
    }
    args.extend(launch.argv);
    let message = json!({"process": {"cmd": "/bin/sh", "args": args, "envs": env, "cwd": launch.cwd}, "stdin": true});
    let mut events = envd
        .server_stream("process.Process/Start", &message, None, user)
        .await
        .map_err(|error| error.into_error("start a process", &launch.cwd))?;
    let pid = start_pid(&mut events).await?;
    let (handshake_sender, handshake) = oneshot::channel();
    let (stdout_sender, stdout_receiver) = mpsc::channel(CHANNEL_CHUNKS);
    let (stderr_sender, stderr_receiver) = mpsc::channel(CHANNEL_CHUNKS);
    let (exit_sender, exit) = watch::channel(None);
    tokio::spawn(pump(events, nonce.clone(), handshake_sender, stdout_sender, stderr_sender, exit_sender));
    let mut control = E2bControl { envd: envd.clone(), pid, nonce, exit, finished: false, user };
    match tokio::time::timeout(HANDSHAKE_TIMEOUT, handshake).await {
        Ok(Ok(Handshake::Started)) => {}
        Ok(Ok(Handshake::Refused(kind))) => {
            control.finished = true;
            if let Some(held) = kind.strip_prefix("fenced ").and_then(|held| held.parse().ok()) {
                return Err(WorkspaceError::SandboxFenced {
                    workspace_id: envd.sandbox_id().to_owned(),
                    held,
                    asked: launch.generation,
                });
            }
            if kind == "pin" {
                return Err(WorkspaceError::InvalidArgument(format!(
                    "the program {program:?} does not match its sha256 pin"
                )));
            }
            return Err(WorkspaceError::SpawnFailed { program, reason: "not found or not executable".into() });
        }
        Ok(Ok(Handshake::Ended) | Err(_)) => {
            control.finished = true;
            return Err(WorkspaceError::SpawnFailed { program, reason: "the process ended before it started".into() });
        }
        Err(_) => {
            return Err(WorkspaceError::Timeout {
                operation: "starting an e2b process",
                millis: HANDSHAKE_TIMEOUT.as_millis() as u64,
            });
        }
    }
    let (stdin, stdin_pipe) = tokio::io::duplex(STDIN_CHUNK);
    tokio::spawn(feed_stdin(envd.clone(), pid, stdin_pipe));
    Ok(Spawned {
        stdin: Box::pin(stdin) as BoxedWriter,
        stdout: reader(stdout_receiver),
        stderr: reader(stderr_receiver),
        control: Box::new(control),
    })
}

fn reader(receiver: mpsc::Receiver<Bytes>) -> BoxedReader {
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (Ok::<Bytes, io::Error>(chunk), receiver))
    });
    Box::pin(tokio_util::io::StreamReader::new(stream.boxed()))
}

/// Reads the event stream: output to the two channels (stderr after the handshake line),
/// the exit to the watch.
async fn pump(
    mut events: BoxStream<'static, EnvdResult<Value>>,
    nonce: String,
    handshake: oneshot::Sender<Handshake>,
    stdout: mpsc::Sender<Bytes>,
    stderr: mpsc::Sender<Bytes>,
    exit: watch::Sender<Option<std::result::Result<ExitInfo, String>>>,
) {
    let mut handshake = Some(handshake);
    let mut early_stderr = Vec::new();
    let mut outcome = Err("the process stream ended without an exit".to_owned());
    while let Some(message) = events.next().await {
        let message = match message {
            Ok(message) => message,
            Err(EnvdError::Code { code, message }) => {
                outcome = Err(format!("{code}: {message}"));
                break;
            }
            Err(EnvdError::Http(failure)) => {
                outcome = Err(format!("{failure:?}"));
                break;
            }
        };
        let event = message.get("event").cloned().unwrap_or(Value::Null);
        if let Some(data) = event.get("data") {
            if let Some(chunk) = data.get("stdout").and_then(decode_bytes) {
                let _ = stdout.send(chunk).await;
            }
            if let Some(chunk) = data.get("stderr").and_then(decode_bytes) {
                if handshake.is_none() {
                    let _ = stderr.send(chunk).await;
                    continue;
                }
                early_stderr.extend_from_slice(&chunk);
                let Some(newline) = early_stderr.iter().position(|&byte| byte == b'\n') else { continue };
                let line = String::from_utf8_lossy(&early_stderr[..newline]).into_owned();
                let rest = Bytes::copy_from_slice(&early_stderr[newline + 1..]);
                let verdict = match line.strip_prefix(&format!("{nonce} ")) {
                    Some(ok) if ok.starts_with("ok ") => Handshake::Started,
                    Some(fail) => Handshake::Refused(fail.strip_prefix("fail ").unwrap_or(fail).to_owned()),
                    // Not our line: the wrapper never ran as expected.
                    None => Handshake::Refused("noprogram".to_owned()),
                };
                if let Some(sender) = handshake.take() {
                    let _ = sender.send(verdict);
                }
                if !rest.is_empty() {
                    let _ = stderr.send(rest).await;
                }
            }
        } else if let Some(end) = event.get("end") {
            outcome = Ok(exit_of(end));
            break;
        }
    }
    if let Some(sender) = handshake.take() {
        let _ = sender.send(Handshake::Ended);
    }
    drop((stdout, stderr));
    let _ = exit.send(Some(outcome));
}

/// Forwards the caller's stdin writes as `SendInput` calls, then `CloseStdin` at EOF.
async fn feed_stdin(envd: Envd, pid: u32, mut pipe: tokio::io::DuplexStream) {
    let mut buffer = vec![0u8; STDIN_CHUNK];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(count) => {
                let message = json!({"process": {"pid": pid}, "input": {"stdin": encode_bytes(&buffer[..count])}});
                if envd.unary("process.Process/SendInput", &message, Retry::Refused).await.is_err() {
                    // The process is gone (or its stdin closed): the writer sees a broken pipe.
                    return;
                }
            }
        }
    }
    let _ = envd.unary("process.Process/CloseStdin", &json!({"process": {"pid": pid}}), Retry::Idempotent).await;
}

struct E2bControl {
    envd: Envd,
    pid: u32,
    nonce: String,
    exit: watch::Receiver<Option<std::result::Result<ExitInfo, String>>>,
    finished: bool,
    /// Who the process runs as (the sweep runs as the same user).
    user: &'static str,
}

/// SIGKILL to the process, then the sweep of its session and marker.
async fn kill_tree(envd: &Envd, pid: u32, nonce: &str, user: &str) -> Result<()> {
    let signal = json!({"process": {"pid": pid}, "signal": "SIGNAL_SIGKILL"});
    match envd.unary("process.Process/SendSignal", &signal, Retry::Idempotent).await {
        Ok(_) => {}
        Err(error) if error.code() == Some("not_found") => {}
        Err(error) => return Err(error.into_error("kill a process", "")),
    }
    let pid_text = pid.to_string();
    let argv = ["/bin/sh", "-c", scripts::KILL, "berth-kill", &pid_text, nonce];
    let (exit, _, stderr) = run_internal_as(envd, &argv, "/", user).await?;
    if exit.code != Some(0) {
        return Err(WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("the kill sweep of process {pid} did not finish: {}", String::from_utf8_lossy(&stderr)),
        });
    }
    Ok(())
}

#[async_trait]
impl ProcessControl for E2bControl {
    async fn wait(&mut self) -> Result<ExitInfo> {
        loop {
            if let Some(outcome) = self.exit.borrow().clone() {
                self.finished = true;
                return outcome.map_err(unavailable);
            }
            if self.exit.changed().await.is_err() {
                self.finished = true;
                return Err(unavailable("lost the process stream".into()));
            }
        }
    }

    async fn kill(&mut self) -> Result<()> {
        kill_tree(&self.envd, self.pid, &self.nonce, self.user).await
    }
}

impl Drop for E2bControl {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else { return };
        let (envd, pid, nonce, user) = (self.envd.clone(), self.pid, self.nonce.clone(), self.user);
        runtime.spawn(async move {
            if let Err(error) = kill_tree(&envd, pid, &nonce, user).await {
                tracing::warn!(%error, pid, "could not kill an abandoned e2b process");
            }
        });
    }
}
