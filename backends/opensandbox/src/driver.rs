//! The lifecycle of workspaces as OpenSandbox sandboxes, found by this cluster's labels
//! (never by a table of this process): a gateway that restarts, or another gateway, finds
//! the same sandbox.
//!
//! Provision: the sandboxes labelled with this cluster and workspace →
//! - one labelled with a newer generation than the placement's: `SandboxFenced`;
//! - found but the placement is `fresh`: an orphan (a deleted workspace's, an unrecorded
//!   bind's): deleted, and a new one created;
//! - found: adopted — its `berth.generation` rewritten to the placement's and read back
//!   (a newer one read back means a newer gateway got there first: `SandboxFenced`),
//!   resumed when paused;
//! - none: created with the labels.
//!
//! Release pauses (files kept), destroy deletes every sandbox labelled with the id.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use tokio::time::Instant;

use berth_workspace::backend::BackendRef;
use berth_workspace::driver::{BackendDriver, LabelledSandbox, ProvisionContext};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;
use berth_workspace::spec::WorkspaceSpec;

use crate::backend::{OpenSandboxBackend, check_users};
use crate::config::{BACKEND_NAME, OpenSandboxConfig};
use crate::execd::{CommandRequest, Ending, Execd};
use crate::files::script_error;
use crate::http::Http;
use crate::labels;
use crate::lifecycle::{CreateRequest, ImageSpec, Lifecycle, SandboxInfo, rfc3339_ms};
use crate::sandbox::Sandbox;
use crate::scripts::Scripts;

/// The execd port inside every sandbox.
pub const EXECD_PORT: u16 = 44772;
const POLL_EVERY: Duration = Duration::from_millis(100);
/// Rounds of "patch the generation, read it back" before adoption gives up.
const ADOPT_ROUNDS: usize = 3;

pub struct OpenSandboxDriver {
    config: Arc<OpenSandboxConfig>,
    lifecycle: Lifecycle,
    http: Http,
    execd_token: Option<String>,
    scripts: Scripts,
    cluster: String,
    handles: Mutex<HashMap<WorkspaceId, OpenSandboxBackend>>,
}

impl std::fmt::Debug for OpenSandboxDriver {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("OpenSandboxDriver").field("api_url", &self.config.api_url).finish_non_exhaustive()
    }
}

fn unavailable(reason: String) -> WorkspaceError {
    WorkspaceError::BackendUnavailable { backend: BACKEND_NAME, reason }
}

impl OpenSandboxDriver {
    /// Validates the config and reads its credential files.
    pub fn new(config: OpenSandboxConfig) -> Result<Self> {
        config.validate()?;
        check_users(config.agent_user, config.secret_holder_user)?;
        let api_key = OpenSandboxConfig::read_secret(&config.api_key_file, "opensandbox API key")?;
        let execd_token = OpenSandboxConfig::read_secret(&config.execd_token_file, "execd access token")?;
        let credential = match &config.api_key_file {
            Some(path) => format!("from {}", path.display()),
            None => "(no API key file configured)".to_owned(),
        };
        let http = Http::new(config.request_timeout, config.retry_deadline, credential)?;
        let lifecycle = Lifecycle::new(http.clone(), &config.api_url, api_key);
        let scripts = Scripts::new(&config.workspace_dir, &config.state_dir);
        let cluster = labels::cluster_value(&config.cluster_prefix);
        Ok(Self { config: Arc::new(config), lifecycle, http, execd_token, scripts, cluster, handles: Mutex::default() })
    }

    pub fn config(&self) -> &OpenSandboxConfig {
        &self.config
    }

    fn handles(&self) -> std::sync::MutexGuard<'_, HashMap<WorkspaceId, OpenSandboxBackend>> {
        self.handles.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// This cluster's live sandboxes of a workspace, newest generation first.
    async fn find(&self, id: &WorkspaceId) -> Result<Vec<SandboxInfo>> {
        let filter = BTreeMap::from([
            (labels::CLUSTER.to_owned(), self.cluster.clone()),
            (labels::WORKSPACE.to_owned(), labels::workspace_value(id)),
        ]);
        let mut found: Vec<SandboxInfo> = self
            .lifecycle
            .list(&filter)
            .await?
            .into_iter()
            .filter(|info| !info.is_terminal() && labels::workspace_id(&info.metadata).as_ref() == Some(id))
            .collect();
        found.sort_by_key(|info| std::cmp::Reverse(labels::generation(&info.metadata)));
        Ok(found)
    }

    fn create_request(&self, id: &WorkspaceId, spec: &WorkspaceSpec, owner: &str, generation: u64) -> CreateRequest {
        let mut limits = BTreeMap::new();
        let cpu = if spec.cpu_millis > 0 { spec.cpu_millis } else { self.config.default_cpu_millis };
        if cpu > 0 {
            limits.insert("cpu".to_owned(), format!("{cpu}m"));
        }
        let memory = if spec.memory_bytes > 0 { spec.memory_bytes } else { self.config.default_memory_bytes };
        if memory > 0 {
            limits.insert("memory".to_owned(), format!("{}Mi", memory.div_ceil(1024 * 1024)));
        }
        CreateRequest {
            image: ImageSpec { uri: spec.image.clone().unwrap_or_else(|| self.config.image.clone()) },
            entrypoint: self.config.entrypoint.clone(),
            timeout: self.config.sandbox_timeout.map(|timeout| timeout.as_secs()),
            resource_limits: limits,
            env: BTreeMap::new(),
            metadata: labels::for_workspace(&self.config.cluster_prefix, id, owner, generation),
        }
    }

