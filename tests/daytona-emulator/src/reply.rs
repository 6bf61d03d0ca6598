//! The answers every handler builds: JSON, empty, and NestJS-style errors
//! (`{statusCode, message, error}`).

use axum::response::Response;
use http::StatusCode;
use serde_json::json;

/// The JSON answer of a successful call.
pub fn json_ok(status: StatusCode, value: &serde_json::Value) -> Response {
    let mut response = Response::new(axum::body::Body::from(value.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    response
}

pub fn empty(status: StatusCode) -> Response {
    let mut response = Response::new(axum::body::Body::empty());
    *response.status_mut() = status;
    response
}

pub fn error(status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_ok(
        status,
        &json!({"statusCode": status.as_u16(), "message": message, "error": status.canonical_reason().unwrap_or("")}),
    )
}
