//! The seam itself: the trait every store implements, its shared handle and the blob
//! listing type (a file of its own so the stores depend on it, not on `store.rs`, which
//! depends on them).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::error::SnapshotError;

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