    /// Waits until the sandbox is `Running` (resuming it once when paused).
    async fn until_running(&self, sandbox_id: &str) -> Result<()> {
        let deadline = Instant::now() + self.config.retry_deadline;
        let mut resumed = false;
        loop {
            let Some(info) = self.lifecycle.get(sandbox_id).await? else {
                return Err(unavailable(format!("sandbox {sandbox_id} vanished")));
            };
            match info.state() {
                "Running" => return Ok(()),
                "Paused" if !resumed => {
                    self.lifecycle.transition(sandbox_id, "resume").await?;
                    resumed = true;
                }
                _ if info.is_terminal() => {
                    return Err(unavailable(format!("sandbox {sandbox_id} is {}", info.state())));
                }
                _ => {}
            }
            if Instant::now() >= deadline {
                return Err(WorkspaceError::Timeout {
                    operation: "waiting for the opensandbox sandbox to run",
                    millis: self.config.retry_deadline.as_millis() as u64,
                });
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
    }

    /// Records `generation` on an adopted sandbox and reads it back.
    async fn claim(&self, id: &WorkspaceId, info: &SandboxInfo, generation: u64) -> Result<()> {
        let mut held = labels::generation(&info.metadata);
        for _ in 0..ADOPT_ROUNDS {
            if held > generation {
                return Err(WorkspaceError::SandboxFenced { workspace_id: id.to_string(), held, asked: generation });
            }
            if held == generation {
                return Ok(());
            }
            let patch = BTreeMap::from([(labels::GENERATION.to_owned(), generation.to_string())]);
            self.lifecycle.patch_metadata(&info.id, &patch).await?;
            let Some(read_back) = self.lifecycle.get(&info.id).await? else {
                return Err(unavailable(format!("sandbox {} vanished during adoption", info.id)));
            };
            held = labels::generation(&read_back.metadata);
        }
        Err(WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!(
                "the generation of sandbox {} does not stick (read back {held}, wrote {generation})",
                info.id
            ),
        })
    }

    /// The execd of a running sandbox, answering.
    async fn connect(&self, sandbox_id: &str) -> Result<Execd> {
        let endpoint = self.lifecycle.endpoint(sandbox_id, EXECD_PORT).await?;
        let base = if endpoint.endpoint.starts_with("http://") || endpoint.endpoint.starts_with("https://") {
            endpoint.endpoint.clone()
        } else {
            format!("http://{}", endpoint.endpoint)
        };
        let execd = Execd::new(
            self.http.clone(),
            base.trim_end_matches('/').to_owned(),
            endpoint.headers,
            self.execd_token.clone(),
        );
        let deadline = Instant::now() + self.config.retry_deadline;
        loop {
            match execd.ping().await {
                Ok(()) => return Ok(execd),
                Err(error @ WorkspaceError::ProviderAuth { .. }) => return Err(error),
                Err(error) if Instant::now() >= deadline => return Err(error),
                Err(_) => tokio::time::sleep(POLL_EVERY).await,
            }
        }
    }

    async fn open(&self, id: &WorkspaceId, sandbox_id: &str, spec: &WorkspaceSpec) -> Result<OpenSandboxBackend> {
        let execd = self.connect(sandbox_id).await?;
        let setup = CommandRequest {
            command: self.scripts.setup(self.config.agent_user, self.config.secret_holder_user),
            timeout: Some(60_000),
            ..CommandRequest::default()
        };
        let collected = execd.run_collect(&setup).await?;
        if collected.ending != Ending::Exited(0) {
            return Err(script_error(
                "set up the workspace root",
                &self.config.workspace_dir,
                &collected.ending,
                &collected.stderr,
            ));
        }
        let backend = OpenSandboxBackend {
            sandbox: Arc::new(Sandbox {
                sandbox_id: sandbox_id.to_owned(),
                execd,
                scripts: self.scripts.clone(),
                workspace_dir: self.config.workspace_dir.clone(),
                state_dir: self.config.state_dir.clone(),
                agent_user: self.config.agent_user,
                secret_holder_user: self.config.secret_holder_user,
                env: spec.env.clone(),
            }),
        };
        self.handles().insert(id.clone(), backend.clone());
        Ok(backend)
    }

    async fn delete_all(&self, sandboxes: &[SandboxInfo]) -> Result<()> {
        for info in sandboxes {
            self.lifecycle.delete(&info.id).await?;
        }
        Ok(())
    }

    /// Provision, returning the concrete backend (tests and the bench use its sandbox id).
    pub async fn provision_sandbox(&self, context: ProvisionContext<'_>) -> Result<OpenSandboxBackend> {
        Ok(self.provision_made(context).await?.0)
    }

    /// Provision; also whether the sandbox was made now (`true`) or adopted with its files.
    async fn provision_made(&self, context: ProvisionContext<'_>) -> Result<(OpenSandboxBackend, bool)> {
        let (id, spec, placement) = (context.workspace_id, context.spec, context.placement);
        spec.validate()?;
        let found = self.find(id).await?;
        if let Some(newest) = found.first() {
            let held = labels::generation(&newest.metadata);
            if held > placement.generation {
                return Err(WorkspaceError::SandboxFenced {
                    workspace_id: id.to_string(),
                    held,
                    asked: placement.generation,
                });
            }
        }
        if placement.fresh || found.is_empty() {
            if !found.is_empty() {
                tracing::info!(ws_id = %id, count = found.len(), "deleting orphaned opensandbox sandboxes of a fresh workspace");
                self.delete_all(&found).await?;
            }
            self.handles().remove(id);
            let created =
                self.lifecycle.create(&self.create_request(id, spec, placement.owner, placement.generation)).await?;
            self.until_running(&created.id).await?;
            return Ok((self.open(id, &created.id, spec).await?, true));
        }
        // Duplicates (a crash between create and record) are orphans of the newest.
        let (adopted, extra) = found.split_first().expect("found is not empty");
        if !extra.is_empty() {
            tracing::warn!(ws_id = %id, count = extra.len(), "deleting duplicate opensandbox sandboxes");
            self.delete_all(extra).await?;
        }
        self.claim(id, adopted, placement.generation).await?;
        if let Some(existing) = self.handles().get(id).cloned()
            && existing.sandbox_id() == adopted.id
            && adopted.state() == "Running"
        {
            return Ok((existing, false));
        }
        self.until_running(&adopted.id).await?;
        Ok((self.open(id, &adopted.id, spec).await?, false))
    }
}

#[async_trait]
impl BackendDriver for OpenSandboxDriver {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    async fn provision(&self, context: ProvisionContext<'_>) -> Result<BackendRef> {
        Ok(Arc::new(self.provision_sandbox(context).await?))
    }

