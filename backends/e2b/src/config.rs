//! Settings of the E2B backend, built from a few node-agent flags (see `E2bConfig`'s
//! fields), and the API key read from its file.

use std::path::PathBuf;
use std::time::Duration;

use berth_workspace::error::{Result, WorkspaceError};

pub const BACKEND_NAME: &str = "e2b";
/// envd's port inside every sandbox (the value of the `E2b-Sandbox-Port` routing header).
pub const ENVD_PORT: u16 = 49983;

/// How a gateway reaches E2B.
#[derive(Clone, Debug)]
pub struct E2bConfig {
    /// Platform API base URL (`--e2b-api-url`, default `https://api.e2b.app`).
    pub api_url: String,
    /// One envd URL for every sandbox, routed by the `E2b-Sandbox-Id` / `E2b-Sandbox-Port`
    /// headers (`--e2b-sandbox-url`). `None`: each sandbox's own host,
    /// `https://49983-<sandbox id>.<domain>`.
    pub sandbox_url: Option<String>,
    /// The sandbox domain of per-sandbox hosts (`--e2b-domain`, default `e2b.app`).
    pub domain: String,
    /// File holding the API key (`--e2b-api-key-file`); never the key itself.
    pub api_key_file: PathBuf,
    /// Template sandboxes are created from (`--e2b-template`, default `base`).
    pub template: String,
    /// This cluster's key prefix (the replica's `--key-prefix`), written to every sandbox's
    /// metadata so two clusters sharing an account never touch each other's sandboxes.
    pub cluster_prefix: String,
    /// E2B's sandbox timeout (`--e2b-sandbox-timeout`, default 1 h). Sandboxes are created
    /// with auto-pause, so a timeout pauses (files kept) rather than kills; every use
    /// pushes it forward.
    pub sandbox_timeout: Duration,
    /// Deadline of one HTTP request to the API or envd (`--e2b-request-timeout`, 30 s).
    pub request_timeout: Duration,
    /// Deadline for a call with its retries on 429 / 5xx (`--e2b-retry-deadline`, 60 s).
    pub retry_deadline: Duration,
    /// The workspace root inside the sandbox (default `/home/user/workspace`).
    pub workspace_root: String,
    /// Sandboxes per list page (1–100, default 100; tests page with less).
    pub list_page_size: u32,
}

impl E2bConfig {
    pub fn new(api_key_file: impl Into<PathBuf>, cluster_prefix: &str) -> Self {
        Self {
            api_url: "https://api.e2b.app".to_owned(),
            sandbox_url: None,
            domain: "e2b.app".to_owned(),
            api_key_file: api_key_file.into(),
            template: "base".to_owned(),
            cluster_prefix: cluster_prefix.to_owned(),
            sandbox_timeout: Duration::from_secs(3600),
            request_timeout: Duration::from_secs(30),
            retry_deadline: Duration::from_secs(60),
            workspace_root: "/home/user/workspace".to_owned(),
            list_page_size: 100,
        }
    }

    /// Checks the settings and reads the API key.
    pub fn load_api_key(&self) -> Result<String> {
        let invalid = |reason: String| WorkspaceError::InvalidArgument(format!("e2b backend: {reason}"));
        for (name, url) in [("api url", Some(&self.api_url)), ("sandbox url", self.sandbox_url.as_ref())] {
            if let Some(url) = url
                && !(url.starts_with("http://") || url.starts_with("https://"))
            {
                return Err(invalid(format!("{name} {url:?} is not an http(s) URL")));
            }
        }
        if self.cluster_prefix.is_empty() {
            return Err(invalid("the cluster prefix is empty".into()));
        }
        if !self.workspace_root.starts_with('/')
            || self.workspace_root.ends_with('/')
            || self.workspace_root.contains("/..")
        {
            return Err(invalid(format!("workspace root {:?} must be absolute and clean", self.workspace_root)));
        }
        if !(1..=100).contains(&self.list_page_size) {
            return Err(invalid(format!("the list page size {} is not within 1..=100", self.list_page_size)));
        }
        if self.sandbox_timeout < Duration::from_secs(60) {
            return Err(invalid("the sandbox timeout must be at least 60 s".into()));
        }
        let text = std::fs::read_to_string(&self.api_key_file).map_err(|error| WorkspaceError::ProviderAuth {
            provider: BACKEND_NAME,
            credential: self.api_key_file.display().to_string(),
            message: format!("cannot read the API key file: {error}"),
        })?;
        let key = text.trim().to_owned();
        if key.is_empty() || key.contains(['\n', '\r']) {
            return Err(WorkspaceError::ProviderAuth {
                provider: BACKEND_NAME,
                credential: self.api_key_file.display().to_string(),
                message: "the API key file must hold one non-empty line".into(),
            });
        }
        Ok(key)
    }

    /// The envd base URL of one sandbox.
    pub fn envd_url(&self, sandbox_id: &str, sandbox_domain: Option<&str>) -> String {
        match &self.sandbox_url {
            Some(url) => url.trim_end_matches('/').to_owned(),
            None => format!("https://{ENVD_PORT}-{sandbox_id}.{}", sandbox_domain.unwrap_or(&self.domain)),
        }
    }

    /// Where this backend records the generation that last adopted a sandbox (outside the
    /// workspace root, beside it).
    pub fn generation_file(&self) -> String {
        let parent = self.workspace_root.rsplit_once('/').map_or("", |(parent, _)| parent);
        format!("{parent}/.berth/generation")
    }
}
