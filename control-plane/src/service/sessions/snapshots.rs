//! SnapshotWorkspace / ListSnapshots / RestoreWorkspace (docs/design.md §4.8). The node
//! holding the workspace takes a snapshot; this replica records it as the latest through
//! the generation-fenced write; a restore is a placement at a new generation whose copy is
//! made from the snapshot (the copy it replaces goes to its node's quarantine).

use berth_proto::v1;

use super::Sessions;
use crate::authz::{Action, Caller};
use crate::binding::BindRequest;
use crate::error::ControlPlaneError;
use crate::node_client::node_request;
use crate::records::StoredState;
use crate::snapshots::{pointer_of, snapshot_to_proto};

impl Sessions {
    /// Snapshots the workspace on its node now and records it as its latest.
    pub async fn snapshot_workspace(
        &self,
        caller: &Caller,
        workspace_id: &str,
    ) -> Result<v1::Snapshot, ControlPlaneError> {
        let (workspace_id, _) = self.access.workspace(caller, workspace_id, Action::Manage).await?;
        if !self.snapshots.enabled() {
            return Err(ControlPlaneError::SnapshotsDisabled { what: format!("snapshotting {workspace_id}") });
        }
        let record = self
            .store
            .load(&workspace_id)
            .await?
            .ok_or_else(|| ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()))?;
        let node = record
            .node_id
            .as_deref()
            .filter(|_| matches!(record.state, StoredState::Ready | StoredState::Idle))
            .and_then(|node_id| self.store.node(node_id))
            .ok_or_else(|| ControlPlaneError::NodeAway {
                workspace_id: workspace_id.to_string(),
                node_id: record.node_id.clone().unwrap_or_default(),
                absent_secs: 0,
                grace_secs: 0,
            })?;
        if !node.snapshots {
            return Err(ControlPlaneError::SnapshotsDisabled { what: format!("node {}", node.node_id) });
        }
        let mut client = self.nodes.get(&node.node_id, &node.address)?;
        let request = v1::SnapshotRequest { workspace_id: workspace_id.to_string() };
        let taken =
            client.snapshot(node_request(request, record.generation, self.snapshot_timeout)).await?.into_inner();
        let pointer = pointer_of(&taken);
        self.store.record_snapshot(&workspace_id, &node.node_id, &pointer).await?;
        Ok(v1::Snapshot {
            snapshot_id: taken.snapshot_id,
            workspace_id: workspace_id.to_string(),
            generation: taken.generation,
            created_at: Some(berth_proto::convert::timestamp_from_unix_ms(taken.created_unix_ms)),
            files: taken.files,
            bytes: taken.bytes,
            uploaded_bytes: taken.uploaded_bytes,
            deduplicated_bytes: taken.deduplicated_bytes,
            latest: true,
            duration_ms: taken.duration_ms,
        })
    }

    /// The workspace's snapshots in the store, newest first.
    pub async fn list_snapshots(
        &self,
        caller: &Caller,
        workspace_id: &str,
    ) -> Result<v1::ListSnapshotsResponse, ControlPlaneError> {
        let (workspace_id, record) = self.access.workspace(caller, workspace_id, Action::View).await?;
        let listed = self.snapshots.list(workspace_id.as_str()).await?;
        let latest = record.snapshot.as_ref();
        Ok(v1::ListSnapshotsResponse { snapshots: listed.iter().map(|info| snapshot_to_proto(info, latest)).collect() })
    }

    /// Replaces the workspace's files with snapshot `snapshot_id` (empty: the latest).
    pub async fn restore_workspace(
        &self,
        caller: &Caller,
        workspace_id: &str,
        snapshot_id: &str,
    ) -> Result<v1::Workspace, ControlPlaneError> {
        let (workspace_id, _) = self.access.workspace(caller, workspace_id, Action::Manage).await?;
        if !self.snapshots.enabled() {
            return Err(ControlPlaneError::SnapshotsDisabled { what: format!("restoring {workspace_id}") });
        }
        let record = self
            .store
            .load(&workspace_id)
            .await?
            .ok_or_else(|| ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()))?;
        let listed = self.snapshots.list(workspace_id.as_str()).await?;
        let chosen = match (snapshot_id, &record.snapshot) {
            ("", Some(pointer)) => pointer.id.clone(),
            ("", None) => {
                listed.first().map(|info| info.id.clone()).ok_or_else(|| ControlPlaneError::SnapshotNotFound {
                    workspace_id: workspace_id.to_string(),
                    snapshot_id: "(latest)".to_owned(),
                })?
            }
            (asked, _) => asked.to_owned(),
        };
        if !listed.iter().any(|info| info.id == chosen) {
            return Err(ControlPlaneError::SnapshotNotFound {
                workspace_id: workspace_id.to_string(),
                snapshot_id: chosen,
            });
        }
        let bind = BindRequest {
            restore: Some(chosen),
            replace_generation: Some(record.generation),
            linearizable: true,
            ..BindRequest::existing(workspace_id.clone())
        };
        let restored = self.binder.ensure_ready(bind).await?;
        Ok(self.workspace_to_proto(&restored))
    }
}
