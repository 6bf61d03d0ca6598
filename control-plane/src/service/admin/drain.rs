//! A migrating drain: `DrainNode` / `DrainNodeProgress` without `force`, when the replicas
//! and the node have a snapshot store. Three steps:
//!
//! 1. every workspace on the node is snapshotted on demand and its snapshot recorded as
//!    latest (the generation-fenced write); if any fails, the drain is refused before
//!    anything changed, naming the failures (`--force` still drains the old way);
//! 2. the drain key is written: no new placements there, and every replica sees the
//!    node's workspaces as movable;
//! 3. each workspace is bound again: the bind asks the (still live) node for a last
//!    snapshot under the workspace's lock, places it on another node, which restores it
//!    before it is READY. One progress message per workspace.

use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_proto::v1;
use tokio::sync::mpsc;
use tonic::Status;

use crate::binding::{BindRequest, Binder};
use crate::error::ControlPlaneError;
use crate::node_client::{NodeClients, node_request};
use crate::records::Origin;
use crate::snapshots::{SnapshotsRef, pointer_of};
use crate::store::WorkspaceStoreRef;

#[derive(Clone)]
pub struct Migration {
    pub binder: Arc<Binder>,
    pub snapshots: SnapshotsRef,
    pub snapshot_timeout: Duration,
    pub store: WorkspaceStoreRef,
    pub nodes: Arc<NodeClients>,
}

impl Migration {
    /// Whether a drain of `node_id` without `force` migrates its workspaces: the replicas
    /// and the node take snapshots, and another live, undrained node does too (a drain of
    /// the only node would strand its workspaces).
    pub fn migrates(&self, node_id: &str) -> bool {
        self.snapshots.enabled()
            && self.store.node(node_id).is_some_and(|node| node.snapshots)
            && self.store.live_nodes().iter().any(|node| {
                node.node_id != node_id && node.snapshots && self.store.node_holds_workspaces(&node.node_id)
            })
    }

    /// Snapshots, drains (`write_drain` writes the drain key) and moves every workspace in
    /// `workspaces`, sending one progress message per moved workspace.
    pub async fn migrate<F>(
        &self,
        by: &str,
        node_id: &str,
        workspaces: Vec<v1::DrainedWorkspace>,
        progress: mpsc::Sender<v1::DrainProgress>,
        write_drain: F,
    ) -> Result<(), Status>
    where
        F: std::future::Future<Output = Result<(), Status>>,
    {
        let migration = self;
        let node =
            self.store.node(node_id).ok_or_else(|| ControlPlaneError::NodeNotFound { node_id: node_id.to_owned() })?;
        let total = workspaces.len() as u32;
        // 1. Snapshot everything first: a failure refuses the drain with nothing changed.
        let mut failures = Vec::new();
        for workspace in &workspaces {
            let outcome = async {
                let id = berth_workspace::WorkspaceId::new(&workspace.workspace_id)?;
                let record =
                    self.store.load(&id).await?.ok_or_else(|| ControlPlaneError::WorkspaceNotFound(id.to_string()))?;
                let mut client = self.nodes.get(&node.node_id, &node.address)?;
                let request = v1::SnapshotRequest { workspace_id: id.to_string() };
                let taken =
                    client.snapshot(node_request(request, record.generation, migration.snapshot_timeout)).await?;
                self.store.record_snapshot(&id, node_id, &pointer_of(taken.get_ref())).await?;
                Ok::<_, ControlPlaneError>(())
            }
            .await;
            if let Err(error) = outcome {
                failures.push(format!("{}: {error}", workspace.workspace_id));
            }
        }
        if !failures.is_empty() {
            return Err(Status::failed_precondition(format!(
                "draining node {node_id}: {} of {total} workspace(s) could not be snapshotted, nothing was drained: {}; \
                 repeat with force (`berth nodes drain --force`) to drain without moving their data",
                failures.len(),
                failures.join("; ")
            )));
        }
        // 2. The drain key: from now on every replica moves these workspaces.
        write_drain.await?;
        tracing::info!(node_id, workspaces = total, by, "node drained; moving its workspaces");
        // 3. Move each one (its bind snapshots it once more under its lock).
        for (index, workspace) in workspaces.iter().enumerate() {
            let started = Instant::now();
            let mut line = v1::DrainProgress {
                index: index as u32 + 1,
                total,
                workspace_id: workspace.workspace_id.clone(),
                ..Default::default()
            };
            let moved = async {
                let id = berth_workspace::WorkspaceId::new(&workspace.workspace_id)?;
                let bind = BindRequest { linearizable: true, ..BindRequest::existing(id) };
                migration.binder.ensure_ready(bind).await
            }
            .await;
            match moved {
                Ok(record) => {
                    line.to_node_id = record.node_id.clone().unwrap_or_default();
                    if let Some(pointer) = &record.snapshot {
                        line.bytes = pointer.bytes;
                    }
                    match &record.origin {
                        Origin::Restored { snapshot_id, .. } if record.origin_generation == record.generation => {
                            line.snapshot_id = snapshot_id.clone();
                        }
                        _ if record.node_id.as_deref() == Some(node_id) => {
                            line.error = "still on the drained node".to_owned();
                        }
                        Origin::RecreatedEmpty { reason } if record.origin_generation == record.generation => {
                            line.error = format!("moved without its files: {reason}");
                        }
                        _ => {}
                    }
                }
                Err(error) => line.error = error.to_string(),
            }
            line.duration_ms = started.elapsed().as_millis() as u64;
            if line.error.is_empty() {
                tracing::info!(node_id, ws_id = %line.workspace_id, to = %line.to_node_id, snapshot = %line.snapshot_id,
                    index = line.index, total, "workspace moved off a drained node");
            } else {
                tracing::error!(node_id, ws_id = %line.workspace_id, error = %line.error, "workspace not moved off a drained node");
            }
            if progress.send(line).await.is_err() {
                // The caller went away: the rest move on their next access.
                return Ok(());
            }
        }
        Ok(())
    }
}
