//! [`DockerDriver`]: creates, starts, stops, removes and adopts workspace containers.
//!
//! Containers are found by label (`berth.node.id` + `berth.workspace.id`), never by an
//! in-memory table, so every call is correct after an agent restart and two agents with
//! different node ids never touch each other's containers. The container name (see
//! [`container_name`]) only makes a concurrent second create fail with 409, after which the
//! loser adopts the winner's container.
//!
//! File ownership: workspace processes run as [`DockerConfig::effective_user`]. A root
//! agent gives the workspace root directory to that uid at provision (the directory only,
//! not its contents: a recursive chown could be steered by symlinks the workspace planted);
//! a non-root agent runs containers as itself, so the root is already its own. Nothing in
//! the bind mount is written by root: execs start in the mount point itself (the daemon
//! never creates a working directory there) and file I/O goes through exec, not the
//! daemon's archive API. So after `destroy` every file left in the data directory is owned
//! by the workspace uid and the agent can remove it.

use std::collections::{BTreeSet, HashMap};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, ContainerSummary, ContainerSummaryStateEnum, HostConfig, Mount, MountType, ResourcesUlimits,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StopContainerOptionsBuilder,
};

use berth_backend_host::netns::{Attach, SandboxNetworks};
use berth_workspace::backend::BackendRef;
use berth_workspace::driver::{BackendDriver, PoolLevel, ProvisionContext};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;
use berth_workspace::spec::WorkspaceSpec;

use super::backend::DockerBackend;
use super::config::{BACKEND_NAME, SECRET_HOLDER_USER};
use super::config::{
    DockerConfig, NODE_LABEL, POOL_LABEL, ROOT_LABEL, SPEC_LABEL_PREFIX, SUPERVISOR_LABEL, WORKSPACE_LABEL,
    container_name, pool_container_name,
};
use super::container::ContainerHandle;
use super::errors::{docker_error, is_not_found, status_code};
use super::network;
use super::pool::Pool;
use super::scripts::Scripts;
use super::supervised::{CONTAINER_BINARY, CONTAINER_RUN_DIR, DockerSupervisor};

mod warm;

/// How often a provision that lost the create race looks for the winner's container.
const CONFLICT_LOOKUPS: usize = 20;
/// How often a start that got "no such container" tries again (about 1.3 s in all).
const START_LOOKUPS: usize = 6;

/// Creates and tears down workspace containers on one Docker engine.
pub struct DockerDriver {
    docker: Docker,
    config: DockerConfig,
    user: (u32, u32),
    /// Network namespaces of networked workspaces' containers.
    networks: SandboxNetworks,
    /// The supervisor of each container made with one, by container id.
    supervisors: std::sync::Mutex<HashMap<String, Arc<DockerSupervisor>>>,
    /// The warm pool, when the config names its directory.
    pool: Option<Arc<Pool>>,
}

impl DockerDriver {
    /// Connects to the local engine (`DOCKER_HOST` or `/var/run/docker.sock`), negotiates
    /// the API version (Docker 20.10 speaks 1.41) and checks that it answers.
    ///
    /// Errors: `BackendUnavailable` when the daemon cannot be reached.
    pub async fn connect(config: DockerConfig) -> Result<Self> {
        let docker = Docker::connect_with_local_defaults()
            .map_err(|error| docker_error("connecting to docker", error))?
            .negotiate_version()
            .await
            .map_err(|error| docker_error("negotiating the docker API version", error))?;
        docker.ping().await.map_err(|error| docker_error("pinging docker", error))?;
        Self::with_client(docker, config)
    }

    /// A driver on an existing client (tests, a remote engine).
    pub fn with_client(docker: Docker, config: DockerConfig) -> Result<Self> {
        config.validate()?;
        if let Some(layout) = &config.supervisor {
            layout.install_binary()?;
        }
        let user = config.effective_user();
        let networks = SandboxNetworks::new(config.network.clone(), BACKEND_NAME);
        let pool = config.warm_pool.as_ref().map(|pool| Arc::new(Pool::new(pool.dir.clone())));
        Ok(Self { docker, config, user, networks, supervisors: std::sync::Mutex::default(), pool })
    }

