//! A sandbox's toolbox (the daemon inside every Daytona sandbox, reached through the
//! sandbox's `toolboxProxyUrl` + `/{sandboxId}`): `process/execute` (one command to its
//! end: exit code and stdout + stderr combined in one `result`), sessions (create, list,
//! get, delete; `exec` synchronous or with `runAsync`; a command's state, its logs —
//! `{output, stdout, stderr}` — and `input` written to its stdin), `user-home-dir`,
//! `work-dir`, and the file calls of `files.rs`.
//!
//! Commands run as `sh -c COMMAND` inside the sandbox's namespaces (`nsenter`), as its
//! user, with the sandbox's env and the request's. Unlike Daytona's persistent session
//! shell, each session command runs in a shell of its own (a `cd` does not carry over).

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::response::Response;
use http::{HeaderMap, Method, StatusCode};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

use berth_e2b_emulator::jail::{command_in, inner_process, process_env};
use berth_e2b_emulator::vfs::{HOME, Vfs};

use super::files;
use super::reply::{empty, error, json_ok};
use super::state::{Sandbox, Session, SessionCommand, kill_session, random};

/// Largest JSON request body of a process call.
const MAX_BODY: usize = 16 * 1024 * 1024;
/// `process/execute`'s timeout when the request names none (the daemon's default).
const DEFAULT_EXECUTE_TIMEOUT: Duration = Duration::from_secs(10);

fn exit_code(status: std::process::ExitStatus) -> i32 {
    status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|object| {
            object.iter().filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_owned()))).collect()
        })
        .unwrap_or_default()
}

pub async fn handle(
    sandbox: Arc<Sandbox>,
    init_pid: u32,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    if path.starts_with("/files") {
        return files::handle(sandbox, method, path, query, headers, body).await;
    }
    let body = match to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(failure) => return error(400, &format!("body: {failure}")),
    };
    let request: Value = if body.is_empty() {
        json!({})
    } else {
        match serde_json::from_slice(&body) {
            Ok(request) => request,
            Err(failure) => return error(400, &format!("invalid request body: {failure}")),
        }
    };
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (method, parts.as_slice()) {
        (&Method::GET, ["user-home-dir"]) => json_ok(StatusCode::OK, &json!({"dir": HOME})),
        (&Method::GET, ["work-dir"]) => json_ok(StatusCode::OK, &json!({"dir": HOME})),
        (&Method::GET, ["version"]) => json_ok(StatusCode::OK, &json!({"version": "emulator"})),
        (&Method::POST, ["process", "execute"]) => execute(&sandbox, init_pid, &request).await,
        (&Method::POST, ["process", "session"]) => {
            let Some(id) = request.get("sessionId").and_then(Value::as_str).filter(|id| !id.is_empty()) else {
                return error(400, "sessionId is required");
            };
            let mut sessions = sandbox.sessions.lock().unwrap_or_else(|poison| poison.into_inner());
            if sessions.contains_key(id) {
                return error(409, "session already exists");
            }
            sessions.insert(id.to_owned(), Arc::new(Session::default()));
            empty(StatusCode::CREATED)
        }
        (&Method::GET, ["process", "session"]) => {
            let sessions: Vec<(String, Arc<Session>)> = sandbox
                .sessions
                .lock()
                .unwrap_or_else(|poison| poison.into_inner())
                .iter()
                .map(|(id, session)| (id.clone(), session.clone()))
                .collect();
            let listed: Vec<Value> = sessions.iter().map(|(id, session)| session_json(id, session)).collect();
            json_ok(StatusCode::OK, &json!(listed))
        }
        (&Method::GET, ["process", "session", id]) => match sandbox.session(id) {
            Some(session) => json_ok(StatusCode::OK, &session_json(id, &session)),
            None => error(404, "session not found"),
        },
        (&Method::DELETE, ["process", "session", id]) => {
            let removed = sandbox.sessions.lock().unwrap_or_else(|poison| poison.into_inner()).remove(*id);
            match removed {
                Some(session) => {
                    kill_session(&session);
                    empty(StatusCode::NO_CONTENT)
                }
                None => error(404, "session not found"),
            }
        }
        (&Method::POST, ["process", "session", id, "exec"]) => {
            let Some(session) = sandbox.session(id) else { return error(404, "session not found") };
            session_exec(&sandbox, init_pid, &session, &request).await
        }
        (&Method::GET, ["process", "session", id, "command", command_id]) => {
            match find_command(&sandbox, id, command_id) {
                Some(command) => json_ok(StatusCode::OK, &command_json(&command)),
                None => error(404, "command not found"),
            }
        }
        (&Method::GET, ["process", "session", id, "command", command_id, "logs"]) => {
            let Some(command) = find_command(&sandbox, id, command_id) else { return error(404, "command not found") };
            let text = |buffer: &std::sync::Mutex<Vec<u8>>| {
                String::from_utf8_lossy(&buffer.lock().unwrap_or_else(|poison| poison.into_inner())).into_owned()
            };
            json_ok(
                StatusCode::OK,
                &json!({"output": text(&command.output), "stdout": text(&command.stdout), "stderr": text(&command.stderr)}),
            )
        }
        (&Method::POST, ["process", "session", id, "command", command_id, "input"]) => {
            let Some(command) = find_command(&sandbox, id, command_id) else { return error(404, "command not found") };
            let Some(data) = request.get("data").and_then(Value::as_str) else { return error(400, "data is required") };
            let mut stdin = command.stdin.lock().await;
            let Some(pipe) = stdin.as_mut() else { return error(400, "command is not running") };
            if pipe.write_all(data.as_bytes()).await.is_err() || pipe.flush().await.is_err() {
                *stdin = None;
                return error(400, "command is not running");
            }
            empty(StatusCode::NO_CONTENT)
        }
        _ => error(404, &format!("Cannot {method} {path}")),
    }
}

