//! The tree walk of a snapshot: `lstat` only, symlinks recorded as links and never
//! followed, special files and non-UTF-8 names skipped and counted. Blocking: run it on the
//! blocking pool.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use crate::error::SnapshotError;
use crate::manifest::{EntryKind, MAX_PATH_BYTES};

#[derive(Debug)]
pub(crate) struct WalkEntry {
    /// Relative, `/`-separated.
    pub path: String,
    pub kind: EntryKind,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    pub target: Option<String>,
}

#[derive(Debug, Default)]
pub(crate) struct Walk {
    /// Sorted by path: a directory comes before everything inside it.
    pub entries: Vec<WalkEntry>,
    pub skipped: u64,
}

pub(crate) fn mtime_ns(metadata: &fs::Metadata) -> i64 {
    metadata.mtime().saturating_mul(1_000_000_000).saturating_add(metadata.mtime_nsec())
}

pub(crate) fn walk(root: &Path) -> Result<Walk, SnapshotError> {
    let metadata =
        fs::symlink_metadata(root).map_err(|source| SnapshotError::io("stat snapshot root", root, source))?;
    if !metadata.is_dir() {
        return Err(SnapshotError::InvalidInput(format!("snapshot root {} is not a directory", root.display())));
    }
    let mut walk = Walk::default();
    let mut pending: Vec<(PathBuf, String)> = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        let listing = match fs::read_dir(&dir) {
            Ok(listing) => listing,
            // Removed while we walked: it is simply not in the snapshot.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound && !prefix.is_empty() => continue,
            Err(source) => return Err(SnapshotError::io("list", &dir, source)),
        };
        for item in listing {
            let item = item.map_err(|source| SnapshotError::io("list", &dir, source))?;
            let Ok(name) = item.file_name().into_string() else {
                walk.skipped += 1;
                continue;
            };
            let path = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            if path.len() > MAX_PATH_BYTES {
                walk.skipped += 1;
                continue;
            }
            let metadata = match item.metadata() {
                Ok(metadata) => metadata,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                Err(source) => return Err(SnapshotError::io("stat", item.path(), source)),
            };
            let file_type = metadata.file_type();
            let mut entry = WalkEntry {
                path,
                kind: EntryKind::File,
                mode: metadata.mode() & 0o7777,
                size: 0,
                mtime_ns: mtime_ns(&metadata),
                target: None,
            };
            if file_type.is_dir() {
                entry.kind = EntryKind::Dir;
                pending.push((item.path(), entry.path.clone()));
            } else if file_type.is_file() {
                entry.size = metadata.len();
            } else if file_type.is_symlink() {
                let target = match fs::read_link(item.path()) {
                    Ok(target) => target,
                    Err(error) if error.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(source) => return Err(SnapshotError::io("read link", item.path(), source)),
                };
                let Ok(target) = target.into_os_string().into_string() else {
                    walk.skipped += 1;
                    continue;
                };
                entry.kind = EntryKind::Symlink;
                entry.target = Some(target);
            } else {
                // FIFOs, sockets, devices: not content, and opening a FIFO would block.
                debug_assert!(
                    file_type.is_fifo()
                        || file_type.is_socket()
                        || file_type.is_block_device()
                        || file_type.is_char_device()
                );
                walk.skipped += 1;
                continue;
            }
            walk.entries.push(entry);
        }
    }
    walk.entries.sort_by(|left, right| left.path.cmp(&right.path));
    Ok(walk)
}