    fn lock_supervisors(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<DockerSupervisor>>> {
        // Single inserts and removals: a panic cannot leave the map half-updated.
        self.supervisors.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn config(&self) -> &DockerConfig {
        &self.config
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// uid:gid of workspace processes (and so of every file they create).
    pub fn container_user(&self) -> (u32, u32) {
        self.user
    }

    /// Every container of this node (all states), optionally only one workspace's.
    async fn list(&self, workspace_id: Option<&WorkspaceId>) -> Result<Vec<ContainerSummary>> {
        let mut labels = vec![format!("{NODE_LABEL}={}", self.config.node_id)];
        if let Some(workspace_id) = workspace_id {
            labels.push(format!("{WORKSPACE_LABEL}={workspace_id}"));
        }
        let filters = HashMap::from([("label".to_owned(), labels)]);
        let options = ListContainersOptionsBuilder::default().all(true).filters(&filters).build();
        self.docker.list_containers(Some(options)).await.map_err(|error| docker_error("listing containers", error))
    }

    /// The container of a workspace; the newest if a crash ever left two.
    async fn find(&self, workspace_id: &WorkspaceId) -> Result<Option<ContainerSummary>> {
        let mut found = self.list(Some(workspace_id)).await?;
        if found.len() > 1 {
            tracing::warn!(ws_id = %workspace_id, count = found.len(), "several containers for one workspace; using the newest");
        }
        found.sort_by_key(|summary| std::cmp::Reverse(summary.created.unwrap_or_default()));
        Ok(found.into_iter().next())
    }

    /// Every container of a workspace: its claimed pool container and any labelled with it.
    async fn containers_of(&self, workspace_id: &WorkspaceId) -> Result<Vec<String>> {
        let mut ids: Vec<String> =
            self.list(Some(workspace_id)).await?.into_iter().filter_map(|summary| summary.id).collect();
        if let Some(pool) = &self.pool
            && let Some(claim) = pool.claim_of(workspace_id)?
        {
            ids.push(claim.container_id);
        }
        Ok(ids)
    }

    fn image_for(&self, spec: &WorkspaceSpec) -> String {
        spec.image.clone().unwrap_or_else(|| self.config.default_image.clone())
    }

    /// Berth never pulls: a missing image is an operator error with a clear fix.
    async fn ensure_image(&self, image: &str) -> Result<()> {
        match self.docker.inspect_image(image).await {
            Ok(_) => Ok(()),
            Err(error) if is_not_found(&error) => Err(missing_image(image, &self.config)),
            Err(error) => Err(docker_error("inspecting an image", error)),
        }
    }

    async fn create(&self, context: &ProvisionContext<'_>, supervised: bool) -> Result<String> {
        let image = self.image_for(context.spec);
        self.ensure_image(&image).await?;
        let name = container_name(&self.config.node_id, context.workspace_id);
        let identity = Identity::Workspace(context.workspace_id);
        let body = container_body(&self.config, self.user, &identity, context.root, context.spec, &image, supervised);
        let options = CreateContainerOptionsBuilder::default().name(&name).build();
        match self.docker.create_container(Some(options), body).await {
            Ok(created) => {
                tracing::info!(ws_id = %context.workspace_id, container = %name, %image, "created workspace container");
                Ok(created.id)
            }
            // Another provision of the same workspace won the race: use its container. The
            // daemon reserves the name before the container is listed, so look a few times.
            Err(error) if status_code(&error) == Some(409) => {
                let mut delay = Duration::from_millis(20);
                for _ in 0..CONFLICT_LOOKUPS {
                    if let Some(ContainerSummary { id: Some(id), .. }) = self.find(context.workspace_id).await? {
                        return Ok(id);
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(500));
                }
                Err(docker_error("creating a container", error))
            }
            Err(error) if is_not_found(&error) => Err(missing_image(&image, &self.config)),
            Err(error) => Err(docker_error("creating a container", error)),
        }
    }

    async fn remove(&self, id: &str) -> Result<()> {
        let options = RemoveContainerOptionsBuilder::default().force(true).v(true).build();
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(error) if is_not_found(&error) => Ok(()),
            // 409: removal already in progress (a concurrent destroy).
            Err(error) if status_code(&error) == Some(409) => Ok(()),
            Err(error) => Err(docker_error("removing a container", error)),
        }
    }

    /// A handle on a container found or made for the workspace: started, its network
    /// attached, its supervisor (when `run_dir`, the container's socket directory) shared.
    async fn handle(
        &self,
        context: &ProvisionContext<'_>,
        id: String,
        state: Option<ContainerSummaryStateEnum>,
        run_dir: Option<PathBuf>,
        started: Option<(Option<i64>, i64)>,
    ) -> Result<BackendRef> {
        let (uid, gid) = self.user;
        let (pids_limit, pid) = match started {
            // A ready pool slot: started, and read then.
            Some(started) => started,
            None => {
                self.start(&id, state).await?;
                self.inspect_started(&id).await?
            }
        };
        if context.spec.network {
            let pid = u32::try_from(pid).ok().filter(|pid| *pid > 0).ok_or_else(|| WorkspaceError::Backend {
                backend: BACKEND_NAME,
                message: format!("container {id} has no process after start"),
            })?;
            let name = network::netns_name(&self.config.node_id, context.workspace_id);
            let owner = container_name(&self.config.node_id, context.workspace_id);
            self.networks.ensure(&name, &owner, Attach::Process(pid)).await?;
        }
        let supervisor = run_dir.and_then(|run_dir| self.supervisor_of(&id, run_dir));
        let handle = ContainerHandle {
            supervisor,
            docker: self.docker.clone(),
            container_name: container_name(&self.config.node_id, context.workspace_id),
            container_id: id,
            user: format!("{uid}:{gid}"),
            scripts: Scripts::new(&self.config.mount_point),
            pids_limit,
        };
        Ok(Arc::new(DockerBackend::new(Arc::new(handle), context.spec.env.clone())))
    }

    /// One per container for the driver's life: every handle of the container (a second
    /// provision's, one an MCP server holds) shares its socket and connection.
    fn supervisor_of(&self, container_id: &str, run_dir: PathBuf) -> Option<Arc<DockerSupervisor>> {
        let layout = self.config.supervisor.as_ref()?;
        Some(
            self.lock_supervisors()
                .entry(container_id.to_owned())
                .or_insert_with(|| Arc::new(DockerSupervisor::new(run_dir, self.user, layout.idle)))
                .clone(),
        )
    }

    /// The pids limit the container runs with (it may predate this agent's config) and the
    /// host pid of its init (0 when it is not running).
    async fn inspect_started(&self, id: &str) -> Result<(Option<i64>, i64)> {
        let inspected = self
            .docker
            .inspect_container(id, None)
            .await
            .map_err(|error| docker_error("inspecting a container", error))?;
        let pid = inspected.state.and_then(|state| state.pid).unwrap_or_default();
        Ok((inspected.host_config.and_then(|host| host.pids_limit).filter(|limit| *limit > 0), pid))
    }

    /// The driver's namespaces (tests look at pasta and the rules through it).
    pub fn networks(&self) -> &SandboxNetworks {
        &self.networks
    }

    async fn start(&self, id: &str, state: Option<ContainerSummaryStateEnum>) -> Result<()> {
        // Listed running a moment ago (or a ready pool slot): a start would answer 304.
        if state == Some(ContainerSummaryStateEnum::RUNNING) {
            return Ok(());
        }
        if state == Some(ContainerSummaryStateEnum::PAUSED) {
            self.docker.unpause_container(id).await.map_err(|error| docker_error("unpausing a container", error))?;
            return Ok(());
        }
        // A container created by a concurrent provision can be listed before the daemon has
        // registered it for start (404 "No such container" for a moment): look again briefly.
        let mut delay = Duration::from_millis(20);
        let mut lookups = 0;
        loop {
            match self.docker.start_container(id, None).await {
                // 304: already running.
                Ok(()) => return Ok(()),
                Err(error) if status_code(&error) == Some(304) => return Ok(()),
                Err(error) if is_not_found(&error) && lookups < START_LOOKUPS => {
                    lookups += 1;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_millis(500));
                }
                Err(error) => return Err(docker_error("starting a container", error)),
            }
        }
    }
}

#[async_trait]
impl BackendDriver for DockerDriver {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    async fn provision(&self, context: ProvisionContext<'_>) -> Result<BackendRef> {
        context.spec.validate()?;
        let root = context.root.to_path_buf();
        let (uid, gid) = self.user;
        tokio::task::spawn_blocking(move || prepare_root(&root, uid, gid)).await.map_err(|error| {
            WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("preparing the workspace root: {error}") }
        })??;

