//! The replica's side of workspace snapshots (docs/design.md §4.8). Nodes take and restore
//! snapshots; a replica never reads a workspace's files. It reads the store for what nodes
//! cannot know: the older snapshots a re-placement may fall back to, the snapshots a user
//! lists, the snapshots of a destroyed workspace (deleted with it), and the blobs no
//! manifest references any more (collected by the elected sweeper).
//!
//! The record's snapshot pointer is the only "latest": a snapshot enters it through a
//! generation-fenced write (`WorkspaceStore::record_snapshot`, or the fenced record write of
//! a state change made under the bind lock, [`apply_taken`]).

use std::sync::Arc;
use std::time::Duration;

use berth_proto::v1;
use berth_snapshot::{SnapshotInfo, SnapshotStoreRef};

use crate::error::{ControlPlaneError, Result};
use crate::records::{SnapshotPointer, WorkspaceRecord};

pub type SnapshotsRef = Arc<Snapshots>;

/// The cluster's snapshot store as a replica uses it (`--snapshot-store`; absent: none).
pub struct Snapshots {
    store: Option<SnapshotStoreRef>,
    /// Snapshots kept per workspace by the sweeper's pass (`--snapshot-keep`).
    keep: usize,
}

impl Snapshots {
    /// Opens the store named by `url`, if any.
    pub fn open(url: Option<&str>, keep: usize) -> std::result::Result<Self, String> {
        let store = match url {
            Some(url) if !url.is_empty() => {
                Some(berth_snapshot::open(url).map_err(|error| format!("--snapshot-store: {error}"))?)
            }
            _ => None,
        };
        Ok(Self { store, keep: keep.max(1) })
    }

    /// No store: snapshots are off.
    pub fn disabled() -> Self {
        Self { store: None, keep: 1 }
    }

    pub fn enabled(&self) -> bool {
        self.store.is_some()
    }

    /// How the store describes itself in logs (`dir:/…`, `redis://…`, never credentials).
    pub fn describe(&self) -> String {
        self.store.as_ref().map(|store| store.describe()).unwrap_or_else(|| "none".to_owned())
    }

    fn store(&self, what: &str) -> Result<&SnapshotStoreRef> {
        self.store.as_ref().ok_or_else(|| ControlPlaneError::SnapshotsDisabled { what: what.to_owned() })
    }

    /// The workspace's snapshots in the store, newest first.
    pub async fn list(&self, workspace_id: &str) -> Result<Vec<SnapshotInfo>> {
        let store = self.store("listing snapshots")?;
        berth_snapshot::list(store.as_ref(), workspace_id).await.map_err(store_error)
    }

    /// What a re-placement restores from, newest first: the record's pointer, then the older
    /// snapshots of earlier or the same placements (never one taken after the pointer: that
    /// is a fenced node's late snapshot). Without a store (or when it cannot be listed) the
    /// pointer alone. Empty when the record has no pointer.
    pub async fn restore_candidates(&self, record: &WorkspaceRecord) -> Vec<String> {
        let Some(pointer) = &record.snapshot else { return Vec::new() };
        let mut candidates = vec![pointer.id.clone()];
        let Some(store) = &self.store else { return candidates };
        match berth_snapshot::list(store.as_ref(), record.id.as_str()).await {
            Ok(listed) => candidates.extend(
                listed
                    .into_iter()
                    .filter(|info| {
                        info.id != pointer.id
                            && info.generation <= pointer.generation
                            && (info.created_unix_ms as i64) <= pointer.taken_at_ms
                    })
                    .map(|info| info.id),
            ),
            Err(error) => {
                tracing::warn!(ws_id = %record.id, %error, "listing snapshots failed; restoring from the latest only")
            }
        }
        candidates
    }

