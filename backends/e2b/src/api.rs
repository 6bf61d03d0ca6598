//! The E2B platform API (`X-API-KEY`): create from a template with metadata and env, list
//! by metadata (every page, following `x-next-token`), connect (resumes a paused sandbox),
//! pause, kill, set timeout, get one. Answers are untrusted: every field is checked.

use std::collections::BTreeMap;
use std::time::Duration;

use reqwest::{Client, Method, StatusCode};
use serde::Deserialize;
use serde_json::json;

use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;
use super::http::{self, Failure, Retry, encode, query};

/// Most pages one listing follows (10 000 sandboxes), so a misbehaving server cannot loop
/// it forever.
const MAX_PAGES: usize = 100;

/// A created or connected sandbox: what envd needs.
#[derive(Clone, Debug, Deserialize)]
pub struct SandboxAccess {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(rename = "envdVersion", default)]
    pub envd_version: String,
    #[serde(rename = "envdAccessToken", default)]
    pub envd_access_token: Option<String>,
    #[serde(default)]
    pub domain: Option<String>,
}

/// One entry of a listing.
#[derive(Clone, Debug, Deserialize)]
pub struct Listed {
    #[serde(rename = "sandboxID")]
    pub sandbox_id: String,
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    pub state: String,
    #[serde(rename = "startedAt", default)]
    pub started_at: String,
}

impl Listed {
    pub fn metadata(&self) -> BTreeMap<String, String> {
        self.metadata.clone().unwrap_or_default()
    }

    pub fn started_at_ms(&self) -> i64 {
        humantime::parse_rfc3339_weak(&self.started_at)
            .ok()
            .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |since| since.as_millis() as i64)
    }
}

pub struct Api {
    client: Client,
    base: String,
    key: String,
    /// The API key file, named in authentication errors.
    credential: String,
    request_timeout: Duration,
    retry_deadline: Duration,
    /// Sandboxes per list page.
    page_size: String,
}

/// The `metadata` query value: `k=v&k2=v2` with keys and values encoded (the whole value
/// is encoded once more as a query parameter).
pub fn metadata_query(filter: &BTreeMap<String, String>) -> String {
    filter.iter().map(|(key, value)| format!("{}={}", encode(key), encode(value))).collect::<Vec<_>>().join("&")
}

impl Api {
    pub fn new(
        client: Client,
        base: &str,
        key: String,
        credential: String,
        request_timeout: Duration,
        retry_deadline: Duration,
        page_size: u32,
    ) -> Self {
        let base = base.trim_end_matches('/').to_owned();
        Self { client, base, key, credential, request_timeout, retry_deadline, page_size: page_size.to_string() }
    }

    fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.client
            .request(method, format!("{}{path}", self.base))
            .header("X-API-KEY", &self.key)
            .timeout(self.request_timeout)
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

    pub async fn create(
        &self,
        template: &str,
        timeout: Duration,
        metadata: &BTreeMap<String, String>,
        env: &BTreeMap<String, String>,
        internet: bool,
    ) -> Result<SandboxAccess> {
        // `allow_internet_access` (false: all egress denied) is the workspace spec's
        // `network`: a workspace without it gets a sandbox without it, as on every backend.
        let body = json!({
            "templateID": template,
            "timeout": timeout.as_secs(),
            "autoPause": true,
            "metadata": metadata,
            "envVars": env,
            "allow_internet_access": internet,
        });
        let what = "create an e2b sandbox";
        let response = http::send(
            || self.request(Method::POST, "/v2/sandboxes").json(&body),
            Retry::Refused,
            self.retry_deadline,
            &[],
        )
        .await
        .map_err(|failure| self.fail(what, failure))?;
        Self::parse(what, response).await
    }