        let name = container_name(&self.config.node_id, context.workspace_id);
        let run_dir = match &self.config.supervisor {
            Some(layout) => {
                let (layout, name) = (layout.clone(), name.clone());
                let prepared = tokio::task::spawn_blocking(move || {
                    // Installed when the driver started; again only if /run was emptied
                    // since (a reboot), not compared on every provision.
                    if !layout.binary().exists() {
                        layout.install_binary()?;
                    }
                    layout.prepare_run_dir(&name)
                })
                .await
                .map_err(|error| WorkspaceError::Backend {
                    backend: BACKEND_NAME,
                    message: format!("preparing the supervisor directory: {error}"),
                })??;
                Some(prepared)
            }
            None => None,
        };

        // A claimed pool container, or one to claim: a fresh root (empty: any provision
        // leaves the layout in it) has no container of its own worth looking for.
        if let Some(pool) = &self.pool {
            if let Some(claimed) = self.provision_claimed(pool, &context).await? {
                return Ok(claimed);
            }
            if let Some(claimed) = self.claim(pool, &context).await? {
                return Ok(claimed);
            }
        }
        let root_label = context.root.to_string_lossy().into_owned();
        let existing = match self.find(context.workspace_id).await? {
            Some(summary) => {
                let same_root = summary
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get(ROOT_LABEL))
                    .is_some_and(|label| *label == root_label);
                // Containers of older agents had Docker's bridge: the host network's reach.
                let no_docker_network =
                    summary.host_config.as_ref().and_then(|host| host.network_mode.as_deref()) == Some("none");
                let supervised = summary
                    .labels
                    .as_ref()
                    .and_then(|labels| labels.get(SUPERVISOR_LABEL))
                    .is_some_and(|value| value == "1");
                match (summary.id, same_root && no_docker_network) {
                    (Some(id), true) => Some((id, summary.state, supervised)),
                    (Some(id), false) => {
                        // The data directory moved (the old container mounts the wrong one),
                        // or the container has a Docker network.
                        tracing::warn!(ws_id = %context.workspace_id, container = %id, same_root, no_docker_network, "workspace container is out of date; recreating it");
                        self.remove(&id).await?;
                        None
                    }
                    (None, _) => None,
                }
            }
            None => None,
        };
        let (id, state, supervised) = match existing {
            Some(found) => found,
            None => (self.create(&context, run_dir.is_some()).await?, None, run_dir.is_some()),
        };
        let run_dir = run_dir.filter(|_| supervised);
        self.handle(&context, id, state, run_dir, None).await
    }

    async fn release(&self, workspace_id: &WorkspaceId) -> Result<()> {
        for id in self.containers_of(workspace_id).await? {
            let options = StopContainerOptionsBuilder::default()
                .t(self.config.stop_timeout.as_secs().min(i32::MAX as u64) as i32)
                .build();
            match self.docker.stop_container(&id, Some(options)).await {
                Ok(()) => {}
                Err(error) if matches!(status_code(&error), Some(304 | 404)) => {}
                Err(error) => return Err(docker_error("stopping a container", error)),
            }
        }
        // The stopped container's namespace lives on in its /run/netns mount: remove it (a
        // started container gets a new one).
        self.networks.remove_owned(&container_name(&self.config.node_id, workspace_id)).await
    }

    async fn destroy(&self, workspace_id: &WorkspaceId) -> Result<()> {
        for id in self.containers_of(workspace_id).await? {
            self.remove(&id).await?;
            self.lock_supervisors().remove(&id);
        }
        if let Some(pool) = &self.pool
            && let Some(claim) = pool.claim_of(workspace_id)?
        {
            if let Some(layout) = &self.config.supervisor {
                layout.remove_run_dir(&pool_container_name(&self.config.node_id, &claim.slot));
            }
            pool.forget_claim(&claim);
        }
        if let Some(layout) = &self.config.supervisor {
            layout.remove_run_dir(&container_name(&self.config.node_id, workspace_id));
        }
        self.networks.remove_owned(&container_name(&self.config.node_id, workspace_id)).await
    }

    async fn adopt(&self) -> Result<Vec<WorkspaceId>> {
        let mut adopted = BTreeSet::new();
        for summary in self.list(None).await? {
            let Some(value) = summary.labels.as_ref().and_then(|labels| labels.get(WORKSPACE_LABEL)) else {
                continue;
            };
            match WorkspaceId::new(value.clone()) {
                Ok(id) => {
                    adopted.insert(id);
                }
                Err(error) => {
                    tracing::warn!(%error, "ignoring a container with an invalid workspace label")
                }
            }
        }
        if let Some(pool) = &self.pool {
            adopted.extend(pool.claims()?.into_iter().map(|claim| claim.workspace_id));
        }
        Ok(adopted.into_iter().collect())
    }

    async fn is_running(&self, workspace_id: &WorkspaceId) -> bool {
        if let Some(pool) = &self.pool
            && let Ok(Some(claim)) = pool.claim_of(workspace_id)
        {
            return matches!(
                self.docker.inspect_container(&claim.container_id, None).await,
                Ok(inspected) if inspected.state.as_ref().and_then(|state| state.running) == Some(true)
            );
        }
        matches!(
            self.find(workspace_id).await,
            Ok(Some(ContainerSummary { state: Some(ContainerSummaryStateEnum::RUNNING), .. }))
        )
    }

    async fn fill_pool(&self, target: usize) -> Result<PoolLevel> {
        self.fill(target).await
    }
}

