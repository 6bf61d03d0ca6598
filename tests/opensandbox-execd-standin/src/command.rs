//! `POST /command` (foreground: a stream of JSON events, each followed by a blank line;
//! background: detached, output kept for `/command/{id}/logs`), `DELETE /command?id=`
//! (interrupt: SIGTERM to the process group, SIGKILL after a grace), and
//! `GET /command/status/{id}`.
//!
//! As the real daemon does: the command runs as `bash -c` (or `sh -c` without bash) in a
//! process group of its own, with stdin on `/dev/null`, the daemon's environment plus
//! `envs`, as `uid`/`gid` when given; a foreground command whose client goes away, or whose
//! `timeout` (ms) passes, has its whole group killed; a non-zero exit is an `error` event
//! with `ename` `CommandExecError` and `evalue` the exit code (`-1` for a signal), and its
//! `traceback` says `exit status N` / `signal: NAME` the way Go's `os/exec` does.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use http::{StatusCode, header};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use crate::answer::{self, empty_ok, error};
use crate::query::Query;

/// How often a foreground stream carries a `ping` event while the command is quiet.
const PING_EVERY: Duration = Duration::from_secs(5);
/// After the command exits, how long output still in its pipes is read (an orphan holding a
/// pipe must not keep the stream open; the real daemon stops tailing its log files then).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(100);
/// Between an interrupt's SIGTERM and its SIGKILL.
const INTERRUPT_GRACE: Duration = Duration::from_secs(3);

#[derive(Deserialize)]
struct RunRequest {
    command: String,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    background: bool,
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    uid: Option<u32>,
    #[serde(default)]
    gid: Option<u32>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
}

#[derive(Default)]
pub struct Commands {
    table: Mutex<HashMap<String, Arc<Entry>>>,
    counter: AtomicU64,
}

struct Entry {
    content: String,
    started_at: SystemTime,
    state: Mutex<EntryState>,
}

#[derive(Default)]
struct EntryState {
    pgid: Option<i32>,
    running: bool,
    exit_code: Option<i32>,
    error: Option<String>,
    finished_at: Option<SystemTime>,
    /// Combined output of a background command.
    log: Vec<u8>,
}

impl Entry {
    fn finish(&self, status: Result<ExitStatus, String>) {
        let mut state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.running = false;
        state.finished_at = Some(SystemTime::now());
        match status {
            Ok(status) if status.success() => state.exit_code = Some(0),
            Ok(status) => {
                state.exit_code = Some(status.code().unwrap_or(-1));
                state.error = Some(go_exit_text(status));
            }
            Err(problem) => {
                state.exit_code = Some(1);
                state.error = Some(problem);
            }
        }
    }

    fn pgid(&self) -> Option<i32> {
        let state = self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        state.running.then_some(state.pgid).flatten()
    }
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |duration| duration.as_millis() as i64)
}

fn rfc3339(time: SystemTime) -> String {
    let seconds = time.duration_since(UNIX_EPOCH).map_or(0, |duration| duration.as_secs() as i64);
    crate::answer::rfc3339(seconds)
}

/// Go's names of Linux signals (`syscall.Signal.String()`), as `os/exec` prints them.
fn go_signal_name(signal: i32) -> String {
    let name = match signal {
        1 => "hangup",
        2 => "interrupt",
        3 => "quit",
        4 => "illegal instruction",
        5 => "trace/breakpoint trap",
        6 => "aborted",
        7 => "bus error",
        8 => "floating point exception",
        9 => "killed",
        10 => "user defined signal 1",
        11 => "segmentation fault",
        12 => "user defined signal 2",
        13 => "broken pipe",
        14 => "alarm clock",
        15 => "terminated",
        _ => return format!("signal {signal}"),
    };
    name.to_owned()
}

/// `exit status N` / `signal: NAME`, the text of Go's `*exec.ExitError`.
fn go_exit_text(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("signal: {}", go_signal_name(signal)),
        _ => "exit status unknown".to_owned(),
    }
}

