//! Configuration of the Docker driver, and the names and labels of its containers.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};

use berth_backend_host::netns::SandboxNetConfig;

use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::{WorkspaceId, validate_id};

/// Name of the backend in logs, metric labels and errors.
pub const BACKEND_NAME: &str = "docker";

/// Image used when a workspace spec names none. Built locally by
/// `deploy/images/build-base.sh`; Berth never pulls images.
pub const DEFAULT_IMAGE: &str = "berth/base:latest";
/// Label holding the node id of the agent that owns a container.
pub const NODE_LABEL: &str = "berth.node.id";
/// Label holding the workspace id a container serves.
pub const WORKSPACE_LABEL: &str = "berth.workspace.id";
/// Label of a warm-pool container (value: its slot); it has no workspace label until it
/// is removed, and a claimed one is found by the node's claim record instead.
pub const POOL_LABEL: &str = "berth.pool";
/// Label of a container made with the supervisor's mounts (value `1`).
pub const SUPERVISOR_LABEL: &str = "berth.supervisor";
/// Host directory of the supervisor binary and the containers' socket directories.
pub const DEFAULT_SUPERVISOR_DIR: &str = "/run/berth/docker-supervisor";
/// How long an idle supervisor lives on in its container.
pub const DEFAULT_SUPERVISOR_IDLE: Duration = Duration::from_secs(300);
/// Label holding the host directory mounted at `/workspace` (to notice a moved data dir).
pub const ROOT_LABEL: &str = "berth.workspace.root";
/// Prefix of the spec's own labels on the container.
pub const SPEC_LABEL_PREFIX: &str = "berth.label.";
/// Where the workspace directory is mounted inside containers by default.
pub const DEFAULT_MOUNT_POINT: &str = "/workspace";
/// The unprivileged user of the base image, used when the agent itself runs as root.
pub const BASE_IMAGE_USER: (u32, u32) = (1000, 1000);
/// `uid:gid` of secret-holding execs (`SpawnRole::SecretHolder`, MCP servers given
/// secrets): not the workspace user, so a workspace process can neither signal nor trace
/// them nor read their `/proc/<pid>/environ` (every exec runs with no capabilities). A
/// workspace user equal to it makes such spawns fail (`BackendUnavailable`).
pub const SECRET_HOLDER_USER: (u32, u32) = (64_000, 64_000);

/// Settings of a [`DockerDriver`](super::DockerDriver). Zero limits in a workspace spec
/// mean "use the default here"; a zero default means "no limit".
#[derive(Clone, Debug)]
pub struct DockerConfig {
    /// Id of this node; every container carries it as `berth.node.id`, which is how a
    /// restarted agent finds (adopts) its containers.
    pub node_id: String,
    /// Image when the spec names none.
    pub default_image: String,
    /// uid:gid that workspace processes run as. `None`: the agent's own euid:egid, or
    /// [`BASE_IMAGE_USER`] when the agent is root (workspace code never runs as root).
    pub user: Option<(u32, u32)>,
    /// Where the workspace directory is mounted (and processes start): an absolute path of
    /// `[A-Za-z0-9._-]` components. Must not be `/` or a system directory of the image.
    pub mount_point: String,
    pub default_memory_bytes: u64,
    pub default_cpu_millis: u32,
    pub default_pids: u32,
    /// Size of the tmpfs at `/tmp` when the spec asks for a read-only root.
    pub tmp_size_bytes: u64,
    /// How long `release` waits for the container to stop before SIGKILL.
    pub stop_timeout: Duration,
    /// Tools and address policy of networked workspaces: their containers have no Docker
    /// network (`none`); pasta gives them outbound access under this policy (see
    /// [`super::network`]).
    pub network: SandboxNetConfig,
    /// Where the host side of the containers' resident supervisors lives, and how long an
    /// idle one lives on (`None`: every exec is a Docker exec). Needs a local engine (the
    /// socket directory is bound into containers). Default: `/run/berth/docker-supervisor`
    /// for a root agent, none otherwise.
    pub supervisor: Option<SupervisorLayout>,
    /// The warm pool (`None`: no pool).
    pub warm_pool: Option<WarmPoolConfig>,
}

