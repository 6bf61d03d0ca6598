//! The Berth workspace contract (DESIGN.md §3) and its backends.
//!
//! A workspace is a directory plus an execution environment with a fixed layout. Each
//! backend implements three primitives ([`Backend`]: spawn, read_file, write_file); every
//! other operation is derived from them. [`BackendDriver`] creates and removes the runtimes
//! on a node. This crate knows nothing of gRPC or the registry.

pub mod backend;
pub mod bubblewrap;
pub mod docker;
pub mod driver;
pub mod error;
pub mod exec;
pub mod hostfs;
pub mod id;
pub mod layout;
pub mod local;
pub mod mcp;
pub mod offload;
pub mod path;
pub mod posix;
pub mod skills;
pub mod spec;
#[doc(hidden)]
pub mod testing;
pub mod tree;

pub use backend::{
    Backend, BackendRef, ByteStream, ExecEvent, ExecOutput, ExecSpec, ExitInfo, FileInfo, FileKind, ProcessControl,
    SpawnSpec, Spawned, WriteOptions,
};
pub use bubblewrap::{BubblewrapBackend, BubblewrapConfig, BubblewrapDriver};
pub use docker::{DockerBackend, DockerConfig, DockerDriver};
pub use driver::{BackendDriver, BackendDriverRef, ProvisionContext};
pub use error::{Result, WorkspaceError};
pub use hostfs::HostFs;
pub use id::{WorkspaceId, validate_id};
pub use local::{LocalBackend, LocalDriver};
pub use path::{RelPath, join_path};
pub use spec::WorkspaceSpec;
