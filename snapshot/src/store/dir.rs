//! `DirStore`: snapshots in a local or mounted directory.
//!
//! ```text
//! ROOT/blobs/ab/abcdef…(64 hex)      one file per blob (zstd frame as the engine wrote it)
//! ROOT/manifests/WORKSPACE/SNAPSHOT   one file per manifest
//! ROOT/tmp/                           writes land here first, then rename into place
//! ```
//!
//! Every write goes to a fresh file under `tmp/`, is fsynced and renamed over its name, so
//! a reader (or a crash) never sees half a value and concurrent writers of one blob race
//! harmlessly (same bytes). Names are validated before they become paths. All file work
//! runs on the blocking pool.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use async_trait::async_trait;
use bytes::Bytes;

use super::names::{validate_hash, validate_snapshot_id, validate_workspace_id};
use super::seam::{BlobEntry, SnapshotStore};
use crate::error::SnapshotError;

#[derive(Debug, Clone)]
pub struct DirStore {
    root: PathBuf,
}

impl DirStore {
    /// Opens (creating when missing) a store rooted at `root`, which must be absolute.
    pub fn open(root: impl Into<PathBuf>) -> Result<DirStore, SnapshotError> {
        let root = root.into();
        if !root.is_absolute() {
            return Err(SnapshotError::InvalidInput(format!("snapshot directory {} is not absolute", root.display())));
        }
        for sub in ["blobs", "manifests", "tmp"] {
            let path = root.join(sub);
            fs::create_dir_all(&path)
                .map_err(|source| SnapshotError::io("create snapshot directory", &path, source))?;
        }
        Ok(DirStore { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn blob_path(&self, hash: &str) -> PathBuf {
        self.root.join("blobs").join(&hash[..2]).join(hash)
    }

    fn workspace_dir(&self, workspace_id: &str) -> PathBuf {
        self.root.join("manifests").join(workspace_id)
    }

    async fn blocking<T: Send + 'static>(
        &self,
        work: impl FnOnce(DirStore) -> Result<T, SnapshotError> + Send + 'static,
    ) -> Result<T, SnapshotError> {
        let store = self.clone();
        tokio::task::spawn_blocking(move || work(store)).await.map_err(|error| SnapshotError::Store {
            store: self.describe(),
            operation: "blocking task",
            reason: error.to_string(),
        })?
    }

    /// Writes `data` to a temp file, fsyncs it and renames it to `target` (creating the
    /// target's directory, again if a concurrent delete removed it in between).
    fn write_atomic(&self, target: &Path, data: &[u8]) -> Result<(), SnapshotError> {
        let temp = self.root.join("tmp").join(format!("{:016x}", rand::random::<u64>()));
        let result = (|| {
            let mut file = fs::File::create_new(&temp).map_err(|source| SnapshotError::io("create", &temp, source))?;
            file.write_all(data).map_err(|source| SnapshotError::io("write", &temp, source))?;
            file.sync_all().map_err(|source| SnapshotError::io("fsync", &temp, source))?;
            let parent = target.parent().unwrap_or(&self.root);
            for attempt in 0..3 {
                fs::create_dir_all(parent).map_err(|source| SnapshotError::io("create directory", parent, source))?;
                match fs::rename(&temp, target) {
                    Ok(()) => return Ok(()),
                    Err(error) if error.kind() == io::ErrorKind::NotFound && attempt < 2 => continue,
                    Err(source) => return Err(SnapshotError::io("rename", target, source)),
                }
            }
            Ok(())
        })();
        if result.is_err() {
            let _ = fs::remove_file(&temp);
        }
        result
    }
}

fn read_or_not_found(path: &Path, kind: &'static str, name: String) -> Result<Bytes, SnapshotError> {
    match fs::read(path) {
        Ok(data) => Ok(Bytes::from(data)),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Err(SnapshotError::not_found(kind, name)),
        Err(source) => Err(SnapshotError::io("read", path, source)),
    }
}

fn remove_if_present(path: &Path) -> Result<(), SnapshotError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(SnapshotError::io("remove", path, source)),
    }
}

/// Names of the entries of `dir` (none when it does not exist), skipping hidden ones.
fn list_names(dir: &Path) -> Result<Vec<(String, fs::Metadata)>, SnapshotError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => return Err(SnapshotError::io("list", dir, source)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| SnapshotError::io("list", dir, source))?;
        let Ok(name) = entry.file_name().into_string() else { continue };
        if name.starts_with('.') {
            continue;
        }
        match entry.metadata() {
            Ok(metadata) => names.push((name, metadata)),
            // Removed between the listing and the stat: not there any more.
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(SnapshotError::io("stat", entry.path(), source)),
        }
    }
    Ok(names)
}

#[async_trait]
impl SnapshotStore for DirStore {
    fn describe(&self) -> String {
        url::Url::from_file_path(&self.root)
            .map(|url| url.to_string())
            .unwrap_or_else(|()| self.root.display().to_string())
    }