fn missing_image(image: &str, config: &DockerConfig) -> WorkspaceError {
    let how = if image == config.default_image {
        "build it with deploy/images/build-base.sh"
    } else {
        "build or load it on this node (Berth never pulls images)"
    };
    WorkspaceError::BackendUnavailable {
        backend: BACKEND_NAME,
        reason: format!("image {image:?} is not present on this node; {how}"),
    }
}

/// Gives the workspace root directory (only it; see the module docs) to the container user.
/// Gives the root to the container's user and closes it to every other host user: mode
/// 0750 with the secret-holder group when the agent is root (secret holders read the
/// workspace through the group; the agent's files are theirs to share or not), 0700
/// otherwise. Re-applied at every provision: the workspace owns its root and could open it.
fn prepare_root(root: &Path, uid: u32, gid: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let display = root.display().to_string();
    // O_NOFOLLOW: the root itself must be a directory, not a symlink to one.
    let directory = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(nix::libc::O_DIRECTORY | nix::libc::O_NOFOLLOW)
        .open(root)
        .map_err(|error| WorkspaceError::from_io("open workspace root", &display, error))?;
    let metadata =
        directory.metadata().map_err(|error| WorkspaceError::from_io("stat workspace root", &display, error))?;
    let (group, mode) = if nix::unistd::geteuid().is_root() { (SECRET_HOLDER_USER.1, 0o750) } else { (gid, 0o700) };
    if (metadata.uid(), metadata.gid()) != (uid, group) {
        std::os::unix::fs::fchown(&directory, Some(uid), Some(group)).map_err(|error| {
            if error.kind() == std::io::ErrorKind::PermissionDenied {
                WorkspaceError::BackendUnavailable {
                    backend: BACKEND_NAME,
                    reason: format!(
                        "workspace root {display} is owned by {}:{}, the container runs as {uid}:{gid}, and this agent may not chown it (run the agent as that user or as root)",
                        metadata.uid(),
                        metadata.gid()
                    ),
                }
            } else {
                WorkspaceError::from_io("chown workspace root", &display, error)
            }
        })?;
    }
    if metadata.permissions().mode() & 0o7777 != mode {
        directory
            .set_permissions(std::fs::Permissions::from_mode(mode))
            .map_err(|error| WorkspaceError::from_io("chmod workspace root", &display, error))?;
    }
    Ok(())
}

