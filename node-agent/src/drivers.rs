//! The backend drivers a node offers, by name. Each is checked at start (a missing `bwrap`
//! or Docker engine is a clear startup error, not a failure on the first workspace).

use std::collections::HashMap;
use std::sync::Arc;

use berth_backend_bubblewrap::{BubblewrapConfig, BubblewrapDriver};
use berth_backend_docker::{DockerConfig, DockerDriver, WarmPoolConfig};
use berth_backend_host::LocalDriver;
use berth_workspace::{BackendDriverRef, WorkspaceError};

use crate::config::NodeAgentConfig;

/// Backend names this build knows (host backends; the cloud ones are in `cloud.rs`).
pub const KNOWN_BACKENDS: &[&str] = &[
    "local",
    "bubblewrap",
    "docker",
    berth_backend_e2b::BACKEND_NAME,
    berth_backend_opensandbox::BACKEND_NAME,
    berth_backend_daytona::BACKEND_NAME,
    berth_backend_kubernetes::BACKEND_NAME,
];

/// Builds the drivers named in the config; an unknown name is a configuration error.
pub async fn build(config: &NodeAgentConfig) -> Result<HashMap<String, BackendDriverRef>, WorkspaceError> {
    let mut drivers: HashMap<String, BackendDriverRef> = HashMap::new();
    for name in &config.backends {
        let driver: BackendDriverRef = match name.as_str() {
            "local" => {
                // Only reachable with `allow_unsandboxed` (config.rs): say so once, loudly.
                tracing::warn!(
                    "offering the unsandboxed backend local: its commands run as this node agent's user; \
                     only admins and principals granted it may pick it"
                );
                Arc::new(LocalDriver::new())
            }
            "bubblewrap" => {
                let bubblewrap = BubblewrapConfig { network: config.sandbox_network(), ..config.bubblewrap.clone() };
                Arc::new(BubblewrapDriver::new(bubblewrap).await?)
            }
            "docker" => {
                let mut docker = DockerConfig {
                    default_image: config.docker_image.clone(),
                    network: config.sandbox_network(),
                    ..DockerConfig::new(&config.node_id)
                };
                // `--no-supervisor` turns off both backends' supervisors (every Docker
                // command is then a Docker exec: needed with an engine on another host).
                if !config.bubblewrap.supervisor {
                    docker.supervisor = None;
                }
                // Always: without --warm-pool the pool stays empty, but containers claimed
                // while it was on are still found by their records (and an earlier agent's
                // unclaimed ones removed). Made with the node's defaults: what a spec that
                // names no limits becomes.
                let mut spec = berth_workspace::WorkspaceSpec::default();
                config
                    .limits
                    .apply_to_spec(&mut spec)
                    .map_err(|error| WorkspaceError::InvalidArgument(format!("the warm pool's spec: {error}")))?;
                docker.warm_pool = Some(WarmPoolConfig { dir: config.data_dir.join("pool").join("docker"), spec });
                Arc::new(DockerDriver::connect(docker).await?)
            }
            other if crate::cloud::CLOUD_BACKENDS.contains(&other) => {
                crate::cloud::driver(other, &config.cloud).unwrap_or_else(|| unreachable_cloud(other))?
            }
            other => {
                return Err(WorkspaceError::UnknownBackend {
                    name: other.to_owned(),
                    offered: KNOWN_BACKENDS.join(", "),
                });
            }
        };
        drivers.insert(name.clone(), driver);
    }
    Ok(drivers)
}

fn unreachable_cloud(name: &str) -> Result<BackendDriverRef, WorkspaceError> {
    Err(WorkspaceError::UnknownBackend { name: name.to_owned(), offered: KNOWN_BACKENDS.join(", ") })
}
