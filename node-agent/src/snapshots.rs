//! This node's snapshots of its workspaces (docs/design.md §4.8): the files of a host
//! workspace (local, bubblewrap, Docker: all under `<data-dir>/workspaces/<id>/`) go to the
//! snapshot store (`--snapshot-store`), incrementally against the workspace's previous
//! snapshot, and come back from it when a replica provisions a copy with restore candidates.
//!
//! When: on Release (if the workspace changed since its last snapshot), every
//! `--snapshot-interval` for changed workspaces, and on demand (the replica's `Snapshot`
//! call, e.g. before a drain moves the workspace). Every snapshot of a workspace runs under
//! its lifecycle lock (`state.rs`), so they are serialized with each other and with
//! provision / release / destroy, and each carries the generation the node holds.
//!
//! The node never decides which snapshot is latest: it reports each one to a replica (in the
//! RPC answer, or queued for the next heartbeat report), and the replica records it in the
//! workspace's record only if the record's generation is the snapshot's.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use berth_proto::v1;
use berth_snapshot::{SnapshotInfo, SnapshotOptions, SnapshotStoreRef};
use berth_workspace::WorkspaceId;

use crate::error::NodeError;
use crate::metrics;

/// Most snapshots queued for the heartbeat (older ones are dropped: the next one of the same
/// workspace supersedes them anyway).
const MAX_UNREPORTED: usize = 1024;

pub struct NodeSnapshots {
    store: SnapshotStoreRef,
    keep: usize,
    /// Interval snapshots waiting for the next heartbeat report.
    unreported: Mutex<Vec<v1::SnapshotTaken>>,
    /// Each workspace's last snapshot on this node: the parent of its next one.
    parents: Mutex<HashMap<WorkspaceId, String>>,
}

pub type NodeSnapshotsRef = Arc<NodeSnapshots>;

impl NodeSnapshots {
    pub fn open(url: &str, keep: usize) -> Result<Self, String> {
        let store = berth_snapshot::open(url).map_err(|error| format!("--snapshot-store: {error}"))?;
        Ok(Self { store, keep: keep.max(1), unreported: Mutex::default(), parents: Mutex::default() })
    }

    pub fn describe(&self) -> String {
        self.store.describe()
    }

