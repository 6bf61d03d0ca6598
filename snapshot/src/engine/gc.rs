//! Garbage collection of chunks no manifest references.
//!
//! Order matters: blobs are listed *before* manifests, so a blob uploaded by a snapshot in
//! flight either is not in the listing or is younger than `grace` (a snapshot writes its
//! manifest after its chunks; `grace` must exceed the longest snapshot). Manifests are
//! listed again just before deleting, so one written meanwhile still protects what it
//! names. What this does not cover: a snapshot that started before the GC and *reuses*
//! (without re-uploading) a chunk that was already unreferenced for longer than `grace`,
//! then writes its manifest after the GC's second listing. Such a snapshot fails its
//! restore loudly (a missing chunk), and `restore_latest` falls back to the one before.

use std::collections::HashSet;
use std::time::Duration;

use super::{blocking, now_unix_ms};
use crate::error::SnapshotError;
use crate::manifest::Manifest;
use crate::store::SnapshotStore;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Blobs in the store when the collection started.
    pub blobs: u64,
    /// Manifests read (all workspaces).
    pub manifests: u64,
    /// Blobs some manifest references.
    pub referenced: u64,
    /// Unreferenced but younger than `grace`: kept for now.
    pub kept_young: u64,
    /// Deleted blob hashes.
    pub deleted: Vec<String>,
    /// `workspace/snapshot` of manifests that did not decode (their chunks are not
    /// protected: an undecodable manifest restores nothing).
    pub unreadable_manifests: Vec<String>,
}

/// Deletes blobs that no manifest references and that were written more than `grace` ago.
/// Any store error aborts before deleting anything it could not justify.
pub async fn collect_garbage(store: &dyn SnapshotStore, grace: Duration) -> Result<GcReport, SnapshotError> {
    let cutoff = now_unix_ms().saturating_sub(grace.as_millis() as u64);
    let blobs = store.list_blob_entries().await?;
    let mut report = GcReport { blobs: blobs.len() as u64, ..GcReport::default() };
    let mut read: HashSet<(String, String)> = HashSet::new();
    let mut referenced: HashSet<String> = HashSet::new();
    read_manifests(store, &mut read, &mut referenced, &mut report).await?;

    let mut candidates: Vec<String> = Vec::new();
    for blob in blobs {
        if referenced.contains(&blob.hash) {
            report.referenced += 1;
        } else if blob.written_unix_ms > cutoff {
            report.kept_young += 1;
        } else {
            candidates.push(blob.hash);
        }
    }
    if candidates.is_empty() {
        return Ok(report);
    }
    // Manifests written while we looked protect their chunks too.
    read_manifests(store, &mut read, &mut referenced, &mut report).await?;
    for hash in candidates {
        if referenced.contains(&hash) {
            report.referenced += 1;
            continue;
        }
        store.delete_blob(&hash).await?;
        report.deleted.push(hash);
    }
    tracing::info!(
        blobs = report.blobs,
        deleted = report.deleted.len(),
        kept_young = report.kept_young,
        "snapshot garbage collected"
    );
    Ok(report)
}

/// Reads every manifest not yet in `read` and adds the chunks it names to `referenced`.
async fn read_manifests(
    store: &dyn SnapshotStore,
    read: &mut HashSet<(String, String)>,
    referenced: &mut HashSet<String>,
    report: &mut GcReport,
) -> Result<(), SnapshotError> {
    for workspace_id in store.list_workspaces().await? {
        for snapshot_id in store.list_manifests(&workspace_id).await? {
            if !read.insert((workspace_id.clone(), snapshot_id.clone())) {
                continue;
            }
            let data = match store.get_manifest(&workspace_id, &snapshot_id).await {
                Ok(data) => data,
                Err(SnapshotError::NotFound { .. }) => continue,
                Err(error) => return Err(error),
            };
            let (workspace, snapshot) = (workspace_id.clone(), snapshot_id.clone());
            match blocking(move || Manifest::decode(&data, &workspace, &snapshot)).await {
                Ok(manifest) => {
                    report.manifests += 1;
                    for entry in manifest.entries {
                        referenced.extend(entry.chunks.into_iter().map(|chunk| chunk.hash));
                    }
                }
                Err(SnapshotError::Corrupt { .. }) => {
                    report.unreadable_manifests.push(format!("{workspace_id}/{snapshot_id}"))
                }
                Err(error) => return Err(error),
            }
        }
    }
    Ok(())
}
