//! `pods/exec` over websockets: the channel protocols `v5.channel.k8s.io` and
//! `v4.channel.k8s.io` (binary frames whose first byte is the channel: 0 stdin, 1 stdout,
//! 2 stderr, 3 the exit `Status` as JSON, 4 resize; v5 adds `[255, channel]`, the client
//! closing one of its streams). The command runs in the container's namespaces; the
//! status is sent once the process exited and its stdout and stderr were drained (so, as
//! on a real cluster, a background process holding stdout holds the exec open), then a
//! close frame, after which what the client still sends is read and dropped until it
//! answers with its own close (the closing handshake). The output of a client that went
//! away is read and dropped, and its process's stdin is closed.

use std::process::Stdio;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http::{HeaderMap, StatusCode, header};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;

use crate::container::Container;
use crate::state::ApiError;

pub const V5: &str = "v5.channel.k8s.io";
pub const V4: &str = "v4.channel.k8s.io";
const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const STATUS: u8 = 3;
const CLOSE: u8 = 255;
const READ_CHUNK: usize = 32 * 1024;
/// How long the closing handshake may take before the socket is dropped anyway.
const CLOSING_HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(5);

/// What the query string asked for.
#[derive(Debug, Default)]
pub struct ExecRequest {
    pub command: Vec<String>,
    pub container: Option<String>,
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

impl ExecRequest {
    pub fn parse(query: &str) -> Self {
        let mut request = Self::default();
        for (key, value) in form_pairs(query) {
            let yes = matches!(value.as_str(), "true" | "1");
            match key.as_str() {
                "command" => request.command.push(value),
                "container" => request.container = Some(value),
                "stdin" => request.stdin = yes,
                "stdout" => request.stdout = yes,
                "stderr" => request.stderr = yes,
                "tty" => request.tty = yes,
                _ => {}
            }
        }
        request
    }
}

/// `application/x-www-form-urlencoded` pairs.
pub fn form_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (decode(key), decode(value))
        })
        .collect()
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let hex = |byte: u8| (byte as char).to_digit(16).map(|digit| digit as u8);
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'+' => out.push(b' '),
            b'%' if index + 2 < bytes.len() => match (hex(bytes[index + 1]), hex(bytes[index + 2])) {
                (Some(high), Some(low)) => {
                    out.push(high * 16 + low);
                    index += 2;
                }
                _ => out.push(b'%'),
            },
            byte => out.push(byte),
        }
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The protocol to speak: v5 when offered, else v4.
fn negotiate(headers: &HeaderMap) -> Option<&'static str> {
    let offered: Vec<String> = headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(',').map(|part| part.trim().to_owned()).collect::<Vec<_>>())
        .collect();
    [V5, V4].into_iter().find(|protocol| offered.iter().any(|offer| offer == protocol))
}

/// Answers the upgrade and runs the exec on the upgraded connection.
pub fn upgrade(
    mut request: http::Request<Body>,
    container: Arc<Container>,
    exec: ExecRequest,
) -> Result<Response, ApiError> {
    let headers = request.headers().clone();
    let wants_websocket = headers
        .get(header::UPGRADE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.eq_ignore_ascii_case("websocket"));
    let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY).filter(|_| wants_websocket) else {
        return Err(ApiError::bad_request("Upgrade request required (this emulator speaks websockets, not SPDY)"));
    };
    let Some(protocol) = negotiate(&headers) else {
        return Err(ApiError::bad_request(format!("no supported channel protocol offered (want {V5} or {V4})")));
    };
    if exec.command.is_empty() {
        return Err(ApiError::bad_request("you must specify at least 1 command"));
    }
    if exec.tty {
        return Err(ApiError::bad_request("tty is not emulated"));
    }
    let accept = derive_accept_key(key.as_bytes());
    let on_upgrade = hyper::upgrade::on(&mut request);
    tokio::spawn(async move {
        match on_upgrade.await {
            Ok(upgraded) => {
                let socket = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
                run(socket, container, exec, protocol).await;
            }
            Err(error) => tracing::warn!(%error, "exec upgrade failed"),
        }
    });
    Response::builder()
        .status(StatusCode::SWITCHING_PROTOCOLS)
        .header(header::UPGRADE, "websocket")
        .header(header::CONNECTION, "Upgrade")
        .header(header::SEC_WEBSOCKET_ACCEPT, accept)
        .header(header::SEC_WEBSOCKET_PROTOCOL, protocol)
        .body(Body::empty())
        .map_err(|error| ApiError::new(500, "InternalError", error.to_string()))
}

fn framed(channel: u8, data: &[u8]) -> Message {
    let mut frame = Vec::with_capacity(data.len() + 1);
    frame.push(channel);
    frame.extend_from_slice(data);
    Message::Binary(Bytes::from(frame))
}

