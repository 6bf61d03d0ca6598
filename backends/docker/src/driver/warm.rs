//! The warm pool's side of the driver: claiming a slot for a workspace, finding a claimed
//! one again, making, removing and sweeping slots (the host side of the pool is
//! `crate::pool`; the design is in `docs/design.md`, Docker, "The warm pool").

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bollard::models::ContainerSummaryStateEnum;
use bollard::query_parameters::{CreateContainerOptionsBuilder, ListContainersOptionsBuilder};

use berth_workspace::backend::BackendRef;
use berth_workspace::driver::{PoolLevel, ProvisionContext};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::spec::WorkspaceSpec;

use super::{DockerDriver, Identity, container_body, prepare_root};
use crate::config::{BACKEND_NAME, NODE_LABEL, POOL_LABEL, ROOT_LABEL, pool_container_name};
use crate::container::ContainerHandle;
use crate::errors::{docker_error, is_not_found};
use crate::pool::{Claim, Pool, Slot, new_slot_name};
use crate::scripts::Scripts;

impl DockerDriver {
    /// The workspace's claimed pool container, when it has one (its claim finished if a
    /// crash interrupted it). A record whose container is gone is dropped: the workspace
    /// gets a container of its own.
    pub(super) async fn provision_claimed(
        &self,
        pool: &Arc<Pool>,
        context: &ProvisionContext<'_>,
    ) -> Result<Option<BackendRef>> {
        let workspace_id = context.workspace_id.clone();
        let Some(claim) = on_disk(pool, move |pool| pool.claim_of(&workspace_id)).await? else {
            return Ok(None);
        };
        let state = match self.docker.inspect_container(&claim.container_id, None).await {
            Ok(inspected) => inspected.state.and_then(|state| state.status),
            Err(error) if is_not_found(&error) => {
                tracing::warn!(ws_id = %context.workspace_id, container = %claim.container_id, "the workspace's claimed pool container is gone; making one");
                on_disk(pool, move |pool| {
                    pool.forget_claim(&claim);
                    Ok(())
                })
                .await?;
                return Ok(None);
            }
            Err(error) => return Err(docker_error("inspecting a container", error)),
        };
        if let Err(error) = finish_claim(pool, &claim, context.root).await {
            // The claim stopped before its rename and the root has files since (a restore
            // into it): the slot's directory is not the workspace's. Its container goes;
            // the workspace gets one of its own on its root.
            tracing::warn!(ws_id = %context.workspace_id, container = %claim.container_id, %error, "an unfinished warm pool claim cannot be finished; making a container");
            self.drop_claim(pool, &claim).await?;
            return Ok(None);
        }
        let state = match state {
            Some(bollard::models::ContainerStateStatusEnum::RUNNING) => Some(ContainerSummaryStateEnum::RUNNING),
            Some(bollard::models::ContainerStateStatusEnum::PAUSED) => Some(ContainerSummaryStateEnum::PAUSED),
            _ => None,
        };
        let run_dir = self.pool_run_dir(&claim.slot)?;
        Ok(Some(self.handle(context, claim.container_id, state, run_dir, None).await?))
    }

    /// Serves a fresh workspace with the default spec from the pool: `None` when the spec
    /// or the root rules it out or no slot is ready.
    pub(super) async fn claim(&self, pool: &Arc<Pool>, context: &ProvisionContext<'_>) -> Result<Option<BackendRef>> {
        if !self.pool_serves(context.spec) {
            return Ok(None);
        }
        let root = context.root.to_path_buf();
        if !on_disk(pool, move |_| Ok(dir_is_empty(&root))).await? {
            return Ok(None);
        }
        let Some(slot) = pool.take() else {
            return Ok(None);
        };
        let claim = Claim {
            workspace_id: context.workspace_id.clone(),
            slot: slot.name.clone(),
            container_id: slot.container_id.clone(),
        };
        let recorded = claim.clone();
        match on_disk(pool, move |pool| pool.record_claim(&recorded)).await {
            Ok(true) => {}
            // A concurrent provision of this workspace claimed first: take its container.
            Ok(false) => {
                pool.put_back(slot);
                return self.provision_claimed(pool, context).await;
            }
            Err(error) => {
                pool.put_back(slot);
                return Err(error);
            }
        }
        pool.count_claim();
        tracing::info!(ws_id = %context.workspace_id, container = %claim.container_id, slot = %claim.slot, "claimed a warm pool container");
        if let Err(error) = finish_claim(pool, &claim, context.root).await {
            tracing::warn!(ws_id = %context.workspace_id, %error, "a warm pool claim failed; making a container");
            self.drop_claim(pool, &claim).await?;
            return Ok(None);
        }
        let run_dir = self.pool_run_dir(&claim.slot)?;
        // Its init still there (one stat): what was read when it started holds. Else (it
        // stopped while it waited, or this agent cannot see the engine's pids) the usual
        // start and inspect.
        let known = slot.started.filter(|(_, pid)| *pid > 0 && Path::new(&format!("/proc/{pid}")).exists());
        let state = known.map(|_| ContainerSummaryStateEnum::RUNNING);
        match self.handle(context, claim.container_id.clone(), state, run_dir, known).await {
            Ok(handle) => Ok(Some(handle)),
            Err(error) => {
                // The slot's container died or was removed while it waited: the workspace
                // gets a container of its own, in the same root.
                tracing::warn!(ws_id = %context.workspace_id, container = %claim.container_id, %error, "a claimed warm pool container cannot serve; making a container");
                self.drop_claim(pool, &claim).await?;
                Ok(None)
            }
        }
    }