/// The container of one workspace (pure, so it can be unit-tested).
/// Whom a container is made for.
enum Identity<'a> {
    Workspace(&'a WorkspaceId),
    /// A warm-pool slot, for no workspace yet.
    Pool(&'a str),
}

impl Identity<'_> {
    fn container_name(&self, node_id: &str) -> String {
        match self {
            Identity::Workspace(workspace_id) => container_name(node_id, workspace_id),
            Identity::Pool(slot) => pool_container_name(node_id, slot),
        }
    }
}

fn container_body(
    config: &DockerConfig,
    (uid, gid): (u32, u32),
    identity: &Identity<'_>,
    root: &Path,
    spec: &WorkspaceSpec,
    image: &str,
    supervised: bool,
) -> ContainerCreateBody {
    let mut labels: HashMap<String, String> =
        spec.labels.iter().map(|(key, value)| (format!("{SPEC_LABEL_PREFIX}{key}"), value.clone())).collect();
    labels.insert(NODE_LABEL.to_owned(), config.node_id.clone());
    match identity {
        Identity::Workspace(workspace_id) => {
            labels.insert(WORKSPACE_LABEL.to_owned(), workspace_id.as_str().to_owned())
        }
        Identity::Pool(slot) => labels.insert(POOL_LABEL.to_owned(), (*slot).to_owned()),
    };
    labels.insert(ROOT_LABEL.to_owned(), root.to_string_lossy().into_owned());

    let or_default = |value: u64, default: u64| if value == 0 { default } else { value };
    let memory = or_default(spec.memory_bytes, config.default_memory_bytes);
    let cpu_millis = or_default(spec.cpu_millis.into(), config.default_cpu_millis.into());
    let pids = or_default(spec.pids.into(), config.default_pids.into());
    let limit = |value: u64| (value > 0).then(|| value.min(i64::MAX as u64) as i64);

    let mut ulimits = Vec::new();
    for (name, value) in [("fsize", spec.file_size_bytes), ("cpu", spec.cpu_time_secs.into())] {
        if let Some(value) = limit(value) {
            ulimits.push(ResourcesUlimits { name: Some(name.to_owned()), soft: Some(value), hard: Some(value) });
        }
    }
    // A read-only root still needs a writable /tmp (tools, shells, sockets). `exec`: Docker
    // mounts a tmpfs noexec unless told, and a secret holder runs its checked program copy
    // from its private directory there (the agent can exec from /workspace anyway).
    let tmpfs = spec.read_only_root.then(|| {
        HashMap::from([("/tmp".to_owned(), format!("rw,exec,nosuid,nodev,size={},mode=1777", config.tmp_size_bytes))])
    });

    let bind = |source: String, target: &str, read_only: bool| Mount {
        target: Some(target.to_owned()),
        source: Some(source),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    };
    let mut mounts = vec![bind(root.to_string_lossy().into_owned(), &config.mount_point, false)];
    if let Some(layout) = config.supervisor.as_ref().filter(|_| supervised) {
        let name = identity.container_name(&config.node_id);
        mounts.push(bind(layout.binary().to_string_lossy().into_owned(), CONTAINER_BINARY, true));
        mounts.push(bind(layout.run_dir(&name).to_string_lossy().into_owned(), CONTAINER_RUN_DIR, true));
        labels.insert(SUPERVISOR_LABEL.to_owned(), "1".to_owned());
    }

    let host_config = HostConfig {
        mounts: Some(mounts),
        // Never a Docker network: a networked workspace gets pasta in this namespace after
        // start, under the node's address policy (see `network`).
        network_mode: Some("none".to_owned()),
        cap_drop: Some(vec!["ALL".to_owned()]),
        security_opt: Some(vec!["no-new-privileges".to_owned()]),
        memory: limit(memory),
        // Equal to memory: no swap, so the memory limit is a real limit.
        memory_swap: limit(memory),
        nano_cpus: limit(cpu_millis.saturating_mul(1_000_000)),
        pids_limit: limit(pids),
        readonly_rootfs: Some(spec.read_only_root),
        tmpfs,
        ulimits: (!ulimits.is_empty()).then_some(ulimits),
        // docker-init as pid 1 reaps the orphans of killed execs.
        init: Some(true),
        ..Default::default()
    };
    ContainerCreateBody {
        image: Some(image.to_owned()),
        // Keeps the container alive; every real process is an exec.
        entrypoint: Some(vec!["sleep".to_owned()]),
        cmd: Some(vec!["infinity".to_owned()]),
        user: Some(format!("{uid}:{gid}")),
        working_dir: Some(config.mount_point.clone()),
        labels: Some(labels),
        host_config: Some(host_config),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_is_locked_down_by_default() {
        let config = DockerConfig::new("node-a");
        let workspace_id = WorkspaceId::new("ws-1").unwrap();
        let spec = WorkspaceSpec::default();
        let identity = Identity::Workspace(&workspace_id);
        let body = container_body(&config, (1000, 1000), &identity, Path::new("/data/ws-1"), &spec, "img", false);
        let host = body.host_config.unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.cap_drop, Some(vec!["ALL".to_owned()]));
        assert_eq!(host.security_opt, Some(vec!["no-new-privileges".to_owned()]));
        assert_eq!(host.pids_limit, Some(512));
        assert_eq!(host.memory, host.memory_swap);
        assert_eq!(host.nano_cpus, None);
        assert_eq!(host.tmpfs, None);
        assert_eq!(body.user.as_deref(), Some("1000:1000"));
        let labels = body.labels.unwrap();
        assert_eq!(labels[NODE_LABEL], "node-a");
        assert_eq!(labels[WORKSPACE_LABEL], "ws-1");
    }

    #[test]
    fn spec_overrides_defaults() {
        let config = DockerConfig::new("node-a");
        let workspace_id = WorkspaceId::new("ws-1").unwrap();
        let spec = WorkspaceSpec {
            network: true,
            cpu_millis: 500,
            memory_bytes: 64 << 20,
            pids: 32,
            read_only_root: true,
            ..Default::default()
        };
        let identity = Identity::Workspace(&workspace_id);
        let host = container_body(&config, (1, 2), &identity, Path::new("/data/ws-1"), &spec, "img", false)
            .host_config
            .unwrap();
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.nano_cpus, Some(500_000_000));
        assert_eq!(host.memory, Some(64 << 20));
        assert_eq!(host.pids_limit, Some(32));
        assert_eq!(host.readonly_rootfs, Some(true));
        assert!(host.tmpfs.unwrap().contains_key("/tmp"));
    }
}
