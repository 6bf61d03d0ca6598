//! Cloud providers for the gateway tests (`tests/cloud_gateways.rs`): each one starts the
//! provider (an emulator where no real service can run here), tells node agents how to reach
//! it, and answers what the provider holds — the ground truth the tests count, never the
//! replicas' answers.

use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use berth_workspace::driver::BackendDriver;
use berth_workspace::{Placement, ProvisionContext, WorkspaceId, WorkspaceSpec};

/// How a provider's official client reaches it: the `.ci/venv` area that holds the client,
/// and the environment its scripts read (the provider's own variable names where it has them).
pub struct Sdk {
    pub venv_area: &'static str,
    pub env: Vec<(&'static str, String)>,
}

/// One provider a cluster's gateways drive.
#[async_trait]
pub trait CloudProvider: Send + Sync {
    /// The backend name node agents offer it as (`--backend NAME`).
    fn backend(&self) -> &'static str;
    /// Node-agent flags reaching this provider (credentials from files).
    fn node_flags(&self) -> Vec<String>;
    /// Sandboxes labelled with cluster `key_prefix` and workspace `workspace_id`.
    async fn sandboxes_of(&self, key_prefix: &str, workspace_id: &str) -> Vec<String>;
    /// Whether the provider holds the sandbox paused / stopped / scaled to zero.
    async fn is_paused(&self, sandbox: &str) -> bool;
    /// Makes a sandbox labelled for cluster `key_prefix` and `workspace_id` behind Berth's
    /// back (the provider's own API, as a stray script or a lost bind would).
    /// Retried while the provider is unavailable (a loaded machine can break a fresh
    /// sandbox's first command stream): the orphan is the test's setup, not what it checks.
    async fn create_orphan(&self, key_prefix: &str, workspace_id: &str) -> anyhow::Result<()> {
        let driver = self.driver(key_prefix).await?;
        let id = WorkspaceId::new(workspace_id)?;
        let root = std::env::temp_dir();
        let spec = WorkspaceSpec::default();
        let placement = Placement { generation: 1, owner: "stray", fresh: true };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let context = ProvisionContext { workspace_id: &id, root: &root, spec: &spec, placement };
            match driver.provision(context).await {
                Ok(_) => return Ok(()),
                Err(berth_workspace::WorkspaceError::BackendUnavailable { .. })
                    if std::time::Instant::now() < deadline =>
                {
                    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
                }
                Err(error) => return Err(error.into()),
            }
        }
    }
    /// The driver a gateway of cluster `key_prefix` builds from [`node_flags`](Self::node_flags).
    async fn driver(&self, key_prefix: &str) -> anyhow::Result<Arc<dyn BackendDriver>>;
    /// The provider's official client, for floors measured against the same provider.
    fn sdk(&self) -> Sdk;
    /// What answers: "emulator" where the provider is emulated here, else what is real.
    fn fidelity(&self) -> &'static str;
}

/// E2B, through its emulator (`tests/e2b-emulator`); its sandboxes run under bubblewrap.
pub struct E2bProvider {
    pub emulator: berth_e2b_emulator::Emulator,
    key_file: PathBuf,
    _dir: tempfile::TempDir,
}

const E2B_KEY: &str = "e2b-emulated-key-0123456789";

impl E2bProvider {
    pub async fn start() -> anyhow::Result<Self> {
        let emulator =
            berth_e2b_emulator::Emulator::start(berth_e2b_emulator::EmulatorConfig::for_test(E2B_KEY)).await?;
        let dir = tempfile::Builder::new().prefix("berth-e2b-key-").tempdir()?;
        let key_file = dir.path().join("e2b.key");
        std::fs::write(&key_file, E2B_KEY)?;
        Ok(Self { emulator, key_file, _dir: dir })
    }
}

