//! Host backends: workspaces whose files are a directory on the node's disk.
//!
//! [`HostFs`] is the file half every host backend shares (cap-std confinement, atomic
//! writes, native `stat` / `rename` / `symlink`); [`LocalBackend`] runs commands as the
//! node agent's own user with no sandbox at all — for trusted single-operator setups only.
//! [`netns`] gives networked sandboxes of the other host backends (bubblewrap, Docker) a
//! network namespace of their own behind pasta, with the address policy in [`netns::policy`].

mod blocks;
pub mod hostfs;
pub mod local;
pub mod netns;

pub use hostfs::HostFs;
pub use local::{LocalBackend, LocalDriver};
