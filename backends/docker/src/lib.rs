//! The `docker` backend: one container per workspace, driven through the Docker Engine API
//! (bollard).
//!
//! - [`DockerDriver`] (`driver.rs`) creates, starts, stops, removes and adopts containers.
//! - [`DockerBackend`] (`backend.rs`) implements the three primitives through the
//!   container's supervisor or Docker exec;
//!   the derived operations come from `posix.rs`.
//! - `supervised.rs`: the container's resident supervisor, which runs the workspace
//!   user's execs without a Docker exec each.
//! - `process.rs`: spawn and kill of exec process trees. `files.rs`: confined, atomic
//!   file I/O. `scripts/`: the shell side of both.
//!
//! Security posture (docs/design.md §5): `network_mode=none` always; a networked workspace's
//! container gets pasta and the node's address policy in that namespace (`network.rs`),
//! all capabilities dropped, `no-new-privileges`, memory (without swap) / CPU / pids
//! limits, an init process reaping orphans, processes running as an unprivileged uid.

mod backend;
mod config;
mod container;
mod driver;
mod errors;
mod exec_api;
mod files;
mod kill;
pub mod network;
mod pool;
mod process;
mod scripts;
mod supervised;

pub use backend::DockerBackend;
pub use config::{
    BACKEND_NAME, BASE_IMAGE_USER, DEFAULT_IMAGE, DEFAULT_MOUNT_POINT, DEFAULT_SUPERVISOR_DIR, DEFAULT_SUPERVISOR_IDLE,
    DockerConfig, NODE_LABEL, POOL_LABEL, ROOT_LABEL, SECRET_HOLDER_USER, SPEC_LABEL_PREFIX, SUPERVISOR_LABEL,
    SupervisorLayout, WORKSPACE_LABEL, WarmPoolConfig, container_name, pool_container_name,
};
pub use driver::DockerDriver;
pub use supervised::{CONTAINER_BINARY, CONTAINER_RUN_DIR, CONTAINER_SOCKET};
