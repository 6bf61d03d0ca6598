//! One place that sends HTTP requests to Daytona (the API and the toolboxes), retries 429 and 5xx
//! with jittered backoff under a deadline, and maps what is left to workspace errors:
//! 401 / 403 → `ProviderAuth` naming the API key file, 429 → `ProviderQuota`, other 5xx
//! and transport failures → `BackendUnavailable`.

use std::time::Duration;

use rand::Rng;
use reqwest::{RequestBuilder, Response, StatusCode};
use tokio::time::Instant;

use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;

/// Which failures a request may be sent again after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retry {
    /// Idempotent: 429, 5xx and transport failures.
    Idempotent,
    /// Not idempotent (create, start a process): only when the request provably was not
    /// acted on — a 429 refusal or a connection that was never made.
    Refused,
    /// Never (a streamed body cannot be replayed).
    Never,
}

/// The first backoff step; it doubles up to [`MAX_BACKOFF`], each step jittered ±50 %.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(4);

/// An answer that is not a success, with its body's message.
#[derive(Debug)]
pub struct Refusal {
    pub status: StatusCode,
    pub message: String,
    /// A Connect error's code (`not_found`…), when the body is one.
    pub code: Option<String>,
}

/// Why a request failed for good.
#[derive(Debug)]
pub enum Failure {
    /// The server answered with this status (after retries, when retried).
    Status(Refusal),
    /// No answer: connection refused or broken, timeout.
    Transport(String),
}

impl Failure {
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            Self::Status(refusal) => Some(refusal.status),
            Self::Transport(_) => None,
        }
    }

    /// The workspace error for a failure nobody handled more specifically.
    pub fn into_error(self, what: &str, credential: &str) -> WorkspaceError {
        match self {
            Self::Status(Refusal { status, message, .. }) => match status.as_u16() {
                // Daytona refuses a create or start past the organization's limits with 403.
                403 if is_quota(&message) => {
                    WorkspaceError::ProviderQuota { provider: BACKEND_NAME, message: format!("{what}: {message}") }
                }
                401 | 403 => WorkspaceError::ProviderAuth {
                    provider: BACKEND_NAME,
                    credential: credential.to_owned(),
                    message: format!("{what}: {status}: {message}"),
                },
                429 => WorkspaceError::ProviderQuota { provider: BACKEND_NAME, message: format!("{what}: {message}") },
                500..=599 => WorkspaceError::BackendUnavailable {
                    backend: BACKEND_NAME,
                    reason: format!("{what}: {status}: {message}"),
                },
                _ => WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("{what}: {status}: {message}") },
            },
            Self::Transport(reason) => {
                WorkspaceError::BackendUnavailable { backend: BACKEND_NAME, reason: format!("{what}: {reason}") }
            }
        }
    }
}

/// Whether a refusal's message is Daytona's quota refusal ("Total CPU limit exceeded…",
/// "… quota …").
fn is_quota(message: &str) -> bool {
    let lower = message.to_ascii_lowercase();
    lower.contains("limit exceeded") || lower.contains("quota")
}

/// The message of an error answer: `message` of a JSON body, else its text (bounded).
pub async fn refusal(response: Response) -> Refusal {
    let status = response.status();
    let text = response.text().await.unwrap_or_default();
    let parsed = serde_json::from_str::<serde_json::Value>(&text).ok();
    let message = parsed
        .as_ref()
        .and_then(|value| value.get("message").and_then(|message| message.as_str()).map(str::to_owned))
        .unwrap_or_else(|| text.chars().take(500).collect());
    let code = parsed.as_ref().and_then(|value| value.get("code")).and_then(|code| code.as_str()).map(str::to_owned);
    Refusal { status, message, code }
}

fn retryable_status(status: StatusCode, retry: Retry) -> bool {
    match retry {
        Retry::Idempotent => status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error(),
        Retry::Refused => status == StatusCode::TOO_MANY_REQUESTS,
        Retry::Never => false,
    }
}

/// Sends the request `build` makes (once per attempt) until it succeeds, fails for good,
/// or `deadline` passes; a status in `accept` counts as success (e.g. 404 for a delete).
pub async fn send(
    build: impl Fn() -> RequestBuilder,
    retry: Retry,
    deadline: Duration,
    accept: &[StatusCode],
) -> Result<Response, Failure> {
    let give_up = Instant::now() + deadline;
    let mut backoff = FIRST_BACKOFF;
    loop {
        let outcome = build().send().await;
        let failure = match outcome {
            Ok(response) if response.status().is_success() || accept.contains(&response.status()) => {
                return Ok(response);
            }
            Ok(response) => {
                let status = response.status();
                let refusal = refusal(response).await;
                if !retryable_status(status, retry) {
                    return Err(Failure::Status(refusal));
                }
                Failure::Status(refusal)
            }
            Err(error) => {
                let never_sent = error.is_connect();
                let failure = Failure::Transport(error_chain(&error));
                if retry == Retry::Never || (retry == Retry::Refused && !never_sent) {
                    return Err(failure);
                }
                failure
            }
        };
        let jitter = rand::rng().random_range(0.5..1.5);
        let pause = backoff.mul_f64(jitter);
        if Instant::now() + pause >= give_up {
            return Err(failure);
        }
        tracing::debug!(?failure, ?pause, "daytona request failed, retrying");
        tokio::time::sleep(pause).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// An error with its sources, for messages.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Percent-encodes all but the unreserved characters.
pub fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for byte in text.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// A query string from pairs, each key and value encoded.
pub fn query(pairs: &[(&str, &str)]) -> String {
    pairs.iter().map(|(key, value)| format!("{}={}", encode(key), encode(value))).collect::<Vec<_>>().join("&")
}
