//! The fault-injection knob: the next `count` requests matching a fault get its status
//! instead of their answer (429 rate limit, 5xx, 401, a quota refusal…). Set in process
//! with `Emulator::inject`, or over HTTP with `POST /_emulator/faults` on the platform
//! listener (a JSON [`Fault`]); `DELETE /_emulator/faults` clears them.

use std::sync::Mutex;

use serde::Deserialize;

/// Which listener a fault applies to.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum FaultTarget {
    /// The platform API (`/sandboxes`, `/v2/sandboxes`…).
    Api,
    /// envd (`/process.Process/*`, `/filesystem.Filesystem/*`, `/files`).
    Envd,
}

/// One injected fault.
#[derive(Clone, Debug, Deserialize)]
pub struct Fault {
    pub target: FaultTarget,
    /// HTTP status to answer (429, 500, 502, 503, 401, 403…).
    pub status: u16,
    /// How many matching requests get it.
    #[serde(default = "one")]
    pub count: u32,
    /// Only requests whose path starts with this (all when empty).
    #[serde(default)]
    pub path_prefix: String,
    /// Only requests with this method (all when empty).
    #[serde(default)]
    pub method: String,
    /// The error message in the answer's body.
    #[serde(default)]
    pub message: String,
}

fn one() -> u32 {
    1
}

impl Fault {
    pub fn new(target: FaultTarget, status: u16, count: u32) -> Self {
        Self { target, status, count, path_prefix: String::new(), method: String::new(), message: String::new() }
    }

    pub fn on_path(mut self, prefix: &str) -> Self {
        self.path_prefix = prefix.to_owned();
        self
    }

    pub fn on_method(mut self, method: &str) -> Self {
        self.method = method.to_owned();
        self
    }

    pub fn with_message(mut self, message: &str) -> Self {
        self.message = message.to_owned();
        self
    }
}

/// Faults waiting to fire, and how many fired.
#[derive(Default)]
pub struct Faults {
    pending: Mutex<Vec<Fault>>,
    fired: Mutex<u64>,
}

impl Faults {
    pub fn inject(&self, fault: Fault) {
        self.pending.lock().unwrap_or_else(|poison| poison.into_inner()).push(fault);
    }

    pub fn clear(&self) {
        self.pending.lock().unwrap_or_else(|poison| poison.into_inner()).clear();
    }

    /// How many requests were answered by a fault so far.
    pub fn fired(&self) -> u64 {
        *self.fired.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    /// The fault a request gets, consuming one of its count.
    pub fn take(&self, target: FaultTarget, method: &str, path: &str) -> Option<(u16, String)> {
        let mut pending = self.pending.lock().unwrap_or_else(|poison| poison.into_inner());
        let index = pending.iter().position(|fault| {
            fault.target == target
                && fault.count > 0
                && path.starts_with(&fault.path_prefix)
                && (fault.method.is_empty() || fault.method.eq_ignore_ascii_case(method))
        })?;
        let fault = &mut pending[index];
        fault.count -= 1;
        let answer = (fault.status, fault.message.clone());
        if fault.count == 0 {
            pending.remove(index);
        }
        drop(pending);
        *self.fired.lock().unwrap_or_else(|poison| poison.into_inner()) += 1;
        Some(answer)
    }
}
