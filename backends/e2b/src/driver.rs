//! The E2B `BackendDriver` of a gateway: sandboxes found by this cluster's metadata,
//! portable between gateways.
//!
//! Provision (at generation G): list the id's sandboxes in this cluster. With `fresh`,
//! any found is an orphan (a deleted workspace's, an unrecorded bind's): killed, and a new
//! sandbox is created. Otherwise the one found is adopted: connect (resumes it when
//! paused), read the generation it holds (the record file, else its metadata); newer than
//! G → `SandboxFenced`; older → record G. None found → create with the metadata at G, then
//! record G. Two sandboxes of one id (an earlier create whose answer was lost) are
//! reconciled: the newest-generation one is kept, the others killed.
//!
//! The read-then-record of an adoption is not atomic at E2B: it relies on the control
//! plane's bind lock letting one placement of an id provision at a time; the record is
//! what later calls of an older handle check (`E2bBackend::check_fence`, the spawn
//! wrapper), so a superseded gateway is refused once the newer one recorded its generation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use serde_json::json;

use berth_workspace::backend::BackendRef;
use berth_workspace::driver::{BackendDriver, LabelledSandbox, ProvisionContext};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;

use super::api::{Api, Listed, SandboxAccess};
use super::backend::E2bBackend;
use super::config::{BACKEND_NAME, E2bConfig};
use super::envd::Envd;
use super::generation;
use super::http::Retry;
use super::labels;

/// The oldest envd this backend speaks to: octet-stream uploads (0.5.7) and closing stdin.
const MIN_ENVD: (u64, u64, u64) = (0, 5, 7);

pub struct E2bDriver {
    config: Arc<E2bConfig>,
    api: Arc<Api>,
    client: reqwest::Client,
    handles: Mutex<HashMap<String, Arc<E2bBackend>>>,
    /// One lifecycle change per workspace id at a time in this gateway.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

fn version(text: &str) -> Option<(u64, u64, u64)> {
    let mut parts = text.trim_start_matches('v').split('.').map(|part| part.parse::<u64>().ok());
    Some((parts.next()??, parts.next().flatten().unwrap_or(0), parts.next().flatten().unwrap_or(0)))
}

impl E2bDriver {
    /// Reads the API key file and builds the HTTP client.
    pub fn new(config: E2bConfig) -> Result<Self> {
        let key = config.load_api_key()?;
        // The tree's one crypto provider; an error means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .build()
            .map_err(|error| WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!("http client: {error}"),
            })?;
        let api = Arc::new(Api::new(
            client.clone(),
            &config.api_url,
            key,
            config.api_key_file.display().to_string(),
            config.request_timeout,
            config.retry_deadline,
            config.list_page_size,
        ));
        Ok(Self {
            config: Arc::new(config),
            api,
            client,
            handles: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
        })
    }

    fn lock_of(&self, id: &WorkspaceId) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|poison| poison.into_inner());
        // Forget locks nobody holds, so the map stays as small as the ids in flight.
        locks.retain(|_, lock| Arc::strong_count(lock) > 1);
        locks.entry(id.as_str().to_owned()).or_default().clone()
    }

    fn cached(&self, id: &WorkspaceId) -> Option<Arc<E2bBackend>> {
        self.handles.lock().unwrap_or_else(|poison| poison.into_inner()).get(id.as_str()).cloned()
    }

    fn drop_handle(&self, id: &WorkspaceId) {
        self.handles.lock().unwrap_or_else(|poison| poison.into_inner()).remove(id.as_str());
    }

    async fn lookup(&self, id: &WorkspaceId) -> Result<Vec<Listed>> {
        self.api.list(&labels::of_workspace(id, &self.config.cluster_prefix)).await
    }

    fn envd(&self, access: &SandboxAccess) -> Result<Envd> {
        let version_ok = version(&access.envd_version).is_some_and(|found| found >= MIN_ENVD);
        if !version_ok {
            return Err(WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!(
                    "sandbox {} runs envd {:?}; this backend needs {}.{}.{} or newer (rebuild the template)",
                    access.sandbox_id, access.envd_version, MIN_ENVD.0, MIN_ENVD.1, MIN_ENVD.2
                ),
            });
        }
        Ok(Envd::new(
            self.client.clone(),
            self.config.envd_url(&access.sandbox_id, access.domain.as_deref()),
            access.sandbox_id.clone(),
            access.envd_access_token.clone(),
            self.config.request_timeout,
            self.config.retry_deadline,
        ))
    }

    /// Adopts a found sandbox at `generation`: `None` when it vanished meanwhile.
    async fn adopt(&self, id: &WorkspaceId, listed: &Listed, generation: u64) -> Result<Option<Envd>> {
        let Some(access) = self.api.connect(&listed.sandbox_id, self.config.sandbox_timeout).await? else {
            return Ok(None);
        };
        let envd = self.envd(&access)?;
        let file = self.config.generation_file();
        let held = generation::read(&envd, &file).await?.unwrap_or_else(|| labels::generation(&listed.metadata()));
        if held > generation {
            return Err(WorkspaceError::SandboxFenced {
                workspace_id: id.as_str().to_owned(),
                held,
                asked: generation,
            });
        }
        if held < generation {
            generation::write(&envd, &file, generation).await?;
        }
        Ok(Some(envd))
    }

    async fn create(&self, context: &ProvisionContext<'_>) -> Result<Envd> {
        let generation = context.placement.generation;
        let metadata =
            labels::for_create(context.workspace_id, generation, context.placement.owner, &self.config.cluster_prefix);
        let access = self
            .api
            .create(
                &self.config.template,
                self.config.sandbox_timeout,
                &metadata,
                &context.spec.env,
                context.spec.network,
            )
            .await?;
        let envd = match self.envd(&access) {
            Ok(envd) => envd,
            Err(error) => {
                let _ = self.api.kill(&access.sandbox_id).await;
                return Err(error);
            }
        };
        generation::write(&envd, &self.config.generation_file(), generation).await?;
        Ok(envd)
    }
}

