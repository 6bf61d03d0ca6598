//! The lifecycle of workspaces as a PVC (the files) and a Pod (the live runtime) each,
//! found by this cluster's labels (never by a table of this process): a gateway that
//! restarts, or another gateway, finds the same objects.
//!
//! Provision: this cluster's PVCs of the workspace →
//! - one labelled with a newer generation than the placement's: `SandboxFenced`;
//! - found but the placement is `fresh`: an orphan (a deleted workspace's, an unrecorded
//!   bind's): it and its Pods are deleted, and a new PVC made;
//! - found: adopted — its generation is written with its `resourceVersion` as the compare
//!   (a 409 re-reads it; a newer one read means a newer gateway got there first:
//!   `SandboxFenced`);
//! - none: created. Its name is a hash of cluster and id, so concurrent creates make one.
//!
//! Then the Pod of this generation (`…-g<generation>`) is found or created on the PVC and
//! awaited; Pods of older generations are deleted first (a ReadWriteOnce volume follows
//! its newest Pod). Before the handle is given out the PVC is read once more: a newer
//! generation there means this gateway lost a race, its Pod is deleted and it is fenced.
//!
//! Release (idle) deletes the Pod and keeps the PVC; the next provision (wake) makes a new
//! Pod on it. Destroy deletes every Pod and PVC labelled with the id.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use tokio::sync::OnceCell;
use tokio::time::Instant;

use berth_workspace::backend::BackendRef;
use berth_workspace::driver::{BackendDriver, LabelledSandbox, ProvisionContext};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;

use crate::api::{Created, Kube};
use crate::backend::{KubernetesBackend, PodHandle};
use crate::config::{BACKEND_NAME, KubernetesConfig, STATE_DIR};
use crate::labels;
use crate::manifests::{self, HOLDER_CONTAINER, WORKSPACE_CONTAINER};
use crate::remote::{ExecError, Target};
use crate::scripts::Scripts;

const POLL_EVERY: Duration = Duration::from_millis(100);
/// Rounds of "write the generation, re-read on conflict" before adoption gives up.
const ADOPT_ROUNDS: usize = 5;
/// Rounds of "create, find it terminating, wait" before provisioning gives up.
const CREATE_ROUNDS: usize = 5;

pub struct KubernetesDriver {
    config: Arc<KubernetesConfig>,
    /// Connected on first use (reading a kubeconfig may run its auth plugin).
    kube: OnceCell<Kube>,
    scripts: Scripts,
    handles: Mutex<HashMap<WorkspaceId, KubernetesBackend>>,
}

impl std::fmt::Debug for KubernetesDriver {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("KubernetesDriver")
            .field("namespace", &self.config.namespace)
            .field("kubeconfig", &self.config.kubeconfig)
            .finish_non_exhaustive()
    }
}

fn unavailable(reason: String) -> WorkspaceError {
    WorkspaceError::BackendUnavailable { backend: BACKEND_NAME, reason }
}

fn pvc_generation(pvc: &PersistentVolumeClaim) -> u64 {
    labels::generation(pvc.metadata.labels.as_ref(), pvc.metadata.annotations.as_ref())
}

fn pod_generation(pod: &Pod) -> u64 {
    labels::generation(pod.metadata.labels.as_ref(), pod.metadata.annotations.as_ref())
}

fn created_ms(time: Option<&k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>) -> i64 {
    time.map_or(0, |time| time.0.as_millisecond())
}

impl KubernetesDriver {
    /// Validates the config and checks its credential file is readable; connects lazily.
    pub fn new(config: KubernetesConfig) -> Result<Self> {
        config.validate()?;
        if let Some(path) = &config.kubeconfig {
            kube::config::Kubeconfig::read_from(path)
                .map_err(|error| unavailable(format!("cannot read the kubeconfig {}: {error}", path.display())))?;
        }
        let scripts = Scripts::new(&config.workspace_dir, STATE_DIR);
        Ok(Self { config: Arc::new(config), kube: OnceCell::new(), scripts, handles: Mutex::default() })
    }

