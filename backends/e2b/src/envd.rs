//! envd, the API inside every sandbox: connect-rpc with the JSON codec over HTTP/1.1
//! (unary calls as `application/json`; server streams as `application/connect+json`
//! envelopes — 1 flag byte, a 4-byte big-endian length, JSON — ending in a `0x02`-flagged
//! trailer envelope), and file bytes over `GET/POST /files`. Every request carries the
//! routing headers (`E2b-Sandbox-Id`, `E2b-Sandbox-Port`) and the sandbox's
//! `X-Access-Token`.

use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use futures::stream::{BoxStream, StreamExt};
use reqwest::{Client, RequestBuilder, StatusCode};
use serde_json::{Value, json};

use berth_workspace::error::WorkspaceError;

use super::config::{BACKEND_NAME, ENVD_PORT};
use super::http::{self, Failure, Refusal, Retry, query};

/// Flag of the end-of-stream envelope.
const END_STREAM: u8 = 0x02;
/// Largest envelope accepted from envd (an output chunk is 32 KiB).
const MAX_ENVELOPE: usize = 16 * 1024 * 1024;
/// The user calls act as (envd's default user of a template).
pub const USER: &str = "user";
/// The user secret holders run as.
pub const ROOT: &str = "root";

/// Why an envd call failed.
#[derive(Debug)]
pub enum EnvdError {
    /// envd answered a Connect error.
    Code { code: String, message: String },
    /// The HTTP layer failed (a proxy's status, transport).
    Http(Failure),
}

impl EnvdError {
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Code { code, .. } => Some(code),
            Self::Http(_) => None,
        }
    }

    /// The error for a call on `path` (`path` names the client path in errors).
    pub fn into_error(self, what: &str, path: &str) -> WorkspaceError {
        let path = path.to_owned();
        match self {
            Self::Code { code, message } => match code.as_str() {
                "not_found" => WorkspaceError::NotFound { path },
                "already_exists" => WorkspaceError::AlreadyExists { path },
                "unavailable" | "deadline_exceeded" => {
                    WorkspaceError::BackendUnavailable { backend: BACKEND_NAME, reason: format!("{what}: {message}") }
                }
                "resource_exhausted" => {
                    WorkspaceError::ProviderQuota { provider: BACKEND_NAME, message: format!("{what}: {message}") }
                }
                _ => WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("{what}: {code}: {message}") },
            },
            Self::Http(Failure::Status(Refusal { status, message, .. })) if status == StatusCode::BAD_GATEWAY => {
                WorkspaceError::BackendUnavailable {
                    backend: BACKEND_NAME,
                    reason: format!("{what}: the sandbox is not running: {message}"),
                }
            }
            Self::Http(Failure::Status(Refusal { status, message, .. })) if status == StatusCode::UNAUTHORIZED => {
                WorkspaceError::BackendUnavailable {
                    backend: BACKEND_NAME,
                    reason: format!("{what}: envd refused the sandbox's access token: {message}"),
                }
            }
            Self::Http(failure) => failure.into_error(what, "the sandbox's envd access token"),
        }
    }
}

pub type EnvdResult<T> = std::result::Result<T, EnvdError>;

fn connect_code(refusal: &Refusal) -> Option<(String, String)> {
    refusal.code.clone().map(|code| (code, refusal.message.clone()))
}

/// One sandbox's envd.
#[derive(Clone)]
pub struct Envd {
    client: Client,
    base: String,
    sandbox_id: String,
    token: Option<String>,
    request_timeout: Duration,
    retry_deadline: Duration,
}

impl Envd {
    pub fn new(
        client: Client,
        base: String,
        sandbox_id: String,
        token: Option<String>,
        request_timeout: Duration,
        retry_deadline: Duration,
    ) -> Self {
        Self { client, base, sandbox_id, token, request_timeout, retry_deadline }
    }

    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    fn request(&self, method: reqwest::Method, path: &str) -> RequestBuilder {
        self.request_as(method, path, USER)
    }

    fn request_as(&self, method: reqwest::Method, path: &str, user: &str) -> RequestBuilder {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .header("E2b-Sandbox-Id", &self.sandbox_id)
            .header("E2b-Sandbox-Port", ENVD_PORT.to_string())
            .header("Authorization", format!("Basic {}", STANDARD.encode(format!("{user}:"))));
        if let Some(token) = &self.token {
            request = request.header("X-Access-Token", token);
        }
        request
    }

    /// A unary call (`service.Service/Method`).
    pub async fn unary(&self, method: &str, message: &Value, retry: Retry) -> EnvdResult<Value> {
        let path = format!("/{method}");
        let timeout_ms = self.request_timeout.as_millis().to_string();
        let body = serde_json::to_vec(message).unwrap_or_default();
        let sent = http::send(
            || {
                self.request(reqwest::Method::POST, &path)
                    .header("Content-Type", "application/json")
                    .header("Connect-Protocol-Version", "1")
                    .header("Connect-Timeout-Ms", &timeout_ms)
                    .timeout(self.request_timeout)
                    .body(body.clone())
            },
            retry,
            self.retry_deadline,
            &[],
        )
        .await;
        let response = match sent {
            Ok(response) => response,
            Err(Failure::Status(refusal)) => {
                return Err(match connect_code(&refusal) {
                    Some((code, message)) => EnvdError::Code { code, message },
                    None => EnvdError::Http(Failure::Status(refusal)),
                });
            }
            Err(failure) => return Err(EnvdError::Http(failure)),
        };
        let bytes =
            response.bytes().await.map_err(|error| EnvdError::Http(Failure::Transport(http::error_chain(&error))))?;
        if bytes.is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(&bytes).map_err(|error| EnvdError::Code {
            code: "internal".into(),
            message: format!("undecodable answer: {error}"),
        })
    }

