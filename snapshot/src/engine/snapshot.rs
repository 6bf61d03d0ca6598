//! Taking a snapshot: walk, reuse what the parent already holds, chunk and upload the rest,
//! then write the manifest (last, so a manifest never names a chunk that is not stored).

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::mpsc;

use super::walk::{self, WalkEntry};
use super::{blocking, now_unix_ms};
use crate::chunk;
use crate::error::SnapshotError;
use crate::manifest::{ChunkRef, Entry, EntryKind, Manifest, SnapshotInfo};
use crate::store::{SnapshotStore, validate_snapshot_id, validate_workspace_id};

/// A file whose mtime is this close to its snapshot's start is re-read next time even when
/// size, mtime and mode match (a write in the same timestamp tick would be invisible).
const RACY_WINDOW_NS: i64 = 2_000_000_000;

#[derive(Clone, Debug)]
pub struct SnapshotOptions {
    /// The previous snapshot of the workspace: files whose size, mtime and mode match its
    /// entries reuse its chunk lists without being read (their chunks are still checked
    /// with `has_blob`). A parent that cannot be read means a full walk, not an error.
    pub parent: Option<String>,
    /// zstd level of the chunks (1 fastest … 19; 3 is zstd's default).
    pub compression_level: i32,
    /// Chunk uploads in flight at once.
    pub concurrency: usize,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions { parent: None, compression_level: 3, concurrency: 8 }
    }
}

/// Snapshots the tree at `root` as a new snapshot of `workspace_id` taken at `generation`,
/// and returns what it stored.
///
/// The tree should be quiescent (the workspace released or paused); files changing during
/// the walk are stored as read, never half-described: each file's hash is of the bytes its
/// chunks hold. Symlinks are stored as links; FIFOs, sockets and devices are skipped and
/// counted in `skipped`.
pub async fn snapshot(
    store: &dyn SnapshotStore,
    workspace_id: &str,
    generation: u64,
    root: &Path,
    options: SnapshotOptions,
) -> Result<SnapshotInfo, SnapshotError> {
    validate_workspace_id(workspace_id)?;
    let created_unix_ms = now_unix_ms();
    let snapshot_id = format!("{created_unix_ms:013}-{generation:020}-{:016x}", rand::random::<u64>());
    let parent = match &options.parent {
        Some(parent_id) => load_parent(store, workspace_id, parent_id).await,
        None => HashMap::new(),
    };

    let walk_root = root.to_path_buf();
    let walk = blocking(move || walk::walk(&walk_root)).await?;
    let mut stats = Stats { skipped: walk.skipped, ..Stats::default() };

    // Files the parent describes exactly keep its chunk lists, if those chunks are all
    // still stored (a garbage-collected or lost chunk means reading the file again).
    let mut entries: Vec<Option<Entry>> = Vec::with_capacity(walk.entries.len());
    let mut candidates: Vec<(usize, &Entry)> = Vec::new();
    for (index, walked) in walk.entries.iter().enumerate() {
        match walked.kind {
            EntryKind::File => {
                if let Some(previous) = parent.get(&walked.path).filter(|previous| reusable(previous, walked)) {
                    candidates.push((index, previous));
                }
                entries.push(None);
            }
            EntryKind::Dir | EntryKind::Symlink => entries.push(Some(Entry {
                path: walked.path.clone(),
                kind: walked.kind,
                mode: walked.mode,
                size: 0,
                mtime_ns: walked.mtime_ns,
                hash: None,
                chunks: Vec::new(),
                target: walked.target.clone(),
            })),
        }
    }
    let wanted: Vec<String> = candidates
        .iter()
        .flat_map(|(_, previous)| previous.chunks.iter().map(|chunk| chunk.hash.clone()))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let present = store.has_blobs(&wanted).await?;
    let stored: HashSet<&str> =
        wanted.iter().zip(present).filter(|(_, present)| *present).map(|(hash, _)| hash.as_str()).collect();
    for (index, previous) in candidates {
        if previous.chunks.iter().all(|chunk| stored.contains(chunk.hash.as_str())) {
            stats.deduplicated_bytes += previous.size;
            entries[index] = Some(Entry { mtime_ns: walk.entries[index].mtime_ns, ..previous.clone() });
        }
    }

    let to_read: Vec<(usize, String)> = walk
        .entries
        .iter()
        .enumerate()
        .filter(|(index, walked)| walked.kind == EntryKind::File && entries[*index].is_none())
        .map(|(index, walked)| (index, walked.path.clone()))
        .collect();
    let read = read_and_upload(store, root, to_read, &options, &mut stats).await?;
    for (index, file) in read {
        let walked = &walk.entries[index];
        entries[index] = file.map(|file| Entry {
            path: walked.path.clone(),
            kind: EntryKind::File,
            mode: walked.mode,
            size: file.size,
            mtime_ns: walked.mtime_ns,
            hash: Some(file.hash),
            chunks: file.chunks,
            target: None,
        });
        if entries[index].is_none() {
            stats.skipped += 1;
        }
    }

    // A file the reader found gone or replaced is left out (counted in `skipped`).
    let entries: Vec<Entry> = entries.into_iter().flatten().collect();
    let files: Vec<&Entry> = entries.iter().filter(|entry| entry.kind == EntryKind::File).collect();
    let mut info = SnapshotInfo {
        id: snapshot_id.clone(),
        workspace_id: workspace_id.to_owned(),
        generation,
        created_unix_ms,
        files: files.len() as u64,
        bytes: files.iter().map(|entry| entry.size).sum(),
        uploaded_bytes: stats.uploaded_bytes,
        deduplicated_bytes: stats.deduplicated_bytes,
        skipped: stats.skipped,
        manifest_bytes: 0,
        parent: options.parent.clone(),
    };
    let manifest = Manifest::new(info.clone(), entries);
    let encoded = blocking(move || manifest.encode()).await?;
    info.manifest_bytes = encoded.len() as u64;
    store.put_manifest(workspace_id, &snapshot_id, Bytes::from(encoded)).await?;
    tracing::debug!(
        ws_id = workspace_id,
        snapshot_id = %snapshot_id,
        files = info.files,
        bytes = info.bytes,
        uploaded = info.uploaded_bytes,
        deduplicated = info.deduplicated_bytes,
        "snapshot stored"
    );
    Ok(info)
}

