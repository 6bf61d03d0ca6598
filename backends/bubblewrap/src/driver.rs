//! [`BubblewrapDriver`]: checks the host once, then hands out [`BubblewrapBackend`]s.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;

use super::backend::{BackendParts, BubblewrapBackend};
use super::cgroup::{CgroupLimits, CgroupPolicy, Cgroups};
use super::config::{BubblewrapConfig, SANDBOX_INNER_ID};
use super::identity::{self, HostUser, UidRange};
use super::launch::Launcher;
use super::network::{self, SandboxNetns};
use super::ownership;
use super::sandbox::{self, MountTable, WorkspaceMounts};
use super::supervised::SupervisorImage;
use berth_backend_host::hostfs::HostFs;
use berth_backend_host::netns::{Attach, SandboxNetworks};
use berth_workspace::backend::BackendRef;
use berth_workspace::driver::{BackendDriver, ProvisionContext};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;

/// How long the start-up probe sandbox may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);
/// Most bytes of the probe's stderr quoted in an error.
const PROBE_STDERR_BYTES: usize = 2000;
/// How long release / destroy wait for a workspace's killed processes to leave its cgroup.
const CGROUP_REMOVE_PATIENCE: Duration = Duration::from_secs(5);

/// Hands out sandboxes. There is no long-lived runtime per workspace: every exec is its
/// own bwrap, so provisioning only prepares the root and builds the handle, and release /
/// destroy kill whatever is still running in the workspace and forget the handle (callers
/// still holding one can keep using it).
#[derive(Debug)]
pub struct BubblewrapDriver {
    config: Arc<BubblewrapConfig>,
    launcher: Arc<Launcher>,
    /// Uids to give workspaces when the node agent is root (`None`: it is not, and every
    /// sandbox runs as its user).
    uid_range: Option<UidRange>,
    /// Per-workspace cgroups (`None`: rlimits only).
    cgroups: Option<Cgroups>,
    backends: Mutex<HashMap<WorkspaceId, (PathBuf, Arc<BubblewrapBackend>)>>,
    /// Network namespaces of networked workspaces (see [`network`]).
    networks: SandboxNetworks,
    /// The supervisor binary (`None`: `config.supervisor` is off).
    supervisor_image: Option<Arc<SupervisorImage>>,
}

impl BubblewrapDriver {
    /// Validates `config`, inspects the host and runs one probe sandbox (as the sandbox
    /// user, with the real mounts and limits) to prove that bubblewrap works here.
    ///
    /// Errors: `InvalidArgument` for a bad config; `BackendUnavailable` naming what is
    /// missing — a binary (`bwrap`, `setsid`, `setpriv`, `prlimit`), user namespaces, or
    /// permission to switch to a sandbox uid.
    pub async fn new(config: BubblewrapConfig) -> Result<Self> {
        config.validate()?;
        let inspected = config.clone();
        let table = tokio::task::spawn_blocking(move || -> Result<MountTable> {
            for (what, path, package) in [
                ("bwrap", &inspected.bwrap_path, "bubblewrap"),
                ("setsid", &inspected.setsid_path, "util-linux"),
                ("setpriv", &inspected.setpriv_path, "util-linux"),
                ("prlimit", &inspected.prlimit_path, "util-linux"),
            ] {
                if !is_executable(path) {
                    return Err(unavailable(format!(
                        "{what} not found or not executable at {} (install {package})",
                        path.display()
                    )));
                }
            }
            super::holder::sweep_stale_copies();
            MountTable::inspect(&inspected)
        })
        .await
        .map_err(|error| unavailable(format!("host inspection task failed: {error}")))??;
        // Root gives each workspace uids of its own; anyone else already is unprivileged and
        // runs sandboxes as itself (RLIMIT_NPROC then counts per sandbox just the same).
        let uid_range = nix::unistd::geteuid().is_root().then_some(config.sandbox_uid_range);
        if let Some(range) = uid_range {
            identity::check_against_host(range).map_err(unavailable)?;
        }
        let launcher = Arc::new(Launcher {
            setsid_path: config.setsid_path.clone(),
            setpriv_path: config.setpriv_path.clone(),
            bwrap_path: config.bwrap_path.clone(),
            prlimit_path: config.prlimit_path.clone(),
            table: Arc::new(table),
            workspace_dir: config.workspace_dir.clone(),
        });
        let cgroups = detect_cgroups(config.cgroups, uid_range.is_some()).await?;
        let networks = SandboxNetworks::new(config.network.clone(), "bubblewrap");
        let supervisor_image = if config.supervisor { Some(Arc::new(SupervisorImage::new()?)) } else { None };
        let driver = Self {
            supervisor_image,
            config: Arc::new(config),
            launcher,
            uid_range,
            cgroups,
            backends: Mutex::new(HashMap::new()),
            networks,
        };
        driver.probe().await?;
        Ok(driver)
    }

