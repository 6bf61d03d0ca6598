//! The `opensandbox` backend: each workspace is an OpenSandbox sandbox, driven through the
//! server's lifecycle REST API (`lifecycle.rs`) and the execd API inside the sandbox
//! (`execd.rs`), with the tree's one `reqwest`. Portable: the sandbox holds the files, a
//! gateway holds nothing, and any gateway of the same cluster finds a sandbox by its labels
//! (`labels.rs`) and adopts it (`driver.rs`).
//!
//! Inside the sandbox (`scripts/`): workspace processes run as an unprivileged user
//! (default 1000:1000) and secret holders as another (64000:64000), through execd's
//! `uid`/`gid`; paths resolve inside the workspace root (`resolve.sh`); content moves as the
//! agent user, never through the daemon's root file API (`files.rs` says why).
//!
//! Node-agent flags a gateway maps onto [`OpenSandboxConfig`]:
//! `--opensandbox-url`, `--opensandbox-api-key-file`, `--opensandbox-execd-token-file`,
//! `--opensandbox-image`, `--opensandbox-cpu-millis`, `--opensandbox-memory-bytes`,
//! `--opensandbox-sandbox-timeout`, `--opensandbox-retry-deadline`,
//! `--opensandbox-request-timeout` (cli/src/commands/server/cloud.rs); the cluster prefix is
//! the replica's key prefix.

mod backend;
mod config;
mod driver;
mod execd;
mod files;
mod http;
mod labels;
mod lifecycle;
mod process;
mod sandbox;
mod scripts;

pub use backend::OpenSandboxBackend;
pub use config::{BACKEND_NAME, DEFAULT_AGENT_USER, DEFAULT_SECRET_HOLDER_USER, OpenSandboxConfig};
pub use driver::{EXECD_PORT, OpenSandboxDriver};
/// Metadata keys of Berth sandboxes (for tests and operators' tooling).
pub mod label_keys {
    pub use crate::labels::{CLUSTER, GENERATION, OWNER, WORKSPACE, WORKSPACE_ID_CHUNK};
    /// The value of [`CLUSTER`] for a cluster key prefix.
    pub fn cluster_value(prefix: &str) -> String {
        crate::labels::cluster_value(prefix)
    }
    /// The value of [`WORKSPACE`] for a workspace id.
    pub fn workspace_value(id: &berth_workspace::id::WorkspaceId) -> String {
        crate::labels::workspace_value(id)
    }
}
