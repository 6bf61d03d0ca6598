//! The lifecycle REST API of the OpenSandbox server (`/v1/sandboxes`), per its published
//! spec (`specs/sandbox-lifecycle.yml`): create, get, list by metadata, delete, pause,
//! resume, patch metadata, and the endpoint of a port inside the sandbox.

use std::collections::BTreeMap;

use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

use berth_workspace::error::{Result, WorkspaceError};

use crate::config::BACKEND_NAME;
use crate::http::{Http, Retry, unexpected};

/// Header of the server's API key.
const API_KEY_HEADER: &str = "OPEN-SANDBOX-API-KEY";
const PAGE_SIZE: u32 = 100;

#[derive(Clone)]
pub(crate) struct Lifecycle {
    http: Http,
    base: String,
    api_key: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SandboxStatus {
    #[serde(default)]
    pub state: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct SandboxInfo {
    pub id: String,
    pub status: SandboxStatus,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    #[serde(default)]
    pub created_at: Option<String>,
}

impl SandboxInfo {
    pub fn state(&self) -> &str {
        &self.status.state
    }

    /// Gone or going: a sandbox in such a state is never adopted.
    pub fn is_terminal(&self) -> bool {
        matches!(self.state(), "Terminated" | "Failed" | "Stopping" | "Deleting" | "Deleted" | "Terminating")
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct CreateRequest {
    pub image: ImageSpec,
    pub entrypoint: Vec<String>,
    /// Seconds (at least 60), or null for no expiry.
    pub timeout: Option<u64>,
    pub resource_limits: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    pub metadata: BTreeMap<String, String>,
}

#[derive(Serialize)]
pub(crate) struct ImageSpec {
    pub uri: String,
}

#[derive(Deserialize)]
struct Page {
    #[serde(default)]
    items: Vec<SandboxInfo>,
    #[serde(default)]
    pagination: Option<Pagination>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Pagination {
    #[serde(default)]
    has_next_page: bool,
}

#[derive(Deserialize)]
pub(crate) struct Endpoint {
    pub endpoint: String,
    #[serde(default)]
    pub headers: BTreeMap<String, String>,
}

fn parse<T: serde::de::DeserializeOwned>(what: &str, bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|error| WorkspaceError::Backend {
        backend: BACKEND_NAME,
        message: format!("{what}: unreadable answer: {error}"),
    })
}

impl Lifecycle {
    pub fn new(http: Http, api_url: &str, api_key: Option<String>) -> Self {
        Self { http, base: format!("{}/v1", api_url.trim_end_matches('/')), api_key }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut builder =
            self.http.client.request(method, format!("{}{path}", self.base)).timeout(self.http.request_timeout);
        if let Some(key) = &self.api_key {
            builder = builder.header(API_KEY_HEADER, key);
        }
        builder
    }

    async fn body(what: &str, response: reqwest::Response) -> Result<bytes::Bytes> {
        response.bytes().await.map_err(|error| WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: format!("{what}: reading the answer: {error}"),
        })
    }

    pub async fn create(&self, request: &CreateRequest) -> Result<SandboxInfo> {
        let what = "create sandbox";
        let body = serde_json::to_vec(request).map_err(|error| WorkspaceError::InvalidArgument(error.to_string()))?;
        let response = self
            .http
            .send(what, Retry::Once, || {
                self.request(reqwest::Method::POST, "/sandboxes")
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await?;
        if !response.status().is_success() {
            return Err(unexpected(what, response).await);
        }
        parse(what, &Self::body(what, response).await?)
    }

    pub async fn get(&self, id: &str) -> Result<Option<SandboxInfo>> {
        let what = "get sandbox";
        let path = format!("/sandboxes/{id}");
        let response = self.http.send(what, Retry::Idempotent, || self.request(reqwest::Method::GET, &path)).await?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(None),
            status if status.is_success() => Ok(Some(parse(what, &Self::body(what, response).await?)?)),
            _ => Err(unexpected(what, response).await),
        }
    }

    /// Every sandbox whose metadata holds all of `filter`, across pages.
    pub async fn list(&self, filter: &BTreeMap<String, String>) -> Result<Vec<SandboxInfo>> {
        let what = "list sandboxes";
        let metadata = filter.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join("&");
        let mut found = Vec::new();
        for page in 1u32.. {
            let query =
                [("metadata", metadata.clone()), ("page", page.to_string()), ("pageSize", PAGE_SIZE.to_string())];
            let response = self
                .http
                .send(what, Retry::Idempotent, || self.request(reqwest::Method::GET, "/sandboxes").query(&query))
                .await?;
            if !response.status().is_success() {
                return Err(unexpected(what, response).await);
            }
            let page: Page = parse(what, &Self::body(what, response).await?)?;
            let more = page.pagination.is_some_and(|pagination| pagination.has_next_page) && !page.items.is_empty();
            // The server filters; the check here keeps a lax one from handing over others'.
            found.extend(
                page.items
                    .into_iter()
                    .filter(|info| filter.iter().all(|(key, value)| info.metadata.get(key) == Some(value))),
            );
            if !more {
                break;
            }
        }
        Ok(found)
    }

    /// Deletes a sandbox; `false` when it did not exist.
    pub async fn delete(&self, id: &str) -> Result<bool> {
        let what = "delete sandbox";
        let path = format!("/sandboxes/{id}");
        let response = self.http.send(what, Retry::Idempotent, || self.request(reqwest::Method::DELETE, &path)).await?;
        match response.status() {
            StatusCode::NOT_FOUND => Ok(false),
            status if status.is_success() => Ok(true),
            _ => Err(unexpected(what, response).await),
        }
    }

    /// `pause` or `resume`.
    pub async fn transition(&self, id: &str, action: &str) -> Result<()> {
        let what = format!("{action} sandbox");
        let path = format!("/sandboxes/{id}/{action}");
        let response = self.http.send(&what, Retry::Idempotent, || self.request(reqwest::Method::POST, &path)).await?;
        match response.status() {
            StatusCode::NOT_FOUND => Err(WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!("sandbox {id} is gone"),
            }),
            status if status.is_success() => Ok(()),
            _ => Err(unexpected(&what, response).await),
        }
    }

    pub async fn patch_metadata(&self, id: &str, patch: &BTreeMap<String, String>) -> Result<SandboxInfo> {
        let what = "patch sandbox metadata";
        let path = format!("/sandboxes/{id}/metadata");
        let body = serde_json::to_vec(patch).map_err(|error| WorkspaceError::InvalidArgument(error.to_string()))?;
        let response = self
            .http
            .send(what, Retry::Idempotent, || {
                self.request(reqwest::Method::PATCH, &path)
                    .header(reqwest::header::CONTENT_TYPE, "application/merge-patch+json")
                    .body(body.clone())
            })
            .await?;
        if !response.status().is_success() {
            return Err(unexpected(what, response).await);
        }
        parse(what, &Self::body(what, response).await?)
    }

    pub async fn endpoint(&self, id: &str, port: u16) -> Result<Endpoint> {
        let what = "get sandbox endpoint";
        let path = format!("/sandboxes/{id}/endpoints/{port}");
        let response = self.http.send(what, Retry::Idempotent, || self.request(reqwest::Method::GET, &path)).await?;
        if !response.status().is_success() {
            return Err(unexpected(what, response).await);
        }
        parse(what, &Self::body(what, response).await?)
    }
}

/// Milliseconds since the epoch of an RFC 3339 UTC time (`2026-12-01T20:51:42.256427Z`);
/// 0 when unreadable.
pub(crate) fn rfc3339_ms(text: &str) -> i64 {
    fn number(text: &str) -> Option<i64> {
        text.parse().ok()
    }
    let parsed = (|| {
        let (date, time) = text.split_once('T')?;
        let mut date_parts = date.splitn(3, '-');
        let (year, month, day) =
            (number(date_parts.next()?)?, number(date_parts.next()?)?, number(date_parts.next()?)?);
        let time = time.trim_end_matches('Z');
        let time = time.split(['+']).next()?;
        let mut time_parts = time.splitn(3, ':');
        let (hour, minute) = (number(time_parts.next()?)?, number(time_parts.next()?)?);
        let seconds = time_parts.next()?;
        let (whole, fraction) = seconds.split_once('.').unwrap_or((seconds, "0"));
        let millis = number(&format!("{fraction:0<3}")[..3])?;
        // Days from civil (proleptic Gregorian).
        let shifted_year = if month <= 2 { year - 1 } else { year };
        let era = shifted_year.div_euclid(400);
        let year_of_era = shifted_year - era * 400;
        let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
        let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
        let days = era * 146_097 + day_of_era - 719_468;
        Some(((days * 24 + hour) * 60 + minute) * 60_000 + number(whole)? * 1000 + millis)
    })();
    parsed.unwrap_or(0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn parses_rfc3339() {
        assert_eq!(super::rfc3339_ms("1970-01-01T00:00:01.5Z"), 1500);
        assert_eq!(super::rfc3339_ms("2023-11-14T22:13:20Z"), 1_700_000_000_000);
        assert_eq!(super::rfc3339_ms("nonsense"), 0);
    }
}