#[async_trait]
impl CloudProvider for E2bProvider {
    fn backend(&self) -> &'static str {
        berth_backend_e2b::BACKEND_NAME
    }

    fn node_flags(&self) -> Vec<String> {
        [
            "--backend",
            "e2b",
            "--e2b-api-key-file",
            &self.key_file.display().to_string(),
            "--e2b-api-url",
            &self.emulator.api_url,
            "--e2b-sandbox-url",
            &self.emulator.sandbox_url,
        ]
        .iter()
        .map(|flag| (*flag).to_owned())
        .collect()
    }

    async fn sandboxes_of(&self, key_prefix: &str, workspace_id: &str) -> Vec<String> {
        let prefix = key_prefix.trim_end_matches('/');
        self.emulator
            .sandbox_ids()
            .into_iter()
            .filter(|id| {
                self.emulator.metadata(id).is_some_and(|metadata| {
                    metadata.get(berth_backend_e2b::CLUSTER).map(String::as_str) == Some(prefix)
                        && metadata.get(berth_backend_e2b::WORKSPACE_ID).map(String::as_str) == Some(workspace_id)
                })
            })
            .collect()
    }

    async fn is_paused(&self, sandbox: &str) -> bool {
        self.emulator.is_paused(sandbox).await == Some(true)
    }

    async fn driver(&self, key_prefix: &str) -> anyhow::Result<Arc<dyn BackendDriver>> {
        let config = berth_backend_e2b::E2bConfig {
            api_url: self.emulator.api_url.clone(),
            sandbox_url: Some(self.emulator.sandbox_url.clone()),
            ..berth_backend_e2b::E2bConfig::new(&self.key_file, key_prefix)
        };
        Ok(Arc::new(berth_backend_e2b::E2bDriver::new(config)?))
    }

    fn sdk(&self) -> Sdk {
        Sdk {
            venv_area: "e2b",
            env: vec![
                ("E2B_API_URL", self.emulator.api_url.clone()),
                ("E2B_SANDBOX_URL", self.emulator.sandbox_url.clone()),
                ("E2B_API_KEY", E2B_KEY.to_owned()),
            ],
        }
    }

    fn fidelity(&self) -> &'static str {
        "emulator (tests/e2b-emulator)"
    }
}

/// OpenSandbox: the real `opensandbox-server` with its Docker runtime and the execd stand-in
/// (`berth_testkit::opensandbox_server`, shared by the run's test processes). The provider's
/// ground truth is its Docker runtime: one container per sandbox, carrying the create-time
/// labels.
pub struct OpenSandboxProvider {
    server: &'static berth_testkit::opensandbox_server::Server,
}

impl OpenSandboxProvider {
    pub async fn start() -> anyhow::Result<Self> {
        let server = tokio::task::spawn_blocking(berth_testkit::opensandbox_server::server).await?;
        Ok(Self { server })
    }

    fn config(&self, key_prefix: &str) -> berth_backend_opensandbox::OpenSandboxConfig {
        berth_backend_opensandbox::OpenSandboxConfig {
            api_key_file: Some(self.server.api_key_file.clone()),
            image: self.server.image.clone(),
            retry_deadline: std::time::Duration::from_secs(30),
            ..berth_backend_opensandbox::OpenSandboxConfig::new(self.server.url.clone(), key_prefix)
        }
    }

    async fn docker(args: &[&str]) -> String {
        let output = tokio::process::Command::new("docker").args(args).output().await;
        output.map(|output| String::from_utf8_lossy(&output.stdout).into_owned()).unwrap_or_default()
    }
}