/// Where a driver's warm pool lives and what its containers are made with.
#[derive(Clone, Debug)]
pub struct WarmPoolConfig {
    /// Its slots' workspace directories and the claim records: on the file system of the
    /// workspace roots, since a claim renames a slot's directory to the workspace's root.
    pub dir: PathBuf,
    /// The spec pool containers are made with (the node's defaults applied); a provision
    /// whose spec has the same limits, image and no labels is served from the pool.
    pub spec: berth_workspace::spec::WorkspaceSpec,
}

impl DockerConfig {
    /// Defaults: [`DEFAULT_IMAGE`], automatic user, mounted at `/workspace`, 2 GiB memory (no swap), no CPU cap,
    /// 512 pids, 64 MiB `/tmp` on read-only roots, 5 s stop timeout.
    pub fn new(node_id: impl Into<String>) -> Self {
        Self {
            node_id: node_id.into(),
            default_image: DEFAULT_IMAGE.to_owned(),
            user: None,
            mount_point: DEFAULT_MOUNT_POINT.to_owned(),
            default_memory_bytes: 2 * 1024 * 1024 * 1024,
            default_cpu_millis: 0,
            default_pids: 512,
            tmp_size_bytes: 64 * 1024 * 1024,
            stop_timeout: Duration::from_secs(5),
            network: SandboxNetConfig::default(),
            supervisor: nix::unistd::geteuid()
                .is_root()
                .then(|| SupervisorLayout { dir: DEFAULT_SUPERVISOR_DIR.into(), idle: DEFAULT_SUPERVISOR_IDLE }),
            warm_pool: None,
        }
    }

    pub fn validate(&self) -> Result<()> {
        validate_id("node id", &self.node_id)?;
        if self.default_image.is_empty() {
            return Err(WorkspaceError::InvalidArgument("docker default image must not be empty".into()));
        }
        if let Some(layout) = &self.supervisor {
            if !layout.dir.is_absolute() {
                return Err(WorkspaceError::InvalidArgument(format!(
                    "docker supervisor directory {} must be absolute",
                    layout.dir.display()
                )));
            }
            if layout.idle.is_zero() {
                return Err(WorkspaceError::InvalidArgument("docker supervisor idle time must be positive".into()));
            }
        }
        if let Some(pool) = &self.warm_pool {
            if !pool.dir.is_absolute() {
                return Err(WorkspaceError::InvalidArgument(format!(
                    "docker warm pool directory {} must be absolute",
                    pool.dir.display()
                )));
            }
            pool.spec.validate()?;
        }
        if !super::scripts::valid_mount_point(&self.mount_point) {
            return Err(WorkspaceError::InvalidArgument(format!(
                "docker mount point {:?} must be an absolute path of [A-Za-z0-9._-] components other than /",
                self.mount_point
            )));
        }
        Ok(())
    }

    /// The uid:gid workspace processes run as (see [`DockerConfig::user`]).
    pub fn effective_user(&self) -> (u32, u32) {
        if let Some(user) = self.user {
            return user;
        }
        let uid = nix::unistd::geteuid().as_raw();
        let gid = nix::unistd::getegid().as_raw();
        if uid == 0 { BASE_IMAGE_USER } else { (uid, gid) }
    }
}

