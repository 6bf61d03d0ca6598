//! A Kubernetes API-server emulator (tests/kubernetes-emulator) per test, and a driver on it.

#![allow(dead_code)]

use std::time::Duration;

use berth_backend_kubernetes::{KubernetesConfig, KubernetesDriver};
use berth_kubernetes_emulator::{Emulator, EmulatorConfig};
use berth_testkit::Fixture;
use berth_workspace::{BackendDriver, ProvisionContext, WorkspaceId, WorkspaceSpec};

pub const NAMESPACE: &str = "berth-test";

/// The suites plant files in `..` of the root, which must be private and writable: the
/// Pod's own `/tmp` is.
pub const SUITE_ROOT: &str = "/tmp/ws";

pub struct Cluster {
    pub emulator: Emulator,
    pub driver: KubernetesDriver,
    pub prefix: String,
}

pub fn config_for(emulator: &Emulator, prefix: &str) -> KubernetesConfig {
    let mut config = KubernetesConfig::new(Some(emulator.kubeconfig.clone()), NAMESPACE, prefix);
    config.image = "berth/base:emulated".into();
    config.storage_size = "1Gi".into();
    config.pod_ready_timeout = Duration::from_secs(60);
    config.retry_deadline = Duration::from_secs(20);
    config
}

pub async fn cluster_with(edit: impl FnOnce(&mut KubernetesConfig)) -> Cluster {
    let emulator = Emulator::start(EmulatorConfig::for_test()).await.expect("start the kubernetes emulator");
    let prefix = format!("/berth-test-{:x}", rand::random::<u32>());
    let mut config = config_for(&emulator, &prefix);
    edit(&mut config);
    let driver = KubernetesDriver::connect(config).await.expect("connect to the emulator");
    Cluster { emulator, driver, prefix }
}

pub async fn cluster() -> Cluster {
    cluster_with(|_| {}).await
}

pub async fn suite_fixture() -> Fixture<Cluster> {
    let cluster = cluster_with(|config| config.workspace_dir = SUITE_ROOT.to_owned()).await;
    let id = WorkspaceId::new("ws-suite").unwrap();
    let root = std::env::temp_dir();
    let backend = cluster
        .driver
        .provision(ProvisionContext::unplaced(&id, &root, &WorkspaceSpec::default()))
        .await
        .unwrap_or_else(|error| panic!("provision the suite's pod: {error}"));
    Fixture::new(backend, cluster)
}