    /// Says whether an existing sandbox was adopted (`Some(true)`) or one made now: a
    /// workspace placed before whose sandbox the provider no longer has comes back empty,
    /// and its answer must say so.
    async fn provision_reporting(&self, context: ProvisionContext<'_>) -> Result<(BackendRef, Option<bool>)> {
        let (backend, made) = self.provision_made(context).await?;
        Ok((Arc::new(backend), Some(!made)))
    }

    /// Pauses the sandbox (files and processes kept, nothing runs).
    async fn release(&self, workspace_id: &WorkspaceId) -> Result<()> {
        self.handles().remove(workspace_id);
        for info in self.find(workspace_id).await? {
            if info.state() == "Running" {
                self.lifecycle.transition(&info.id, "pause").await?;
            }
        }
        Ok(())
    }

    async fn destroy(&self, workspace_id: &WorkspaceId) -> Result<()> {
        self.handles().remove(workspace_id);
        let found = self.find(workspace_id).await?;
        self.delete_all(&found).await
    }

    async fn is_running(&self, workspace_id: &WorkspaceId) -> bool {
        match self.find(workspace_id).await {
            Ok(found) => found.first().is_some_and(|info| info.state() == "Running"),
            Err(_) => false,
        }
    }

    fn portable(&self) -> bool {
        true
    }

    async fn forget(&self, workspace_id: &WorkspaceId) -> Result<()> {
        self.handles().remove(workspace_id);
        Ok(())
    }

    async fn list_labelled(&self) -> Result<Vec<LabelledSandbox>> {
        let filter = BTreeMap::from([(labels::CLUSTER.to_owned(), self.cluster.clone())]);
        Ok(self
            .lifecycle
            .list(&filter)
            .await?
            .into_iter()
            .filter(|info| !info.is_terminal())
            .map(|info| LabelledSandbox {
                workspace_id: labels::workspace_id(&info.metadata),
                generation: labels::generation(&info.metadata),
                created_at_ms: info.created_at.as_deref().map_or(0, rfc3339_ms),
                provider_id: info.id,
            })
            .collect())
    }

    /// Deletes the sandbox only if it still carries this cluster's label.
    async fn remove_labelled(&self, sandbox: &LabelledSandbox) -> Result<()> {
        let Some(info) = self.lifecycle.get(&sandbox.provider_id).await? else { return Ok(()) };
        if info.metadata.get(labels::CLUSTER) != Some(&self.cluster) {
            return Err(WorkspaceError::InvalidArgument(format!(
                "sandbox {} does not belong to this cluster",
                sandbox.provider_id
            )));
        }
        if let Some(id) = &sandbox.workspace_id {
            let mut handles = self.handles();
            if handles.get(id).is_some_and(|backend| backend.sandbox_id() == sandbox.provider_id) {
                handles.remove(id);
            }
        }
        self.lifecycle.delete(&sandbox.provider_id).await.map(|_| ())
    }
}
