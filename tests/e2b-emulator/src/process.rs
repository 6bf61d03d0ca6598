//! envd's `process.Process` service: `Start` (server stream: start, data, keepalive and
//! end events), `SendInput`, `StreamInput` (client stream), `CloseStdin`, `SendSignal`,
//! `List`. As in envd, a process outlives its `Start` stream (a client that goes away
//! leaves it running), `Connect-Timeout-Ms` bounds its life, and `SendSignal` signals the
//! process itself — not its children.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::os::unix::process::ExitStatusExt;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use futures::StreamExt;
use http::HeaderMap;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use super::connect::{
    ConnectError, END_STREAM, EnvelopeReader, end_envelope, message_envelope, selector_pid, single_message,
    stream_error, stream_response, unary_message, unary_ok,
};
use super::gofmt;
use super::jail::{inner_process, process_env};
use super::state::{ProcHandle, Sandbox};
use super::vfs::{HOME, Vfs};

/// envd reads output in chunks of this size.
const CHUNK: usize = 32 * 1024;
/// After the process exits, how long output still buffered in the pipes is forwarded
/// (envd closes the pipes when the process is reaped; an orphan holding them is ignored).
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(200);

fn event(value: Value) -> Bytes {
    message_envelope(&json!({"event": value}))
}

fn string_map(value: Option<&Value>) -> BTreeMap<String, String> {
    value
        .and_then(Value::as_object)
        .map(|object| {
            object
                .iter()
                .filter_map(|(key, value)| value.as_str().map(|value| (key.clone(), value.to_owned())))
                .collect()
        })
        .unwrap_or_default()
}

fn header_u64(headers: &HeaderMap, name: &str) -> Option<u64> {
    headers.get(name).and_then(|value| value.to_str().ok()).and_then(|value| value.trim().parse().ok())
}

pub async fn start(sandbox: Arc<Sandbox>, init_pid: Option<u32>, headers: &HeaderMap, body: &[u8]) -> Response {
    let request = match single_message(body) {
        Ok(request) => request,
        Err(error) => return stream_error(error),
    };
    if request.get("pty").is_some_and(|pty| !pty.is_null()) {
        return stream_error(ConnectError::new("unimplemented", "the emulator does not run PTYs"));
    }
    let config = request.get("process").cloned().unwrap_or(Value::Null);
    let Some(cmd) = config.get("cmd").and_then(Value::as_str).filter(|cmd| !cmd.is_empty()) else {
        return stream_error(ConnectError::invalid("process.cmd is required"));
    };
    let mut argv = vec![cmd.to_owned()];
    argv.extend(
        config.get("args").and_then(Value::as_array).into_iter().flatten().filter_map(Value::as_str).map(str::to_owned),
    );
    let cwd = Vfs::expand(config.get("cwd").and_then(Value::as_str).unwrap_or(HOME));
    if !sandbox.vfs.is_dir(&cwd) {
        return stream_error(ConnectError::invalid(format!("cwd '{cwd}' does not exist")));
    }
    let Some(init_pid) = init_pid else {
        return stream_error(ConnectError::new("unavailable", format!("The sandbox {} was not found", sandbox.id)));
    };
    let stdin_enabled = request.get("stdin").and_then(Value::as_bool).unwrap_or(true);
    let env = process_env(&sandbox.env, &string_map(config.get("envs")));
    let mut command = super::jail::command_in(init_pid, &cwd, &argv, &env);
    command.stdin(if stdin_enabled { std::process::Stdio::piped() } else { std::process::Stdio::null() });
    command.stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped());
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => return stream_error(ConnectError::invalid(format!("error starting process '{cmd}': {error}"))),
    };
    let nsenter_pid = child.id().unwrap_or(0);
    let (host_pid, pid) = inner_process(nsenter_pid).await.unwrap_or((nsenter_pid, nsenter_pid));
    let handle = Arc::new(ProcHandle {
        host_pid,
        config: config.clone(),
        tag: request.get("tag").and_then(Value::as_str).map(str::to_owned),
        stdin: tokio::sync::Mutex::new(child.stdin.take()),
    });
    sandbox.processes.lock().unwrap_or_else(|poison| poison.into_inner()).insert(pid, handle);
    if let Some(timeout_ms) = header_u64(headers, "connect-timeout-ms").filter(|ms| *ms > 0) {
        let sandbox = sandbox.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(timeout_ms)).await;
            if let Some(process) = sandbox.process(pid) {
                let _ = kill(Pid::from_raw(process.host_pid as i32), Signal::SIGKILL);
            }
        });
    }
    let keepalive = header_u64(headers, "keepalive-ping-interval").filter(|secs| *secs > 0).map(Duration::from_secs);
    let (sender, receiver) = mpsc::channel::<Bytes>(16);
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    tokio::spawn(async move {
        let _ = sender.send(event(json!({"start": {"pid": pid}}))).await;
        let (output_sender, mut output) = mpsc::channel::<(&'static str, Bytes)>(16);
        if let Some(pipe) = stdout {
            tokio::spawn(read_pipe(pipe, "stdout", output_sender.clone()));
        }
        if let Some(pipe) = stderr {
            tokio::spawn(read_pipe(pipe, "stderr", output_sender.clone()));
        }
        drop(output_sender);
        let mut status = None;
        let mut drain_until = None;
        loop {
            let idle = keepalive.unwrap_or(Duration::from_secs(3600));
            let deadline = drain_until.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(86_400));
            tokio::select! {
                chunk = output.recv() => match chunk {
                    Some((stream, data)) => {
                        let _ = sender.send(event(json!({"data": {stream: STANDARD.encode(&data)}}))).await;
                    }
                    None if status.is_some() => break,
                    None => {
                        status = child.wait().await.ok();
                        break;
                    }
                },
                exited = child.wait(), if status.is_none() => {
                    status = exited.ok();
                    drain_until = Some(tokio::time::Instant::now() + DRAIN_AFTER_EXIT);
                }
                () = tokio::time::sleep_until(deadline), if drain_until.is_some() => break,
                () = tokio::time::sleep(idle), if keepalive.is_some() => {
                    let _ = sender.send(event(json!({"keepalive": {}}))).await;
                }
            }
        }
        sandbox.processes.lock().unwrap_or_else(|poison| poison.into_inner()).remove(&pid);
        let (code, signal, core) = match status {
            Some(status) => (status.code(), status.signal(), status.core_dumped()),
            None => (None, Some(9), false),
        };
        let text = gofmt::process_state(code, signal, core);
        let mut end = json!({"exitCode": code.unwrap_or(-1), "exited": code.is_some(), "status": text});
        if code != Some(0) {
            end["error"] = json!(text);
        }
        let _ = sender.send(event(json!({"end": end}))).await;
        let _ = sender.send(end_envelope(None)).await;
    });
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|frame| (Ok::<Bytes, Infallible>(frame), receiver))
    });
    stream_response(Body::from_stream(stream))
}