#[async_trait]
impl CloudProvider for OpenSandboxProvider {
    fn backend(&self) -> &'static str {
        berth_backend_opensandbox::BACKEND_NAME
    }

    fn node_flags(&self) -> Vec<String> {
        [
            "--backend",
            "opensandbox",
            "--opensandbox-url",
            &self.server.url,
            "--opensandbox-api-key-file",
            &self.server.api_key_file.display().to_string(),
            "--opensandbox-image",
            &self.server.image,
            "--opensandbox-retry-deadline",
            "30s",
        ]
        .iter()
        .map(|flag| (*flag).to_owned())
        .collect()
    }

    async fn sandboxes_of(&self, key_prefix: &str, workspace_id: &str) -> Vec<String> {
        use berth_backend_opensandbox::label_keys;
        let Ok(id) = WorkspaceId::new(workspace_id) else { return Vec::new() };
        let cluster = format!("label={}={}", label_keys::CLUSTER, label_keys::cluster_value(key_prefix));
        let workspace = format!("label={}={}", label_keys::WORKSPACE, label_keys::workspace_value(&id));
        let args = ["ps", "-aq", "--no-trunc", "--filter", &cluster, "--filter", &workspace];
        let listed = Self::docker(&args).await;
        let mut containers: Vec<String> = listed.split_whitespace().map(str::to_owned).collect();
        containers.sort();
        containers
    }

    async fn is_paused(&self, sandbox: &str) -> bool {
        let args = ["inspect", "--format", "{{.State.Paused}}", sandbox];
        Self::docker(&args).await.trim() == "true"
    }

    async fn driver(&self, key_prefix: &str) -> anyhow::Result<Arc<dyn BackendDriver>> {
        Ok(Arc::new(berth_backend_opensandbox::OpenSandboxDriver::new(self.config(key_prefix))?))
    }

    fn sdk(&self) -> Sdk {
        Sdk {
            venv_area: "opensandbox",
            env: vec![
                ("OPENSANDBOX_DOMAIN", self.server.url.trim_start_matches("http://").to_owned()),
                ("OPENSANDBOX_API_KEY", self.server.api_key.clone()),
                ("BERTH_OPENSANDBOX_IMAGE", self.server.image.clone()),
            ],
        }
    }

    fn fidelity(&self) -> &'static str {
        "real opensandbox-server (Docker runtime); in-sandbox execd is the stand-in (tests/opensandbox-execd-standin)"
    }
}

/// Daytona, through its emulator (`tests/daytona-emulator`); its sandboxes run under
/// bubblewrap.
pub struct DaytonaProvider {
    pub emulator: berth_daytona_emulator::Emulator,
    key_file: PathBuf,
    _dir: tempfile::TempDir,
}

const DAYTONA_KEY: &str = "daytona-emulated-key-0123456789";

impl DaytonaProvider {
    pub async fn start() -> anyhow::Result<Self> {
        let emulator =
            berth_daytona_emulator::Emulator::start(berth_daytona_emulator::EmulatorConfig::for_test(DAYTONA_KEY))
                .await?;
        let dir = tempfile::Builder::new().prefix("berth-daytona-key-").tempdir()?;
        let key_file = dir.path().join("daytona.key");
        std::fs::write(&key_file, DAYTONA_KEY)?;
        Ok(Self { emulator, key_file, _dir: dir })
    }
}

#[async_trait]
impl CloudProvider for DaytonaProvider {
    fn backend(&self) -> &'static str {
        berth_backend_daytona::BACKEND_NAME
    }

    fn node_flags(&self) -> Vec<String> {
        [
            "--backend",
            "daytona",
            "--daytona-api-key-file",
            &self.key_file.display().to_string(),
            "--daytona-api-url",
            &self.emulator.api_url,
        ]
        .iter()
        .map(|flag| (*flag).to_owned())
        .collect()
    }

    async fn sandboxes_of(&self, key_prefix: &str, workspace_id: &str) -> Vec<String> {
        let prefix = key_prefix.trim_end_matches('/');
        self.emulator
            .sandbox_ids()
            .into_iter()
            .filter(|id| {
                self.emulator.labels(id).is_some_and(|labels| {
                    labels.get(berth_backend_daytona::CLUSTER).map(String::as_str) == Some(prefix)
                        && labels.get(berth_backend_daytona::WORKSPACE_ID).map(String::as_str) == Some(workspace_id)
                })
            })
            .collect()
    }

    async fn is_paused(&self, sandbox: &str) -> bool {
        self.emulator.is_stopped(sandbox).await == Some(true)
    }

    async fn driver(&self, key_prefix: &str) -> anyhow::Result<Arc<dyn BackendDriver>> {
        let config = berth_backend_daytona::DaytonaConfig {
            api_url: self.emulator.api_url.clone(),
            ..berth_backend_daytona::DaytonaConfig::new(&self.key_file, key_prefix)
        };
        Ok(Arc::new(berth_backend_daytona::DaytonaDriver::new(config)?))
    }

    fn sdk(&self) -> Sdk {
        Sdk {
            venv_area: "daytona",
            env: vec![("DAYTONA_API_URL", self.emulator.api_url.clone()), ("DAYTONA_API_KEY", DAYTONA_KEY.to_owned())],
        }
    }

    fn fidelity(&self) -> &'static str {
        "emulator (tests/daytona-emulator)"
    }
}