fn event(kind: &str, fields: Value) -> Bytes {
    let mut object = match fields {
        Value::Object(object) => object,
        _ => serde_json::Map::new(),
    };
    object.insert("type".into(), kind.into());
    object.insert("timestamp".into(), now_ms().into());
    let mut text = Value::Object(object).to_string();
    text.push_str("\n\n");
    Bytes::from(text)
}

/// Text of an output chunk: valid UTF-8 passes, invalid bytes become U+FFFD (as Go's JSON
/// encoder writes them), a sequence cut at the chunk's end waits in `carry`.
fn decode(carry: &mut Vec<u8>, data: &[u8]) -> String {
    carry.extend_from_slice(data);
    let mut text = String::new();
    let mut rest: &[u8] = carry;
    loop {
        match std::str::from_utf8(rest) {
            Ok(valid) => {
                text.push_str(valid);
                rest = &[];
                break;
            }
            Err(problem) => {
                let (valid, after) = rest.split_at(problem.valid_up_to());
                text.push_str(std::str::from_utf8(valid).unwrap_or_default());
                match problem.error_len() {
                    Some(length) => {
                        text.push('\u{FFFD}');
                        rest = &after[length..];
                    }
                    None => {
                        rest = after;
                        break;
                    }
                }
            }
        }
    }
    let left = rest.to_vec();
    *carry = left;
    text
}

fn shell() -> &'static str {
    let path = std::env::var("PATH").unwrap_or_default();
    if path.split(':').any(|dir| std::path::Path::new(dir).join("bash").is_file()) { "bash" } else { "sh" }
}

/// The primary group of `uid` in `/etc/passwd`; 0 when it has no entry (as the daemon does).
fn primary_gid(uid: u32) -> u32 {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    passwd
        .lines()
        .find_map(|line| {
            let fields: Vec<&str> = line.split(':').collect();
            (fields.get(2)?.parse::<u32>().ok()? == uid).then(|| fields.get(3)?.parse().ok())?
        })
        .unwrap_or(0)
}

fn kill_group(pgid: i32, signal: Signal) {
    let _ = killpg(Pid::from_raw(pgid), signal);
}

/// Kills the command's group when the event stream is dropped before the command ended.
struct KillOnDrop {
    entry: Arc<Entry>,
    finished: Arc<AtomicBool>,
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if !self.finished.load(Ordering::SeqCst)
            && let Some(pgid) = self.entry.pgid()
        {
            kill_group(pgid, Signal::SIGKILL);
        }
    }
}

pub async fn run(State(commands): State<Arc<Commands>>, body: Bytes) -> Response {
    let request: RunRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(problem) => {
            return error(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", format!("error parsing request: {problem}"));
        }
    };
    if request.gid.is_some() && request.uid.is_none() {
        return error(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", "gid requires uid");
    }
    let id = format!("cmd-{:x}-{}", now_ms(), commands.counter.fetch_add(1, Ordering::SeqCst));
    let entry = Arc::new(Entry {
        content: request.command.clone(),
        started_at: SystemTime::now(),
        state: Mutex::new(EntryState { running: true, ..EntryState::default() }),
    });
    commands.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id.clone(), entry.clone());

    let mut command = tokio::process::Command::new(shell());
    command.arg("-c").arg(&request.command).envs(&request.envs).stdin(Stdio::null()).process_group(0);
    command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(false);
    if let Some(cwd) = request.cwd.as_deref().filter(|cwd| !cwd.is_empty()) {
        command.current_dir(cwd);
    }
    if let Some(uid) = request.uid {
        command.uid(uid).gid(request.gid.unwrap_or_else(|| primary_gid(uid)));
    }
    let (sender, receiver) = mpsc::channel::<Bytes>(64);
    let _ = sender.send(event("init", json!({ "text": id }))).await;
    let started = Instant::now();
    let child = match command.spawn() {
        Ok(child) => child,
        Err(problem) => {
            let text = problem.to_string();
            entry.finish(Err(text.clone()));
            let _ = sender
                .send(event(
                    "error",
                    json!({ "error": { "ename": "CommandExecError", "evalue": text, "traceback": [text] } }),
                ))
                .await;
            drop(sender);
            return stream_response(receiver, None);
        }
    };
    entry.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).pgid = child.id().map(|pid| pid as i32);
    let finished = Arc::new(AtomicBool::new(false));
    if request.background {
        tokio::spawn(background(child, entry.clone(), finished));
        let _ = sender.send(event("execution_complete", json!({ "execution_time": 0 }))).await;
        drop(sender);
        return stream_response(receiver, None);
    }
    let guard = KillOnDrop { entry: entry.clone(), finished: finished.clone() };
    let timeout = request.timeout.filter(|ms| *ms > 0).map(Duration::from_millis);
    tokio::spawn(foreground(child, entry, finished, sender, started, timeout));
    stream_response(receiver, Some(guard))
}