async fn read_pipe(
    mut pipe: impl AsyncRead + Unpin,
    stream: &'static str,
    sender: mpsc::Sender<(&'static str, Bytes)>,
) {
    let mut buffer = vec![0u8; CHUNK];
    loop {
        match pipe.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(count) => {
                if sender.send((stream, Bytes::copy_from_slice(&buffer[..count]))).await.is_err() {
                    return;
                }
            }
        }
    }
}

fn find(sandbox: &Sandbox, request: &Value) -> Result<Arc<ProcHandle>, ConnectError> {
    let selector = request.get("process").cloned().unwrap_or(Value::Null);
    if let Some(tag) = selector.get("tag").and_then(Value::as_str) {
        let processes = sandbox.processes.lock().unwrap_or_else(|poison| poison.into_inner());
        return processes
            .values()
            .find(|process| process.tag.as_deref() == Some(tag))
            .cloned()
            .ok_or_else(|| ConnectError::not_found(format!("process with tag {tag} not found")));
    }
    let pid = selector_pid(&selector).ok_or_else(|| ConnectError::invalid("process selector is required"))?;
    sandbox.process(pid).ok_or_else(|| ConnectError::not_found(format!("process with pid {pid} not found")))
}

async fn write_stdin(process: &ProcHandle, input: &Value) -> Result<(), ConnectError> {
    let Some(data) = input.get("stdin").and_then(Value::as_str) else {
        return Err(ConnectError::invalid("only stdin input is supported (no PTY)"));
    };
    let bytes =
        STANDARD.decode(data).map_err(|error| ConnectError::invalid(format!("stdin is not base64: {error}")))?;
    let mut stdin = process.stdin.lock().await;
    let Some(pipe) = stdin.as_mut() else {
        return Err(ConnectError::new("failed_precondition", "stdin not enabled or closed"));
    };
    pipe.write_all(&bytes).await.map_err(|error| ConnectError::internal(format!("error writing to stdin: {error}")))
}

