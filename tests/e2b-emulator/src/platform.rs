//! The platform API (`X-API-KEY`): `POST /v2/sandboxes` (and `/sandboxes`),
//! `GET /v2/sandboxes?metadata=&state=&limit=&nextToken=` (the next page's token in the
//! `x-next-token` header), `GET|DELETE /sandboxes/{id}`, `POST /v2/sandboxes/{id}/connect`
//! (and `/sandboxes/{id}/connect`, `/resume`), `POST /sandboxes/{id}/pause`,
//! `POST /sandboxes/{id}/timeout`. Errors are `{code, message}` with the HTTP status as
//! code. The knob `POST|DELETE /_emulator/faults` injects faults (`faults.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, to_bytes};
use axum::extract::Request;
use axum::response::Response;
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use http::{HeaderValue, Method, StatusCode};
use serde_json::{Value, json};

use super::connect::json_response;
use super::faults::{Fault, FaultTarget};
use super::state::{ApiError, Phase, State};

/// Most sandboxes one list page holds.
const MAX_PAGE: usize = 100;
const MAX_BODY: usize = 1024 * 1024;

pub fn error(status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    json_response(status, &json!({"code": status.as_u16(), "message": message}))
}

fn api_error(error: ApiError) -> Response {
    self::error(error.status, &error.message)
}

fn no_content() -> Response {
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::NO_CONTENT;
    response
}

pub async fn handle(state: Arc<State>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    if path == "/_emulator/faults" {
        return faults(&state, request).await;
    }
    if let Some((status, message)) = state.faults.take(FaultTarget::Api, method.as_str(), &path) {
        let message = if message.is_empty() { format!("injected fault {status}") } else { message };
        return self::error(status, &message);
    }
    let key = request.headers().get("x-api-key").and_then(|value| value.to_str().ok()).unwrap_or("");
    if key != state.config.api_key {
        return self::error(401, "Invalid API key, it must start with 'e2b_' prefix and be followed by 40 hex chars");
    }
    let body = match to_bytes(request.into_body(), MAX_BODY).await {
        Ok(body) => body,
        Err(_) => return self::error(400, "request body too large"),
    };
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    match (&method, segments.as_slice()) {
        (&Method::POST, ["v2", "sandboxes"] | ["sandboxes"]) => create(&state, &body).await,
        (&Method::GET, ["v2", "sandboxes"]) => list(&state, &query).await,
        (&Method::GET, ["sandboxes", id]) => detail(&state, id).await,
        (&Method::DELETE, ["sandboxes", id]) => match state.kill(id).await {
            Ok(()) => no_content(),
            Err(error) => api_error(error),
        },
        (&Method::POST, ["v2", "sandboxes", id, "connect"] | ["sandboxes", id, "connect" | "resume"]) => {
            connect(&state, id, &body).await
        }
        (&Method::POST, ["sandboxes", id, "pause"]) => match state.pause(id).await {
            Ok(true) => no_content(),
            Ok(false) => self::error(409, &format!("sandbox \"{id}\" is already paused")),
            Err(error) => api_error(error),
        },
        (&Method::POST, ["sandboxes", id, "timeout"]) => {
            let Some(timeout) = parse_json(&body).get("timeout").and_then(Value::as_u64) else {
                return self::error(400, "timeout is required");
            };
            match state.set_timeout(id, Duration::from_secs(timeout)).await {
                Ok(()) => no_content(),
                Err(error) => api_error(error),
            }
        }
        _ => self::error(404, &format!("no route {method} {path}")),
    }
}

fn parse_json(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

fn string_map(value: Option<&Value>) -> Result<BTreeMap<String, String>, String> {
    let Some(value) = value else { return Ok(BTreeMap::new()) };
    if value.is_null() {
        return Ok(BTreeMap::new());
    }
    let object = value.as_object().ok_or("expected an object of strings")?;
    object
        .iter()
        .map(|(key, value)| {
            value.as_str().map(|value| (key.clone(), value.to_owned())).ok_or(format!("{key}: not a string"))
        })
        .collect()
}

async fn create(state: &State, body: &[u8]) -> Response {
    let request = parse_json(body);
    let Some(template) = request.get("templateID").and_then(Value::as_str) else {
        return self::error(400, "templateID is required");
    };
    let timeout =
        request.get("timeout").and_then(Value::as_u64).map_or(state.config.default_timeout, Duration::from_secs);
    let (metadata, env) = match (string_map(request.get("metadata")), string_map(request.get("envVars"))) {
        (Ok(metadata), Ok(env)) => (metadata, env),
        (Err(error), _) | (_, Err(error)) => return self::error(400, &error),
    };
    let auto_pause = request.get("autoPause").and_then(Value::as_bool).unwrap_or(false);
    let internet = match request.get("allow_internet_access") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(allowed)) => Some(*allowed),
        Some(_) => return self::error(400, "allow_internet_access: expected a boolean"),
    };
    match state.create(template, timeout, metadata, env, auto_pause, internet).await {
        Ok(sandbox) => json_response(StatusCode::CREATED, &sandbox.created()),
        Err(error) => api_error(error),
    }
}

