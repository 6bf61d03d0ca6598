//! Host backends: workspaces whose files are a directory on the node's disk.
//!
//! [`HostFs`] is the file half every host backend shares (cap-std confinement, atomic
//! writes, native `stat` / `rename` / `symlink`); [`LocalBackend`] runs commands as the
//! node agent's own user with no sandbox at all — for trusted single-operator setups only.

pub mod hostfs;
pub mod local;

pub use hostfs::HostFs;
pub use local::{LocalBackend, LocalDriver};
