//! Restoring a snapshot: check the whole manifest first, then write into a fresh
//! directory beside the target, verifying every chunk and every file, and swap it into
//! place only when all of it is there.
//!
//! Confinement does not depend on the manifest's good will: every path is validated, each
//! entry's parent must be a directory *of the manifest* (never a symlink), directories
//! and files are created with `O_EXCL` semantics in a directory this restore made, and
//! symlinks are created last, so no write ever goes through a link.

use std::cell::Cell;
use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use futures::StreamExt;

use super::blocking;
use crate::chunk;
use crate::error::SnapshotError;
use crate::manifest::{ChunkRef, Entry, EntryKind, Manifest, SnapshotInfo, validate_entry_path};
use crate::store::{SnapshotStore, validate_snapshot_id, validate_workspace_id};

/// Files restored at once, and chunks fetched ahead within one file.
const FILES_IN_FLIGHT: usize = 8;
const CHUNKS_AHEAD: usize = 4;

/// A restore into `dir/NAME` writes into `dir/.NAME.restore-<16 hex digits>` first.
const STAGING_INFIX: &str = ".restore-";

/// The target name a restore's staging directory is named after (`.NAME.restore-<16 hex>`
/// gives `NAME`), or `None` for any other name. A process killed mid-restore leaves such a
/// directory beside the target; whoever owns that directory removes it at start-up, when
/// nothing can be restoring into it.
pub fn staging_target(name: &str) -> Option<&str> {
    let (target, random) = name.strip_prefix('.')?.rsplit_once(STAGING_INFIX)?;
    let hex = random.len() == 16 && random.bytes().all(|byte| byte.is_ascii_hexdigit());
    (hex && !target.is_empty()).then_some(target)
}

/// Restores snapshot `snapshot_id` of `workspace_id` into `into` (replacing what is there,
/// atomically: `into` is the old tree or the whole new one, never a mix). Every chunk is
/// checked against its hash and every file against its content hash.
///
/// Errors: `NotFound` (no such manifest), `Corrupt` (naming the file whose chunk is missing
/// or wrong), `UnsafePath` (a manifest entry that would land outside `into`), `Io`.
pub async fn restore(
    store: &dyn SnapshotStore,
    workspace_id: &str,
    snapshot_id: &str,
    into: &Path,
) -> Result<SnapshotInfo, SnapshotError> {
    validate_workspace_id(workspace_id)?;
    validate_snapshot_id(snapshot_id)?;
    let (parent, name) = match (into.parent(), into.file_name().and_then(|name| name.to_str())) {
        (Some(parent), Some(name)) if !parent.as_os_str().is_empty() => (parent.to_path_buf(), name.to_owned()),
        _ => {
            return Err(SnapshotError::InvalidInput(format!(
                "restore target {} has no parent directory",
                into.display()
            )));
        }
    };
    let data = store.get_manifest(workspace_id, snapshot_id).await?;
    let (workspace, id) = (workspace_id.to_owned(), snapshot_id.to_owned());
    let manifest = blocking(move || Manifest::decode(&data, &workspace, &id)).await?;
    let plan = Plan::check(&manifest)?;

    let staging = parent.join(format!(".{name}{STAGING_INFIX}{:016x}", rand::random::<u64>()));
    let staging_for_create = staging.clone();
    blocking(move || {
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&staging_for_create)
            .map_err(|source| SnapshotError::io("create restore directory", &staging_for_create, source))
    })
    .await?;
    let written = write_tree(store, snapshot_id, &manifest, &plan, &staging).await;
    let swapped = match written {
        Ok(()) => {
            let (staging, into) = (staging.clone(), into.to_path_buf());
            blocking(move || swap_into_place(&staging, &into)).await
        }
        Err(error) => Err(error),
    };
    if let Err(error) = swapped {
        let leftover = staging.clone();
        let _ = blocking(move || {
            if let Err(error) = fs::remove_dir_all(&leftover) {
                tracing::warn!(path = %leftover.display(), %error, "could not remove a failed restore's directory");
            }
            Ok(())
        })
        .await;
        return Err(error);
    }
    tracing::debug!(ws_id = workspace_id, snapshot_id, files = manifest.info.files, "snapshot restored");
    Ok(manifest.info)
}

