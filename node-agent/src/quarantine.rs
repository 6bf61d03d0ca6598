//! The quarantine: copies of workspaces the node no longer serves but must not delete yet.
//!
//! A copy a newer placement superseded, an orphan a bind never recorded, or the copy of a
//! workspace deleted while this node was away is moved here (one `rename`, same
//! filesystem), never `rm -rf`'d as the first step: if the registry was wrong, the files are
//! still there. Entries are kept for `--quarantine-retention`, listed by
//! `berth nodes quarantine NODE` and restored into the live workspace of the same id.
//!
//! Layout: `<data-dir>/quarantine/` (0700, root only: sandbox users cannot reach it) holds
//! one directory per entry, `<workspace id>.g<generation>.<unix ms>`, with `meta.json` and
//! `files/` (the workspace root as it was).

use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_workspace::{WorkspaceError, WorkspaceId};
use serde::{Deserialize, Serialize};

const META: &str = "meta.json";
const FILES: &str = "files";

/// Why a copy went to the quarantine.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum QuarantineReason {
    /// The registry records a newer placement (elsewhere, or a newer generation here), or
    /// the workspace was deleted while this node was away.
    Superseded,
    /// A fresh workspace of the same id was placed here at `generation`; this older copy
    /// was never recorded (or was deleted) and is not adopted.
    ReplacedByFresh { generation: u64 },
}

impl std::fmt::Display for QuarantineReason {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Superseded => {
                formatter.write_str("superseded by a newer placement or deleted while the node was away")
            }
            Self::ReplacedByFresh { generation } => {
                write!(
                    formatter,
                    "an unrecorded copy found when a fresh workspace was placed here at generation {generation}"
                )
            }
        }
    }
}

/// One quarantined copy.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct QuarantineEntry {
    /// `<workspace id>.g<generation>.<unix ms>`.
    pub entry: String,
    pub workspace_id: WorkspaceId,
    pub generation: u64,
    pub backend: String,
    pub reason: QuarantineReason,
    pub quarantined_at_ms: i64,
    /// Bytes of regular files in the copy.
    pub bytes: u64,
}

pub struct Quarantine {
    dir: PathBuf,
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> WorkspaceError + 'a {
    move |source| WorkspaceError::Io { op, path: path.display().to_string(), source }
}

impl Quarantine {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    async fn ensure_dir(&self) -> Result<(), WorkspaceError> {
        tokio::fs::create_dir_all(&self.dir).await.map_err(io("create", &self.dir))?;
        tokio::fs::set_permissions(&self.dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .await
            .map_err(io("chmod 0700", &self.dir))
    }

    /// Moves `root` (if it exists) into a new entry; returns the entry's name.
    pub async fn admit(
        &self,
        workspace_id: &WorkspaceId,
        generation: u64,
        backend: &str,
        root: &Path,
        reason: QuarantineReason,
    ) -> Result<String, WorkspaceError> {
        self.ensure_dir().await?;
        let quarantined_at_ms = now_ms();
        let entry = format!("{workspace_id}.g{generation}.{quarantined_at_ms}");
        let entry_dir = self.dir.join(&entry);
        tokio::fs::create_dir(&entry_dir).await.map_err(io("create", &entry_dir))?;
        let files = entry_dir.join(FILES);
        match tokio::fs::rename(root, &files).await {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(WorkspaceError::Io { op: "move to quarantine", path: root.display().to_string(), source });
            }
        }
        let measured = files.clone();
        let bytes = tokio::task::spawn_blocking(move || tree_bytes(&measured)).await.unwrap_or(0);
        let meta = QuarantineEntry {
            entry: entry.clone(),
            workspace_id: workspace_id.clone(),
            generation,
            backend: backend.to_owned(),
            reason,
            quarantined_at_ms,
            bytes,
        };
        let path = entry_dir.join(META);
        tokio::fs::write(&path, serde_json::to_vec_pretty(&meta).unwrap_or_default())
            .await
            .map_err(io("write", &path))?;
        Ok(entry)
    }