#[derive(Debug, Default)]
struct Stats {
    uploaded_bytes: u64,
    deduplicated_bytes: u64,
    skipped: u64,
}

/// The parent's file entries by path, and empty when it cannot be read (logged: the
/// snapshot is still correct, only slower).
async fn load_parent(store: &dyn SnapshotStore, workspace_id: &str, parent_id: &str) -> HashMap<String, Entry> {
    let loaded = async {
        validate_snapshot_id(parent_id)?;
        let data = store.get_manifest(workspace_id, parent_id).await?;
        let (workspace, id) = (workspace_id.to_owned(), parent_id.to_owned());
        blocking(move || Manifest::decode(&data, &workspace, &id)).await
    };
    match loaded.await {
        Ok(manifest) => {
            // Only entries comfortably older than the parent's start are trusted.
            let horizon = (manifest.info.created_unix_ms as i64).saturating_mul(1_000_000) - RACY_WINDOW_NS;
            manifest
                .entries
                .into_iter()
                .filter(|entry| entry.kind == EntryKind::File && entry.mtime_ns < horizon)
                .map(|entry| (entry.path.clone(), entry))
                .collect()
        }
        Err(error) => {
            tracing::warn!(ws_id = workspace_id, parent = parent_id, %error, "parent snapshot unreadable; walking the whole tree");
            HashMap::new()
        }
    }
}

fn reusable(previous: &Entry, walked: &WalkEntry) -> bool {
    previous.size == walked.size
        && previous.mtime_ns == walked.mtime_ns
        && previous.mode == walked.mode
        && previous.hash.is_some()
        && previous.chunks.iter().map(|chunk| chunk.size).sum::<u64>() == previous.size
}

/// What the reader learned of one file.
#[derive(Debug)]
struct ReadFile {
    hash: String,
    size: u64,
    chunks: Vec<ChunkRef>,
}

enum Piece {
    Chunk {
        file: usize,
        hash: String,
        data: Vec<u8>,
    },
    Done {
        file: usize,
        hash: String,
        size: u64,
    },
    /// Gone or no longer a regular file when the reader got to it.
    Vanished {
        file: usize,
    },
}

enum Uploaded {
    Stored { compressed: u64 },
    AlreadyThere { size: u64 },
}

