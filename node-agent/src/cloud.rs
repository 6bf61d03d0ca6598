//! The cloud backends a node agent can offer as a *gateway*: it holds no workspace data,
//! drives a provider's API and serves the workspace contract through the provider's
//! in-sandbox API (docs/design.md §4.7). Each provider's settings come from its own flags;
//! credentials only from files.

use berth_workspace::{BackendDriverRef, WorkspaceError};

pub use berth_backend_daytona::DaytonaConfig;
pub use berth_backend_e2b::E2bConfig;
pub use berth_backend_kubernetes::KubernetesConfig;
pub use berth_backend_opensandbox::OpenSandboxConfig;

/// Settings of the cloud backends this node may offer.
#[derive(Clone, Debug)]
pub struct CloudConfig {
    /// The cluster's key prefix (the replicas' `--key-prefix`), written to every sandbox's
    /// labels so two clusters sharing a provider account never touch each other's sandboxes.
    /// A replica refuses a node whose prefix is not its own.
    pub key_prefix: String,
    /// `--backend e2b`: E2B (`--e2b-*` flags).
    pub e2b: Option<berth_backend_e2b::E2bConfig>,
    /// `--backend opensandbox`: an OpenSandbox server (`--opensandbox-*` flags).
    pub opensandbox: Option<berth_backend_opensandbox::OpenSandboxConfig>,
    /// `--backend daytona`: Daytona (`--daytona-*` flags).
    pub daytona: Option<berth_backend_daytona::DaytonaConfig>,
    /// `--backend kubernetes`: a PVC and a Pod per workspace (`--kube-*` flags; without
    /// `--kube-config-file`, the in-cluster service account).
    pub kubernetes: Option<berth_backend_kubernetes::KubernetesConfig>,
}

impl Default for CloudConfig {
    fn default() -> Self {
        Self { key_prefix: "/berth".to_owned(), e2b: None, opensandbox: None, daytona: None, kubernetes: None }
    }
}

/// Cloud backend names this build knows.
pub const CLOUD_BACKENDS: &[&str] = &[
    berth_backend_e2b::BACKEND_NAME,
    berth_backend_opensandbox::BACKEND_NAME,
    berth_backend_daytona::BACKEND_NAME,
    berth_backend_kubernetes::BACKEND_NAME,
];

/// The driver of cloud backend `name`, or `None` when `name` is not a cloud backend.
pub fn driver(name: &str, config: &CloudConfig) -> Option<Result<BackendDriverRef, WorkspaceError>> {
    let missing = |flag: &str| {
        Err(WorkspaceError::BackendUnavailable { backend: "cloud", reason: format!("--backend {name} needs {flag}") })
    };
    match name {
        berth_backend_e2b::BACKEND_NAME => Some(match &config.e2b {
            None => missing("--e2b-api-key-file"),
            Some(e2b) => {
                let e2b = berth_backend_e2b::E2bConfig { cluster_prefix: config.key_prefix.clone(), ..e2b.clone() };
                berth_backend_e2b::E2bDriver::new(e2b).map(|driver| std::sync::Arc::new(driver) as BackendDriverRef)
            }
        }),
        berth_backend_opensandbox::BACKEND_NAME => Some(match &config.opensandbox {
            None => missing("--opensandbox-url"),
            Some(opensandbox) => {
                let opensandbox = berth_backend_opensandbox::OpenSandboxConfig {
                    cluster_prefix: config.key_prefix.clone(),
                    ..opensandbox.clone()
                };
                berth_backend_opensandbox::OpenSandboxDriver::new(opensandbox)
                    .map(|driver| std::sync::Arc::new(driver) as BackendDriverRef)
            }
        }),
        berth_backend_daytona::BACKEND_NAME => Some(match &config.daytona {
            None => missing("--daytona-api-key-file"),
            Some(daytona) => {
                let daytona = berth_backend_daytona::DaytonaConfig {
                    cluster_prefix: config.key_prefix.clone(),
                    ..daytona.clone()
                };
                berth_backend_daytona::DaytonaDriver::new(daytona)
                    .map(|driver| std::sync::Arc::new(driver) as BackendDriverRef)
            }
        }),
        berth_backend_kubernetes::BACKEND_NAME => Some(match &config.kubernetes {
            None => missing("--kube-namespace"),
            Some(kubernetes) => {
                let kubernetes = berth_backend_kubernetes::KubernetesConfig {
                    cluster_prefix: config.key_prefix.clone(),
                    ..kubernetes.clone()
                };
                berth_backend_kubernetes::KubernetesDriver::new(kubernetes)
                    .map(|driver| std::sync::Arc::new(driver) as BackendDriverRef)
            }
        }),
        _ => None,
    }
}
