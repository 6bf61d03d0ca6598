//! Test support: one cluster prefix per test over the run's shared real `opensandbox-server`
//! (`berth_testkit::opensandbox_server`: started by the first test process of the run, joined
//! by the others). Each test removes its own cluster's containers when it ends (`Cluster`'s
//! drop).

#![allow(dead_code)]

use std::time::Duration;

use berth_backend_opensandbox::{OpenSandboxConfig, OpenSandboxDriver, label_keys};
pub use berth_testkit::opensandbox_server::{docker, server};

/// Containers carrying a cluster's label.
pub fn cluster_containers(prefix: &str) -> Vec<String> {
    let filter = format!("label={}={}", label_keys::CLUSTER, label_keys::cluster_value(prefix));
    docker(&["ps", "-aq", "--filter", &filter]).split_whitespace().map(str::to_owned).collect()
}
/// One test's cluster: its own key prefix and driver; its containers go when it drops.
pub struct Cluster {
    pub prefix: String,
    pub driver: OpenSandboxDriver,
}

pub fn config(prefix: &str) -> OpenSandboxConfig {
    let server = server();
    let mut config = OpenSandboxConfig::new(server.url.clone(), prefix);
    config.api_key_file = Some(server.api_key_file.clone());
    config.image = server.image.clone();
    config.retry_deadline = Duration::from_secs(30);
    config
}

impl Cluster {
    pub fn new() -> Self {
        Self::with_config(|_| {})
    }

    pub fn with_config(adjust: impl FnOnce(&mut OpenSandboxConfig)) -> Self {
        let prefix = format!("/berth-test/{}", hex::encode(rand::random::<[u8; 8]>()));
        Self::with_prefix(prefix, adjust)
    }

    pub fn with_prefix(prefix: String, adjust: impl FnOnce(&mut OpenSandboxConfig)) -> Self {
        let mut config = config(&prefix);
        adjust(&mut config);
        let driver = OpenSandboxDriver::new(config).expect("a valid driver config");
        Self { prefix, driver }
    }

    /// Another gateway of the same cluster (its own driver, nothing shared in memory).
    pub fn another_gateway(&self) -> OpenSandboxDriver {
        OpenSandboxDriver::new(config(&self.prefix)).expect("a valid driver config")
    }

    pub fn containers(&self) -> Vec<String> {
        cluster_containers(&self.prefix)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let left = self.containers();
        if !left.is_empty() {
            let mut args = vec!["rm", "-f", "-v"];
            args.extend(left.iter().map(String::as_str));
            docker(&args);
        }
    }
}