/// Name of a workspace's container: `berth-<node>-<workspace>-<hash>`. Ids may hold `@`
/// and `:` (not allowed in names) and be 128 bytes long (names fit in 128 with the prefix),
/// so both are sanitised and shortened, and a hash of the exact pair keeps names unique.
/// Lookups go by label; the name only makes a concurrent second create fail (409).
pub fn container_name(node_id: &str, workspace_id: &WorkspaceId) -> String {
    let mut hasher = Sha256::new();
    hasher.update(node_id.as_bytes());
    hasher.update([0]);
    hasher.update(workspace_id.as_str().as_bytes());
    let digest = hex::encode(hasher.finalize());
    format!("berth-{}-{}-{}", sanitize(node_id, 32), sanitize(workspace_id.as_str(), 64), &digest[..12])
}

fn sanitize(value: &str, max_chars: usize) -> String {
    value
        .chars()
        .take(max_chars)
        .map(
            |character| {
                if character.is_ascii_alphanumeric() || matches!(character, '_' | '.' | '-') { character } else { '_' }
            },
        )
        .collect()
}

/// Name of a warm-pool container: `berth-pool-<node>-<slot>` (a slot is 16 hex digits, a
/// workspace container's last part 12, so the two never meet).
pub fn pool_container_name(node_id: &str, slot: &str) -> String {
    format!("berth-pool-{}-{}", sanitize(node_id, 32), sanitize(slot, 16))
}

/// The host side of the supervisor of every container of one driver.
#[derive(Clone, Debug)]
pub struct SupervisorLayout {
    /// `<dir>/bin/berth-supervisor` and `<dir>/run/<container>/`.
    pub dir: PathBuf,
    pub idle: Duration,
}

impl SupervisorLayout {
    pub fn binary(&self) -> PathBuf {
        self.dir.join("bin").join("berth-supervisor")
    }

    pub fn run_dir(&self, container_name: &str) -> PathBuf {
        self.dir.join("run").join(container_name)
    }