    fn name(&self) -> &'static str {
        "dir"
    }

    async fn put_blob(&self, hash: &str, data: Bytes) -> Result<(), SnapshotError> {
        validate_hash(hash)?;
        let hash = hash.to_owned();
        self.blocking(move |store| store.write_atomic(&store.blob_path(&hash), &data)).await
    }

    async fn get_blob(&self, hash: &str) -> Result<Bytes, SnapshotError> {
        validate_hash(hash)?;
        let hash = hash.to_owned();
        self.blocking(move |store| read_or_not_found(&store.blob_path(&hash), "blob", hash)).await
    }

    async fn has_blob(&self, hash: &str) -> Result<bool, SnapshotError> {
        validate_hash(hash)?;
        let hash = hash.to_owned();
        self.blocking(move |store| {
            let path = store.blob_path(&hash);
            path.try_exists().map_err(|source| SnapshotError::io("stat", &path, source))
        })
        .await
    }

    async fn delete_blob(&self, hash: &str) -> Result<(), SnapshotError> {
        validate_hash(hash)?;
        let hash = hash.to_owned();
        self.blocking(move |store| remove_if_present(&store.blob_path(&hash))).await
    }

    async fn list_blob_entries(&self) -> Result<Vec<BlobEntry>, SnapshotError> {
        self.blocking(|store| {
            let mut blobs = Vec::new();
            for (prefix, metadata) in list_names(&store.root.join("blobs"))? {
                if !metadata.is_dir() {
                    continue;
                }
                for (hash, metadata) in list_names(&store.root.join("blobs").join(&prefix))? {
                    if validate_hash(&hash).is_err() || !hash.starts_with(&prefix) {
                        continue;
                    }
                    let written_unix_ms = metadata
                        .modified()
                        .ok()
                        .and_then(|time| time.duration_since(UNIX_EPOCH).ok())
                        .map_or(0, |since| since.as_millis() as u64);
                    blobs.push(BlobEntry { hash, written_unix_ms });
                }
            }
            Ok(blobs)
        })
        .await
    }

    async fn put_manifest(&self, workspace_id: &str, snapshot_id: &str, data: Bytes) -> Result<(), SnapshotError> {
        validate_workspace_id(workspace_id)?;
        validate_snapshot_id(snapshot_id)?;
        let (workspace_id, snapshot_id) = (workspace_id.to_owned(), snapshot_id.to_owned());
        self.blocking(move |store| store.write_atomic(&store.workspace_dir(&workspace_id).join(&snapshot_id), &data))
            .await
    }

    async fn get_manifest(&self, workspace_id: &str, snapshot_id: &str) -> Result<Bytes, SnapshotError> {
        validate_workspace_id(workspace_id)?;
        validate_snapshot_id(snapshot_id)?;
        let (workspace_id, snapshot_id) = (workspace_id.to_owned(), snapshot_id.to_owned());
        self.blocking(move |store| {
            let path = store.workspace_dir(&workspace_id).join(&snapshot_id);
            read_or_not_found(&path, "manifest", format!("{workspace_id}/{snapshot_id}"))
        })
        .await
    }

    async fn list_manifests(&self, workspace_id: &str) -> Result<Vec<String>, SnapshotError> {
        validate_workspace_id(workspace_id)?;
        let workspace_id = workspace_id.to_owned();
        self.blocking(move |store| {
            Ok(list_names(&store.workspace_dir(&workspace_id))?
                .into_iter()
                .filter(|(name, metadata)| metadata.is_file() && validate_snapshot_id(name).is_ok())
                .map(|(name, _)| name)
                .collect())
        })
        .await
    }

    async fn delete_manifest(&self, workspace_id: &str, snapshot_id: &str) -> Result<(), SnapshotError> {
        validate_workspace_id(workspace_id)?;
        validate_snapshot_id(snapshot_id)?;
        let (workspace_id, snapshot_id) = (workspace_id.to_owned(), snapshot_id.to_owned());
        self.blocking(move |store| {
            let dir = store.workspace_dir(&workspace_id);
            remove_if_present(&dir.join(&snapshot_id))?;
            // The last manifest takes its directory along; a concurrent put recreates it
            // (`write_atomic` retries the rename), and a non-empty directory stays.
            let _ = fs::remove_dir(&dir);
            Ok(())
        })
        .await
    }

    async fn list_workspaces(&self) -> Result<Vec<String>, SnapshotError> {
        self.blocking(|store| {
            let mut workspaces = Vec::new();
            for (name, metadata) in list_names(&store.root.join("manifests"))? {
                if !metadata.is_dir() || validate_workspace_id(&name).is_err() {
                    continue;
                }
                let has_manifest = list_names(&store.workspace_dir(&name))?
                    .iter()
                    .any(|(snapshot, metadata)| metadata.is_file() && validate_snapshot_id(snapshot).is_ok());
                if has_manifest {
                    workspaces.push(name);
                }
            }
            Ok(workspaces)
        })
        .await
    }
}