fn find_command(sandbox: &Sandbox, session_id: &str, command_id: &str) -> Option<Arc<SessionCommand>> {
    let session = sandbox.session(session_id)?;
    let commands = session.commands.lock().unwrap_or_else(|poison| poison.into_inner());
    commands.iter().find(|command| command.id == command_id).cloned()
}

fn command_json(command: &SessionCommand) -> Value {
    let exit = *command.exit_code.lock().unwrap_or_else(|poison| poison.into_inner());
    json!({"id": command.id, "command": command.command, "exitCode": exit})
}

fn session_json(id: &str, session: &Session) -> Value {
    let commands: Vec<Value> =
        session.commands.lock().unwrap_or_else(|poison| poison.into_inner()).iter().map(|c| command_json(c)).collect();
    json!({"sessionId": id, "commands": commands})
}

/// The request's cwd, or the refusal's message.
fn cwd_of(sandbox: &Sandbox, request: &Value) -> Result<String, String> {
    let cwd = Vfs::expand(request.get("cwd").and_then(Value::as_str).filter(|cwd| !cwd.is_empty()).unwrap_or(HOME));
    if !sandbox.vfs.is_dir(&cwd) {
        return Err(format!("cwd {cwd} does not exist"));
    }
    Ok(cwd)
}

/// `POST /process/execute`: stdout and stderr share one pipe, as the daemon's
/// `CombinedOutput` does.
async fn execute(sandbox: &Sandbox, init_pid: u32, request: &Value) -> Response {
    let Some(command_text) = request.get("command").and_then(Value::as_str) else {
        return error(400, "command is required");
    };
    let cwd = match cwd_of(sandbox, request) {
        Ok(cwd) => cwd,
        Err(message) => return error(400, &message),
    };
    let timeout = request
        .get("timeout")
        .and_then(Value::as_u64)
        .filter(|seconds| *seconds > 0)
        .map_or(DEFAULT_EXECUTE_TIMEOUT, Duration::from_secs);
    let env = process_env(&sandbox.env, &string_map(request.get("envs")));
    let argv = vec!["/bin/sh".to_owned(), "-c".to_owned(), command_text.to_owned()];
    let mut command = command_in(init_pid, &cwd, &argv, &env);
    // Close-on-exec: a process another request forks meanwhile (a long-lived session
    // command) must not inherit the write end, or this read would wait for that process
    // to exit and answer 408 (seen as a flaky MCP test). The child gets its copies via dup2.
    let (reader, writer) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(pair) => pair,
        Err(failure) => return error(500, &format!("pipe: {failure}")),
    };
    let writer_copy = match writer.try_clone() {
        Ok(copy) => copy,
        Err(failure) => return error(500, &format!("pipe: {failure}")),
    };
    command.stdin(Stdio::null()).stdout(Stdio::from(writer)).stderr(Stdio::from(writer_copy)).kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(failure) => return error(400, &format!("error starting command: {failure}")),
    };
    // The command keeps the pipe's write ends until dropped: only the process may hold them.
    drop(command);
    let host_pid = match child.id() {
        Some(pid) => inner_process(pid).await.map_or(pid, |(host, _)| host),
        None => 0,
    };
    let mut output = Vec::new();
    let mut pipe = tokio::fs::File::from_std(std::fs::File::from(reader));
    let outcome = tokio::time::timeout(timeout, async {
        let _ = pipe.read_to_end(&mut output).await;
        child.wait().await
    })
    .await;
    match outcome {
        Ok(Ok(status)) => {
            json_ok(StatusCode::OK, &json!({"exitCode": exit_code(status), "result": String::from_utf8_lossy(&output)}))
        }
        Ok(Err(failure)) => error(500, &format!("wait: {failure}")),
        Err(_) => {
            if host_pid > 0 {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(host_pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            let _ = child.start_kill();
            error(408, "command execution timeout")
        }
    }
}

async fn pump(pipe: impl AsyncRead + Unpin, buffer: Arc<SessionCommand>, stderr: bool) {
    let mut pipe = pipe;
    let mut chunk = vec![0u8; 32 * 1024];
    loop {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(count) => {
                let own = if stderr { &buffer.stderr } else { &buffer.stdout };
                own.lock().unwrap_or_else(|poison| poison.into_inner()).extend_from_slice(&chunk[..count]);
                buffer.output.lock().unwrap_or_else(|poison| poison.into_inner()).extend_from_slice(&chunk[..count]);
            }
        }
    }
}

