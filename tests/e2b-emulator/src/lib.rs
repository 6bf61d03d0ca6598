//! An emulator of E2B for Berth's tests: the platform API (`X-API-KEY`; create from a
//! template with metadata and env, list by metadata with `x-next-token` paging, connect /
//! resume, pause, kill, timeout) and envd, the in-sandbox API (connect-rpc with the JSON
//! codec over HTTP/1.1: `process.Process` and `filesystem.Filesystem`, file bytes over
//! `GET/POST /files`), routed by the `E2b-Sandbox-Id` header and guarded by the per-sandbox
//! `X-Access-Token`.
//!
//! No real E2B can be reached from the test machines, so this stands in for it; the
//! official Python SDK drives it in this crate's `tests/sdk_validation.rs` to prove it
//! speaks the published protocol. Each emulated sandbox is a directory (its `/home` and
//! `/tmp`) and a bubblewrap init holding its own user, pid, mount, network, IPC and UTS
//! namespaces; every process started through envd enters those namespaces (`nsenter`),
//! so processes of one sandbox see and signal each other as in a VM. Pause stops every
//! process and keeps the files; resume starts a fresh init over the same files. See the
//! README beside this crate for what is and is not emulated, and [`Fault`] for the
//! fault-injection knob.

pub mod connect;
pub mod faults;
pub mod filesystem;
pub mod gofmt;
pub mod jail;
pub mod platform;
pub mod process;
pub mod server;
pub mod state;
pub mod vfs;

pub use faults::{Fault, FaultTarget};
pub use server::{Emulator, EmulatorConfig};
