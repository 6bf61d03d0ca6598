//! Fault injection, for tests of what the real execd cannot be made to do on purpose.
//!
//! `POST /x-standin/faults` with `{"path_prefix": "/files", "status": 503, "count": 2}`
//! makes the next 2 calls whose path starts with `/files` answer 503 with the API's error
//! body; `{"clear": true}` removes every fault. Not part of the published API: the path
//! prefix `/x-standin/` says so.

use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use http::StatusCode;
use serde::Deserialize;

use crate::answer::{empty_ok, error};

#[derive(Default)]
pub struct Faults {
    pending: Mutex<Vec<Fault>>,
}

#[derive(Clone, Debug)]
struct Fault {
    path_prefix: String,
    status: u16,
    count: u32,
}

fn one() -> u32 {
    1
}

#[derive(Deserialize)]
struct Request {
    #[serde(default)]
    clear: bool,
    #[serde(default)]
    path_prefix: String,
    status: Option<u16>,
    #[serde(default = "one")]
    count: u32,
}

impl Faults {
    /// The status to answer instead of serving `path`, if a fault is armed for it.
    pub fn take(&self, path: &str) -> Option<StatusCode> {
        let mut pending = self.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let index = pending.iter().position(|fault| path.starts_with(&fault.path_prefix) && fault.count > 0)?;
        let fault = &mut pending[index];
        fault.count -= 1;
        let status = StatusCode::from_u16(fault.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if fault.count == 0 {
            pending.remove(index);
        }
        Some(status)
    }
}

pub async fn set(State(faults): State<Arc<Faults>>, body: Bytes) -> Response {
    let request: Request = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(problem) => return error(StatusCode::BAD_REQUEST, "INVALID_REQUEST_BODY", problem.to_string()),
    };
    let mut pending = faults.pending.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if request.clear {
        pending.clear();
    }
    if let Some(status) = request.status {
        pending.push(Fault { path_prefix: request.path_prefix, status, count: request.count });
    }
    empty_ok()
}