    /// A server-streaming call: the stream of its messages, ending with the trailer's
    /// error if it carries one. `timeout` bounds the whole stream (`Connect-Timeout-Ms`).
    pub async fn server_stream(
        &self,
        method: &str,
        message: &Value,
        timeout: Option<Duration>,
        user: &str,
    ) -> EnvdResult<BoxStream<'static, EnvdResult<Value>>> {
        let payload = serde_json::to_vec(message).unwrap_or_default();
        let mut frame = BytesMut::with_capacity(5 + payload.len());
        frame.put_u8(0);
        frame.put_u32(payload.len() as u32);
        frame.put_slice(&payload);
        let frame = frame.freeze();
        let path = format!("/{method}");
        let sent = http::send(
            || {
                let mut request = self
                    .request_as(reqwest::Method::POST, &path, user)
                    .header("Content-Type", "application/connect+json")
                    .header("Connect-Protocol-Version", "1")
                    .body(frame.clone());
                if let Some(timeout) = timeout {
                    request = request.header("Connect-Timeout-Ms", timeout.as_millis().to_string());
                }
                request
            },
            Retry::Refused,
            self.retry_deadline,
            &[],
        )
        .await;
        let response = match sent {
            Ok(response) => response,
            Err(Failure::Status(refusal)) => {
                return Err(match connect_code(&refusal) {
                    Some((code, message)) => EnvdError::Code { code, message },
                    None => EnvdError::Http(Failure::Status(refusal)),
                });
            }
            Err(failure) => return Err(EnvdError::Http(failure)),
        };
        let body = response.bytes_stream();
        let state = (body, BytesMut::new(), false);
        Ok(futures::stream::unfold(state, |(mut body, mut buffer, mut done)| async move {
            loop {
                if done {
                    return None;
                }
                if buffer.len() >= 5 {
                    let length = u32::from_be_bytes([buffer[1], buffer[2], buffer[3], buffer[4]]) as usize;
                    if length > MAX_ENVELOPE {
                        done = true;
                        let error =
                            EnvdError::Code { code: "internal".into(), message: format!("envelope of {length} bytes") };
                        return Some((Err(error), (body, buffer, done)));
                    }
                    if buffer.len() >= 5 + length {
                        let flags = buffer[0];
                        buffer.advance(5);
                        let payload = buffer.split_to(length);
                        let parsed: Value = serde_json::from_slice(&payload).unwrap_or(Value::Null);
                        if flags & END_STREAM != 0 {
                            done = true;
                            let error = parsed.get("error").map(|error| EnvdError::Code {
                                code: error.get("code").and_then(Value::as_str).unwrap_or("unknown").to_owned(),
                                message: error.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
                            });
                            return error.map(|error| (Err(error), (body, buffer, done)));
                        }
                        return Some((Ok(parsed), (body, buffer, done)));
                    }
                }
                match body.next().await {
                    Some(Ok(chunk)) => buffer.extend_from_slice(&chunk),
                    Some(Err(error)) => {
                        done = true;
                        let error = EnvdError::Http(Failure::Transport(http::error_chain(&error)));
                        return Some((Err(error), (body, buffer, done)));
                    }
                    None => {
                        done = true;
                        let error = EnvdError::Http(Failure::Transport("the stream ended without its trailer".into()));
                        return Some((Err(error), (body, buffer, done)));
                    }
                }
            }
        })
        .boxed())
    }

    /// `GET /files?path=`: the response, its body not read yet.
    pub async fn download(&self, path: &str) -> EnvdResult<reqwest::Response> {
        http::send(
            || self.request(reqwest::Method::GET, &format!("/files?{}", query(&[("path", path), ("username", USER)]))),
            Retry::Idempotent,
            self.retry_deadline,
            &[],
        )
        .await
        .map_err(EnvdError::Http)
    }

    /// `POST /files?path=` with a streamed `application/octet-stream` body (never retried).
    pub async fn upload(&self, path: &str, body: reqwest::Body) -> EnvdResult<()> {
        let body = std::sync::Mutex::new(Some(body));
        http::send(
            || {
                let body = body
                    .lock()
                    .unwrap_or_else(|poison| poison.into_inner())
                    .take()
                    .unwrap_or_else(|| reqwest::Body::from(Bytes::new()));
                self.request(reqwest::Method::POST, &format!("/files?{}", query(&[("path", path), ("username", USER)])))
                    .header("Content-Type", "application/octet-stream")
                    .body(body)
            },
            Retry::Never,
            self.retry_deadline,
            &[],
        )
        .await
        .map(|_| ())
        .map_err(EnvdError::Http)
    }
}

/// Decodes a protobuf-JSON `bytes` field.
pub fn decode_bytes(value: &Value) -> Option<Bytes> {
    value.as_str().and_then(|text| STANDARD.decode(text).ok()).map(Bytes::from)
}

/// Encodes a protobuf-JSON `bytes` field.
pub fn encode_bytes(data: &[u8]) -> String {
    STANDARD.encode(data)
}

/// A protobuf-JSON integer (a number, or a string for 64-bit fields).
pub fn json_u64(value: Option<&Value>) -> Option<u64> {
    match value? {
        Value::Number(number) => number.as_u64(),
        Value::String(text) => text.parse().ok(),
        _ => None,
    }
}
