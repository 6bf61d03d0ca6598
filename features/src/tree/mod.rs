//! Directory trees in and out of a workspace as tar streams, through the [`Backend`]
//! primitives only (so every backend gets them): [`extract`] lands a tar / tar.gz stream in
//! a fresh directory with traversal, link, type and size checks; [`upload`] puts such a
//! tree at a destination atomically; [`pack`] streams a directory out as tar.
//!
//! What an archive may hold: regular files, directories, symlinks whose target stays
//! inside the archive's root (lexically), and hardlinks to a file extracted earlier from the
//! same archive (copied, not linked). Refused, failing the whole archive: absolute paths,
//! `..` components, a path through a symlink of the archive, a symlink or hardlink leading
//! elsewhere, device nodes, FIFOs, sparse and unknown entry types, duplicate names, more
//! than [`TreeLimits::max_files`] entries or [`TreeLimits::max_bytes`] of content (checked
//! against each header's size *before* reading the data), a truncated stream. On any refusal
//! the partly extracted directory is removed: nothing is left behind.
//!
//! [`Backend`]: berth_workspace::backend::Backend

mod extract;
mod pack;

pub use berth_workspace::tree::{ExtractStats, TreeLimits};
pub use extract::{TEMP_PREFIX, extract, upload};
pub use pack::pack;