    /// Deletes every snapshot of a destroyed workspace (its blobs go with the next garbage
    /// collection). Failures are logged: the sweeper's pass deletes what is left.
    pub async fn delete_workspace(&self, workspace_id: &str) {
        let Some(store) = &self.store else { return };
        if let Err(error) = berth_snapshot::delete_workspace(store.as_ref(), workspace_id).await {
            tracing::warn!(ws_id = workspace_id, %error, "deleting the snapshots of a destroyed workspace failed");
        }
    }

    /// The elected sweeper's pass: keeps the newest `keep` snapshots of each live workspace
    /// (never the recorded latest), deletes the snapshots of workspaces without a record,
    /// then deletes blobs no manifest references that are older than `grace`.
    pub async fn sweep(&self, records: &[Arc<WorkspaceRecord>], grace: Duration) {
        let Some(store) = &self.store else { return };
        for record in records {
            let Ok(listed) = berth_snapshot::list(store.as_ref(), record.id.as_str()).await else { continue };
            if listed.len() <= self.keep {
                continue;
            }
            let pointer = record.snapshot.as_ref().map(|pointer| pointer.id.as_str());
            if pointer.is_some_and(|pointer| listed.iter().skip(self.keep).any(|info| info.id == pointer)) {
                // The latest is older than `keep` newer (fenced) ones: leave them all for now.
                continue;
            }
            if let Err(error) = berth_snapshot::prune(store.as_ref(), record.id.as_str(), self.keep).await {
                tracing::warn!(ws_id = %record.id, %error, "pruning snapshots failed");
            }
        }
        match berth_snapshot::collect_garbage(store.as_ref(), grace).await {
            Ok(report) => {
                crate::metrics::snapshot_gc(report.deleted.len() as u64);
                if !report.deleted.is_empty() {
                    tracing::info!(deleted = report.deleted.len(), blobs = report.blobs, "snapshot blobs collected");
                }
            }
            Err(error) => tracing::warn!(%error, "collecting snapshot garbage failed"),
        }
    }
}

fn store_error(error: berth_snapshot::SnapshotError) -> ControlPlaneError {
    ControlPlaneError::SnapshotStore { reason: error.to_string() }
}

/// The pointer of a snapshot a node reports.
pub fn pointer_of(taken: &v1::SnapshotTaken) -> SnapshotPointer {
    SnapshotPointer {
        id: taken.snapshot_id.clone(),
        generation: taken.generation,
        taken_at_ms: taken.created_unix_ms,
        bytes: taken.bytes,
        files: taken.files,
    }
}

/// Puts a snapshot a node took (on Release, before a move) into the record about to be
/// written under the bind lock — only if it is of the record's own placement on that node
/// (the fenced write then makes it latest atomically with the state change).
pub fn apply_taken(record: &mut WorkspaceRecord, node_id: &str, taken: Option<v1::SnapshotTaken>) {
    let Some(taken) = taken else { return };
    if taken.generation != record.generation || record.node_id.as_deref() != Some(node_id) {
        tracing::warn!(ws_id = %record.id, snapshot = %taken.snapshot_id, generation = taken.generation,
            record_generation = record.generation, "snapshot of another placement not recorded");
        crate::metrics::snapshot_refused();
        return;
    }
    record.snapshot = Some(pointer_of(&taken));
}

/// A snapshot as the public API answers it.
pub fn snapshot_to_proto(info: &SnapshotInfo, latest: Option<&SnapshotPointer>) -> v1::Snapshot {
    v1::Snapshot {
        snapshot_id: info.id.clone(),
        workspace_id: info.workspace_id.clone(),
        generation: info.generation,
        created_at: Some(berth_proto::convert::timestamp_from_unix_ms(info.created_unix_ms as i64)),
        files: info.files,
        bytes: info.bytes,
        uploaded_bytes: info.uploaded_bytes,
        deduplicated_bytes: info.deduplicated_bytes,
        latest: latest.is_some_and(|pointer| pointer.id == info.id),
        duration_ms: 0,
    }
}
