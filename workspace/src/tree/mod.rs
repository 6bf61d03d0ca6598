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
//! [`Backend`]: crate::backend::Backend

mod extract;
mod pack;

pub use extract::{ExtractStats, extract, upload};
pub use pack::pack;

/// Bounds of one archive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeLimits {
    /// Most content bytes (the sum of file sizes, hardlink copies included).
    pub max_bytes: u64,
    /// Most entries (files, directories, links).
    pub max_files: u64,
}

impl TreeLimits {
    /// 64 MiB and 10 000 entries.
    pub const DEFAULT: TreeLimits = TreeLimits { max_bytes: 64 * 1024 * 1024, max_files: 10_000 };

    /// Bytes of tar framing allowed on top of the content (headers, long names, PAX
    /// records): the decompressed stream is cut off past content plus this.
    fn framing_allowance(&self) -> u64 {
        self.max_files.saturating_add(16).saturating_mul(3 * 512).saturating_add(1024 * 1024)
    }
}

impl Default for TreeLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Prefix of the temporary directories extraction works in (`.berth-tree-<random>`).
pub const TEMP_PREFIX: &str = ".berth-tree-";

/// A fresh temp directory name below `parent`.
pub(crate) fn temp_dir_in(parent: &crate::path::RelPath) -> crate::error::Result<crate::path::RelPath> {
    parent.join(&format!("{TEMP_PREFIX}{:016x}", rand::random::<u64>()))
}
