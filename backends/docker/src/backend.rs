//! [`DockerBackend`]: one workspace's container seen through the three primitives.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use berth_workspace::backend::{Backend, ByteStream, SpawnRole, SpawnSpec, Spawned, WriteOptions};
use berth_workspace::error::Result;
use berth_workspace::path::RelPath;

use super::config::BACKEND_NAME;
use super::container::ContainerHandle;
use super::files;
use super::process;

/// A workspace running in a Docker container, its directory bind-mounted at `/workspace`.
///
/// Everything runs as the workspace user, through the container's supervisor or a Docker
/// exec: `spawn` (started by the supervisor, else wrapped by `spawn.sh`; see `process.rs`
/// for kill), `read_file` / `write_file` (see `files.rs` for
/// confinement and atomicity) and, through them, the derived POSIX operations. The image
/// must provide `/bin/sh` and the usual tools (`cat`, `mv`, `stat`, `readlink`,
/// `truncate`, `find`); busybox has them all.
#[derive(Debug)]
pub struct DockerBackend {
    container: Arc<ContainerHandle>,
    /// The workspace spec's env, given to every process (an exec's own env wins).
    env: BTreeMap<String, String>,
}

impl DockerBackend {
    pub(crate) fn new(container: Arc<ContainerHandle>, env: BTreeMap<String, String>) -> Self {
        Self { container, env }
    }

    pub fn container_id(&self) -> &str {
        &self.container.container_id
    }

    pub fn container_name(&self) -> &str {
        &self.container.container_name
    }

    /// `uid:gid` that workspace processes run as.
    pub fn user(&self) -> &str {
        &self.container.user
    }
}

#[async_trait]
impl Backend for DockerBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    async fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned> {
        spec.validate()?;
        // A secret holder gets exactly its own env (an MCP declaration's, bound to its
        // hash): the workspace's env (PYTHONPATH, LD_PRELOAD into the workspace...) would
        // let workspace code run inside it.
        let (mut env, launch) = match spec.role {
            SpawnRole::Agent => (self.env.clone(), process::Launch::Agent),
            SpawnRole::SecretHolder => {
                (BTreeMap::new(), process::Launch::SecretHolder { pin: spec.program_sha256.as_ref() })
            }
        };
        env.extend(spec.env.iter().map(|(name, value)| (name.clone(), value.clone())));
        // The kill marker is ours (process.rs); a client value would only muddle the sweep.
        let env = env
            .into_iter()
            .filter(|(name, _)| name != process::EXEC_MARKER_ENV)
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        process::spawn_as(&self.container, launch, spec.argv.clone(), &spec.cwd, env).await
    }

    async fn read_file(&self, path: &RelPath) -> Result<ByteStream> {
        files::read_file(&self.container, path).await
    }

    async fn write_file(&self, path: &RelPath, data: ByteStream, options: WriteOptions) -> Result<u64> {
        files::write_file(&self.container, path, data, options).await
    }
}
