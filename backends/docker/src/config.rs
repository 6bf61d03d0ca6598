//! Configuration of the Docker driver, and the names and labels of its containers.

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
        }
    }

    pub fn validate(&self) -> Result<()> {
        validate_id("node id", &self.node_id)?;
        if self.default_image.is_empty() {
            return Err(WorkspaceError::InvalidArgument("docker default image must not be empty".into()));
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

#[cfg(test)]
mod tests {
    use super::*;

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
