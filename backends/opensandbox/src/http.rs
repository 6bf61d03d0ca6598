//! One HTTP client for both APIs, with the retry and error rules of every provider call.
//!
//! Retried with backoff until the call's deadline: connection failures that provably never
//! sent the request, 429, and — for idempotent calls only — 5xx (lookups: but 500) and
//! timeouts. Mapped: 401 /
//! 403 to `ProviderAuth` naming the credential file, 429 past the deadline and any refusal
//! that says "quota" to `ProviderQuota`, other failures to `Backend` with the provider's
//! `{code, message}`.

use std::time::Duration;

use reqwest::{RequestBuilder, Response, StatusCode};
use tokio::time::Instant;

use berth_workspace::error::{Result, WorkspaceError};

use crate::config::BACKEND_NAME;

/// Whether a call may be sent twice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Retry {
    /// GET, DELETE, PUT-like calls: any transient failure is retried.
    Idempotent,
    /// Lookups whose 500 is an answer (execd's file API says 500 for a path it cannot
    /// stat: ENOTDIR, ELOOP): retried like `Idempotent` but for 500.
    Lookup,
    /// POSTs that act (create, run a command): only failures that never reached the server.
    Once,
}

#[derive(Clone)]
pub(crate) struct Http {
    pub client: reqwest::Client,
    /// Bound of one non-streaming call (command streams and transfers have none: they are
    /// bounded by the exec's timeout or the caller).
    pub request_timeout: Duration,
    pub retry_deadline: Duration,
    /// Names the credential in auth errors (a file path, never the secret).
    pub credential: String,
}

impl std::fmt::Debug for Http {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("Http").field("credential", &self.credential).finish_non_exhaustive()
    }
}

const FIRST_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

impl Http {
    pub fn new(request_timeout: Duration, retry_deadline: Duration, credential: String) -> Result<Self> {
        // The tree's one crypto provider (docs/dependencies.md); an error means one is set.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(request_timeout.min(Duration::from_secs(10)))
            .no_proxy()
            .build()
            .map_err(|error| WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!("cannot build the HTTP client: {error}"),
            })?;
        Ok(Self { client, request_timeout, retry_deadline, credential })
    }

    /// Sends the request `make` builds (again on each attempt) and returns a response whose
    /// status is a success or a client error other than auth (the caller reads those:
    /// 404 means different things to different calls).
    pub async fn send(&self, what: &str, retry: Retry, make: impl Fn() -> RequestBuilder) -> Result<Response> {
        let deadline = Instant::now() + self.retry_deadline;
        let mut backoff = FIRST_BACKOFF;
        loop {
            let outcome = make().send().await;
            let transient = match outcome {
                Ok(response) => {
                    let status = response.status();
                    if status.is_success() || (status.is_client_error() && !is_special(status)) {
                        return Ok(response);
                    }
                    if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
                        let (_, message) = read_error(response).await;
                        return Err(WorkspaceError::ProviderAuth {
                            provider: BACKEND_NAME,
                            credential: self.credential.clone(),
                            message: format!("{what}: {message}"),
                        });
                    }
                    let retryable = status == StatusCode::TOO_MANY_REQUESTS
                        || retry == Retry::Idempotent
                        || (retry == Retry::Lookup && status != StatusCode::INTERNAL_SERVER_ERROR);
                    let (code, message) = read_error(response).await;
                    let error = failure(what, status, &code, &message);
                    if !retryable {
                        return Err(error);
                    }
                    error
                }
                Err(error) => {
                    let never_sent = error.is_connect();
                    let problem = WorkspaceError::BackendUnavailable {
                        backend: BACKEND_NAME,
                        reason: format!("{what}: {}", error_chain(&error)),
                    };
                    if !(never_sent || retry != Retry::Once) {
                        return Err(problem);
                    }
                    problem
                }
            };
            let now = Instant::now();
            if now + backoff > deadline {
                return Err(transient);
            }
            tracing::debug!(what, error = %transient, "opensandbox call failed, retrying");
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}

fn is_special(status: StatusCode) -> bool {
    matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN | StatusCode::TOO_MANY_REQUESTS)
}

fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// The provider's `{code, message}` of an error answer (bounded; the text when not JSON).
pub(crate) async fn read_error(response: Response) -> (String, String) {
    let status = response.status();
    let body = response.bytes().await.unwrap_or_default();
    let body = &body[..body.len().min(4096)];
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        #[serde(default)]
        code: String,
        #[serde(default)]
        message: String,
        #[serde(default)]
        detail: Option<serde_json::Value>,
    }
    match serde_json::from_slice::<ErrorBody>(body) {
        Ok(parsed) if !parsed.code.is_empty() || !parsed.message.is_empty() => (parsed.code, parsed.message),
        Ok(ErrorBody { detail: Some(detail), .. }) => {
            let code = detail.get("code").and_then(|code| code.as_str()).unwrap_or_default().to_owned();
            let message =
                detail.get("message").and_then(|text| text.as_str()).map_or_else(|| detail.to_string(), str::to_owned);
            (code, message)
        }
        _ => (String::new(), format!("HTTP {status}: {}", String::from_utf8_lossy(body).trim())),
    }
}

/// The error of a failed call: quota when the provider says so, else its code and message.
pub(crate) fn failure(what: &str, status: StatusCode, code: &str, message: &str) -> WorkspaceError {
    let quota = status == StatusCode::TOO_MANY_REQUESTS
        || code.to_ascii_lowercase().contains("quota")
        || message.to_ascii_lowercase().contains("quota");
    let text = if code.is_empty() { format!("{what}: {message}") } else { format!("{what}: {code}: {message}") };
    if quota {
        WorkspaceError::ProviderQuota { provider: BACKEND_NAME, message: text }
    } else {
        WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("{text} (HTTP {})", status.as_u16()) }
    }
}

/// The error of a client-error answer a caller did not expect.
pub(crate) async fn unexpected(what: &str, response: Response) -> WorkspaceError {
    let status = response.status();
    let (code, message) = read_error(response).await;
    failure(what, status, &code, &message)
}