    /// Snapshots `root` as workspace `id` at `generation`, then prunes to `keep`. Callers
    /// hold the workspace's lifecycle lock.
    pub async fn take(&self, id: &WorkspaceId, generation: u64, root: &Path) -> Result<v1::SnapshotTaken, NodeError> {
        let parent = self.parents.lock().unwrap_or_else(PoisonError::into_inner).get(id).cloned();
        let options = SnapshotOptions { parent, ..SnapshotOptions::default() };
        let started = Instant::now();
        let taken = berth_snapshot::snapshot(self.store.as_ref(), id.as_str(), generation, root, options).await;
        let elapsed = started.elapsed();
        let info = match taken {
            Ok(info) => info,
            Err(error) => {
                metrics::snapshot_failed("snapshot");
                tracing::error!(ws_id = %id, generation, %error, "snapshot failed");
                return Err(NodeError::Snapshot {
                    workspace_id: id.clone(),
                    what: "snapshot",
                    reason: error.to_string(),
                });
            }
        };
        metrics::snapshot_done(&info, elapsed);
        self.parents.lock().unwrap_or_else(PoisonError::into_inner).insert(id.clone(), info.id.clone());
        tracing::info!(ws_id = %id, generation, snapshot = %info.id, files = info.files, bytes = info.bytes,
            uploaded = info.uploaded_bytes, deduplicated = info.deduplicated_bytes, ms = elapsed.as_millis() as u64,
            "snapshot taken");
        match berth_snapshot::prune(self.store.as_ref(), id.as_str(), self.keep).await {
            Ok(pruned) if !pruned.is_empty() => {
                tracing::debug!(ws_id = %id, pruned = pruned.len(), "old snapshots pruned")
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(ws_id = %id, %error, "pruning old snapshots failed"),
        }
        Ok(taken_of(&info, elapsed))
    }

    /// Restores the first of `candidates` (newest first) that restores completely into
    /// `into` (replaced atomically). Returns it and the failures before it (`<id>: <error>`),
    /// or every failure when none restored. Each failure is logged loudly.
    pub async fn restore(
        &self,
        id: &WorkspaceId,
        candidates: &[String],
        into: &Path,
    ) -> (Option<v1::SnapshotTaken>, Vec<String>) {
        let started = Instant::now();
        // The engine's restore future is not `Send` (a closure over borrowed manifest
        // entries), so it cannot run inside the Provision task: it runs to completion on a
        // blocking-pool thread, driven by this runtime (its own file work goes to the
        // blocking pool as well).
        let (store, workspace, list, target) =
            (Arc::clone(&self.store), id.to_string(), candidates.to_vec(), into.to_path_buf());
        let runtime = tokio::runtime::Handle::current();
        let outcome = tokio::task::spawn_blocking(move || {
            runtime.block_on(berth_snapshot::restore_latest(store.as_ref(), &workspace, &list, &target))
        })
        .await
        .unwrap_or_else(|error| {
            Err(berth_snapshot::SnapshotError::InvalidInput(format!("restore task failed: {error}")))
        });
        match outcome {
            Ok((info, failed)) => {
                let elapsed = started.elapsed();
                metrics::restore_done(true, elapsed);
                let failures: Vec<String> =
                    failed.iter().map(|(snapshot, error)| format!("{snapshot}: {error}")).collect();
                for failure in &failures {
                    metrics::snapshot_failed("restore");
                    tracing::error!(ws_id = %id, failure = %failure, "a snapshot failed to restore; fell back to an older one");
                }
                self.parents.lock().unwrap_or_else(PoisonError::into_inner).insert(id.clone(), info.id.clone());
                tracing::info!(ws_id = %id, snapshot = %info.id, files = info.files, bytes = info.bytes,
                    ms = elapsed.as_millis() as u64, "workspace restored from a snapshot");
                (Some(taken_of(&info, elapsed)), failures)
            }
            Err(error) => {
                metrics::restore_done(false, started.elapsed());
                metrics::snapshot_failed("restore");
                tracing::error!(ws_id = %id, candidates = candidates.len(), %error, "no snapshot restored");
                let failures = match &error {
                    berth_snapshot::SnapshotError::NoRestorableSnapshot { .. } if candidates.len() == 1 => {
                        vec![format!("{}: {error}", candidates[0])]
                    }
                    _ => vec![error.to_string()],
                };
                (None, failures)
            }
        }
    }

    /// Queues an interval snapshot for the next heartbeat report.
    pub fn queue(&self, taken: v1::SnapshotTaken) {
        let mut unreported = self.unreported.lock().unwrap_or_else(PoisonError::into_inner);
        if unreported.len() >= MAX_UNREPORTED {
            unreported.remove(0);
        }
        unreported.push(taken);
    }

    /// The queued snapshots, for a heartbeat report (put back with [`Self::requeue`] if the
    /// report could not be sent).
    pub fn drain_unreported(&self) -> Vec<v1::SnapshotTaken> {
        std::mem::take(&mut *self.unreported.lock().unwrap_or_else(PoisonError::into_inner))
    }

    pub fn requeue(&self, taken: Vec<v1::SnapshotTaken>) {
        for one in taken {
            self.queue(one);
        }
    }

    /// Forgets a workspace that left this node.
    pub fn forget(&self, id: &WorkspaceId) {
        self.parents.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
    }
}

fn taken_of(info: &SnapshotInfo, elapsed: Duration) -> v1::SnapshotTaken {
    v1::SnapshotTaken {
        workspace_id: info.workspace_id.clone(),
        snapshot_id: info.id.clone(),
        generation: info.generation,
        created_unix_ms: info.created_unix_ms as i64,
        files: info.files,
        bytes: info.bytes,
        uploaded_bytes: info.uploaded_bytes,
        deduplicated_bytes: info.deduplicated_bytes,
        duration_ms: elapsed.as_millis() as u64,
    }
}