#[async_trait]
impl BackendDriver for E2bDriver {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    async fn provision(&self, context: ProvisionContext<'_>) -> Result<BackendRef> {
        Ok(self.provision_reporting(context).await?.0)
    }

    async fn provision_reporting(&self, context: ProvisionContext<'_>) -> Result<(BackendRef, Option<bool>)> {
        let id = context.workspace_id;
        let lock = self.lock_of(id);
        let _serialised = lock.lock().await;
        let generation = context.placement.generation;
        let mut found = self.lookup(id).await?;
        if context.placement.fresh {
            for orphan in &found {
                tracing::info!(ws_id = %id, sandbox = orphan.sandbox_id, "killing an orphan e2b sandbox of a fresh placement");
                self.api.kill(&orphan.sandbox_id).await?;
            }
            found.clear();
        }
        // Newest generation first; duplicates (lost create answers) are killed.
        found.sort_by_key(|listed| std::cmp::Reverse((labels::generation(&listed.metadata()), listed.started_at_ms())));
        for duplicate in found.iter().skip(1) {
            tracing::warn!(ws_id = %id, sandbox = duplicate.sandbox_id, "killing a duplicate e2b sandbox");
            self.api.kill(&duplicate.sandbox_id).await?;
        }
        let adopted = match found.first() {
            Some(listed) => self.adopt(id, listed, generation).await?,
            None => None,
        };
        let was_adopted = adopted.is_some();
        let envd = match adopted {
            Some(envd) => envd,
            None => self.create(&context).await?,
        };
        let root = self.config.workspace_root.clone();
        match envd.unary("filesystem.Filesystem/MakeDir", &json!({"path": root}), Retry::Idempotent).await {
            Ok(_) => {}
            Err(error) if error.code() == Some("already_exists") => {}
            Err(error) => return Err(error.into_error("create the workspace root", &root)),
        }
        let backend = Arc::new(E2bBackend::new(
            envd,
            self.api.clone(),
            root,
            self.config.generation_file(),
            generation,
            id.as_str().to_owned(),
            self.config.sandbox_timeout,
        ));
        self.handles
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .insert(id.as_str().to_owned(), backend.clone());
        Ok((backend, Some(was_adopted)))
    }

    async fn release(&self, workspace_id: &WorkspaceId) -> Result<()> {
        let lock = self.lock_of(workspace_id);
        let _serialised = lock.lock().await;
        self.drop_handle(workspace_id);
        for listed in self.lookup(workspace_id).await? {
            if listed.state != "paused" {
                self.api.pause(&listed.sandbox_id).await?;
            }
        }
        Ok(())
    }

    async fn destroy(&self, workspace_id: &WorkspaceId) -> Result<()> {
        let lock = self.lock_of(workspace_id);
        let _serialised = lock.lock().await;
        self.drop_handle(workspace_id);
        for listed in self.lookup(workspace_id).await? {
            self.api.kill(&listed.sandbox_id).await?;
        }
        Ok(())
    }

    async fn is_running(&self, workspace_id: &WorkspaceId) -> bool {
        match self.cached(workspace_id) {
            Some(handle) => matches!(self.api.state(handle.sandbox_id()).await, Ok(Some(state)) if state == "running"),
            // A restarted gateway knows no handle: ask by metadata.
            None => {
                self.lookup(workspace_id).await.is_ok_and(|found| found.iter().any(|listed| listed.state == "running"))
            }
        }
    }

    fn portable(&self) -> bool {
        true
    }

    async fn forget(&self, workspace_id: &WorkspaceId) -> Result<()> {
        self.drop_handle(workspace_id);
        Ok(())
    }

    async fn list_labelled(&self) -> Result<Vec<LabelledSandbox>> {
        let listed = self.api.list(&labels::of_cluster(&self.config.cluster_prefix)).await?;
        Ok(listed
            .iter()
            .map(|listed| labels::labelled(&listed.sandbox_id, &listed.metadata(), listed.started_at_ms()))
            .collect())
    }

    async fn remove_labelled(&self, sandbox: &LabelledSandbox) -> Result<()> {
        self.api.kill(&sandbox.provider_id).await?;
        Ok(())
    }
}