/// Restores the first of `candidates` (newest first) that restores, and reports the ones
/// that failed before it. Fails with `NoRestorableSnapshot` when none does (or there are
/// none); an unusable target (`InvalidInput`) stops at once.
pub async fn restore_latest(
    store: &dyn SnapshotStore,
    workspace_id: &str,
    candidates: &[String],
    into: &Path,
) -> Result<(SnapshotInfo, Vec<(String, SnapshotError)>), SnapshotError> {
    let mut failures: Vec<(String, SnapshotError)> = Vec::new();
    for candidate in candidates {
        match restore(store, workspace_id, candidate, into).await {
            Ok(info) => return Ok((info, failures)),
            Err(error @ SnapshotError::InvalidInput(_)) => return Err(error),
            Err(error) => {
                tracing::warn!(ws_id = workspace_id, snapshot_id = %candidate, %error, "snapshot did not restore; trying an older one");
                failures.push((candidate.clone(), error));
            }
        }
    }
    let tried = failures.len();
    Err(SnapshotError::NoRestorableSnapshot {
        workspace_id: workspace_id.to_owned(),
        tried,
        last: failures.into_iter().next().map(|(_, error)| Box::new(error)),
    })
}

/// The checked shape of a manifest: entries split by kind, parents before children.
struct Plan<'a> {
    dirs: Vec<&'a Entry>,
    files: Vec<&'a Entry>,
    symlinks: Vec<&'a Entry>,
}

impl<'a> Plan<'a> {
    fn check(manifest: &'a Manifest) -> Result<Plan<'a>, SnapshotError> {
        let unsafe_path = |path: &str, reason| SnapshotError::UnsafePath {
            snapshot_id: manifest.info.id.clone(),
            path: path.chars().take(200).collect(),
            reason,
        };
        let corrupt = |entry: &Entry, reason: String| SnapshotError::Corrupt {
            snapshot_id: manifest.info.id.clone(),
            what: "manifest entry".to_owned(),
            path: entry.path.clone(),
            reason,
        };
        let mut kinds: HashMap<&str, EntryKind> = HashMap::with_capacity(manifest.entries.len());
        for entry in &manifest.entries {
            validate_entry_path(&entry.path).map_err(|reason| unsafe_path(&entry.path, reason))?;
            if kinds.insert(entry.path.as_str(), entry.kind).is_some() {
                return Err(unsafe_path(&entry.path, "duplicate path"));
            }
        }
        let mut plan = Plan { dirs: Vec::new(), files: Vec::new(), symlinks: Vec::new() };
        for entry in &manifest.entries {
            if let Some((parent, _)) = entry.path.rsplit_once('/')
                && kinds.get(parent) != Some(&EntryKind::Dir)
            {
                return Err(unsafe_path(&entry.path, "parent is not a directory of the snapshot"));
            }
            match entry.kind {
                EntryKind::Dir => plan.dirs.push(entry),
                EntryKind::File => {
                    if entry.hash.as_deref().is_none_or(|hash| crate::store::validate_hash(hash).is_err()) {
                        return Err(corrupt(entry, "file without a valid content hash".to_owned()));
                    }
                    let mut total = 0u64;
                    for chunk in &entry.chunks {
                        crate::store::validate_hash(&chunk.hash).map_err(|error| corrupt(entry, error.to_string()))?;
                        if chunk.size == 0 || chunk.size > chunk::MAX_CHUNK_ACCEPTED {
                            return Err(corrupt(entry, format!("chunk size {} out of range", chunk.size)));
                        }
                        total = total.saturating_add(chunk.size);
                    }
                    if total != entry.size {
                        return Err(corrupt(entry, format!("chunks hold {total} bytes, the file {}", entry.size)));
                    }
                    plan.files.push(entry);
                }
                EntryKind::Symlink => match entry.target.as_deref() {
                    Some(target)
                        if !target.is_empty()
                            && target.len() <= crate::manifest::MAX_PATH_BYTES
                            && !target.contains('\0') =>
                    {
                        plan.symlinks.push(entry)
                    }
                    _ => return Err(corrupt(entry, "symlink without a valid target".to_owned())),
                },
            }
        }
        // Shorter (parent) paths sort first.
        plan.dirs.sort_by(|left, right| left.path.cmp(&right.path));
        Ok(plan)
    }
}

async fn write_tree(
    store: &dyn SnapshotStore,
    snapshot_id: &str,
    manifest: &Manifest,
    plan: &Plan<'_>,
    staging: &Path,
) -> Result<(), SnapshotError> {
    let dirs: Vec<PathBuf> = plan.dirs.iter().map(|entry| staging.join(&entry.path)).collect();
    blocking(move || {
        for dir in dirs {
            fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|source| SnapshotError::io("create directory", &dir, source))?;
        }
        Ok(())
    })
    .await?;