    /// [`new`](Self::new), and connects now.
    pub async fn connect(config: KubernetesConfig) -> Result<Self> {
        let driver = Self::new(config)?;
        driver.kube().await?;
        Ok(driver)
    }

    pub fn config(&self) -> &KubernetesConfig {
        &self.config
    }

    async fn kube(&self) -> Result<&Kube> {
        self.kube.get_or_try_init(|| Kube::connect(&self.config)).await
    }

    fn handles(&self) -> std::sync::MutexGuard<'_, HashMap<WorkspaceId, KubernetesBackend>> {
        self.handles.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn names_workspace(
        &self,
        id: &WorkspaceId,
        metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> bool {
        labels::workspace_id(metadata.labels.as_ref(), metadata.annotations.as_ref()).as_ref() == Some(id)
    }

    /// This cluster's PVCs of a workspace, newest generation first.
    async fn find_pvcs(&self, id: &WorkspaceId) -> Result<Vec<PersistentVolumeClaim>> {
        let kube = self.kube().await?;
        let mut found: Vec<PersistentVolumeClaim> = kube
            .list_pvcs(&labels::selector(&self.config.cluster_prefix, id))
            .await?
            .into_iter()
            .filter(|pvc| self.names_workspace(id, &pvc.metadata))
            .collect();
        found.sort_by_key(|pvc| std::cmp::Reverse(pvc_generation(pvc)));
        Ok(found)
    }

    async fn find_pods(&self, id: &WorkspaceId) -> Result<Vec<Pod>> {
        let kube = self.kube().await?;
        Ok(kube
            .list_pods(&labels::selector(&self.config.cluster_prefix, id))
            .await?
            .into_iter()
            .filter(|pod| self.names_workspace(id, &pod.metadata))
            .collect())
    }

    async fn delete_pods(&self, pods: &[Pod]) -> Result<()> {
        let kube = self.kube().await?;
        for pod in pods {
            if let Some(name) = &pod.metadata.name {
                kube.delete_pod(name).await?;
            }
        }
        Ok(())
    }

    /// Deletes a workspace's Pods and PVCs and waits until the PVC's name is free.
    async fn delete_everything(&self, id: &WorkspaceId) -> Result<()> {
        let kube = self.kube().await?;
        self.delete_pods(&self.find_pods(id).await?).await?;
        for pvc in self.find_pvcs(id).await? {
            if let Some(name) = &pvc.metadata.name {
                kube.delete_pvc(name).await?;
            }
        }
        Ok(())
    }

    async fn wait_gone_pvc(&self, name: &str) -> Result<()> {
        let kube = self.kube().await?;
        let deadline = Instant::now() + self.config.retry_deadline;
        while kube.get_pvc(name).await?.is_some() {
            if Instant::now() >= deadline {
                return Err(WorkspaceError::Timeout {
                    operation: "waiting for a deleted PVC to go",
                    millis: self.config.retry_deadline.as_millis() as u64,
                });
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
        Ok(())
    }

    async fn wait_gone_pod(&self, name: &str) -> Result<()> {
        let kube = self.kube().await?;
        let deadline = Instant::now() + self.config.retry_deadline;
        while kube.get_pod(name).await?.is_some() {
            if Instant::now() >= deadline {
                return Err(WorkspaceError::Timeout {
                    operation: "waiting for a deleted pod to go",
                    millis: self.config.retry_deadline.as_millis() as u64,
                });
            }
            tokio::time::sleep(POLL_EVERY).await;
        }
        Ok(())
    }

    /// Writes `generation` on an adopted PVC (compare: its `resourceVersion`).
    async fn claim(
        &self,
        id: &WorkspaceId,
        mut pvc: PersistentVolumeClaim,
        generation: u64,
    ) -> Result<PersistentVolumeClaim> {
        let kube = self.kube().await?;
        let name = pvc.metadata.name.clone().unwrap_or_default();
        for _ in 0..ADOPT_ROUNDS {
            let held = pvc_generation(&pvc);
            if held > generation {
                return Err(WorkspaceError::SandboxFenced { workspace_id: id.to_string(), held, asked: generation });
            }
            if held == generation {
                return Ok(pvc);
            }
            let mut updated = pvc.clone();
            let value = generation.to_string();
            updated.metadata.labels.get_or_insert_default().insert(labels::GENERATION.to_owned(), value.clone());
            updated.metadata.annotations.get_or_insert_default().insert(labels::GENERATION.to_owned(), value);
            match kube.replace_pvc(&updated).await? {
                Some(written) => return Ok(written),
                None => match kube.get_pvc(&name).await? {
                    Some(current) => pvc = current,
                    None => return Err(unavailable(format!("PVC {name} vanished during adoption"))),
                },
            }
        }
        Err(WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("the generation of PVC {name} did not stick after {ADOPT_ROUNDS} conflicts"),
        })
    }

    /// The workspace's PVC at `generation`; `true` when it was made now (empty).
    async fn volume(&self, context: &ProvisionContext<'_>) -> Result<(PersistentVolumeClaim, bool)> {
        let (id, placement) = (context.workspace_id, context.placement);
        let kube = self.kube().await?;
        let name = labels::volume_name(&self.config.cluster_prefix, id);
        let mut orphans_cleared = false;
        for _ in 0..CREATE_ROUNDS {
            let found = self.find_pvcs(id).await?;
            if let Some(newest) = found.first() {
                let held = pvc_generation(newest);
                if held > placement.generation {
                    return Err(WorkspaceError::SandboxFenced {
                        workspace_id: id.to_string(),
                        held,
                        asked: placement.generation,
                    });
                }
            }
            if placement.fresh && !found.is_empty() && !orphans_cleared {
                tracing::info!(ws_id = %id, "deleting the orphaned PVC and pods of a fresh workspace");
                self.delete_everything(id).await?;
                self.wait_gone_pvc(&name).await?;
                orphans_cleared = true;
                continue;
            }
            match found.into_iter().find(|pvc| pvc.metadata.name.as_deref() == Some(name.as_str())) {
                Some(pvc) if pvc.metadata.deletion_timestamp.is_some() => {
                    // Being destroyed: the workspace starts over on a new PVC.
                    self.delete_pods(&self.find_pods(id).await?).await?;
                    self.wait_gone_pvc(&name).await?;
                }
                Some(pvc) => return Ok((self.claim(id, pvc, placement.generation).await?, false)),
                None => {
                    let (labels, annotations) =
                        labels::for_workspace(&self.config.cluster_prefix, id, placement.owner, placement.generation);
                    let manifest = manifests::pvc(&self.config, &name, &labels, &annotations)?;
                    match kube.create_pvc(&manifest).await? {
                        Created::New(pvc) => return Ok((pvc, true)),
                        // Another gateway made it a moment ago: adopt it on the next round.
                        Created::Exists => {}
                    }
                }
            }
        }
        Err(WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("PVC {name} kept changing under provisioning"),
        })
    }

    /// The Pod of this generation, ready.
    async fn running_pod(&self, context: &ProvisionContext<'_>) -> Result<Pod> {
        let (id, placement) = (context.workspace_id, context.placement);
        let kube = self.kube().await?;
        let name = labels::pod_name(&self.config.cluster_prefix, id, placement.generation);
        // Older generations' Pods go first (and any stray of another name).
        let stale: Vec<Pod> = self
            .find_pods(id)
            .await?
            .into_iter()
            .filter(|pod| {
                pod.metadata.name.as_deref() != Some(name.as_str()) || pod_generation(pod) < placement.generation
            })
            .collect();
        if !stale.is_empty() {
            self.delete_pods(&stale).await?;
        }
        let claim = labels::volume_name(&self.config.cluster_prefix, id);
        for _ in 0..CREATE_ROUNDS {
            let pod = match kube.get_pod(&name).await? {
                Some(pod) if pod.metadata.deletion_timestamp.is_some() => {
                    self.wait_gone_pod(&name).await?;
                    continue;
                }
                Some(pod) => pod,
                None => {
                    let (labels, annotations) =
                        labels::for_workspace(&self.config.cluster_prefix, id, placement.owner, placement.generation);
                    let manifest = manifests::pod(
                        &self.config,
                        &name,
                        &claim,
                        &self.config.workspace_dir,
                        context.spec,
                        &labels,
                        &annotations,
                    )?;
                    match kube.create_pod(&manifest).await? {
                        Created::New(pod) => pod,
                        Created::Exists => continue,
                    }
                }
            };
            return self.until_ready(pod).await;
        }
        Err(WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("pod {name} kept changing") })
    }