    pub fn config(&self) -> &BubblewrapConfig {
        &self.config
    }

    /// The range workspace uids come from (`None`: the agent is not root and sandboxes run
    /// as its user).
    pub fn uid_range(&self) -> Option<UidRange> {
        self.uid_range
    }

    /// Runs `prlimit <default limits> -- true` through the real host chain (as the first
    /// uid of the range) in a sandbox with every mount but the workspace (an empty tmpfs
    /// stands in for it).
    async fn probe(&self) -> Result<()> {
        let probe_user: Option<HostUser> = self.uid_range.map(|range| range.first_users().agent);
        let mut args = self.launcher.host_chain(probe_user, None, &[]);
        args.extend(sandbox::bwrap_args(
            &self.config,
            &self.launcher.table,
            &WorkspaceMounts {
                root: None,
                dir: &self.config.workspace_dir,
                read_only_files: &[],
                network: false,
                tmp_per_exec: false,
            },
        ));
        args.push("--".into());
        args.push(self.config.prlimit_path.clone().into_os_string());
        args.extend(self.config.default_limits.prlimit_args().into_iter().map(Into::into));
        args.push("--".into());
        args.push("true".into());
        let who = match probe_user {
            Some(user) => format!("as uid {}:{}", user.uid, user.gid),
            None => "as the agent's user".to_owned(),
        };
        let child = self.launcher.start(args, &BTreeMap::new())?;
        let output = tokio::time::timeout(PROBE_TIMEOUT, child.wait_with_output())
            .await
            .map_err(|_| unavailable(format!("the probe sandbox did not finish within {PROBE_TIMEOUT:?}")))?
            .map_err(|error| unavailable(format!("cannot run the probe sandbox {who}: {error}")))?;
        if output.status.success() {
            tracing::info!(
                bwrap = %self.config.bwrap_path.display(),
                user = %who,
                inner_uid = SANDBOX_INNER_ID,
                "bubblewrap sandboxes work"
            );
            return Ok(());
        }
        let stderr = String::from_utf8_lossy(&output.stderr);
        let stderr: String = stderr.trim().chars().take(PROBE_STDERR_BYTES).collect();
        let hint = if stderr.contains("namespace") || stderr.contains("Operation not permitted") {
            " (unprivileged user namespaces must be allowed: sysctl kernel.unprivileged_userns_clone=1, \
             and on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap)"
        } else {
            ""
        };
        Err(unavailable(format!("a probe sandbox {who} failed with {}: {stderr}{hint}", output.status)))
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<WorkspaceId, (PathBuf, Arc<BubblewrapBackend>)>> {
        // Single inserts and removals: a panic cannot leave the map half-updated.
        self.backends.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Whether workspaces get cgroups ("v1" / "v2"), `None` when they do not.
    pub fn cgroup_version(&self) -> Option<&'static str> {
        self.cgroups.as_ref().map(Cgroups::version)
    }

    /// Forgets the handle, kills what runs, removes the cgroup and the workspace's network
    /// namespace (found by its owner record, so that goes after an agent restart too).
    async fn forget_and_kill(&self, workspace_id: &WorkspaceId) -> Result<()> {
        let removed = self.lock().remove(workspace_id);
        if let Some((_, backend)) = removed {
            let killed = backend.kill_all();
            if killed > 0 {
                tracing::info!(ws_id = %workspace_id, killed, "killed running sandboxes");
            }
            if let Some(cgroup) = backend.cgroup().cloned() {
                tokio::task::spawn_blocking(move || cgroup.remove(CGROUP_REMOVE_PATIENCE))
                    .await
                    .map_err(|error| unavailable(format!("cgroup removal task failed: {error}")))??;
            }
        }
        self.networks.remove_owned(workspace_id.as_str()).await
    }

    /// The network namespace sandboxes of this workspace run in (`None`: no network).
    async fn network_for(&self, context: &ProvisionContext<'_>) -> Result<Option<SandboxNetns>> {
        if !context.spec.network {
            return Ok(None);
        }
        let name = network::netns_name(context.root);
        let path = self.networks.ensure(&name, context.workspace_id.as_str(), Attach::Fresh).await?;
        tracing::debug!(ws_id = %context.workspace_id, netns = %path.display(), "sandbox network ready");
        Ok(Some(SandboxNetns { nsenter_path: self.config.network.nsenter_path.clone(), path }))
    }

    /// The driver's namespaces (tests look at pasta and the rules through it).
    pub fn networks(&self) -> &SandboxNetworks {
        &self.networks
    }
}

/// The cgroups the policy asks for: only a root agent sets them up; `Auto` falls back to
/// rlimits (with a warning) when they are not usable, `Required` refuses to start.
async fn detect_cgroups(policy: CgroupPolicy, is_root: bool) -> Result<Option<Cgroups>> {
    if policy == CgroupPolicy::Off {
        return Ok(None);
    }
    let detected = if is_root {
        tokio::task::spawn_blocking(Cgroups::detect)
            .await
            .map_err(|error| unavailable(format!("cgroup detection task failed: {error}")))?
    } else {
        Err(super::cgroup::CgroupError::Unavailable { reason: "the node agent is not root".into() })
    };
    match (detected, policy) {
        (Ok(cgroups), _) => {
            tracing::info!(version = cgroups.version(), "bubblewrap workspaces get cgroups");
            Ok(Some(cgroups))
        }
        (Err(error), CgroupPolicy::Required) => Err(error.into()),
        (Err(error), _) => {
            tracing::warn!(
                %error,
                "bubblewrap workspaces get no cgroup: memory is limited per process (RLIMIT_AS), CPU not at all"
            );
            Ok(None)
        }
    }
}

/// The cgroup directory name of a workspace: its id and a digest of its root, so two
/// drivers (two agents, or tests) using the same id on one host never share a cgroup, and
/// a restarted agent finds its own again.
fn cgroup_name(workspace_id: &WorkspaceId, root: &Path) -> String {
    use sha2::Digest as _;
    let digest = sha2::Sha256::digest(root.as_os_str().as_encoded_bytes());
    let short: String = digest.iter().take(6).map(|byte| format!("{byte:02x}")).collect();
    format!("{}.{short}", workspace_id.as_str())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(path).is_ok_and(|metadata| metadata.is_file() && metadata.permissions().mode() & 0o111 != 0)
}

fn unavailable(reason: String) -> WorkspaceError {
    WorkspaceError::BackendUnavailable { backend: "bubblewrap", reason }
}

#[async_trait]
impl BackendDriver for BubblewrapDriver {
    fn name(&self) -> &'static str {
        "bubblewrap"
    }