    /// Every sandbox whose metadata holds `filter` (running and paused), all pages.
    pub async fn list(&self, filter: &BTreeMap<String, String>) -> Result<Vec<Listed>> {
        let what = "list e2b sandboxes";
        let metadata = metadata_query(filter);
        let mut token: Option<String> = None;
        let mut all = Vec::new();
        for _ in 0..MAX_PAGES {
            let response = http::send(
                || {
                    let mut pairs = vec![
                        ("metadata", metadata.as_str()),
                        ("state", "running,paused"),
                        ("limit", self.page_size.as_str()),
                    ];
                    if let Some(token) = &token {
                        pairs.push(("nextToken", token.as_str()));
                    }
                    self.request(Method::GET, &format!("/v2/sandboxes?{}", query(&pairs)))
                },
                Retry::Idempotent,
                self.retry_deadline,
                &[],
            )
            .await
            .map_err(|failure| self.fail(what, failure))?;
            let next = response
                .headers()
                .get("x-next-token")
                .and_then(|value| value.to_str().ok())
                .filter(|value| !value.is_empty())
                .map(str::to_owned);
            let page: Vec<Listed> = Self::parse(what, response).await?;
            // The server filtered; check again (an answer is untrusted).
            all.extend(page.into_iter().filter(|listed| {
                let metadata = listed.metadata();
                filter.iter().all(|(key, value)| metadata.get(key) == Some(value))
            }));
            match next {
                Some(next) => token = Some(next),
                None => return Ok(all),
            }
        }
        Err(WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("{what}: more than {MAX_PAGES} pages") })
    }

    /// Connects to (and resumes, when paused) a sandbox; `None` when it does not exist.
    pub async fn connect(&self, sandbox_id: &str, timeout: Duration) -> Result<Option<SandboxAccess>> {
        let what = format!("connect to e2b sandbox {sandbox_id}");
        let path = format!("/v2/sandboxes/{}/connect", encode(sandbox_id));
        let body = json!({"timeout": timeout.as_secs()});
        let response = http::send(
            || self.request(Method::POST, &path).json(&body),
            Retry::Idempotent,
            self.retry_deadline,
            &[StatusCode::NOT_FOUND],
        )
        .await
        .map_err(|failure| self.fail(&what, failure))?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        Self::parse(&what, response).await.map(Some)
    }

    /// Pauses a sandbox (files kept); fine when it is already paused or gone.
    pub async fn pause(&self, sandbox_id: &str) -> Result<()> {
        let what = format!("pause e2b sandbox {sandbox_id}");
        let path = format!("/sandboxes/{}/pause", encode(sandbox_id));
        http::send(
            || self.request(Method::POST, &path).json(&json!({})),
            Retry::Idempotent,
            self.retry_deadline,
            &[StatusCode::NOT_FOUND, StatusCode::CONFLICT],
        )
        .await
        .map_err(|failure| self.fail(&what, failure))?;
        Ok(())
    }

    /// Kills a sandbox; `false` when it did not exist.
    pub async fn kill(&self, sandbox_id: &str) -> Result<bool> {
        let what = format!("kill e2b sandbox {sandbox_id}");
        let path = format!("/sandboxes/{}", encode(sandbox_id));
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

    pub async fn set_timeout(&self, sandbox_id: &str, timeout: Duration) -> Result<()> {
        let what = format!("set the timeout of e2b sandbox {sandbox_id}");
        let path = format!("/sandboxes/{}/timeout", encode(sandbox_id));
        let body = json!({"timeout": timeout.as_secs()});
        http::send(|| self.request(Method::POST, &path).json(&body), Retry::Idempotent, self.retry_deadline, &[])
            .await
            .map_err(|failure| self.fail(&what, failure))?;
        Ok(())
    }

    /// A sandbox's state (`running`, `paused`), `None` when it does not exist.
    pub async fn state(&self, sandbox_id: &str) -> Result<Option<String>> {
        let what = format!("get e2b sandbox {sandbox_id}");
        let path = format!("/sandboxes/{}", encode(sandbox_id));
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
        let listed: Listed = Self::parse(&what, response).await?;
        Ok(Some(listed.state))
    }
}