    async fn until_ready(&self, mut pod: Pod) -> Result<Pod> {
        let kube = self.kube().await?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        let deadline = Instant::now() + self.config.pod_ready_timeout;
        loop {
            if manifests::is_ready(&pod) {
                return Ok(pod);
            }
            if Instant::now() >= deadline {
                return Err(unavailable(format!(
                    "pod {name} was not ready in {:?}: {}",
                    self.config.pod_ready_timeout,
                    manifests::waiting_reason(&pod)
                )));
            }
            tokio::time::sleep(POLL_EVERY).await;
            pod = match kube.get_pod(&name).await? {
                Some(pod) => pod,
                None => return Err(unavailable(format!("pod {name} vanished while starting"))),
            };
        }
    }

    fn handle(&self, id: &WorkspaceId, kube: &Kube, pod: &str, generation: u64) -> KubernetesBackend {
        let target = |container: &str| Target {
            pods: kube.pods.clone(),
            pod: pod.to_owned(),
            container: container.to_owned(),
            credential: kube.credential.clone(),
        };
        KubernetesBackend {
            pod: Arc::new(PodHandle {
                workspace_id: id.to_string(),
                pod: pod.to_owned(),
                volume: labels::volume_name(&self.config.cluster_prefix, id),
                generation,
                kube: kube.clone(),
                agent: target(WORKSPACE_CONTAINER),
                holder: target(HOLDER_CONTAINER),
                scripts: self.scripts.clone(),
                workspace_dir: self.config.workspace_dir.clone(),
                state_dir: STATE_DIR.to_owned(),
            }),
        }
    }