/// `POST /process/session/{id}/exec`: `runAsync` answers 202 `{cmdId}` at once;
/// otherwise the command runs to its end and the answer carries its output.
async fn session_exec(sandbox: &Sandbox, init_pid: u32, session: &Arc<Session>, request: &Value) -> Response {
    let Some(command_text) = request.get("command").and_then(Value::as_str) else {
        return error(400, "command is required");
    };
    let run_async = request.get("runAsync").and_then(Value::as_bool).unwrap_or(false)
        || request.get("async").and_then(Value::as_bool).unwrap_or(false);
    let env = process_env(&sandbox.env, &BTreeMap::new());
    let argv = vec!["/bin/sh".to_owned(), "-c".to_owned(), command_text.to_owned()];
    let mut command = command_in(init_pid, HOME, &argv, &env);
    command.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(failure) => return error(400, &format!("error starting command: {failure}")),
    };
    let host_pid = match child.id() {
        Some(pid) => inner_process(pid).await.map_or(pid, |(host, _)| host),
        None => 0,
    };
    let entry = Arc::new(SessionCommand {
        id: format!("{}-{}", random(8), random(8)),
        command: command_text.to_owned(),
        stdout: Default::default(),
        stderr: Default::default(),
        output: Default::default(),
        exit_code: Default::default(),
        host_pid: host_pid.into(),
        stdin: tokio::sync::Mutex::new(child.stdin.take()),
    });
    session.commands.lock().unwrap_or_else(|poison| poison.into_inner()).push(entry.clone());
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let runner = entry.clone();
    let finished = tokio::spawn(async move {
        let readers = async {
            if let Some(pipe) = stdout {
                pump(pipe, runner.clone(), false).await;
            }
        };
        let errors = async {
            if let Some(pipe) = stderr {
                pump(pipe, runner.clone(), true).await;
            }
        };
        let (_, _, status) = tokio::join!(readers, errors, child.wait());
        let code = status.map(exit_code).unwrap_or(-1);
        runner.host_pid.store(0, Ordering::Relaxed);
        *runner.stdin.lock().await = None;
        *runner.exit_code.lock().unwrap_or_else(|poison| poison.into_inner()) = Some(code);
    });
    if run_async {
        return json_ok(StatusCode::ACCEPTED, &json!({"cmdId": entry.id}));
    }
    let _ = finished.await;
    let text = |buffer: &std::sync::Mutex<Vec<u8>>| {
        String::from_utf8_lossy(&buffer.lock().unwrap_or_else(|poison| poison.into_inner())).into_owned()
    };
    let exit = *entry.exit_code.lock().unwrap_or_else(|poison| poison.into_inner());
    json_ok(
        StatusCode::OK,
        &json!({"cmdId": entry.id, "output": text(&entry.output), "stdout": text(&entry.stdout), "stderr": text(&entry.stderr), "exitCode": exit}),
    )
}