fn stream_response(receiver: mpsc::Receiver<Bytes>, guard: Option<KillOnDrop>) -> Response {
    let stream = futures::stream::unfold((receiver, guard), |(mut receiver, guard)| async move {
        let chunk = receiver.recv().await?;
        Some((Ok::<_, std::convert::Infallible>(chunk), (receiver, guard)))
    });
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")],
        Body::from_stream(stream.boxed()),
    )
        .into_response()
}

/// Reads one pipe into `kind` events until EOF (or until told to stop after the exit).
async fn pump(
    mut pipe: impl AsyncRead + Unpin,
    kind: &'static str,
    sender: mpsc::Sender<Bytes>,
    mut exited: tokio::sync::watch::Receiver<bool>,
) {
    let mut buffer = vec![0u8; 32 * 1024];
    let mut carry = Vec::new();
    loop {
        let read = if *exited.borrow() {
            match tokio::time::timeout(DRAIN_AFTER_EXIT, pipe.read(&mut buffer)).await {
                Ok(read) => read,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                read = pipe.read(&mut buffer) => read,
                _ = exited.changed() => continue,
            }
        };
        match read {
            Ok(0) | Err(_) => break,
            Ok(count) => {
                let text = decode(&mut carry, &buffer[..count]);
                if !text.is_empty() && sender.send(event(kind, json!({ "text": text }))).await.is_err() {
                    break;
                }
            }
        }
    }
}

async fn foreground(
    mut child: tokio::process::Child,
    entry: Arc<Entry>,
    finished: Arc<AtomicBool>,
    sender: mpsc::Sender<Bytes>,
    started: Instant,
    timeout: Option<Duration>,
) {
    let (exit_sender, exit_receiver) = tokio::sync::watch::channel(false);
    let stdout =
        child.stdout.take().map(|pipe| tokio::spawn(pump(pipe, "stdout", sender.clone(), exit_receiver.clone())));
    let stderr = child.stderr.take().map(|pipe| tokio::spawn(pump(pipe, "stderr", sender.clone(), exit_receiver)));
    let deadline = timeout.map(|timeout| tokio::time::Instant::now() + timeout);
    let mut ping = tokio::time::interval_at(tokio::time::Instant::now() + PING_EVERY, PING_EVERY);
    let status = loop {
        tokio::select! {
            status = child.wait() => break status,
            _ = ping.tick() => {
                if sender.send(event("ping", json!({ "text": "pong" }))).await.is_err() {
                    // The client went away: the stream's guard kills the group.
                }
            }
            _ = async {
                match deadline {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => std::future::pending().await,
                }
            } => {
                if let Some(pgid) = entry.pgid() {
                    kill_group(pgid, Signal::SIGKILL);
                }
            }
        }
    };
    let _ = exit_sender.send(true);
    for pump in [stdout, stderr].into_iter().flatten() {
        let _ = pump.await;
    }
    let status = status.map_err(|problem| problem.to_string());
    entry.finish(status.clone());
    finished.store(true, Ordering::SeqCst);
    let last = match status {
        Ok(status) if status.success() => {
            event("execution_complete", json!({ "execution_time": started.elapsed().as_millis() as u64 }))
        }
        Ok(status) => {
            let value = status.code().unwrap_or(-1).to_string();
            event(
                "error",
                json!({ "error": { "ename": "CommandExecError", "evalue": value, "traceback": [go_exit_text(status)] } }),
            )
        }
        Err(problem) => event(
            "error",
            json!({ "error": { "ename": "CommandExecError", "evalue": problem, "traceback": [problem] } }),
        ),
    };
    let _ = sender.send(last).await;
}

