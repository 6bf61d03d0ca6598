//! The `kubernetes` backend: each workspace is a PersistentVolumeClaim (its files, mounted
//! at the workspace root) and, while it is live, a Pod on it, in one namespace, driven
//! through the API server with kube-rs (`api.rs`). Portable: the PVC holds the files, a
//! gateway holds nothing, and any gateway of the same cluster finds a workspace's objects
//! by their labels (`labels.rs`) and adopts them (`driver.rs`).
//!
//! Inside the Pod (`manifests.rs`, `scripts/`): workspace processes run in the `workspace`
//! container as an unprivileged user (default 1000:1000), secret holders in the
//! `secret-holder` container as another (64000:64000) without the workspace; both
//! hardened (non-root, no privilege escalation, read-only root, no capabilities, no
//! service-account token). Processes and files go through `pods/exec` over the websocket
//! channel protocol (`remote.rs`, `process.rs`, `files.rs`), paths resolved inside the root
//! by `resolve.sh`.
//!
//! Node-agent flags a gateway maps onto [`KubernetesConfig`]: `--kube-config-file` (else
//! the in-cluster service account), `--kube-context`, `--kube-namespace`, `--kube-image`,
//! `--kube-storage-class`, `--kube-storage-size`, `--kube-pull-secret` (repeatable),
//! `--kube-cpu-millis`, `--kube-memory-bytes`, `--kube-pod-ready-timeout`; the cluster
//! prefix is the replica's key prefix.

mod api;
mod backend;
mod config;
mod driver;
mod files;
mod labels;
mod manifests;
mod process;
mod remote;
mod scripts;

pub use backend::KubernetesBackend;
pub use config::{
    BACKEND_NAME, DEFAULT_AGENT_USER, DEFAULT_SECRET_HOLDER_USER, KubernetesConfig, STATE_DIR, WORKSPACE_DIR,
};
pub use driver::KubernetesDriver;
pub use manifests::{HOLDER_CONTAINER, WORKSPACE_CONTAINER};

/// Label keys of Berth objects (for tests and operators' tooling).
pub mod label_keys {
    pub use crate::labels::{CLUSTER, GENERATION, OWNER, WORKSPACE};
    /// The value of [`CLUSTER`] for a cluster key prefix.
    pub fn cluster_value(prefix: &str) -> String {
        crate::labels::cluster_value(prefix)
    }
    /// The selector of one cluster's objects.
    pub fn cluster_selector(prefix: &str) -> String {
        crate::labels::cluster_selector(prefix)
    }
    /// The selector of one workspace's objects in one cluster.
    pub fn workspace_selector(prefix: &str, id: &berth_workspace::id::WorkspaceId) -> String {
        crate::labels::selector(prefix, id)
    }
}