async fn connect(state: &State, id: &str, body: &[u8]) -> Response {
    let timeout = parse_json(body)
        .get("timeout")
        .and_then(Value::as_u64)
        .map_or(state.config.default_timeout, Duration::from_secs);
    match state.connect(id, timeout).await {
        Ok((sandbox, resumed)) => {
            let status = if resumed { StatusCode::CREATED } else { StatusCode::OK };
            json_response(status, &sandbox.created())
        }
        Err(error) => api_error(error),
    }
}

async fn detail(state: &State, id: &str) -> Response {
    let Some(sandbox) = state.get(id) else {
        return self::error(404, &format!("sandbox \"{id}\" doesn't exist"));
    };
    let life = sandbox.life.lock().await;
    let mut value = sandbox.listed(&life);
    value["envdAccessToken"] = json!(sandbox.envd_token);
    // Null when the create did not say (SandboxDetail).
    value["allowInternetAccess"] = json!(sandbox.allow_internet_access);
    json_response(StatusCode::OK, &value)
}

/// Decodes `application/x-www-form-urlencoded` text.
pub fn form_decode(text: &str) -> Vec<(String, String)> {
    text.split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            (percent_decode(key, true), percent_decode(value, true))
        })
        .collect()
}

pub fn percent_decode(text: &str, plus_is_space: bool) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        match bytes[index] {
            b'%' if index + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[index + 1..index + 3]).ok();
                if let Some(byte) = hex.and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
                    out.push(byte);
                    index += 3;
                    continue;
                }
                out.push(b'%');
            }
            b'+' if plus_is_space => out.push(b' '),
            byte => out.push(byte),
        }
        index += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn list(state: &State, query: &str) -> Response {
    let params = form_decode(query);
    let param = |name: &str| params.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone());
    // `metadata` is itself a url-encoded `k=v&k2=v2`, its keys and values encoded once more.
    let wanted: Vec<(String, String)> = param("metadata")
        .map(|text| {
            form_decode(&text)
                .into_iter()
                .map(|(key, value)| (percent_decode(&key, false), percent_decode(&value, false)))
                .collect()
        })
        .unwrap_or_default();
    let states: Vec<String> = param("state")
        .map(|text| text.split(',').map(str::to_owned).filter(|state| !state.is_empty()).collect())
        .unwrap_or_else(|| vec!["running".to_owned(), "paused".to_owned()]);
    let limit = match param("limit").map(|limit| limit.parse::<usize>()) {
        None => MAX_PAGE,
        Some(Ok(limit)) if (1..=MAX_PAGE).contains(&limit) => limit,
        Some(_) => return self::error(400, &format!("limit must be between 1 and {MAX_PAGE}")),
    };
    let after = match param("nextToken") {
        None => None,
        Some(token) => {
            match URL_SAFE_NO_PAD.decode(token.as_bytes()).ok().and_then(|raw| String::from_utf8(raw).ok()) {
                Some(id) => Some(id),
                None => return self::error(400, "invalid next token"),
            }
        }
    };
    let mut rows = Vec::new();
    for sandbox in state.all() {
        if wanted.iter().any(|(key, value)| sandbox.metadata.get(key) != Some(value)) {
            continue;
        }
        let life = sandbox.life.lock().await;
        if life.killed {
            continue;
        }
        let phase = if life.phase == Phase::Running { "running" } else { "paused" };
        if !states.iter().any(|state| state == phase) {
            continue;
        }
        rows.push((sandbox.started_at, sandbox.id.clone(), sandbox.listed(&life)));
    }
    // Newest first, ties by id; the token is the last id returned (opaque to clients).
    rows.sort_by(|left, right| right.0.cmp(&left.0).then_with(|| left.1.cmp(&right.1)));
    let start = match &after {
        Some(id) => rows.iter().position(|(_, row_id, _)| row_id == id).map_or(rows.len(), |index| index + 1),
        None => 0,
    };
    let page: Vec<Value> = rows.iter().skip(start).take(limit).map(|(_, _, value)| value.clone()).collect();
    let mut response = json_response(StatusCode::OK, &page);
    if start + limit < rows.len()
        && let Some((_, last_id, _)) = rows.get(start + limit - 1)
        && let Ok(value) = HeaderValue::from_str(&URL_SAFE_NO_PAD.encode(last_id.as_bytes()))
    {
        response.headers_mut().insert("x-next-token", value);
    }
    response
}

async fn faults(state: &State, request: Request) -> Response {
    let method = request.method().clone();
    if method == Method::DELETE {
        state.faults.clear();
        return no_content();
    }
    let body = to_bytes(request.into_body(), MAX_BODY).await.unwrap_or_default();
    match serde_json::from_slice::<Fault>(&body) {
        Ok(fault) => {
            state.faults.inject(fault);
            no_content()
        }
        Err(error) => self::error(400, &format!("bad fault: {error}")),
    }
}