async fn background(mut child: tokio::process::Child, entry: Arc<Entry>, finished: Arc<AtomicBool>) {
    let collect = |pipe: Option<Box<dyn AsyncRead + Unpin + Send>>, entry: Arc<Entry>| async move {
        let Some(mut pipe) = pipe else { return };
        let mut buffer = vec![0u8; 32 * 1024];
        while let Ok(count) = pipe.read(&mut buffer).await {
            if count == 0 {
                break;
            }
            entry.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).log.extend_from_slice(&buffer[..count]);
        }
    };
    let stdout = child.stdout.take().map(|pipe| Box::new(pipe) as Box<dyn AsyncRead + Unpin + Send>);
    let stderr = child.stderr.take().map(|pipe| Box::new(pipe) as Box<dyn AsyncRead + Unpin + Send>);
    tokio::spawn(collect(stdout, entry.clone()));
    tokio::spawn(collect(stderr, entry.clone()));
    let status = child.wait().await.map_err(|problem| problem.to_string());
    entry.finish(status);
    finished.store(true, Ordering::SeqCst);
}

fn find(commands: &Commands, id: &str) -> Option<Arc<Entry>> {
    commands.table.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(id).cloned()
}

pub async fn interrupt(State(commands): State<Arc<Commands>>, request: Request) -> Response {
    let query = Query::parse(request.uri().query());
    let Some(id) = query.first("id").filter(|id| !id.is_empty()).map(str::to_owned) else {
        return error(StatusCode::BAD_REQUEST, "MISSING_QUERY", "missing query parameter 'id'");
    };
    let Some(entry) = find(&commands, &id) else {
        return error(StatusCode::NOT_FOUND, "COMMAND_NOT_FOUND", format!("command {id} not found"));
    };
    if let Some(pgid) = entry.pgid() {
        kill_group(pgid, Signal::SIGTERM);
        tokio::spawn(async move {
            tokio::time::sleep(INTERRUPT_GRACE).await;
            if let Some(pgid) = entry.pgid() {
                kill_group(pgid, Signal::SIGKILL);
            }
        });
    }
    empty_ok()
}

pub async fn status(State(commands): State<Arc<Commands>>, Path(id): Path<String>) -> Response {
    let Some(entry) = find(&commands, &id) else {
        return error(StatusCode::NOT_FOUND, "COMMAND_NOT_FOUND", format!("command {id} not found"));
    };
    let state = entry.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    answer::json(json!({
        "id": id,
        "content": entry.content,
        "running": state.running,
        "exit_code": state.exit_code,
        "error": state.error.clone().unwrap_or_default(),
        "started_at": rfc3339(entry.started_at),
        "finished_at": state.finished_at.map(rfc3339),
    }))
}

pub async fn logs(State(commands): State<Arc<Commands>>, Path(id): Path<String>, request: Request) -> Response {
    let Some(entry) = find(&commands, &id) else {
        return error(StatusCode::NOT_FOUND, "COMMAND_NOT_FOUND", format!("command {id} not found"));
    };
    let cursor = Query::parse(request.uri().query()).first("cursor").and_then(|cursor| cursor.parse::<usize>().ok());
    let log = entry.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).log.clone();
    let text = String::from_utf8_lossy(&log).into_owned();
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let skip = cursor.map_or(0, |cursor| (cursor + 1).min(lines.len()));
    let body: String = lines[skip..].concat();
    let tail = lines.len().saturating_sub(1);
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8".to_owned()),
            (http::HeaderName::from_static("execd-commands-tail-cursor"), tail.to_string()),
        ],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    #[test]
    fn decodes_split_and_invalid_utf8() {
        let mut carry = Vec::new();
        let euro = "€".as_bytes();
        assert_eq!(super::decode(&mut carry, &euro[..2]), "");
        assert_eq!(super::decode(&mut carry, &euro[2..]), "€");
        assert_eq!(super::decode(&mut carry, b"a\xffb"), "a\u{FFFD}b");
        assert!(carry.is_empty());
    }
}