    /// Provision, returning the concrete backend and whether its PVC was made now.
    pub async fn provision_pod(&self, context: ProvisionContext<'_>) -> Result<(KubernetesBackend, bool)> {
        let (id, placement) = (context.workspace_id, context.placement);
        context.spec.validate()?;
        let kube = self.kube().await?.clone();
        let (_volume, created) = self.volume(&context).await?;
        let pod = self.running_pod(&context).await?;
        let pod_name = pod.metadata.name.clone().unwrap_or_default();
        // Lost a race to a newer placement between the claim and now?
        let volume_name = labels::volume_name(&self.config.cluster_prefix, id);
        if let Some(current) = kube.get_pvc(&volume_name).await? {
            let held = pvc_generation(&current);
            if held > placement.generation {
                kube.delete_pod(&pod_name).await?;
                return Err(WorkspaceError::SandboxFenced {
                    workspace_id: id.to_string(),
                    held,
                    asked: placement.generation,
                });
            }
        }
        let backend = self.handle(id, &kube, &pod_name, placement.generation);
        match backend.pod.agent.run(self.scripts.setup(), None).await {
            Ok(collected) if collected.code() == Some(0) => {}
            Ok(collected) => {
                return Err(unavailable(format!(
                    "the workspace root {} is not usable: {}",
                    self.config.workspace_dir,
                    collected.stderr.trim()
                )));
            }
            Err(ExecError::PodGone) => return Err(unavailable(format!("pod {pod_name} vanished while starting"))),
            Err(ExecError::Other(error)) => return Err(error),
        }
        self.handles().insert(id.clone(), backend.clone());
        Ok((backend, created))
    }

