//! The E2B backend: each workspace is an E2B sandbox created from a template, found again
//! by its metadata (`berth.workspace.id`, `berth.cluster`), driven through E2B's platform
//! API and, inside the sandbox, envd (connect-rpc with the JSON codec over HTTP/1.1, file
//! bytes over `/files`) — all with the tree's one `reqwest`. Portable: a gateway that
//! dies leaves the sandbox where another gateway adopts it with its files.
//!
//! Lifecycle: provision → create (or adopt: record the new generation in the sandbox,
//! connect, which resumes it); release → pause (files kept); destroy → kill every sandbox
//! of the id. See `driver.rs` for fencing and `labels.rs` for the metadata.

mod api;
mod backend;
mod config;
mod driver;
mod envd;
mod files;
mod generation;
mod http;
mod labels;
mod process;
mod resolve;
mod scripts;

pub use backend::E2bBackend;
pub use config::{BACKEND_NAME, E2bConfig};
pub use driver::E2bDriver;
pub use labels::{CLUSTER, GENERATION, OWNER, WORKSPACE_ID};