pub async fn send_input(sandbox: &Sandbox, body: &[u8]) -> Response {
    let result = async {
        let request = unary_message(body)?;
        let process = find(sandbox, &request)?;
        write_stdin(&process, request.get("input").unwrap_or(&Value::Null)).await
    };
    match result.await {
        Ok(()) => unary_ok(&json!({})),
        Err(error) => error.into_unary(),
    }
}

pub async fn close_stdin(sandbox: &Sandbox, body: &[u8]) -> Response {
    let result = async {
        let request = unary_message(body)?;
        let process = find(sandbox, &request)?;
        if let Some(mut pipe) = process.stdin.lock().await.take() {
            let _ = pipe.shutdown().await;
        }
        Ok::<(), ConnectError>(())
    };
    match result.await {
        Ok(()) => unary_ok(&json!({})),
        Err(error) => error.into_unary(),
    }
}

pub async fn send_signal(sandbox: &Sandbox, body: &[u8]) -> Response {
    let result = (|| {
        let request = unary_message(body)?;
        let process = find(sandbox, &request)?;
        let signal = match request.get("signal") {
            Some(Value::String(name)) if name == "SIGNAL_SIGTERM" => Signal::SIGTERM,
            Some(Value::String(name)) if name == "SIGNAL_SIGKILL" => Signal::SIGKILL,
            Some(Value::Number(number)) if number.as_u64() == Some(15) => Signal::SIGTERM,
            Some(Value::Number(number)) if number.as_u64() == Some(9) => Signal::SIGKILL,
            other => return Err(ConnectError::invalid(format!("unsupported signal {other:?}"))),
        };
        kill(Pid::from_raw(process.host_pid as i32), signal)
            .map_err(|error| ConnectError::internal(format!("error sending signal: {error}")))
    })();
    match result {
        Ok(()) => unary_ok(&json!({})),
        Err(error) => error.into_unary(),
    }
}

pub fn list(sandbox: &Sandbox) -> Response {
    let processes = sandbox.processes.lock().unwrap_or_else(|poison| poison.into_inner());
    let listed: Vec<Value> = processes
        .iter()
        .map(|(pid, process)| {
            let mut info = json!({"pid": pid, "config": process.config});
            if let Some(tag) = &process.tag {
                info["tag"] = json!(tag);
            }
            info
        })
        .collect();
    unary_ok(&json!({"processes": listed}))
}

/// `StreamInput`: a client stream of envelopes — `start{process}`, then `data{input}`
/// (and `keepalive`) — answered once the client ends it.
pub async fn stream_input(sandbox: &Sandbox, body: Body) -> Response {
    let mut chunks = body.into_data_stream();
    let mut reader = EnvelopeReader::default();
    let mut process: Option<Arc<ProcHandle>> = None;
    let failure: Option<ConnectError> = 'outer: loop {
        loop {
            match reader.next_envelope() {
                Err(error) => break 'outer Some(error),
                Ok(None) => break,
                Ok(Some((flags, _))) if flags & END_STREAM != 0 => break 'outer None,
                Ok(Some((_, payload))) => {
                    let Ok(message) = serde_json::from_slice::<Value>(&payload) else {
                        break 'outer Some(ConnectError::invalid("bad StreamInput message"));
                    };
                    if let Some(start) = message.get("start") {
                        match find(sandbox, start) {
                            Ok(found) => process = Some(found),
                            Err(error) => break 'outer Some(error),
                        }
                    } else if let Some(data) = message.get("data") {
                        let Some(target) = &process else {
                            break 'outer Some(ConnectError::invalid("data before start"));
                        };
                        if let Err(error) = write_stdin(target, data.get("input").unwrap_or(&Value::Null)).await {
                            break 'outer Some(error);
                        }
                    }
                }
            }
        }
        match chunks.next().await {
            Some(Ok(chunk)) => reader.push(&chunk),
            Some(Err(error)) => break Some(ConnectError::new("canceled", format!("client stream broke: {error}"))),
            None => break None,
        }
    };
    let mut frames = Vec::new();
    if failure.is_none() {
        frames.extend_from_slice(&message_envelope(&json!({})));
    }
    frames.extend_from_slice(&end_envelope(failure.as_ref()));
    stream_response(Body::from(frames))
}
