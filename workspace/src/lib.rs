//! The Berth workspace contract (docs/design.md §3): what a workspace is, as types and one
//! seam, with no backend and no transport in it.
//!
//! A workspace is a directory plus an execution environment with a fixed layout. Each
//! backend implements three primitives ([`Backend`]: spawn, read_file, write_file); every
//! other operation is derived from them (`exec.rs` drives processes, `posix.rs` runs file
//! operations as POSIX tools). [`BackendDriver`] creates and removes the runtimes on a node.
//! The data of the contract's features (MCP declarations, skills, offload, trees) lives
//! here too, so `berth-proto` and the control plane can validate requests without linking
//! a backend SDK; their implementations are in `berth-features`, the backends in
//! `backends/*`. This crate knows nothing of gRPC or the registry.

pub mod backend;
pub mod driver;
pub mod error;
pub mod exec;
pub mod file;
pub mod id;
pub mod layout;
pub mod mcp;
pub mod offload;
pub mod path;
pub mod posix;
pub mod process;
pub mod skills;
pub mod spec;
pub mod tree;

pub use backend::{
    Backend, BackendRef, ByteStream, Capabilities, ExecEvent, ExecOutput, ExecSpec, ExitInfo, FileInfo, FileKind,
    ProcessControl, SpawnRole, SpawnSpec, Spawned, WriteOptions,
};
pub use driver::{BackendDriver, BackendDriverRef, LabelledSandbox, Placement, PoolLevel, ProvisionContext};
pub use error::{Result, WorkspaceError};
pub use id::{WorkspaceId, validate_id};
pub use path::{RelPath, join_path};
pub use spec::WorkspaceSpec;
