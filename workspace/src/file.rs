//! Files as the contract names them: chunk streams, write options, entry metadata.

use std::time::SystemTime;

use bytes::Bytes;
use futures::stream::BoxStream;

use crate::error::Result;
use crate::path::RelPath;

/// A stream of file chunks. Errors before the first chunk are returned by the call that
/// made the stream; errors later arrive in the stream.
pub type ByteStream = BoxStream<'static, Result<Bytes>>;

/// Chunk size of file streams on the wire when the caller names none. A backend's
/// [`ByteStream`] may yield larger pieces; the node agent cuts them to the size asked for.
pub const DEFAULT_CHUNK_BYTES: usize = 64 * 1024;

/// Options of a file write.
#[derive(Clone, Copy, Debug)]
pub struct WriteOptions {
    /// Permission bits of a new file.
    pub mode: u32,
    /// Largest file accepted; the write fails with `LimitExceeded` past it and leaves nothing.
    pub max_bytes: u64,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self { mode: 0o644, max_bytes: u64::MAX }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other,
}

/// Metadata of one entry. Symlinks are reported as such, not followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    pub path: RelPath,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub modified: Option<SystemTime>,
}

impl FileInfo {
    pub fn name(&self) -> &str {
        self.path.file_name().unwrap_or(".")
    }
}
