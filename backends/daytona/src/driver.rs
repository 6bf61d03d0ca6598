//! The Daytona `BackendDriver` of a gateway: sandboxes found by this cluster's labels,
//! portable between gateways.
//!
//! Provision (at generation G): list the id's sandboxes in this cluster. With `fresh`,
//! any found is an orphan (a deleted workspace's, an unrecorded bind's): deleted, and a
//! new sandbox is created. Otherwise the one found is adopted: started when stopped, then
//! `generation.sh` compares the generation recorded inside it (and its labels' one) with G:
//! newer → `SandboxFenced`; otherwise G is recorded, and the labels are replaced with G and
//! the new owner. None found → create with the labels at G, then record G. Two sandboxes of
//! one id (an earlier create whose answer was lost) are reconciled: the newest-generation
//! one is kept, the others deleted.
//!
//! The compare-and-record runs in one toolbox call inside the sandbox; between gateways it
//! relies on the control plane's bind lock letting one placement of an id provision at a
//! time. The record is what later calls of an older handle check (spawn and write scripts),
//! so a superseded gateway is refused once the newer one recorded its generation.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;

use berth_workspace::backend::BackendRef;
use berth_workspace::driver::{BackendDriver, LabelledSandbox, ProvisionContext};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;

use super::api::{Api, SandboxInfo};
use super::backend::DaytonaBackend;
use super::config::{BACKEND_NAME, DaytonaConfig, generation_file, valid_root};
use super::http::Retry;
use super::labels;
use super::process::INTERNAL_TIMEOUT;
use super::scripts::{self, command_line};
use super::toolbox::Toolbox;