    /// Whether a pool container (made with the pool's spec) is what `spec` would make.
    /// Env is per exec and a network is attached after start, so neither matters.
    fn pool_serves(&self, spec: &WorkspaceSpec) -> bool {
        let Some(pool) = &self.config.warm_pool else {
            return false;
        };
        let made = &pool.spec;
        self.image_for(spec) == self.image_for(made)
            && (spec.cpu_millis, spec.memory_bytes, spec.pids) == (made.cpu_millis, made.memory_bytes, made.pids)
            && (spec.file_size_bytes, spec.cpu_time_secs) == (made.file_size_bytes, made.cpu_time_secs)
            && spec.read_only_root == made.read_only_root
            && spec.labels.is_empty()
            && made.labels.is_empty()
    }

    fn pool_run_dir(&self, slot: &str) -> Result<Option<PathBuf>> {
        match &self.config.supervisor {
            Some(layout) => Ok(Some(layout.prepare_run_dir(&pool_container_name(&self.config.node_id, slot))?)),
            None => Ok(None),
        }
    }

    /// Makes one ready slot: its directory, its container (started) and its supervisor.
    async fn make_slot(&self, pool: &Pool) -> Result<Slot> {
        let name = new_slot_name();
        let root = pool.slot_root(&name);
        let (uid, gid) = self.user;
        {
            let root = root.clone();
            tokio::task::spawn_blocking(move || {
                std::fs::create_dir_all(&root).map_err(|error| {
                    WorkspaceError::from_io("create a warm pool slot", &root.display().to_string(), error)
                })?;
                prepare_root(&root, uid, gid)?;
                seed_layout(&root, uid, gid)
            })
            .await
            .map_err(|error| WorkspaceError::Backend {
                backend: BACKEND_NAME,
                message: format!("making a slot: {error}"),
            })??;
        }
        let run_dir = self.pool_run_dir(&name)?;
        let spec = self.config.warm_pool.as_ref().map(|pool| pool.spec.clone()).unwrap_or_default();
        let image = self.image_for(&spec);
        self.ensure_image(&image).await?;
        let body =
            container_body(&self.config, self.user, &Identity::Pool(&name), &root, &spec, &image, run_dir.is_some());
        let container = pool_container_name(&self.config.node_id, &name);
        let options = CreateContainerOptionsBuilder::default().name(&container).build();
        let created = match self.docker.create_container(Some(options), body).await {
            Ok(created) => created,
            Err(error) => {
                if let Some(layout) = &self.config.supervisor {
                    layout.remove_run_dir(&container);
                }
                let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(root)).await;
                return Err(docker_error("creating a warm pool container", error));
            }
        };
        let mut slot = Slot { name, container_id: created.id, started: None };
        let started = async {
            self.start(&slot.container_id, None).await?;
            let started = self.inspect_started(&slot.container_id).await?;
            if let Some(run_dir) = run_dir
                && let Some(supervisor) = self.supervisor_of(&slot.container_id, run_dir)
            {
                let handle = ContainerHandle {
                    supervisor: None,
                    docker: self.docker.clone(),
                    container_name: container.clone(),
                    container_id: slot.container_id.clone(),
                    user: format!("{uid}:{gid}"),
                    scripts: Scripts::new(&self.config.mount_point),
                    pids_limit: None,
                };
                // Started now, so the claiming workspace's first exec is a fork.
                supervisor.warm_up(handle.target(), &handle.user).await;
            }
            Ok::<_, WorkspaceError>(started)
        };
        match started.await {
            Ok(started) => slot.started = Some(started),
            Err(error) => {
                self.remove_slot(pool, &slot).await;
                return Err(error);
            }
        }
        Ok(slot)
    }

    /// Undoes a claim that cannot be finished: its container, socket directory and slot
    /// directory go, then its record.
    async fn drop_claim(&self, pool: &Pool, claim: &Claim) -> Result<()> {
        self.remove(&claim.container_id).await?;
        let slot = Slot { name: claim.slot.clone(), container_id: claim.container_id.clone(), started: None };
        self.remove_slot(pool, &slot).await;
        pool.forget_claim(claim);
        Ok(())
    }

    /// Removes an unclaimed slot: container, socket directory, directory.
    async fn remove_slot(&self, pool: &Pool, slot: &Slot) {
        if let Err(error) = self.remove(&slot.container_id).await {
            tracing::warn!(container = %slot.container_id, %error, "could not remove a warm pool container");
        }
        self.lock_supervisors().remove(&slot.container_id);
        if let Some(layout) = &self.config.supervisor {
            layout.remove_run_dir(&pool_container_name(&self.config.node_id, &slot.name));
        }
        let root = pool.slot_root(&slot.name);
        if std::fs::symlink_metadata(&root).is_ok_and(|metadata| metadata.is_dir()) {
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(root)).await;
        }
    }

    /// Once per driver: removes the unclaimed pool containers and slots an earlier agent
    /// left (they are anonymous: nothing of them is worth keeping).
    async fn sweep_stale_slots(&self, pool: &Pool) -> Result<()> {
        let claimed: BTreeSet<String> = pool.claims()?.into_iter().map(|claim| claim.slot).collect();
        let ready: BTreeSet<String> = pool.ready_slots().into_iter().map(|slot| slot.name).collect();
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{NODE_LABEL}={}", self.config.node_id), POOL_LABEL.to_owned()],
        )]);
        let options = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
        let listed = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(|error| docker_error("listing containers", error))?;
        for summary in listed {
            let (Some(id), Some(name)) =
                (summary.id, summary.labels.as_ref().and_then(|labels| labels.get(POOL_LABEL)).cloned())
            else {
                continue;
            };
            // Only this pool's (its directory under ours): an agent with the same node id
            // on another data directory keeps its own.
            let ours = summary
                .labels
                .as_ref()
                .and_then(|labels| labels.get(ROOT_LABEL))
                .is_some_and(|root| Path::new(root).starts_with(pool.slots_dir()));
            if ours && !claimed.contains(&name) && !ready.contains(&name) {
                self.remove_slot(pool, &Slot { name, container_id: id, started: None }).await;
            }
        }
        if let Ok(entries) = std::fs::read_dir(pool.slots_dir()) {
            for entry in entries.flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let is_dir = entry.file_type().is_ok_and(|kind| kind.is_dir());
                if is_dir && !claimed.contains(&name) && !ready.contains(&name) {
                    let _ = std::fs::remove_dir_all(entry.path());
                }
            }
        }
        Ok(())
    }

    /// [`BackendDriver::fill_pool`]: sweeps once, then removes or makes slots.
    pub(super) async fn fill(&self, target: usize) -> Result<PoolLevel> {
        let Some(pool) = &self.pool else {
            return Ok(PoolLevel::default());
        };
        let mut swept = pool.filling.lock().await;
        if !*swept {
            self.sweep_stale_slots(pool).await?;
            *swept = true;
        }
        while pool.ready_count() > target {
            let Some(slot) = pool.take() else { break };
            self.remove_slot(pool, &slot).await;
        }
        while pool.ready_count() < target {
            let slot = self.make_slot(pool).await?;
            pool.push_ready(slot);
        }
        Ok(PoolLevel { ready: pool.ready_count(), claimed: pool.claimed() })
    }
}

