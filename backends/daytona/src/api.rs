//! The Daytona API (`Authorization: Bearer`, `X-Daytona-Organization-ID` when configured):
//! create with labels and env, list by labels (a JSON map; every page, following
//! `nextCursor`), get, start (waiting for `started`), stop, delete, replace labels, the
//! toolbox proxy URL. Answers are untrusted: every field used is checked.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde::Deserialize;
use serde_json::json;

use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;
use super::http::{self, Failure, Retry, encode, query};

/// Most pages one listing follows, so a misbehaving server cannot loop it forever.
const MAX_PAGES: usize = 200;

/// The fields of Daytona's `Sandbox` (and list item) this backend uses.
#[derive(Clone, Debug, Deserialize)]
pub struct SandboxInfo {
    pub id: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub state: Option<String>,
    #[serde(rename = "toolboxProxyUrl", default)]
    pub toolbox_proxy_url: String,
    #[serde(rename = "createdAt", default)]
    pub created_at: Option<String>,
    #[serde(rename = "errorReason", default)]
    pub error_reason: Option<String>,
}

impl SandboxInfo {
    pub fn state(&self) -> &str {
        self.state.as_deref().unwrap_or("unknown")
    }

    pub fn created_at_ms(&self) -> i64 {
        self.created_at
            .as_deref()
            .and_then(|text| humantime::parse_rfc3339_weak(text).ok())
            .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |since| since.as_millis() as i64)
    }
}

#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    items: Vec<SandboxInfo>,
    #[serde(rename = "nextCursor", default)]
    next_cursor: Option<String>,
}

pub struct Api {
    client: Client,
    base: String,
    key: String,
    organization_id: Option<String>,
    /// The API key file, named in authentication errors.
    credential: String,
    request_timeout: Duration,
    retry_deadline: Duration,
    start_timeout: Duration,
    page_size: String,
}

/// States a sandbox passes through on its way to `started` (or `stopped`).
const TRANSIENT: [&str; 8] = [
    "creating",
    "starting",
    "stopping",
    "restoring",
    "pulling_snapshot",
    "pending_build",
    "building_snapshot",
    "resuming",
];