pub struct DaytonaDriver {
    config: Arc<DaytonaConfig>,
    api: Arc<Api>,
    client: reqwest::Client,
    handles: Mutex<HashMap<String, Arc<DaytonaBackend>>>,
    /// One lifecycle change per workspace id at a time in this gateway.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

impl DaytonaDriver {
    /// Reads the API key file and builds the HTTP client.
    pub fn new(config: DaytonaConfig) -> Result<Self> {
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
            config.organization_id.clone(),
            config.api_key_file.display().to_string(),
            config.request_timeout,
            config.retry_deadline,
            config.start_timeout,
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

    fn cached(&self, id: &WorkspaceId) -> Option<Arc<DaytonaBackend>> {
        self.handles.lock().unwrap_or_else(|poison| poison.into_inner()).get(id.as_str()).cloned()
    }

    fn drop_handle(&self, id: &WorkspaceId) {
        self.handles.lock().unwrap_or_else(|poison| poison.into_inner()).remove(id.as_str());
    }

    async fn lookup(&self, id: &WorkspaceId) -> Result<Vec<SandboxInfo>> {
        self.api.list(&labels::of_workspace(id, &self.config.cluster_prefix)).await
    }

    async fn toolbox(&self, sandbox: &SandboxInfo) -> Result<Toolbox> {
        let proxy = if sandbox.toolbox_proxy_url.is_empty() {
            self.api.toolbox_proxy_url(&sandbox.id).await?
        } else {
            sandbox.toolbox_proxy_url.clone()
        };
        if !(proxy.starts_with("http://") || proxy.starts_with("https://")) {
            return Err(WorkspaceError::Backend {
                backend: BACKEND_NAME,
                message: format!("sandbox {} has the toolbox url {proxy:?}", sandbox.id),
            });
        }
        Ok(Toolbox::new(
            self.client.clone(),
            &proxy,
            &sandbox.id,
            self.api.key().to_owned(),
            self.api.organization_id().map(str::to_owned),
            self.api.credential().to_owned(),
            self.config.request_timeout,
            self.config.retry_deadline,
        ))
    }

    /// The workspace root: configured, or `<home>/workspace`.
    async fn root(&self, toolbox: &Toolbox) -> Result<String> {
        let root = match &self.config.workspace_root {
            Some(root) => root.clone(),
            None => format!("{}/workspace", toolbox.user_home_dir().await?.trim_end_matches('/')),
        };
        if !valid_root(&root) {
            return Err(WorkspaceError::Backend {
                backend: BACKEND_NAME,
                message: format!("the workspace root {root:?} in sandbox {} is not a clean path", toolbox.sandbox_id()),
            });
        }
        Ok(root)
    }

    /// Records `generation` in the sandbox (refused when it holds a newer one) and makes
    /// the root.
    async fn record(&self, id: &WorkspaceId, toolbox: &Toolbox, root: &str, generation: u64) -> Result<()> {
        let file = generation_file(root);
        let generation_text = generation.to_string();
        let line = command_line(scripts::GENERATION, "berth-generation", &[&file, &generation_text, root]);
        let (code, output) = toolbox.execute(&line, INTERNAL_TIMEOUT, Retry::Idempotent).await?;
        let last = output.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("").trim();
        if let Some(held) = last.strip_prefix("berth-fenced ") {
            return Err(WorkspaceError::SandboxFenced {
                workspace_id: id.as_str().to_owned(),
                held: held.parse().unwrap_or(u64::MAX),
                asked: generation,
            });
        }
        if code != 0 || last != "berth-ok" {
            return Err(WorkspaceError::Backend {
                backend: BACKEND_NAME,
                message: format!("record the generation in sandbox {}: {}", toolbox.sandbox_id(), output.trim()),
            });
        }
        Ok(())
    }

    /// Adopts a found sandbox at `generation`: `None` when it vanished meanwhile.
    async fn adopt(&self, context: &ProvisionContext<'_>, found: &SandboxInfo) -> Result<Option<(Toolbox, String)>> {
        let id = context.workspace_id;
        let generation = context.placement.generation;
        let held = labels::generation(&found.labels);
        if held > generation {
            return Err(WorkspaceError::SandboxFenced {
                workspace_id: id.as_str().to_owned(),
                held,
                asked: generation,
            });
        }
        let sandbox = if found.state() == "started" {
            found.clone()
        } else {
            match self.api.start(&found.id).await? {
                Some(sandbox) => sandbox,
                None => return Ok(None),
            }
        };
        let toolbox = self.toolbox(&sandbox).await?;
        let root = self.root(&toolbox).await?;
        self.record(id, &toolbox, &root, generation).await?;
        if held < generation || found.labels.get(labels::OWNER).map(String::as_str) != Some(context.placement.owner) {
            let mut replaced = found.labels.clone();
            replaced.extend(labels::of_placement(id, generation, context.placement.owner, &self.config.cluster_prefix));
            self.api.replace_labels(&found.id, &replaced).await?;
        }
        Ok(Some((toolbox, root)))
    }

    async fn create(&self, context: &ProvisionContext<'_>) -> Result<(Toolbox, String)> {
        let generation = context.placement.generation;
        let labels = labels::of_placement(
            context.workspace_id,
            generation,
            context.placement.owner,
            &self.config.cluster_prefix,
        );
        let sandbox = self
            .api
            .create(
                self.config.snapshot.as_deref(),
                &labels,
                &context.spec.env,
                self.config.auto_stop_minutes,
                context.spec.network,
            )
            .await?;
        let prepared = async {
            let toolbox = self.toolbox(&sandbox).await?;
            let root = self.root(&toolbox).await?;
            self.record(context.workspace_id, &toolbox, &root, generation).await?;
            Ok::<_, WorkspaceError>((toolbox, root))
        };
        match prepared.await {
            Ok(prepared) => Ok(prepared),
            Err(error) => {
                let _ = self.api.delete(&sandbox.id).await;
                Err(error)
            }
        }
    }
}

#[async_trait]
impl BackendDriver for DaytonaDriver {
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
        let mut found = self.lookup(id).await?;
        if context.placement.fresh {
            for orphan in &found {
                tracing::info!(ws_id = %id, sandbox = orphan.id, "deleting an orphan daytona sandbox of a fresh placement");
                self.api.delete(&orphan.id).await?;
            }
            found.clear();
        }
        // Newest generation first; duplicates (lost create answers) are deleted.
        found.sort_by_key(|sandbox| std::cmp::Reverse((labels::generation(&sandbox.labels), sandbox.created_at_ms())));
        for duplicate in found.iter().skip(1) {
            tracing::warn!(ws_id = %id, sandbox = duplicate.id, "deleting a duplicate daytona sandbox");
            self.api.delete(&duplicate.id).await?;
        }
        let adopted = match found.first() {
            Some(sandbox) => self.adopt(&context, sandbox).await?,
            None => None,
        };
        let was_adopted = adopted.is_some();
        let (toolbox, root) = match adopted {
            Some(adopted) => adopted,
            None => self.create(&context).await?,
        };
        let backend = Arc::new(DaytonaBackend::new(
            toolbox,
            root.clone(),
            generation_file(&root),
            context.placement.generation,
            id.as_str().to_owned(),
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
        for sandbox in self.lookup(workspace_id).await? {
            if sandbox.state() != "stopped" {
                self.api.stop(&sandbox.id).await?;
            }
        }
        Ok(())
    }

    async fn destroy(&self, workspace_id: &WorkspaceId) -> Result<()> {
        let lock = self.lock_of(workspace_id);
        let _serialised = lock.lock().await;
        self.drop_handle(workspace_id);
        for sandbox in self.lookup(workspace_id).await? {
            self.api.delete(&sandbox.id).await?;
        }
        Ok(())
    }

    async fn is_running(&self, workspace_id: &WorkspaceId) -> bool {
        match self.cached(workspace_id) {
            Some(handle) => {
                matches!(self.api.get(handle.sandbox_id()).await, Ok(Some(sandbox)) if sandbox.state() == "started")
            }
            // A restarted gateway knows no handle: ask by labels.
            None => self
                .lookup(workspace_id)
                .await
                .is_ok_and(|found| found.iter().any(|sandbox| sandbox.state() == "started")),
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
            .map(|sandbox| labels::labelled(&sandbox.id, &sandbox.labels, sandbox.created_at_ms()))
            .collect())
    }

    async fn remove_labelled(&self, sandbox: &LabelledSandbox) -> Result<()> {
        self.api.delete(&sandbox.provider_id).await?;
        Ok(())
    }
}