    // The first failure stops the files in flight at their next step, but each is still
    // awaited to its end: a file's blocking `open` left running on its own could create an
    // entry in `staging` after the caller listed it for removal, and the directory would stay.
    let failed = Cell::new(false);
    let mut files = futures::stream::iter(
        plan.files.iter().map(|entry| restore_file(store, snapshot_id, entry, staging.join(&entry.path), &failed)),
    )
    .buffer_unordered(FILES_IN_FLIGHT);
    let mut first_error = None;
    while let Some(outcome) = files.next().await {
        if let Err(error) = outcome {
            failed.set(true);
            first_error.get_or_insert(error);
        }
    }
    if let Some(error) = first_error {
        return Err(error);
    }

    // Links last (nothing is written after them, so nothing goes through one), then the
    // directories' own modes and times, deepest first (a read-only directory is finished).
    let links: Vec<(PathBuf, String)> = plan
        .symlinks
        .iter()
        .map(|entry| (staging.join(&entry.path), entry.target.clone().unwrap_or_default()))
        .collect();
    let dirs: Vec<(PathBuf, u32, i64)> =
        plan.dirs.iter().rev().map(|entry| (staging.join(&entry.path), entry.mode, entry.mtime_ns)).collect();
    let root = staging.to_path_buf();
    let _ = manifest;
    blocking(move || {
        for (path, target) in links {
            std::os::unix::fs::symlink(&target, &path)
                .map_err(|source| SnapshotError::io("create symlink", &path, source))?;
        }
        for (path, mode, mtime_ns) in dirs {
            finish_dir(&path, mode, mtime_ns)?;
        }
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755))
            .map_err(|source| SnapshotError::io("chmod", &root, source))
    })
    .await
}

fn finish_dir(path: &Path, mode: u32, mtime_ns: i64) -> Result<(), SnapshotError> {
    let handle = fs::File::open(path).map_err(|source| SnapshotError::io("open directory", path, source))?;
    let _ = handle.set_modified(system_time(mtime_ns));
    handle
        .set_permissions(fs::Permissions::from_mode(mode & 0o777))
        .map_err(|source| SnapshotError::io("chmod", path, source))
}

fn system_time(mtime_ns: i64) -> std::time::SystemTime {
    if mtime_ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(mtime_ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(mtime_ns.unsigned_abs())
    }
}

/// One file: chunks fetched `CHUNKS_AHEAD` at a time, each verified, appended in order, the
/// whole content checked against the entry's hash before mode and mtime are set. Once
/// `failed` is set (another file failed) it stops between steps, never inside one.
async fn restore_file(
    store: &dyn SnapshotStore,
    snapshot_id: &str,
    entry: &Entry,
    path: PathBuf,
    failed: &Cell<bool>,
) -> Result<(), SnapshotError> {
    if failed.get() {
        return Ok(());
    }
    let open_path = path.clone();
    let handle = blocking(move || {
        fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
            .open(&open_path)
            .map_err(|source| SnapshotError::io("create", &open_path, source))
    })
    .await?;
    let mut writer = Some((handle, blake3::Hasher::new()));
    let mut chunks =
        futures::stream::iter(entry.chunks.iter().map(|chunk| fetch_chunk(store, snapshot_id, entry, chunk)))
            .buffered(CHUNKS_AHEAD);
    while let Some(data) = chunks.next().await {
        if failed.get() {
            return Ok(());
        }
        let data = data?;
        let (mut handle, mut hasher) = writer.take().expect("writer is put back after every chunk");
        let write_path = path.clone();
        writer = Some(
            blocking(move || {
                hasher.update(&data);
                handle.write_all(&data).map_err(|source| SnapshotError::io("write", &write_path, source))?;
                Ok((handle, hasher))
            })
            .await?,
        );
    }
    let (handle, hasher) = writer.take().expect("writer is put back after every chunk");
    let actual = hasher.finalize().to_hex().to_string();
    if Some(actual.as_str()) != entry.hash.as_deref() {
        return Err(SnapshotError::Corrupt {
            snapshot_id: snapshot_id.to_owned(),
            what: "file content".to_owned(),
            path: entry.path.clone(),
            reason: format!("content hash {actual} differs from the manifest's"),
        });
    }
    let (mode, mtime_ns) = (entry.mode, entry.mtime_ns);
    blocking(move || {
        handle
            .set_permissions(fs::Permissions::from_mode(mode & 0o777))
            .map_err(|source| SnapshotError::io("chmod", &path, source))?;
        handle.set_modified(system_time(mtime_ns)).map_err(|source| SnapshotError::io("set mtime", &path, source))
    })
    .await
}

