//! Tar out: a directory of a workspace as a tar stream, through `list_dir` and `read_file`.
//!
//! Directories and regular files are archived (paths relative to the directory, long
//! names as GNU long-name records); symlinks and special files are left out, so the
//! archive never names anything outside. A file that changes size while it is read is
//! cut or zero-padded to the size its header announced (the stream stays a valid tar).

use std::time::UNIX_EPOCH;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use berth_workspace::backend::{BackendRef, ByteStream, FileInfo, FileKind};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

const BLOCK: usize = 512;
/// Chunks buffered ahead of a slow reader.
const CHANNEL_CHUNKS: usize = 8;
/// Longest name that fits a GNU header's name field.
const NAME_FIELD_BYTES: usize = 100;

/// Streams `dir` as a tar archive. Fails before the first byte when `dir` is not a
/// directory; later failures (a file vanishing mid-read) end the stream with an error.
pub async fn pack(backend: BackendRef, dir: RelPath) -> Result<ByteStream> {
    let listing = backend.list_dir(&dir).await?;
    let (sender, receiver) = mpsc::channel::<Result<Bytes>>(CHANNEL_CHUNKS);
    tokio::spawn(async move {
        let outcome = Packer { backend, base: dir, sender: sender.clone() }.run(listing).await;
        if let Err(error) = outcome {
            // A closed receiver is not an error to report: the reader left.
            if !matches!(error, WorkspaceError::Backend { backend: "tree-reader-gone", .. }) {
                let _ = sender.send(Err(error)).await;
            }
        }
    });
    Ok(ReceiverStream::new(receiver).boxed())
}

struct Packer {
    backend: BackendRef,
    base: RelPath,
    sender: mpsc::Sender<Result<Bytes>>,
}

fn reader_gone() -> WorkspaceError {
    WorkspaceError::Backend { backend: "tree-reader-gone", message: "the reader of the archive went away".into() }
}

impl Packer {
    async fn emit(&self, bytes: Bytes) -> Result<()> {
        self.sender.send(Ok(bytes)).await.map_err(|_| reader_gone())
    }

    async fn run(self, top: Vec<FileInfo>) -> Result<()> {
        // Depth-first with an explicit stack; list_dir sorts, so the order is stable.
        let mut stack: Vec<FileInfo> = top.into_iter().rev().collect();
        while let Some(info) = stack.pop() {
            let name = self.archive_name(&info.path);
            match info.kind {
                FileKind::Directory => {
                    self.emit(header(&format!("{name}/"), &info, tar::EntryType::Directory, 0)?).await?;
                    let children = match self.backend.list_dir(&info.path).await {
                        Ok(children) => children,
                        // Removed meanwhile: archived as an empty directory.
                        Err(WorkspaceError::NotFound { .. }) => Vec::new(),
                        Err(error) => return Err(error),
                    };
                    stack.extend(children.into_iter().rev());
                }
                FileKind::File => self.file(&name, &info).await?,
                FileKind::Symlink | FileKind::Other => {
                    tracing::debug!(path = %info.path, "not archived: not a regular file or directory");
                }
            }
        }
        // End of archive: two zero blocks.
        self.emit(Bytes::from(vec![0u8; 2 * BLOCK])).await
    }

    fn archive_name(&self, path: &RelPath) -> String {
        let full = path.as_str();
        let base = self.base.as_str();
        if base.is_empty() { full.to_owned() } else { full[base.len() + 1..].to_owned() }
    }

    async fn file(&self, name: &str, info: &FileInfo) -> Result<()> {
        let mut stream = match self.backend.read_file(&info.path).await {
            Ok(stream) => stream,
            Err(WorkspaceError::NotFound { .. }) => return Ok(()),
            Err(error) => return Err(error),
        };
        self.emit(header(name, info, tar::EntryType::Regular, info.size)?).await?;
        let mut remaining = info.size;
        while remaining > 0 {
            let Some(chunk) = stream.next().await else { break };
            let mut chunk = chunk?;
            if chunk.len() as u64 > remaining {
                chunk.truncate(remaining as usize);
            }
            remaining -= chunk.len() as u64;
            self.emit(chunk).await?;
        }
        if remaining > 0 {
            tracing::warn!(path = %info.path, missing = remaining, "file shrank while archived; zero-padded");
        }
        let padding = (BLOCK - (info.size as usize % BLOCK)) % BLOCK;
        let mut tail = BytesMut::zeroed(remaining as usize + padding);
        tail.truncate(remaining as usize + padding);
        if !tail.is_empty() {
            self.emit(tail.freeze()).await?;
        }
        Ok(())
    }
}

/// A GNU header (preceded by a long-name record when the name does not fit).
fn header(name: &str, info: &FileInfo, kind: tar::EntryType, size: u64) -> Result<Bytes> {
    let mut out = BytesMut::new();
    let name_bytes = name.as_bytes();
    if name_bytes.len() > NAME_FIELD_BYTES {
        let mut long = tar::Header::new_gnu();
        if let Some(gnu) = long.as_gnu_mut() {
            gnu.name[..13].copy_from_slice(b"././@LongLink");
        }
        long.set_mode(0o644);
        long.set_uid(0);
        long.set_gid(0);
        long.set_mtime(0);
        long.set_size(name_bytes.len() as u64 + 1);
        long.set_entry_type(tar::EntryType::GNULongName);
        long.set_cksum();
        out.extend_from_slice(long.as_bytes());
        out.extend_from_slice(name_bytes);
        let written = name_bytes.len() + 1;
        out.extend_from_slice(&vec![0u8; 1 + (BLOCK - written % BLOCK) % BLOCK]);
    }
    let mut header = tar::Header::new_gnu();
    let gnu = header.as_gnu_mut().ok_or_else(|| WorkspaceError::Backend {
        backend: "tree",
        message: "gnu header without a name field".into(),
    })?;
    let cut = name_bytes.len().min(NAME_FIELD_BYTES);
    gnu.name[..cut].copy_from_slice(&name_bytes[..cut]);
    header.set_mode(info.mode & 0o7777);
    header.set_uid(0);
    header.set_gid(0);
    header.set_size(size);
    let mtime = info.modified.and_then(|time| time.duration_since(UNIX_EPOCH).ok()).map_or(0, |since| since.as_secs());
    header.set_mtime(mtime);
    header.set_entry_type(kind);
    header.set_cksum();
    out.extend_from_slice(header.as_bytes());
    Ok(out.freeze())
}