/// Kubernetes, through the API-server emulator (`tests/kubernetes-emulator`); a sandbox is
/// a workspace's PVC (named by the provider id), paused when no Pod runs on it.
pub struct KubernetesProvider {
    pub emulator: berth_kubernetes_emulator::Emulator,
}

/// The namespace the gateways of the Kubernetes tests use.
pub const KUBE_NAMESPACE: &str = "berth-gateways";

impl KubernetesProvider {
    pub async fn start() -> anyhow::Result<Self> {
        let config = berth_kubernetes_emulator::EmulatorConfig {
            namespace: KUBE_NAMESPACE.to_owned(),
            ..berth_kubernetes_emulator::EmulatorConfig::for_test()
        };
        Ok(Self { emulator: berth_kubernetes_emulator::Emulator::start(config).await? })
    }
}

#[async_trait]
impl CloudProvider for KubernetesProvider {
    fn backend(&self) -> &'static str {
        berth_backend_kubernetes::BACKEND_NAME
    }

    fn node_flags(&self) -> Vec<String> {
        [
            "--backend",
            "kubernetes",
            "--kube-config-file",
            &self.emulator.kubeconfig.display().to_string(),
            "--kube-namespace",
            KUBE_NAMESPACE,
            "--kube-image",
            "berth/base:emulated",
            "--kube-storage-size",
            "1Gi",
        ]
        .iter()
        .map(|flag| (*flag).to_owned())
        .collect()
    }

    async fn sandboxes_of(&self, key_prefix: &str, workspace_id: &str) -> Vec<String> {
        let Ok(id) = WorkspaceId::new(workspace_id) else { return Vec::new() };
        let selector = berth_backend_kubernetes::label_keys::workspace_selector(key_prefix.trim_end_matches('/'), &id);
        let mut names: Vec<String> = self
            .emulator
            .list(berth_kubernetes_emulator::PVCS, KUBE_NAMESPACE, &selector)
            .iter()
            .filter_map(|pvc| pvc["metadata"]["name"].as_str().map(str::to_owned))
            .collect();
        names.sort();
        names
    }

    async fn is_paused(&self, sandbox: &str) -> bool {
        let pods = self.emulator.list(berth_kubernetes_emulator::PODS, KUBE_NAMESPACE, "");
        !pods.iter().any(|pod| {
            pod["spec"]["volumes"].as_array().is_some_and(|volumes| {
                volumes.iter().any(|volume| volume["persistentVolumeClaim"]["claimName"].as_str() == Some(sandbox))
            })
        })
    }

    async fn driver(&self, key_prefix: &str) -> anyhow::Result<Arc<dyn BackendDriver>> {
        let config = berth_backend_kubernetes::KubernetesConfig {
            image: "berth/base:emulated".to_owned(),
            storage_size: "1Gi".to_owned(),
            ..berth_backend_kubernetes::KubernetesConfig::new(
                Some(self.emulator.kubeconfig.clone()),
                KUBE_NAMESPACE,
                key_prefix.trim_end_matches('/'),
            )
        };
        Ok(Arc::new(berth_backend_kubernetes::KubernetesDriver::connect(config).await?))
    }

    fn sdk(&self) -> Sdk {
        Sdk {
            venv_area: "kubernetes",
            env: vec![
                ("KUBECONFIG", self.emulator.kubeconfig.display().to_string()),
                ("BERTH_KUBE_NAMESPACE", KUBE_NAMESPACE.to_owned()),
            ],
        }
    }

    fn fidelity(&self) -> &'static str {
        "emulator (tests/kubernetes-emulator API server)"
    }
}