/// Reads, chunks and hashes `files` on a blocking thread, and uploads the chunks the store
/// lacks with `options.concurrency` puts in flight. Returns each file's chunk list (None for
/// a file that vanished).
async fn read_and_upload(
    store: &dyn SnapshotStore,
    root: &Path,
    files: Vec<(usize, String)>,
    options: &SnapshotOptions,
    stats: &mut Stats,
) -> Result<Vec<(usize, Option<ReadFile>)>, SnapshotError> {
    let (sender, mut receiver) = mpsc::channel::<Result<Piece, SnapshotError>>(16);
    let root = root.to_path_buf();
    let order: Vec<usize> = files.iter().map(|(index, _)| *index).collect();
    let reader = tokio::task::spawn_blocking(move || read_files(&root, files, &sender));

    let mut chunks_of: HashMap<usize, Vec<ChunkRef>> = HashMap::new();
    let mut done: HashMap<usize, Option<ReadFile>> = HashMap::new();
    let mut seen: HashSet<String> = HashSet::new();
    let mut in_flight = FuturesUnordered::new();
    let mut reading = true;
    let level = options.compression_level;
    let concurrency = options.concurrency.max(1);
    loop {
        tokio::select! {
            Some(result) = in_flight.next(), if !in_flight.is_empty() => match result? {
                Uploaded::Stored { compressed } => stats.uploaded_bytes += compressed,
                Uploaded::AlreadyThere { size } => stats.deduplicated_bytes += size,
            },
            piece = receiver.recv(), if reading && in_flight.len() < concurrency => match piece {
                None => reading = false,
                Some(piece) => match piece? {
                    Piece::Chunk { file, hash, data } => {
                        let size = data.len() as u64;
                        chunks_of.entry(file).or_default().push(ChunkRef { hash: hash.clone(), size });
                        if seen.insert(hash.clone()) {
                            in_flight.push(upload(store, hash, data, level));
                        } else {
                            stats.deduplicated_bytes += size;
                        }
                    }
                    Piece::Done { file, hash, size } => {
                        let chunks = chunks_of.remove(&file).unwrap_or_default();
                        done.insert(file, Some(ReadFile { hash, size, chunks }));
                    }
                    Piece::Vanished { file } => {
                        chunks_of.remove(&file);
                        done.insert(file, None);
                    }
                },
            },
            else => break,
        }
    }
    reader.await.map_err(|error| SnapshotError::InvalidInput(format!("file reader failed: {error}")))?;
    Ok(order.into_iter().map(|index| (index, done.remove(&index).flatten())).collect())
}

async fn upload(store: &dyn SnapshotStore, hash: String, data: Vec<u8>, level: i32) -> Result<Uploaded, SnapshotError> {
    if store.has_blob(&hash).await? {
        return Ok(Uploaded::AlreadyThere { size: data.len() as u64 });
    }
    let compressed =
        blocking(move || chunk::compress(&data, level).map_err(|source| SnapshotError::io("compress", "", source)))
            .await?;
    let length = compressed.len() as u64;
    store.put_blob(&hash, Bytes::from(compressed)).await?;
    Ok(Uploaded::Stored { compressed: length })
}

/// The blocking half: one file after another, chunks in order, then the file's hash. Stops
/// when the receiver is gone (the snapshot failed).
fn read_files(root: &Path, files: Vec<(usize, String)>, sender: &mpsc::Sender<Result<Piece, SnapshotError>>) {
    for (file, relative) in files {
        let path: PathBuf = root.join(&relative);
        let opened = fs::OpenOptions::new()
            .read(true)
            .custom_flags((nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK).bits())
            .open(&path);
        let handle = match opened {
            Ok(handle) => handle,
            // Removed, or replaced by a symlink (ELOOP) since the walk.
            Err(error) if error.kind() == io::ErrorKind::NotFound || error.raw_os_error() == Some(nix::libc::ELOOP) => {
                if sender.blocking_send(Ok(Piece::Vanished { file })).is_err() {
                    return;
                }
                continue;
            }
            Err(source) => {
                let _ = sender.blocking_send(Err(SnapshotError::io("open", &path, source)));
                return;
            }
        };
        match handle.metadata() {
            Ok(metadata) if metadata.is_file() => {}
            Ok(_) => {
                if sender.blocking_send(Ok(Piece::Vanished { file })).is_err() {
                    return;
                }
                continue;
            }
            Err(source) => {
                let _ = sender.blocking_send(Err(SnapshotError::io("stat", &path, source)));
                return;
            }
        }
        let mut hasher = blake3::Hasher::new();
        let mut size = 0u64;
        for piece in chunk::chunks(handle) {
            let piece = match piece {
                Ok(piece) => piece,
                Err(error) => {
                    let _ = sender.blocking_send(Err(SnapshotError::io(
                        "read",
                        &path,
                        io::Error::other(error.to_string()),
                    )));
                    return;
                }
            };
            hasher.update(&piece.data);
            size += piece.data.len() as u64;
            let hash = chunk::hash(&piece.data);
            if sender.blocking_send(Ok(Piece::Chunk { file, hash, data: piece.data })).is_err() {
                return;
            }
        }
        let hash = hasher.finalize().to_hex().to_string();
        if sender.blocking_send(Ok(Piece::Done { file, hash, size })).is_err() {
            return;
        }
    }
}