/// The status the kubelet reports for an exit code (a signal `n` is `128 + n`, as the
/// runtime reports it).
pub fn exit_status(command: &[String], code: i32) -> Value {
    if code == 0 {
        return json!({"metadata": {}, "status": "Success"});
    }
    json!({
        "metadata": {}, "status": "Failure",
        "message": format!("command terminated with non-zero exit code: error executing command {command:?}, exit code {code}"),
        "reason": "NonZeroExitCode",
        "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]},
    })
}

async fn run<S>(socket: WebSocketStream<S>, container: Arc<Container>, exec: ExecRequest, protocol: &'static str)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sink, mut source) = socket.split();
    let (outgoing, mut to_send) = mpsc::channel::<Message>(16);
    let writer = tokio::spawn(async move {
        let mut healthy = true;
        while let Some(message) = to_send.recv().await {
            // A client that went away: keep draining, so the pumps do not block.
            if healthy && let Err(error) = sink.send(message).await {
                tracing::debug!(%error, "exec: the client went away");
                healthy = false;
            }
        }
        // A normal closure (1000): clients read it as the end of every channel (kubectl
        // reports a close without a code as an error).
        if healthy {
            let close = tokio_tungstenite::tungstenite::protocol::CloseFrame {
                code: tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode::Normal,
                reason: "".into(),
            };
            let _ = sink.send(Message::Close(Some(close))).await;
            let _ = sink.close().await;
        }
    });
    let mut command = container.command(&exec.command);
    command
        .stdin(if exec.stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(if exec.stdout { Stdio::piped() } else { Stdio::null() })
        .stderr(if exec.stderr { Stdio::piped() } else { Stdio::null() });
    let mut child = match command.spawn() {
        Ok(child) => child,
        Err(error) => {
            let status = json!({"metadata": {}, "status": "Failure", "reason": "InternalError",
                "message": format!("start the exec: {error}")});
            let _ = outgoing.send(framed(STATUS, status.to_string().as_bytes())).await;
            drop(outgoing);
            let _ = writer.await;
            return;
        }
    };
    let mut pumps = Vec::new();
    for (channel, pipe) in [
        (STDOUT, child.stdout.take().map(|pipe| Box::new(pipe) as Box<dyn tokio::io::AsyncRead + Send + Unpin>)),
        (STDERR, child.stderr.take().map(|pipe| Box::new(pipe) as Box<dyn tokio::io::AsyncRead + Send + Unpin>)),
    ] {
        let Some(mut pipe) = pipe else { continue };
        let outgoing = outgoing.clone();
        pumps.push(tokio::spawn(async move {
            let mut buffer = vec![0u8; READ_CHUNK];
            loop {
                match pipe.read(&mut buffer).await {
                    Ok(0) | Err(_) => return,
                    Ok(count) => {
                        if outgoing.send(framed(channel, &buffer[..count])).await.is_err() {
                            return;
                        }
                    }
                }
            }
        }));
    }
    let mut stdin = child.stdin.take();
    let reader = tokio::spawn(async move {
        while let Some(message) = source.next().await {
            let message = match message {
                Ok(message) => message,
                Err(error) => {
                    tracing::debug!(%error, "exec: reading from the client failed");
                    break;
                }
            };
            match message {
                Message::Binary(data) if data.len() >= 2 && data[0] == CLOSE && data[1] == STDIN => {
                    stdin = None;
                }
                // The Python client sends stdin as text frames (the server takes the bytes
                // of either kind).
                Message::Text(text) if text.as_bytes().first() == Some(&STDIN) => {
                    if let Some(pipe) = stdin.as_mut()
                        && pipe.write_all(&text.as_bytes()[1..]).await.is_err()
                    {
                        stdin = None;
                    }
                }
                Message::Binary(data) if !data.is_empty() && data[0] == STDIN => {
                    if let Some(pipe) = stdin.as_mut()
                        && pipe.write_all(&data[1..]).await.is_err()
                    {
                        stdin = None;
                    }
                }
                Message::Close(_) => break,
                _ => {}
            }
        }
        // The client is gone (or closed the socket): the process's stdin ends with it.
        drop(stdin);
    });
    let _ = protocol;
    for pump in pumps {
        let _ = pump.await;
    }
    let code = match child.wait().await {
        Ok(status) => {
            use std::os::unix::process::ExitStatusExt;
            status.code().unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
        }
        Err(_) => 1,
    };
    let status = exit_status(&exec.command, code);
    let _ = outgoing.send(framed(STATUS, status.to_string().as_bytes())).await;
    drop(outgoing);
    let _ = writer.await;
    // A process that exited without reading all its stdin leaves the client still sending
    // it. Dropping the socket with that input unread makes the kernel reset the connection,
    // and a client can lose the status it had not read yet (kube-rs then reports the stdin
    // write that failed): read on until the client's close, for a while, in the
    // background (the exec is over for everything else).
    let abort = reader.abort_handle();
    tokio::spawn(async move {
        if tokio::time::timeout(CLOSING_HANDSHAKE, reader).await.is_err() {
            abort.abort();
        }
    });
}
