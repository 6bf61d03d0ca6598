//! Settings of the OpenSandbox driver, built from a few node-agent flags
//! (`--opensandbox-*`, see the crate docs). Secrets come from files, never from a flag.

use std::path::PathBuf;
use std::time::Duration;

use berth_workspace::error::{Result, WorkspaceError};

/// Name of the backend in logs, metric labels and errors.
pub const BACKEND_NAME: &str = "opensandbox";
/// `uid:gid` of workspace processes unless configured otherwise (the base image's `berth`).
pub const DEFAULT_AGENT_USER: (u32, u32) = (1000, 1000);
/// `uid:gid` of secret-holding processes (`SpawnRole::SecretHolder`): not the agent's, so an
/// agent process can neither signal nor trace them nor read their `/proc/<pid>/environ`.
pub const DEFAULT_SECRET_HOLDER_USER: (u32, u32) = (64_000, 64_000);

/// Settings of an [`OpenSandboxDriver`](crate::OpenSandboxDriver).
#[derive(Clone, Debug)]
pub struct OpenSandboxConfig {
    /// Base URL of the lifecycle server, e.g. `http://127.0.0.1:8090` (its API is at `/v1`).
    pub api_url: String,
    /// File holding the API key (`OPEN-SANDBOX-API-KEY`); `None` for a server started
    /// without one (`OPENSANDBOX_INSECURE_SERVER`). Read at start and named in auth errors.
    pub api_key_file: Option<PathBuf>,
    /// File holding the execd access token (`X-EXECD-ACCESS-TOKEN`) when sandboxes have one.
    pub execd_token_file: Option<PathBuf>,
    /// The cluster's registry key prefix: every sandbox carries its hash, and this driver
    /// never sees, adopts or deletes a sandbox without it (two clusters on one account).
    pub cluster_prefix: String,
    /// Sandbox image when the workspace spec names none.
    pub image: String,
    /// The sandbox's own entrypoint (the server runs execd's bootstrap in front of it).
    pub entrypoint: Vec<String>,
    /// Defaults for specs that set no CPU / memory (0: the provider's default).
    pub default_cpu_millis: u32,
    pub default_memory_bytes: u64,
    /// Absolute path of the workspace root inside the sandbox.
    pub workspace_dir: String,
    /// Root-owned directory inside the sandbox for Berth's staging files.
    pub state_dir: String,
    pub agent_user: (u32, u32),
    pub secret_holder_user: (u32, u32),
    /// Timeout of one HTTP call (a streamed exec is bounded by its own timeout instead).
    pub request_timeout: Duration,
    /// How long 429 / 5xx / connection failures are retried (with backoff) before the call
    /// fails; create and resume get this much too.
    pub retry_deadline: Duration,
    /// The sandbox's lifetime at the provider (`timeout`, at least 60 s); `None`: no expiry,
    /// Berth deletes it.
    pub sandbox_timeout: Option<Duration>,
}

impl OpenSandboxConfig {
    /// Defaults for everything but where the server is and which cluster this is.
    pub fn new(api_url: impl Into<String>, cluster_prefix: impl Into<String>) -> Self {
        Self {
            api_url: api_url.into(),
            api_key_file: None,
            execd_token_file: None,
            cluster_prefix: cluster_prefix.into(),
            image: "berth/base:latest".to_owned(),
            entrypoint: vec!["tail".into(), "-f".into(), "/dev/null".into()],
            default_cpu_millis: 0,
            default_memory_bytes: 0,
            workspace_dir: "/workspace".to_owned(),
            state_dir: "/var/lib/berth".to_owned(),
            agent_user: DEFAULT_AGENT_USER,
            secret_holder_user: DEFAULT_SECRET_HOLDER_USER,
            request_timeout: Duration::from_secs(30),
            retry_deadline: Duration::from_secs(60),
            sandbox_timeout: None,
        }
    }

    pub fn validate(&self) -> Result<()> {
        let invalid = |message: String| Err(WorkspaceError::InvalidArgument(format!("opensandbox config: {message}")));
        if !(self.api_url.starts_with("http://") || self.api_url.starts_with("https://")) {
            return invalid(format!("api url {:?} is not http(s)", self.api_url));
        }
        if self.cluster_prefix.is_empty() {
            return invalid("the cluster prefix is empty".into());
        }
        for (name, path) in [("workspace dir", &self.workspace_dir), ("state dir", &self.state_dir)] {
            if !safe_absolute(path) {
                return invalid(format!("{name} {path:?} must be an absolute path of [A-Za-z0-9._-] components"));
            }
        }
        if self.agent_user.0 == 0 || self.agent_user == self.secret_holder_user {
            return invalid("the agent user must be neither root nor the secret-holder user".into());
        }
        if self.entrypoint.is_empty() {
            return invalid("the sandbox entrypoint is empty".into());
        }
        if self.sandbox_timeout.is_some_and(|timeout| timeout < Duration::from_secs(60)) {
            return invalid("the sandbox timeout is under 60 s (the provider's minimum)".into());
        }
        Ok(())
    }

    /// The API key, read from its file (trailing whitespace dropped).
    pub(crate) fn read_secret(path: &Option<PathBuf>, what: &str) -> Result<Option<String>> {
        let Some(path) = path else { return Ok(None) };
        let text = std::fs::read_to_string(path).map_err(|error| WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: format!("cannot read the {what} file {}: {error}", path.display()),
        })?;
        let secret = text.trim_end().to_owned();
        if secret.is_empty() || secret.contains(['\n', '\r']) {
            return Err(WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!("the {what} file {} must hold one line", path.display()),
            });
        }
        Ok(Some(secret))
    }
}

/// An absolute, normalised path of `[A-Za-z0-9._-]` components other than `/`: safe to
/// splice into a script between single quotes.
pub(crate) fn safe_absolute(path: &str) -> bool {
    let Some(relative) = path.strip_prefix('/') else { return false };
    !relative.is_empty()
        && relative.split('/').all(|component| {
            !component.is_empty()
                && component != "."
                && component != ".."
                && component.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
        })
}
