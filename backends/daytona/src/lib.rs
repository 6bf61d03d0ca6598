//! The Daytona backend: each workspace is a Daytona sandbox found again by its labels
//! (`berth.workspace.id`, `berth.cluster`), driven through Daytona's API and, inside the
//! sandbox, its toolbox (`process/execute`, sessions, bulk file transfer) — all with the
//! tree's one `reqwest`. Portable: a gateway that dies leaves the sandbox where another
//! gateway adopts it with its files.
//!
//! Lifecycle: provision → create (or adopt: start it when stopped, record the new
//! generation in the sandbox and its labels); release → stop (files kept); destroy →
//! delete every sandbox of the id. See `driver.rs` for fencing, `process.rs` for how
//! stdout, stderr and stdin stay apart over the toolbox, `labels.rs` for the labels.

mod api;
mod backend;
mod config;
mod driver;
mod files;
mod http;
mod labels;
mod multipart;
mod process;
mod scripts;
mod toolbox;

pub use backend::DaytonaBackend;
pub use config::{BACKEND_NAME, DaytonaConfig};
pub use driver::DaytonaDriver;
pub use labels::{CLUSTER, GENERATION, OWNER, WORKSPACE_ID};
