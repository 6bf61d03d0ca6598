//! The Connect protocol as envd speaks it with the JSON codec over HTTP/1.1: unary calls are
//! `POST` with `application/json` both ways (errors: an HTTP status plus `{code, message}`);
//! streaming calls are `application/connect+json`, a body of envelopes (1 flag byte, 4-byte
//! big-endian length, JSON), the last one flagged `0x02` and carrying the end-of-stream
//! trailers (`{}` or `{"error": {code, message}}`).

use axum::body::Body;
use axum::response::Response;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderValue, StatusCode, header};
use serde::Serialize;
use serde_json::{Value, json};

/// Flag of the end-of-stream envelope.
pub const END_STREAM: u8 = 0x02;
/// Largest envelope the emulator accepts (stdin chunks, start requests).
const MAX_ENVELOPE: usize = 32 * 1024 * 1024;

/// A Connect error: a code of the protocol's set and a message.
#[derive(Clone, Debug)]
pub struct ConnectError {
    pub code: &'static str,
    pub message: String,
}

impl ConnectError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new("invalid_argument", message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new("not_found", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new("internal", message)
    }

    fn http_status(&self) -> StatusCode {
        match self.code {
            "canceled" => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
            "invalid_argument" | "failed_precondition" | "out_of_range" => StatusCode::BAD_REQUEST,
            "deadline_exceeded" => StatusCode::GATEWAY_TIMEOUT,
            "not_found" => StatusCode::NOT_FOUND,
            "already_exists" | "aborted" => StatusCode::CONFLICT,
            "permission_denied" => StatusCode::FORBIDDEN,
            "resource_exhausted" => StatusCode::TOO_MANY_REQUESTS,
            "unimplemented" => StatusCode::NOT_IMPLEMENTED,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            "unauthenticated" => StatusCode::UNAUTHORIZED,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    fn body(&self) -> Value {
        json!({"code": self.code, "message": self.message})
    }

    /// A unary error answer.
    pub fn into_unary(self) -> Response {
        json_response(self.http_status(), &self.body())
    }
}

pub fn json_response(status: StatusCode, value: &impl Serialize) -> Response {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

/// A unary success answer.
pub fn unary_ok(value: &impl Serialize) -> Response {
    json_response(StatusCode::OK, value)
}

/// One envelope.
pub fn envelope(flags: u8, payload: &[u8]) -> Bytes {
    let mut frame = BytesMut::with_capacity(5 + payload.len());
    frame.put_u8(flags);
    frame.put_u32(payload.len() as u32);
    frame.put_slice(payload);
    frame.freeze()
}

pub fn message_envelope(value: &Value) -> Bytes {
    envelope(0, &serde_json::to_vec(value).unwrap_or_default())
}

/// The end-of-stream envelope, with the error when the stream failed.
pub fn end_envelope(error: Option<&ConnectError>) -> Bytes {
    let trailer = match error {
        Some(error) => json!({"error": error.body()}),
        None => json!({}),
    };
    envelope(END_STREAM, &serde_json::to_vec(&trailer).unwrap_or_default())
}

/// The headers of a streaming answer around a body.
pub fn stream_response(body: Body) -> Response {
    let mut response = Response::new(body);
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/connect+json"));
    response
}

/// A streaming answer that is only an error.
pub fn stream_error(error: ConnectError) -> Response {
    stream_response(Body::from(end_envelope(Some(&error))))
}

/// Incremental envelope reader over body chunks.
#[derive(Default)]
pub struct EnvelopeReader {
    buffer: BytesMut,
}

impl EnvelopeReader {
    pub fn push(&mut self, chunk: &[u8]) {
        self.buffer.extend_from_slice(chunk);
    }

    /// The next whole envelope (flags, payload), if one is buffered.
    pub fn next_envelope(&mut self) -> Result<Option<(u8, Bytes)>, ConnectError> {
        if self.buffer.len() < 5 {
            return Ok(None);
        }
        let length = u32::from_be_bytes([self.buffer[1], self.buffer[2], self.buffer[3], self.buffer[4]]) as usize;
        if length > MAX_ENVELOPE {
            return Err(ConnectError::new("resource_exhausted", format!("envelope of {length} bytes")));
        }
        if self.buffer.len() < 5 + length {
            return Ok(None);
        }
        let flags = self.buffer[0];
        self.buffer.advance(5);
        Ok(Some((flags, self.buffer.split_to(length).freeze())))
    }

    pub fn is_empty(&self) -> bool {
        self.buffer.is_empty()
    }
}

/// The single message of a server-streaming request body (one envelope).
pub fn single_message(body: &[u8]) -> Result<Value, ConnectError> {
    let mut reader = EnvelopeReader::default();
    reader.push(body);
    match reader.next_envelope()? {
        Some((flags, payload)) if flags & END_STREAM == 0 => serde_json::from_slice(&payload)
            .map_err(|error| ConnectError::invalid(format!("bad request message: {error}"))),
        _ => Err(ConnectError::invalid("the request body holds no message envelope")),
    }
}

/// The message of a unary request body (JSON).
pub fn unary_message(body: &[u8]) -> Result<Value, ConnectError> {
    if body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(body).map_err(|error| ConnectError::invalid(format!("bad request message: {error}")))
}

/// A `ProcessSelector`: `{"pid": n}` or `{"tag": "..."}`.
pub fn selector_pid(value: &Value) -> Option<u32> {
    value.get("pid").and_then(Value::as_u64).and_then(|pid| u32::try_from(pid).ok())
}
