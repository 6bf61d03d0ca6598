//! Directory trees as tar streams, the contract's data: the bounds of one archive and what
//! an extraction put on disk. Extraction and packing are in `berth-features`.

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
    pub fn framing_allowance(&self) -> u64 {
        self.max_files.saturating_add(16).saturating_mul(3 * 512).saturating_add(1024 * 1024)
    }
}

impl Default for TreeLimits {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// What one archive put on disk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExtractStats {
    pub files: u64,
    pub directories: u64,
    pub symlinks: u64,
    /// Content bytes written (hardlink copies included).
    pub bytes: u64,
}
