//! The `SnapshotStore` seam: a flat blob space addressed by content hash, plus manifests
//! per workspace. Implementations: `dir` (a local or mounted directory), `redis`, `s3`.
//! `open(url)` is the one place a URL becomes a store.

pub mod dir;
mod names;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::SnapshotError;

pub use self::names::{validate_hash, validate_snapshot_id, validate_workspace_id};

/// Shared handle to a store.
pub type SnapshotStoreRef = Arc<dyn SnapshotStore>;

/// One stored blob as listed for garbage collection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlobEntry {
    pub hash: String,
    /// When the blob was last written (milliseconds since the Unix epoch), as the store
    /// keeps it; a rewrite of the same blob may or may not move it forward.
    pub written_unix_ms: u64,
}

/// Where snapshots live.
///
/// Guarantees: `put_blob` and `put_manifest` are idempotent and atomic (a reader sees the
/// whole value or none; a crash mid-write leaves no partial value under the name); every
/// name is validated before use (`validate_hash`, `validate_workspace_id`,
/// `validate_snapshot_id`), so a name never escapes the store's namespace. The store does
/// not interpret values: hashes are checked by the engine on restore.
///
/// Errors: a missing blob or manifest is `SnapshotError::NotFound` (deletes of missing
/// names succeed); anything the backing service fails or refuses is `SnapshotError::Store`.
#[async_trait]
pub trait SnapshotStore: Send + Sync + std::fmt::Debug {
    /// Where the store is, for logs and answers: a URL without credentials
    /// (`file:///var/lib/berth/snapshots`, `redis://host:6379/0`, `s3://bucket/prefix`).
    fn describe(&self) -> String;

    /// Short implementation name for metric labels: `dir`, `redis`, `s3`.
    fn name(&self) -> &'static str;

    async fn put_blob(&self, hash: &str, data: Bytes) -> Result<(), SnapshotError>;
    async fn get_blob(&self, hash: &str) -> Result<Bytes, SnapshotError>;
    async fn has_blob(&self, hash: &str) -> Result<bool, SnapshotError>;
    async fn delete_blob(&self, hash: &str) -> Result<(), SnapshotError>;
    /// Every blob with its write time (the garbage collector's view).
    async fn list_blob_entries(&self) -> Result<Vec<BlobEntry>, SnapshotError>;

    async fn put_manifest(&self, workspace_id: &str, snapshot_id: &str, data: Bytes) -> Result<(), SnapshotError>;
    async fn get_manifest(&self, workspace_id: &str, snapshot_id: &str) -> Result<Bytes, SnapshotError>;
    /// Snapshot ids of a workspace, in no particular order (empty when it has none).
    async fn list_manifests(&self, workspace_id: &str) -> Result<Vec<String>, SnapshotError>;
    async fn delete_manifest(&self, workspace_id: &str, snapshot_id: &str) -> Result<(), SnapshotError>;
    /// Workspaces that have at least one manifest.
    async fn list_workspaces(&self) -> Result<Vec<String>, SnapshotError>;

    /// Every blob hash.
    async fn list_blobs(&self) -> Result<Vec<String>, SnapshotError> {
        Ok(self.list_blob_entries().await?.into_iter().map(|entry| entry.hash).collect())
    }

    /// `has_blob` for many hashes, answers in the same order. Stores with a batch call
    /// (Redis pipelines) override it.
    async fn has_blobs(&self, hashes: &[String]) -> Result<Vec<bool>, SnapshotError> {
        let mut answers = Vec::with_capacity(hashes.len());
        for batch in hashes.chunks(32) {
            let mut checks = Vec::with_capacity(batch.len());
            for hash in batch {
                checks.push(self.has_blob(hash));
            }
            answers.extend(futures::future::try_join_all(checks).await?);
        }
        Ok(answers)
    }
}

/// Opens the store a `--snapshot-store` URL names:
/// - `file:///absolute/dir` — a directory (created when missing),
/// - `redis://[user:password@]host:port/db` (or `rediss://`),
/// - `s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1[&credentials_file=PATH]`
///   with credentials from the `AWS_*` environment or the file.
pub fn open(url: &str) -> Result<SnapshotStoreRef, SnapshotError> {
    let invalid = |reason: &str| SnapshotError::InvalidUrl { url: redact(url), reason: reason.to_owned() };
    let parsed = url::Url::parse(url).map_err(|error| invalid(&error.to_string()))?;
    match parsed.scheme() {
        "file" => {
            if parsed.host_str().is_some_and(|host| !host.is_empty() && host != "localhost") {
                return Err(invalid("a file:// url names no host (file:///absolute/path)"));
            }
            if parsed.query().is_some() || parsed.fragment().is_some() {
                return Err(invalid("a file:// url takes no query or fragment"));
            }
            let path = parsed.to_file_path().map_err(|()| invalid("not an absolute local path"))?;
            Ok(Arc::new(dir::DirStore::open(path)?))
        }
        "redis" | "rediss" | "s3" => Err(invalid("this store is not built into this binary yet")),
        other => Err(invalid(&format!("unknown scheme {other:?} (file, redis, s3)"))),
    }
}

/// A URL with any password replaced, for errors and logs.
pub(crate) fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => "<unparsable url>".to_owned(),
    }
}