    /// Writes the supervisor binary (atomically: a started container keeps the file it was
    /// given) when it is missing or another version.
    pub fn install_binary(&self) -> Result<()> {
        let path = self.binary();
        let failed =
            |op: &'static str, error: std::io::Error| WorkspaceError::from_io(op, &path.display().to_string(), error);
        if std::fs::read(&path).is_ok_and(|present| present == berth_supervisor::BINARY) {
            return Ok(());
        }
        let dir = path.parent().unwrap_or(Path::new("/"));
        std::fs::create_dir_all(dir).map_err(|error| failed("create the supervisor directory", error))?;
        let temp = dir.join(format!(".berth-supervisor.{}.{:x}", std::process::id(), rand::random::<u64>()));
        let written = std::fs::write(&temp, berth_supervisor::BINARY)
            .and_then(|()| std::fs::set_permissions(&temp, std::fs::Permissions::from_mode(0o755)))
            .and_then(|()| std::fs::rename(&temp, &path));
        if let Err(error) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(failed("install the supervisor binary", error));
        }
        Ok(())
    }

    /// Makes the container's socket directory: the agent's, mode 0711 (again at every
    /// provision: `/run` is empty after a reboot, and Docker refuses to start a container
    /// whose bind source is missing). Whatever else is at that path — a directory of
    /// another owner (an older agent's), a link, a file — is removed and never reused.
    pub fn prepare_run_dir(&self, container_name: &str) -> Result<PathBuf> {
        let dir = self.run_dir(container_name);
        let failed =
            |op: &'static str, error: std::io::Error| WorkspaceError::from_io(op, &dir.display().to_string(), error);
        let found = match std::fs::symlink_metadata(&dir) {
            Ok(metadata) => Some(metadata),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(failed("stat the supervisor socket directory", error)),
        };
        let ours =
            found.as_ref().filter(|metadata| metadata.is_dir() && metadata.uid() == nix::unistd::geteuid().as_raw());
        if ours.is_none() {
            if let Some(metadata) = &found {
                // remove_dir_all never follows a link out of the directory.
                let removed =
                    if metadata.is_dir() { std::fs::remove_dir_all(&dir) } else { std::fs::remove_file(&dir) };
                removed.map_err(|error| failed("remove a foreign supervisor socket directory", error))?;
            }
            if let Some(parent) = dir.parent() {
                std::fs::create_dir_all(parent).map_err(|error| failed("create the supervisor directory", error))?;
            }
            // A concurrent provision of the same container may make it first: fine.
            match std::fs::create_dir(&dir) {
                Err(error) if error.kind() != std::io::ErrorKind::AlreadyExists => {
                    return Err(failed("create the supervisor socket directory", error));
                }
                _ => {}
            }
        }
        let mode = match ours {
            Some(metadata) => metadata.permissions().mode(),
            None => std::fs::symlink_metadata(&dir)
                .map_err(|error| failed("stat the supervisor socket directory", error))?
                .permissions()
                .mode(),
        };
        if mode & 0o7777 != 0o711 {
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711))
                .map_err(|error| failed("chmod the supervisor socket directory", error))?;
        }
        Ok(dir)
    }

    /// Removes a container's socket directory (its container is gone).
    pub fn remove_run_dir(&self, container_name: &str) {
        let dir = self.run_dir(container_name);
        if let Err(error) = std::fs::remove_dir_all(&dir)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            tracing::warn!(dir = %dir.display(), %error, "cannot remove a supervisor socket directory");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_foreign_socket_directory_is_replaced_not_reused() {
        let base = tempfile::tempdir().unwrap();
        let layout = SupervisorLayout { dir: base.path().to_path_buf(), idle: DEFAULT_SUPERVISOR_IDLE };
        let elsewhere = base.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("kept"), b"x").unwrap();
        let is_ours = |dir: &Path| {
            let metadata = std::fs::symlink_metadata(dir).unwrap();
            assert!(metadata.is_dir(), "{} is not a directory", dir.display());
            assert_eq!(metadata.uid(), nix::unistd::geteuid().as_raw());
            assert_eq!(metadata.permissions().mode() & 0o7777, 0o711);
            assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0, "{} kept foreign entries", dir.display());
        };
        // Missing: made.
        is_ours(&layout.prepare_run_dir("fresh").unwrap());
        // A link (to a directory of someone else's): replaced, its target untouched.
        std::fs::create_dir_all(base.path().join("run")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, layout.run_dir("linked")).unwrap();
        is_ours(&layout.prepare_run_dir("linked").unwrap());
        assert!(elsewhere.join("kept").exists());
        // A directory of another owner with entries (an older agent gave it to the
        // workspace user): replaced. The tests run as root, which may chown.
        let foreign = layout.run_dir("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::fs::write(foreign.join("planted"), b"x").unwrap();
        std::os::unix::fs::chown(&foreign, Some(1000), Some(1000)).expect("chown (the tests run as root)");
        is_ours(&layout.prepare_run_dir("foreign").unwrap());
        // Ours with the wrong mode: kept, mode fixed.
        std::fs::set_permissions(layout.run_dir("fresh"), std::fs::Permissions::from_mode(0o755)).unwrap();
        is_ours(&layout.prepare_run_dir("fresh").unwrap());
    }

    #[test]
    fn names_are_valid_unique_and_bounded() {
        let long = WorkspaceId::new("w".repeat(128)).unwrap();
        let name = container_name(&"n".repeat(128), &long);
        assert!(name.len() <= 128, "{}", name.len());
        let first = container_name("node:1", &WorkspaceId::new("a@b").unwrap());
        let second = container_name("node:1", &WorkspaceId::new("a_b").unwrap());
        assert_ne!(first, second);
        assert!(first.starts_with("berth-node_1-a_b-"), "{first}");
        assert!(first.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c)));
    }

    #[test]
    fn root_agents_run_workspaces_unprivileged() {
        let mut config = DockerConfig::new("node");
        let (uid, _) = config.effective_user();
        assert_ne!(uid, 0);
        config.user = Some((4242, 4243));
        assert_eq!(config.effective_user(), (4242, 4243));
    }
}
