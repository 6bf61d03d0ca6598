//! `berth ws snapshot | snapshots | restore`: workspace snapshots through the control plane
//! (owner or admin; listing needs view access).

use berth_proto::v1::{ListSnapshotsRequest, RestoreWorkspaceRequest, Snapshot, SnapshotWorkspaceRequest};
use serde::Serialize;

use crate::client::{RpcResultExt, WorkspaceClient};
use crate::format::{rfc3339_opt, rfc3339_seconds_cell, workspace_origin_name};
use crate::global::GlobalArgs;
use crate::io::Io;
use crate::output::{Table, emit, emit_message};

/// JSON form of a snapshot.
#[derive(Debug, Serialize)]
pub struct SnapshotView {
    pub snapshot_id: String,
    pub workspace_id: String,
    pub generation: u64,
    pub created_at: Option<String>,
    pub files: u64,
    pub bytes: u64,
    pub uploaded_bytes: u64,
    pub deduplicated_bytes: u64,
    pub latest: bool,
    pub duration_ms: u64,
}

impl From<&Snapshot> for SnapshotView {
    fn from(snapshot: &Snapshot) -> Self {
        SnapshotView {
            snapshot_id: snapshot.snapshot_id.clone(),
            workspace_id: snapshot.workspace_id.clone(),
            generation: snapshot.generation,
            created_at: rfc3339_opt(snapshot.created_at.as_ref()),
            files: snapshot.files,
            bytes: snapshot.bytes,
            uploaded_bytes: snapshot.uploaded_bytes,
            deduplicated_bytes: snapshot.deduplicated_bytes,
            latest: snapshot.latest,
            duration_ms: snapshot.duration_ms,
        }
    }
}

/// JSON form of a restore: the workspace's placement and origin after it.
#[derive(Debug, Serialize)]
pub struct RestoredView {
    pub workspace_id: String,
    pub node_id: String,
    pub generation: u64,
    pub origin: String,
    pub origin_generation: u64,
    pub origin_snapshot_id: String,
    pub origin_snapshot_time: Option<String>,
}

fn snapshots_table(snapshots: &[Snapshot]) -> Table {
    let mut table = Table::new(["SNAPSHOT", "GENERATION", "CREATED", "FILES", "BYTES", "UPLOADED", "LATEST"])
        .align_right(3)
        .align_right(4)
        .align_right(5);
    for snapshot in snapshots {
        table.push_row(vec![
            snapshot.snapshot_id.clone(),
            snapshot.generation.to_string(),
            rfc3339_seconds_cell(snapshot.created_at.as_ref()),
            snapshot.files.to_string(),
            snapshot.bytes.to_string(),
            snapshot.uploaded_bytes.to_string(),
            if snapshot.latest { "yes".into() } else { "-".into() },
        ]);
    }
    table
}

pub async fn snapshot(
    client: &mut WorkspaceClient,
    workspace: &str,
    global: &GlobalArgs,
    io: &mut Io<'_>,
) -> anyhow::Result<()> {
    let taken = client
        .snapshot_workspace(SnapshotWorkspaceRequest { workspace_id: workspace.to_owned() })
        .await
        .rpc_context(|| format!("snapshot workspace {workspace}"))?
        .into_inner();
    let message = format!(
        "snapshot {} of {workspace}: {} files, {} bytes, {} uploaded, {} deduplicated, {} ms",
        taken.snapshot_id, taken.files, taken.bytes, taken.uploaded_bytes, taken.deduplicated_bytes, taken.duration_ms
    );
    emit_message(io, global.output, &SnapshotView::from(&taken), &message).await
}

pub async fn list(
    client: &mut WorkspaceClient,
    workspace: &str,
    global: &GlobalArgs,
    io: &mut Io<'_>,
) -> anyhow::Result<()> {
    let listed = client
        .list_snapshots(ListSnapshotsRequest { workspace_id: workspace.to_owned() })
        .await
        .rpc_context(|| format!("list snapshots of {workspace}"))?
        .into_inner()
        .snapshots;
    let views: Vec<SnapshotView> = listed.iter().map(SnapshotView::from).collect();
    emit(io, global.output, &views, || snapshots_table(&listed)).await
}

pub async fn restore(
    client: &mut WorkspaceClient,
    workspace: &str,
    snapshot: Option<String>,
    global: &GlobalArgs,
    io: &mut Io<'_>,
) -> anyhow::Result<()> {
    let restored = client
        .restore_workspace(RestoreWorkspaceRequest {
            workspace_id: workspace.to_owned(),
            snapshot_id: snapshot.unwrap_or_default(),
        })
        .await
        .rpc_context(|| format!("restore workspace {workspace}"))?
        .into_inner();
    let view = RestoredView {
        workspace_id: restored.workspace_id.clone(),
        node_id: restored.node_id.clone(),
        generation: restored.generation,
        origin: workspace_origin_name(restored.origin),
        origin_generation: restored.origin_generation,
        origin_snapshot_id: restored.origin_snapshot_id.clone(),
        origin_snapshot_time: rfc3339_opt(restored.origin_snapshot_time.as_ref()),
    };
    let message = format!(
        "restored workspace {workspace} from snapshot {} (generation {}, node {})",
        view.origin_snapshot_id, view.generation, view.node_id
    );
    emit_message(io, global.output, &view, &message).await
}