/// Fetches one chunk and checks it: present, a zstd frame of exactly `chunk.size` bytes
/// whose BLAKE3 is `chunk.hash`.
async fn fetch_chunk(
    store: &dyn SnapshotStore,
    snapshot_id: &str,
    entry: &Entry,
    chunk: &ChunkRef,
) -> Result<Vec<u8>, SnapshotError> {
    let corrupt = |reason: String| SnapshotError::Corrupt {
        snapshot_id: snapshot_id.to_owned(),
        what: format!("chunk {}", chunk.hash),
        path: entry.path.clone(),
        reason,
    };
    let stored = match store.get_blob(&chunk.hash).await {
        Ok(stored) => stored,
        Err(SnapshotError::NotFound { .. }) => return Err(corrupt("missing from the store".to_owned())),
        Err(error) => return Err(error),
    };
    let (expected_hash, expected_size) = (chunk.hash.clone(), chunk.size);
    let checked = tokio::task::spawn_blocking(move || -> Result<Vec<u8>, String> {
        let data = chunk::decompress_bounded(&stored, expected_size as usize)?;
        if data.len() as u64 != expected_size {
            return Err(format!("holds {} bytes, the manifest says {expected_size}", data.len()));
        }
        let actual = chunk::hash(&data);
        if actual != expected_hash {
            return Err(format!("content hashes to {actual}"));
        }
        Ok(data)
    })
    .await
    .map_err(|error| SnapshotError::InvalidInput(format!("blocking task failed: {error}")))?;
    checked.map_err(corrupt)
}

/// Puts the finished `staging` tree at `into`: a plain rename when `into` does not exist,
/// an atomic exchange (`renameat2(RENAME_EXCHANGE)`) when it does, after which the old tree
/// (now at `staging`) is removed.
fn swap_into_place(staging: &Path, into: &Path) -> Result<(), SnapshotError> {
    match fs::symlink_metadata(into) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            fs::rename(staging, into).map_err(|source| SnapshotError::io("rename restored tree", into, source))
        }
        Err(source) => Err(SnapshotError::io("stat restore target", into, source)),
        Ok(old) => {
            nix::fcntl::renameat2(
                nix::fcntl::AT_FDCWD,
                staging,
                nix::fcntl::AT_FDCWD,
                into,
                nix::fcntl::RenameFlags::RENAME_EXCHANGE,
            )
            .map_err(|errno| SnapshotError::io("exchange restored tree", into, std::io::Error::from(errno)))?;
            let removed = if old.is_dir() { fs::remove_dir_all(staging) } else { fs::remove_file(staging) };
            if let Err(error) = removed {
                tracing::warn!(path = %staging.display(), %error, "could not remove the tree a restore replaced");
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_names_are_recognised_and_nothing_else() {
        let made = format!(".ws-1{STAGING_INFIX}{:016x}", 0x1234_u64);
        assert_eq!(staging_target(&made), Some("ws-1"));
        assert_eq!(staging_target(".a.b.restore-0123456789abcdef"), Some("a.b"));
        for other in [
            "ws-1",
            ".ws-1",
            "ws-1.restore-0123456789abcdef",
            "..restore-0123456789abcdef",
            ".ws-1.restore-0123456789abcde",
            ".ws-1.restore-0123456789abcdefa",
            ".ws-1.restore-0123456789abcdeg",
            ".ws-1.restored-0123456789abcdef",
        ] {
            assert_eq!(staging_target(other), None, "{other}");
        }
    }
}