    /// Every entry, oldest first. An entry whose metadata cannot be read is skipped (and
    /// logged), never deleted.
    pub async fn list(&self) -> Result<Vec<QuarantineEntry>, WorkspaceError> {
        let mut entries = Vec::new();
        let mut listing = match tokio::fs::read_dir(&self.dir).await {
            Ok(listing) => listing,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(entries),
            Err(source) => return Err(WorkspaceError::Io { op: "list", path: self.dir.display().to_string(), source }),
        };
        while let Ok(Some(item)) = listing.next_entry().await {
            let path = item.path().join(META);
            match tokio::fs::read(&path).await.map(|bytes| serde_json::from_slice::<QuarantineEntry>(&bytes)) {
                Ok(Ok(entry)) => entries.push(entry),
                _ => tracing::warn!(path = %path.display(), "skipping an unreadable quarantine entry"),
            }
        }
        entries
            .sort_by(|left, right| (left.quarantined_at_ms, &left.entry).cmp(&(right.quarantined_at_ms, &right.entry)));
        Ok(entries)
    }

    /// The entry called `name`; NotFound for any other name (names are never paths).
    pub async fn get(&self, name: &str) -> Result<QuarantineEntry, WorkspaceError> {
        let not_found = || WorkspaceError::NotFound { path: format!("quarantine entry {name}") };
        if name.is_empty() || name.contains('/') || name.starts_with('.') {
            return Err(not_found());
        }
        self.list().await?.into_iter().find(|entry| entry.entry == name).ok_or_else(not_found)
    }

    /// Moves the entry's files to `destination` (which must not exist) and drops the entry.
    pub async fn take(&self, entry: &QuarantineEntry, destination: &Path) -> Result<(), WorkspaceError> {
        let entry_dir = self.dir.join(&entry.entry);
        let files = entry_dir.join(FILES);
        match tokio::fs::rename(&files, destination).await {
            Ok(()) => {}
            // A copy that had no files: restore an empty directory.
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                tokio::fs::create_dir(destination).await.map_err(io("create", destination))?
            }
            Err(source) => return Err(WorkspaceError::Io { op: "restore", path: files.display().to_string(), source }),
        }
        tokio::fs::remove_dir_all(&entry_dir).await.map_err(io("remove", &entry_dir))
    }

    /// Deletes entries quarantined longer than `retention` ago; returns how many.
    pub async fn purge(&self, retention: Duration) -> Result<usize, WorkspaceError> {
        let cutoff = now_ms() - retention.as_millis() as i64;
        let mut purged = 0;
        for entry in self.list().await? {
            if entry.quarantined_at_ms > cutoff {
                continue;
            }
            let entry_dir = self.dir.join(&entry.entry);
            let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&entry_dir)).await;
            match removed {
                Ok(Ok(())) => {
                    purged += 1;
                    tracing::info!(entry = %entry.entry, "quarantine entry past its retention deleted");
                }
                _ => tracing::warn!(entry = %entry.entry, "deleting a quarantine entry failed"),
            }
        }
        Ok(purged)
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_millis() as i64)
        .unwrap_or(0)
}

/// Bytes of the regular files under `root` (symlinks are not followed).
fn tree_bytes(root: &Path) -> u64 {
    let mut total = 0;
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(listing) = std::fs::read_dir(&dir) else { continue };
        for item in listing.flatten() {
            let Ok(metadata) = item.path().symlink_metadata() else { continue };
            if metadata.is_dir() {
                pending.push(item.path());
            } else if metadata.is_file() {
                total += metadata.len();
            }
        }
    }
    total
}

/// Gives every file under `root` (and `root`) to `uid:gid`, without following symlinks.
pub fn chown_tree(root: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(root, Some(uid), Some(gid))?;
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for item in std::fs::read_dir(&dir)? {
            let path = item?.path();
            std::os::unix::fs::lchown(&path, Some(uid), Some(gid))?;
            if path.symlink_metadata()?.is_dir() {
                pending.push(path);
            }
        }
    }
    Ok(())
}