    async fn provision(&self, context: ProvisionContext<'_>) -> Result<BackendRef> {
        let backend: BackendRef = self.provision_bubblewrap(context).await?;
        Ok(backend)
    }

    async fn release(&self, workspace_id: &WorkspaceId) -> Result<()> {
        self.forget_and_kill(workspace_id).await
    }

    async fn destroy(&self, workspace_id: &WorkspaceId) -> Result<()> {
        self.forget_and_kill(workspace_id).await
    }
}

impl BubblewrapDriver {
    /// [`BackendDriver::provision`] with the concrete type, for callers that want
    /// [`BubblewrapBackend::running`] or [`BubblewrapBackend::kill_all`].
    ///
    /// Prepares the root (the caller created it): checks that the sandbox user can reach
    /// it and makes that user own everything in it. Idempotent; a second call for the same
    /// root returns the same handle.
    pub async fn provision_bubblewrap(&self, context: ProvisionContext<'_>) -> Result<Arc<BubblewrapBackend>> {
        context.spec.validate()?;
        if let Some((root, backend)) = self.lock().get(context.workspace_id)
            && root == context.root
        {
            return Ok(backend.clone());
        }
        if context.spec.image.is_some() {
            tracing::warn!(ws_id = %context.workspace_id, "the bubblewrap backend runs host binaries; ignoring image");
        }
        if context.spec.cpu_millis > 0 && self.cgroups.is_none() {
            tracing::warn!(ws_id = %context.workspace_id, "no cgroups: ignoring cpu_millis");
        }
        let root = context.root.to_path_buf();
        let uid_range = self.uid_range;
        let opened_root = root.clone();
        let (files, users) = tokio::task::spawn_blocking(move || -> Result<_> {
            let files = HostFs::open(&opened_root)?;
            let Some(range) = uid_range else {
                return Ok((files, None));
            };
            let users = identity::allocate(files.host_root(), range)?;
            let (uid, gid) = (users.agent.uid, users.agent.gid);
            ownership::check_reachable(files.host_root(), uid, gid)?;
            let changed = ownership::hand_over(files.host_root(), uid, gid)?;
            if changed > 0 {
                tracing::debug!(root = %files.host_root().display(), changed, uid, "workspace handed to its uid");
            }
            Ok((files.with_owner(Some((uid, gid))), Some(users)))
        })
        .await
        .map_err(|error| unavailable(format!("preparing the workspace root failed: {error}")))??;
        let mounts = |tmp_per_exec| WorkspaceMounts {
            root: Some(files.host_root()),
            dir: &self.config.workspace_dir,
            read_only_files: &[],
            network: context.spec.network,
            tmp_per_exec,
        };
        let sandbox_args = sandbox::bwrap_args(&self.config, &self.launcher.table, &mounts(false));
        let supervisor_sandbox_args = sandbox::bwrap_args(&self.config, &self.launcher.table, &mounts(true));
        let mut limits = self.config.default_limits.for_spec(context.spec);
        let cgroup = match &self.cgroups {
            Some(cgroups) => {
                let cgroup_limits = CgroupLimits {
                    memory_bytes: limits.memory_bytes,
                    cpu_millis: (context.spec.cpu_millis > 0).then_some(context.spec.cpu_millis),
                    pids: limits.pids,
                };
                // Memory is the workspace's, in the cgroup: no RLIMIT_AS on top (it breaks
                // runtimes that reserve address space, and counts nothing shared).
                limits.memory_bytes = None;
                let cgroup = cgroups.workspace(&cgroup_name(context.workspace_id, &root), cgroup_limits);
                let created = cgroup.clone();
                tokio::task::spawn_blocking(move || created.apply())
                    .await
                    .map_err(|error| unavailable(format!("cgroup task failed: {error}")))??;
                Some(cgroup)
            }
            None => None,
        };
        let netns = self.network_for(&context).await?;
        let backend = Arc::new(BubblewrapBackend::new(BackendParts {
            netns,
            files,
            launcher: self.launcher.clone(),
            config: self.config.clone(),
            users,
            sandbox_args,
            supervisor_sandbox_args,
            network: context.spec.network,
            limit_args: limits.prlimit_args(),
            rlimits: limits.rlimits(),
            supervisor_image: self.supervisor_image.clone(),
            base_env: context.spec.env.clone(),
            cgroup,
        }));
        // Two racing provisions both prepare the root; the later insert wins and both
        // handles serve the same directory, which keeps provision idempotent.
        self.lock().insert(context.workspace_id.clone(), (root, backend.clone()));
        Ok(backend)
    }
}
