//! An emulator of Daytona for Berth's tests: the API (`Authorization: Bearer`, optional
//! `X-Daytona-Organization-ID`; create with labels, list by labels with cursor paging, get,
//! start, stop, delete, label replace) and the toolbox every sandbox serves behind its
//! `toolboxProxyUrl` (`/{sandboxId}/process/execute`, sessions, bulk upload / download,
//! files list / info / delete / move / folder).
//!
//! No real Daytona can be reached from the test machines, so this stands in for it; the
//! official Python SDK drives it in this crate's `tests/sdk_validation.rs` to prove it
//! speaks the published protocol. Emulated sandboxes are the E2B emulator's: a directory
//! and a bubblewrap init holding the sandbox's namespaces, every process entering them with
//! `nsenter`. Stop ends every process and keeps the files; start runs a fresh init over
//! them. See the README beside this crate for what is and is not emulated.

pub mod api;
pub mod files;
pub mod multipart;
pub mod reply;
pub mod server;
pub mod state;
pub mod toolbox;

pub use berth_e2b_emulator::{Fault, FaultTarget};
pub use server::{Emulator, EmulatorConfig};