    /// `berth.workspace.id`-labelled objects of this cluster, as the janitor sees them.
    async fn labelled(&self) -> Result<Vec<LabelledSandbox>> {
        let kube = self.kube().await?;
        let selector = labels::cluster_selector(&self.config.cluster_prefix);
        let pvcs = kube.list_pvcs(&selector).await?;
        let mut out: Vec<LabelledSandbox> = pvcs
            .iter()
            .map(|pvc| LabelledSandbox {
                provider_id: format!("pvc/{}", pvc.metadata.name.clone().unwrap_or_default()),
                workspace_id: labels::workspace_id(pvc.metadata.labels.as_ref(), pvc.metadata.annotations.as_ref()),
                generation: pvc_generation(pvc),
                created_at_ms: created_ms(pvc.metadata.creation_timestamp.as_ref()),
            })
            .collect();
        let claims: Vec<String> = pvcs.iter().filter_map(|pvc| pvc.metadata.name.clone()).collect();
        for pod in kube.list_pods(&selector).await? {
            let on_listed_claim = claims_of(&pod).iter().any(|claim| claims.contains(claim));
            if !on_listed_claim {
                out.push(LabelledSandbox {
                    provider_id: format!("pod/{}", pod.metadata.name.clone().unwrap_or_default()),
                    workspace_id: labels::workspace_id(pod.metadata.labels.as_ref(), pod.metadata.annotations.as_ref()),
                    generation: pod_generation(&pod),
                    created_at_ms: created_ms(pod.metadata.creation_timestamp.as_ref()),
                });
            }
        }
        Ok(out)
    }

    fn ours(&self, metadata: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> bool {
        metadata.labels.as_ref().and_then(|labels| labels.get(labels::CLUSTER))
            == Some(&labels::cluster_value(&self.config.cluster_prefix))
    }
}

fn claims_of(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|spec| spec.volumes.iter().flatten())
        .filter_map(|volume| Some(volume.persistent_volume_claim.as_ref()?.claim_name.clone()))
        .collect()
}

#[async_trait]
impl BackendDriver for KubernetesDriver {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    async fn provision(&self, context: ProvisionContext<'_>) -> Result<BackendRef> {
        Ok(Arc::new(self.provision_pod(context).await?.0))
    }

    async fn provision_reporting(&self, context: ProvisionContext<'_>) -> Result<(BackendRef, Option<bool>)> {
        let (backend, created) = self.provision_pod(context).await?;
        Ok((Arc::new(backend), Some(!created)))
    }

    /// Deletes the Pod, keeps the PVC (the files).
    async fn release(&self, workspace_id: &WorkspaceId) -> Result<()> {
        self.handles().remove(workspace_id);
        self.delete_pods(&self.find_pods(workspace_id).await?).await
    }

    async fn destroy(&self, workspace_id: &WorkspaceId) -> Result<()> {
        self.handles().remove(workspace_id);
        self.delete_everything(workspace_id).await
    }

    async fn is_running(&self, workspace_id: &WorkspaceId) -> bool {
        match self.find_pods(workspace_id).await {
            Ok(pods) => pods.iter().any(manifests::is_ready),
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
        self.labelled().await
    }

    /// Deletes a PVC (and the Pods on it) or a Pod, only if it still carries this
    /// cluster's label.
    async fn remove_labelled(&self, sandbox: &LabelledSandbox) -> Result<()> {
        let kube = self.kube().await?;
        let foreign =
            || Err(WorkspaceError::InvalidArgument(format!("{} does not belong to this cluster", sandbox.provider_id)));
        if let Some(id) = &sandbox.workspace_id {
            self.handles().remove(id);
        }
        match sandbox.provider_id.split_once('/') {
            Some(("pvc", name)) => {
                let Some(pvc) = kube.get_pvc(name).await? else { return Ok(()) };
                if !self.ours(&pvc.metadata) {
                    return foreign();
                }
                let selector = labels::cluster_selector(&self.config.cluster_prefix);
                for pod in kube.list_pods(&selector).await? {
                    if claims_of(&pod).iter().any(|claim| claim == name)
                        && let Some(pod_name) = &pod.metadata.name
                    {
                        kube.delete_pod(pod_name).await?;
                    }
                }
                kube.delete_pvc(name).await
            }
            Some(("pod", name)) => {
                let Some(pod) = kube.get_pod(name).await? else { return Ok(()) };
                if !self.ours(&pod.metadata) {
                    return foreign();
                }
                kube.delete_pod(name).await
            }
            _ => Err(WorkspaceError::InvalidArgument(format!("unknown sandbox id {:?}", sandbox.provider_id))),
        }
    }
}
