//! The Daytona API: `POST /sandbox` (labels, env, name, snapshot), `GET /sandbox` (labels
//! as a JSON map, `cursor` / `limit` paging: `{items, nextCursor}`), `GET|DELETE
//! /sandbox/{idOrName}`, `POST /sandbox/{idOrName}/start|stop`, `PUT
//! /sandbox/{idOrName}/labels`, `GET /sandbox/{id}/toolbox-proxy-url`. Errors are NestJS's
//! `{statusCode, message, error}`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::response::Response;
use http::{Method, StatusCode};
use serde_json::{Value, json};

use berth_e2b_emulator::Fault;
use berth_e2b_emulator::platform::form_decode;

use super::reply::{empty, error, json_ok};
use super::state::{ApiError, State};

/// Largest page a list answers.
const MAX_LIMIT: usize = 200;
const DEFAULT_LIMIT: usize = 100;

fn string_map(value: Option<&Value>) -> Result<BTreeMap<String, String>, ApiError> {
    let mut map = BTreeMap::new();
    match value {
        None | Some(Value::Null) => {}
        Some(Value::Object(object)) => {
            for (key, value) in object {
                let Some(text) = value.as_str() else {
                    return Err(ApiError::new(400, format!("{key} must be a string")));
                };
                map.insert(key.clone(), text.to_owned());
            }
        }
        Some(_) => return Err(ApiError::new(400, "expected an object of strings")),
    }
    Ok(map)
}

pub async fn handle(
    state: &Arc<State>,
    method: &Method,
    path: &str,
    query: &str,
    body: &[u8],
) -> Result<Response, ApiError> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let toolbox = state.toolbox_url();
    match (method, parts.as_slice()) {
        (&Method::POST, ["sandbox"]) => {
            let request: Value = serde_json::from_slice(body)
                .map_err(|failure| ApiError::new(400, format!("invalid body: {failure}")))?;
            let labels = string_map(request.get("labels"))?;
            let env = string_map(request.get("env"))?;
            let name = request.get("name").and_then(Value::as_str).filter(|name| !name.is_empty()).map(str::to_owned);
            let snapshot = request.get("snapshot").and_then(Value::as_str).unwrap_or("daytona-small").to_owned();
            let network_block_all = match request.get("networkBlockAll") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(blocked)) => *blocked,
                Some(_) => return Err(ApiError::new(400, "networkBlockAll must be a boolean")),
            };
            let sandbox = state.create(name, snapshot, labels, env, network_block_all).await?;
            let life = sandbox.life.lock().await;
            Ok(json_ok(StatusCode::OK, &sandbox.dto(&life, &toolbox)))
        }
        (&Method::GET, ["sandbox"]) => list(state, query).await,
        (&Method::GET, ["sandbox", id]) => {
            let sandbox = state.get(id).ok_or_else(|| not_found(id))?;
            let life = sandbox.life.lock().await;
            Ok(json_ok(StatusCode::OK, &sandbox.dto(&life, &toolbox)))
        }
        (&Method::DELETE, ["sandbox", id]) => {
            let sandbox = state.delete(id).await?;
            let life = sandbox.life.lock().await;
            let mut dto = sandbox.dto(&life, &toolbox);
            dto["state"] = json!("destroyed");
            Ok(json_ok(StatusCode::OK, &dto))
        }
        (&Method::POST, ["sandbox", id, "start"]) => {
            let sandbox = state.start(id).await?;
            let life = sandbox.life.lock().await;
            Ok(json_ok(StatusCode::OK, &sandbox.dto(&life, &toolbox)))
        }
        (&Method::POST, ["sandbox", id, "stop"]) => {
            let sandbox = state.stop(id).await?;
            let life = sandbox.life.lock().await;
            Ok(json_ok(StatusCode::OK, &sandbox.dto(&life, &toolbox)))
        }
        (&Method::PUT, ["sandbox", id, "labels"]) => {
            let request: Value = serde_json::from_slice(body)
                .map_err(|failure| ApiError::new(400, format!("invalid body: {failure}")))?;
            let labels = string_map(request.get("labels"))?;
            let sandbox = state.get(id).ok_or_else(|| not_found(id))?;
            *sandbox.labels.lock().unwrap_or_else(|poison| poison.into_inner()) = labels.clone();
            Ok(json_ok(StatusCode::OK, &json!({"labels": labels})))
        }
        (&Method::GET, ["sandbox", id, "toolbox-proxy-url"]) => {
            state.get(id).ok_or_else(|| not_found(id))?;
            Ok(json_ok(StatusCode::OK, &json!({"url": toolbox})))
        }
        _ => Ok(error(404, &format!("Cannot {method} {path}"))),
    }
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(404, format!("Sandbox with ID or name {id} not found"))
}

/// `GET /sandbox`: newest first; the cursor is the offset of the next page.
async fn list(state: &Arc<State>, query: &str) -> Result<Response, ApiError> {
    let pairs = form_decode(query);
    let value = |name: &str| pairs.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone());
    let filter: BTreeMap<String, String> = match value("labels") {
        Some(text) => {
            let parsed: Value =
                serde_json::from_str(&text).map_err(|failure| ApiError::new(400, format!("labels: {failure}")))?;
            string_map(Some(&parsed))?
        }
        None => BTreeMap::new(),
    };
    let states: Vec<String> = pairs.iter().filter(|(key, _)| key == "states").map(|(_, value)| value.clone()).collect();
    let limit = match value("limit") {
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|limit| (1..=MAX_LIMIT).contains(limit))
            .ok_or_else(|| ApiError::new(400, format!("limit must be between 1 and {MAX_LIMIT}")))?,
        None => DEFAULT_LIMIT,
    };
    let offset = match value("cursor").filter(|cursor| !cursor.is_empty()) {
        Some(cursor) => cursor.parse::<usize>().map_err(|_| ApiError::new(400, "invalid cursor"))?,
        None => 0,
    };
    let toolbox = state.toolbox_url();
    let mut matching = Vec::new();
    for sandbox in state.all() {
        let labels = sandbox.labels();
        if !filter.iter().all(|(key, value)| labels.get(key) == Some(value)) {
            continue;
        }
        let life = sandbox.life.lock().await;
        if life.deleted || (!states.is_empty() && !states.iter().any(|state| state == life.phase.name())) {
            continue;
        }
        matching.push((sandbox.created_at, sandbox.id.clone(), sandbox.dto(&life, &toolbox)));
    }
    matching.sort_by(|left, right| right.0.cmp(&left.0).then_with(|| left.1.cmp(&right.1)));
    let items: Vec<Value> = matching.iter().skip(offset).take(limit).map(|(_, _, dto)| dto.clone()).collect();
    let next = (offset + limit < matching.len()).then(|| (offset + limit).to_string());
    Ok(json_ok(StatusCode::OK, &json!({"items": items, "nextCursor": next})))
}

/// `POST /_emulator/faults` (a JSON `Fault`), `DELETE` clears.
pub async fn faults(state: &Arc<State>, method: &Method, body: Body) -> Response {
    match *method {
        Method::DELETE => {
            state.faults.clear();
            empty(StatusCode::NO_CONTENT)
        }
        Method::POST => {
            let Ok(body) = to_bytes(body, 1024 * 1024).await else { return error(400, "body") };
            match serde_json::from_slice::<Fault>(&body) {
                Ok(fault) => {
                    state.faults.inject(fault);
                    empty(StatusCode::NO_CONTENT)
                }
                Err(failure) => error(400, &failure.to_string()),
            }
        }
        _ => error(405, "method not allowed"),
    }
}
