//! Settings of the Daytona backend, built from a few node-agent flags (see
//! `DaytonaConfig`'s fields), and the API key read from its file.

use std::path::PathBuf;
use std::time::Duration;

use berth_workspace::error::{Result, WorkspaceError};

pub const BACKEND_NAME: &str = "daytona";

/// How a gateway reaches Daytona.
#[derive(Clone, Debug)]
pub struct DaytonaConfig {
    /// API base URL (`--daytona-api-url`, default `https://app.daytona.io/api`).
    pub api_url: String,
    /// File holding the API key (`--daytona-api-key-file`); never the key itself.
    pub api_key_file: PathBuf,
    /// Sent as `X-Daytona-Organization-ID` when set (`--daytona-organization-id`).
    pub organization_id: Option<String>,
    /// Snapshot sandboxes are created from (`--daytona-snapshot`); Daytona's default when
    /// `None`.
    pub snapshot: Option<String>,
    /// This cluster's key prefix (the replica's `--key-prefix`), a label of every sandbox
    /// so two clusters sharing an organization never touch each other's sandboxes.
    pub cluster_prefix: String,
    /// Daytona's auto-stop interval in minutes (`--daytona-auto-stop-minutes`, 0 = never;
    /// Berth stops idle workspaces itself). A stopped sandbox keeps its files.
    pub auto_stop_minutes: u32,
    /// Deadline of one HTTP request to the API or a toolbox (`--daytona-request-timeout`).
    pub request_timeout: Duration,
    /// Deadline for a call with its retries on 429 / 5xx (`--daytona-retry-deadline`).
    pub retry_deadline: Duration,
    /// How long a started sandbox may take to reach `started`.
    pub start_timeout: Duration,
    /// The workspace root inside the sandbox; `None`: `<the sandbox user's home>/workspace`
    /// as the toolbox reports it.
    pub workspace_root: Option<String>,
    /// Sandboxes per list page (1–200, default 100; tests page with less).
    pub list_page_size: u32,
}

impl DaytonaConfig {
    pub fn new(api_key_file: impl Into<PathBuf>, cluster_prefix: &str) -> Self {
        Self {
            api_url: "https://app.daytona.io/api".to_owned(),
            api_key_file: api_key_file.into(),
            organization_id: None,
            snapshot: None,
            cluster_prefix: cluster_prefix.to_owned(),
            auto_stop_minutes: 0,
            request_timeout: Duration::from_secs(30),
            retry_deadline: Duration::from_secs(60),
            start_timeout: Duration::from_secs(120),
            workspace_root: None,
            list_page_size: 100,
        }
    }

    /// Checks the settings and reads the API key.
    pub fn load_api_key(&self) -> Result<String> {
        let invalid = |reason: String| WorkspaceError::InvalidArgument(format!("daytona backend: {reason}"));
        if !(self.api_url.starts_with("http://") || self.api_url.starts_with("https://")) {
            return Err(invalid(format!("api url {:?} is not an http(s) URL", self.api_url)));
        }
        if self.cluster_prefix.is_empty() {
            return Err(invalid("the cluster prefix is empty".into()));
        }
        if let Some(root) = &self.workspace_root
            && !valid_root(root)
        {
            return Err(invalid(format!("workspace root {root:?} must be absolute and clean")));
        }
        if !(1..=200).contains(&self.list_page_size) {
            return Err(invalid(format!("the list page size {} is not within 1..=200", self.list_page_size)));
        }
        if let Some(organization) = &self.organization_id
            && (organization.is_empty() || !organization.bytes().all(|byte| byte.is_ascii_graphic()))
        {
            return Err(invalid("the organization id must be printable ASCII".into()));
        }
        let text = std::fs::read_to_string(&self.api_key_file).map_err(|error| WorkspaceError::ProviderAuth {
            provider: BACKEND_NAME,
            credential: self.api_key_file.display().to_string(),
            message: format!("cannot read the API key file: {error}"),
        })?;
        let key = text.trim().to_owned();
        if key.is_empty() || key.contains(['\n', '\r']) || !key.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err(WorkspaceError::ProviderAuth {
                provider: BACKEND_NAME,
                credential: self.api_key_file.display().to_string(),
                message: "the API key file must hold one non-empty line".into(),
            });
        }
        Ok(key)
    }
}

/// An absolute, normalised path of `[A-Za-z0-9._-]` components, other than `/`: safe to
/// splice into a script between single quotes.
pub fn valid_root(path: &str) -> bool {
    let Some(relative) = path.strip_prefix('/') else {
        return false;
    };
    !relative.is_empty()
        && relative.split('/').all(|component| {
            !component.is_empty()
                && component != "."
                && component != ".."
                && component.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
        })
}

/// Where a backend records the generation that last adopted a sandbox: beside the
/// workspace root, outside it.
pub fn generation_file(root: &str) -> String {
    let parent = root.rsplit_once('/').map_or("", |(parent, _)| parent);
    format!("{parent}/.berth/generation")
}