/// Seeds a fresh slot directory (made by this agent a moment ago, nothing of a workspace
/// has run in it) with the workspace layout, as the workspace user made it: the node's
/// layout check at provision then finds it complete in one listing.
fn seed_layout(root: &Path, uid: u32, gid: u32) -> Result<()> {
    use berth_workspace::layout::{DATA_DIR, EMPTY_MCP, MCP_FILE, SESSIONS_DIR, SKILLS_DIR};
    use std::os::unix::fs::PermissionsExt as _;
    let failed =
        |path: &Path, error| WorkspaceError::from_io("seed a warm pool slot", &path.display().to_string(), error);
    for dir in [SKILLS_DIR, DATA_DIR, SESSIONS_DIR] {
        let path = root.join(dir);
        std::fs::create_dir(&path)
            .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)))
            .and_then(|()| std::os::unix::fs::lchown(&path, Some(uid), Some(gid)))
            .map_err(|error| failed(&path, error))?;
    }
    let path = root.join(MCP_FILE);
    std::fs::write(&path, EMPTY_MCP)
        .and_then(|()| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)))
        .and_then(|()| std::os::unix::fs::lchown(&path, Some(uid), Some(gid)))
        .map_err(|error| failed(&path, error))
}

/// Whether a directory exists and holds nothing (a fresh workspace's root).
fn dir_is_empty(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_none())
}

/// Runs a step of the pool's bookkeeping off the async workers: claim records are synced
/// to disk, and directories renamed.
async fn on_disk<T: Send + 'static>(
    pool: &Arc<Pool>,
    step: impl FnOnce(&Pool) -> Result<T> + Send + 'static,
) -> Result<T> {
    let pool = Arc::clone(pool);
    tokio::task::spawn_blocking(move || step(&pool)).await.map_err(|error| WorkspaceError::Backend {
        backend: BACKEND_NAME,
        message: format!("warm pool bookkeeping: {error}"),
    })?
}

async fn finish_claim(pool: &Arc<Pool>, claim: &Claim, root: &Path) -> Result<()> {
    let (claim, root) = (claim.clone(), root.to_path_buf());
    on_disk(pool, move |pool| pool.finish_claim(&claim, &root)).await
}
