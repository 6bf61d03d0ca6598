//! Listing and retention of a workspace's snapshots. Deleting manifests never deletes
//! blobs: chunks are shared between snapshots and workspaces, and only the garbage
//! collector (`gc.rs`) removes the ones nothing references.

use futures::{StreamExt, TryStreamExt};

use super::blocking;
use crate::error::SnapshotError;
use crate::manifest::{Manifest, SnapshotInfo};
use crate::store::{SnapshotStore, validate_workspace_id};

/// Snapshot ids of a workspace, newest first (ids sort by creation time).
pub(crate) async fn ids_newest_first(
    store: &dyn SnapshotStore,
    workspace_id: &str,
) -> Result<Vec<String>, SnapshotError> {
    validate_workspace_id(workspace_id)?;
    let mut ids = store.list_manifests(workspace_id).await?;
    ids.sort_unstable_by(|left, right| right.cmp(left));
    Ok(ids)
}

/// Every readable snapshot of a workspace, newest first. A manifest that vanished
/// meanwhile (pruned) is left out; one that does not decode is left out and logged (a
/// restore of it would fail the same way).
pub async fn list(store: &dyn SnapshotStore, workspace_id: &str) -> Result<Vec<SnapshotInfo>, SnapshotError> {
    let ids = ids_newest_first(store, workspace_id).await?;
    let infos: Vec<Option<SnapshotInfo>> = futures::stream::iter(ids.into_iter().map(|id| async move {
        match store.get_manifest(workspace_id, &id).await {
            Ok(data) => {
                let (workspace, snapshot) = (workspace_id.to_owned(), id.clone());
                match blocking(move || Manifest::decode(&data, &workspace, &snapshot)).await {
                    Ok(manifest) => Ok(Some(manifest.info)),
                    Err(error) => {
                        tracing::warn!(ws_id = workspace_id, snapshot_id = %id, %error, "unreadable snapshot manifest");
                        Ok(None)
                    }
                }
            }
            Err(SnapshotError::NotFound { .. }) => Ok(None),
            Err(error) => Err(error),
        }
    }))
    .buffered(8)
    .try_collect()
    .await?;
    Ok(infos.into_iter().flatten().collect())
}

/// Keeps the `keep` newest snapshots of a workspace and deletes the manifests of the
/// others; returns the deleted ids (oldest last). Their chunks go at the next GC.
pub async fn prune(store: &dyn SnapshotStore, workspace_id: &str, keep: usize) -> Result<Vec<String>, SnapshotError> {
    let ids = ids_newest_first(store, workspace_id).await?;
    let doomed: Vec<String> = ids.into_iter().skip(keep).collect();
    for id in &doomed {
        store.delete_manifest(workspace_id, id).await?;
    }
    Ok(doomed)
}

/// Deletes every snapshot of a workspace (its chunks go at the next GC).
pub async fn delete_workspace(store: &dyn SnapshotStore, workspace_id: &str) -> Result<(), SnapshotError> {
    for id in ids_newest_first(store, workspace_id).await? {
        store.delete_manifest(workspace_id, &id).await?;
    }
    Ok(())
}