impl Api {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        base: &str,
        key: String,
        organization_id: Option<String>,
        credential: String,
        request_timeout: Duration,
        retry_deadline: Duration,
        start_timeout: Duration,
        page_size: u32,
    ) -> Self {
        let base = base.trim_end_matches('/').to_owned();
        Self {
            client,
            base,
            key,
            organization_id,
            credential,
            request_timeout,
            retry_deadline,
            start_timeout,
            page_size: page_size.to_string(),
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn organization_id(&self) -> Option<&str> {
        self.organization_id.as_deref()
    }

    pub fn credential(&self) -> &str {
        &self.credential
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .header("X-Daytona-Source", "berth")
            .timeout(self.request_timeout);
        if let Some(organization) = &self.organization_id {
            request = request.header("X-Daytona-Organization-ID", organization);
        }
        request
    }

    fn fail(&self, what: &str, failure: Failure) -> WorkspaceError {
        failure.into_error(what, &self.credential)
    }

    async fn parse<T: for<'de> Deserialize<'de>>(what: &str, response: reqwest::Response) -> Result<T> {
        let bytes = response.bytes().await.map_err(|error| WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: format!("{what}: reading the answer: {error}"),
        })?;
        serde_json::from_slice(&bytes).map_err(|error| WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("{what}: unexpected answer: {error}"),
        })
    }

    /// Creates a sandbox and waits until it is started.
    pub async fn create(
        &self,
        snapshot: Option<&str>,
        labels: &BTreeMap<String, String>,
        env: &BTreeMap<String, String>,
        auto_stop_minutes: u32,
        network: bool,
    ) -> Result<SandboxInfo> {
        // The workspace spec's `network`: a workspace without it gets a sandbox whose
        // egress is blocked (Daytona's own default would be open).
        let mut body = json!({
            "labels": labels,
            "env": env,
            "autoStopInterval": auto_stop_minutes,
            "networkBlockAll": !network,
        });
        if let Some(snapshot) = snapshot {
            body["snapshot"] = json!(snapshot);
        }
        let what = "create a daytona sandbox";
        let response =
            http::send(|| self.request(Method::POST, "/sandbox").json(&body), Retry::Refused, self.retry_deadline, &[])
                .await
                .map_err(|failure| self.fail(what, failure))?;
        let created: SandboxInfo = Self::parse(what, response).await?;
        self.wait_started(created).await
    }

    /// Waits until a sandbox is `started` (polling `GET /sandbox/{id}`).
    async fn wait_started(&self, mut sandbox: SandboxInfo) -> Result<SandboxInfo> {
        let give_up = tokio::time::Instant::now() + self.start_timeout;
        let mut pause = Duration::from_millis(100);
        loop {
            match sandbox.state() {
                "started" => return Ok(sandbox),
                state if TRANSIENT.contains(&state) || state == "unknown" => {}
                state => {
                    return Err(WorkspaceError::BackendUnavailable {
                        backend: BACKEND_NAME,
                        reason: format!(
                            "sandbox {} is {state} ({})",
                            sandbox.id,
                            sandbox.error_reason.as_deref().unwrap_or("no reason given")
                        ),
                    });
                }
            }
            if tokio::time::Instant::now() + pause > give_up {
                return Err(WorkspaceError::Timeout {
                    operation: "starting a daytona sandbox",
                    millis: self.start_timeout.as_millis() as u64,
                });
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_secs(2));
            sandbox = match self.get(&sandbox.id).await? {
                Some(sandbox) => sandbox,
                None => {
                    return Err(WorkspaceError::BackendUnavailable {
                        backend: BACKEND_NAME,
                        reason: format!("sandbox {} vanished while starting", sandbox.id),
                    });
                }
            };
        }
    }

    /// Every sandbox whose labels hold `filter`, all pages.
    pub async fn list(&self, filter: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>> {
        let what = "list daytona sandboxes";
        let labels = serde_json::to_string(filter).unwrap_or_default();
        let mut cursor: Option<String> = None;
        let mut all = Vec::new();
        for _ in 0..MAX_PAGES {
            let response = http::send(
                || {
                    let mut pairs = vec![("labels", labels.as_str()), ("limit", self.page_size.as_str())];
                    if let Some(cursor) = &cursor {
                        pairs.push(("cursor", cursor.as_str()));
                    }
                    self.request(Method::GET, &format!("/sandbox?{}", query(&pairs)))
                },
                Retry::Idempotent,
                self.retry_deadline,
                &[],
            )
            .await
            .map_err(|failure| self.fail(what, failure))?;
            let page: Page = Self::parse(what, response).await?;
            // The server filtered; check again (an answer is untrusted). Destroyed sandboxes
            // linger in some listings: they are gone for Berth.
            all.extend(page.items.into_iter().filter(|sandbox| {
                !matches!(sandbox.state(), "destroyed" | "destroying")
                    && filter.iter().all(|(key, value)| sandbox.labels.get(key) == Some(value))
            }));
            match page.next_cursor.filter(|next| !next.is_empty()) {
                Some(next) if Some(&next) != cursor.as_ref() => cursor = Some(next),
                _ => return Ok(all),
            }
        }
        Err(WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("{what}: more than {MAX_PAGES} pages") })
    }

    /// One sandbox; `None` when it does not exist.
    pub async fn get(&self, sandbox_id: &str) -> Result<Option<SandboxInfo>> {
        let what = format!("get daytona sandbox {sandbox_id}");
        let path = format!("/sandbox/{}", encode(sandbox_id));
        let response = http::send(
            || self.request(Method::GET, &path),
            Retry::Idempotent,
            self.retry_deadline,
            &[StatusCode::NOT_FOUND],
        )
        .await
        .map_err(|failure| self.fail(&what, failure))?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let sandbox: SandboxInfo = Self::parse(&what, response).await?;
        if matches!(sandbox.state(), "destroyed" | "destroying") {
            return Ok(None);
        }
        Ok(Some(sandbox))
    }

    /// Starts a sandbox (fine when started) and waits until it is; `None` when it is gone.
    pub async fn start(&self, sandbox_id: &str) -> Result<Option<SandboxInfo>> {
        let what = format!("start daytona sandbox {sandbox_id}");
        let path = format!("/sandbox/{}/start", encode(sandbox_id));
        let response = http::send(
            || self.request(Method::POST, &path),
            Retry::Idempotent,
            self.retry_deadline,
            &[StatusCode::NOT_FOUND],
        )
        .await
        .map_err(|failure| self.fail(&what, failure))?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let sandbox: SandboxInfo = Self::parse(&what, response).await?;
        self.wait_started(sandbox).await.map(Some)
    }

    /// Stops a sandbox (files kept); fine when it is stopped or gone.
    pub async fn stop(&self, sandbox_id: &str) -> Result<()> {
        let what = format!("stop daytona sandbox {sandbox_id}");
        let path = format!("/sandbox/{}/stop", encode(sandbox_id));
        http::send(
            || self.request(Method::POST, &path),
            Retry::Idempotent,
            self.retry_deadline,
            &[StatusCode::NOT_FOUND, StatusCode::CONFLICT],
        )
        .await
        .map_err(|failure| self.fail(&what, failure))?;
        Ok(())
    }

    /// Deletes a sandbox; `false` when it did not exist.
    pub async fn delete(&self, sandbox_id: &str) -> Result<bool> {
        let what = format!("delete daytona sandbox {sandbox_id}");
        let path = format!("/sandbox/{}", encode(sandbox_id));
        let response = http::send(
            || self.request(Method::DELETE, &path),
            Retry::Idempotent,
            self.retry_deadline,
            &[StatusCode::NOT_FOUND],
        )
        .await
        .map_err(|failure| self.fail(&what, failure))?;
        Ok(response.status() != StatusCode::NOT_FOUND)
    }

    /// Replaces a sandbox's labels.
    pub async fn replace_labels(&self, sandbox_id: &str, labels: &BTreeMap<String, String>) -> Result<()> {
        let what = format!("replace the labels of daytona sandbox {sandbox_id}");
        let path = format!("/sandbox/{}/labels", encode(sandbox_id));
        let body = json!({"labels": labels});
        http::send(|| self.request(Method::PUT, &path).json(&body), Retry::Idempotent, self.retry_deadline, &[])
            .await
            .map_err(|failure| self.fail(&what, failure))?;
        Ok(())
    }

    /// The toolbox base of a sandbox whose answer carried none.
    pub async fn toolbox_proxy_url(&self, sandbox_id: &str) -> Result<String> {
        #[derive(Deserialize)]
        struct Url {
            url: String,
        }
        let what = format!("get the toolbox url of daytona sandbox {sandbox_id}");
        let path = format!("/sandbox/{}/toolbox-proxy-url", encode(sandbox_id));
        let response = http::send(|| self.request(Method::GET, &path), Retry::Idempotent, self.retry_deadline, &[])
            .await
            .map_err(|failure| self.fail(&what, failure))?;
        let url: Url = Self::parse(&what, response).await?;
        Ok(url.url)
    }
}
