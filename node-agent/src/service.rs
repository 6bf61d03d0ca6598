//! `NodeAgentService`: the node-only lifecycle calls from replicas (provision, release,
//! destroy, list). Exec, file and contract calls are the public services, served by
//! `data_plane.rs`.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use berth_proto::convert::spec_from_proto;
use berth_proto::v1;
use berth_proto::v1::node_agent_service_server::NodeAgentService;
use berth_workspace::WorkspaceId;
use tonic::{Request, Response, Status};

use crate::error::{NodeError, status};
use crate::gate::Gate;
use crate::limits::NodeLimits;
use crate::metrics;
use crate::quarantine::QuarantineEntry;
use crate::state::{Entry, RestoreFrom, Workspaces};

pub struct NodeAgentApi {
    gate: Arc<Gate>,
    /// Defaults and ceilings applied to every provisioned spec.
    limits: NodeLimits,
}

fn workspace_id(value: &str) -> Result<WorkspaceId, Status> {
    WorkspaceId::new(value).map_err(status)
}

impl NodeAgentApi {
    pub fn new(gate: Arc<Gate>, limits: NodeLimits) -> Self {
        Self { gate, limits }
    }

    fn workspaces(&self) -> &Arc<Workspaces> {
        self.gate.workspaces()
    }
}

#[tonic::async_trait]
impl NodeAgentService for NodeAgentApi {
    async fn provision(
        &self,
        request: Request<v1::ProvisionRequest>,
    ) -> Result<Response<v1::ProvisionResponse>, Status> {
        self.gate.check_serving()?;
        let request = request.into_inner();
        let id = workspace_id(&request.workspace_id)?;
        berth_proto::trace::record_workspace(id.as_str());
        let mut spec = spec_from_proto(request.spec);
        spec.validate().map_err(status)?;
        // Zeros become the operator's defaults; a value over a ceiling is refused before
        // anything exists on disk. Applied on every provision, so a lowered ceiling holds
        // for a workspace re-placed later too.
        self.limits.apply_to_spec(&mut spec)?;
        tracing::debug!(ws_id = %id, generation = request.generation, "provisioning");
        // Run to completion even if the caller goes away: a provision cancelled between
        // creating the directory and writing the state file would leave a directory the
        // node never reports or cleans up. A copy nobody records is removed later by the
        // heartbeat reconciliation.
        let workspaces = Arc::clone(self.workspaces());
        let task_id = id.clone();
        let asked_backend = if request.backend.is_empty() { "default".to_owned() } else { request.backend.clone() };
        let started = std::time::Instant::now();
        let restore = RestoreFrom { candidates: request.restore_snapshots, required: request.restore_required };
        let provisioned = tokio::spawn(async move {
            workspaces
                .provision(
                    &task_id,
                    request.generation,
                    &request.backend,
                    &spec,
                    request.fresh,
                    &request.owner,
                    &restore,
                )
                .await
        })
        .await
        .map_err(|error| NodeError::ProvisionTask { reason: error.to_string() })?;
        let backend_label = provisioned.as_ref().map(|done| done.backend.as_str()).unwrap_or(&asked_backend);
        metrics::provision_done(backend_label, provisioned.is_ok(), started.elapsed());
        let provisioned = provisioned.map_err(Status::from)?;
        tracing::info!(ws_id = %id, generation = request.generation, backend = %provisioned.backend, created = provisioned.created,
            restored = provisioned.restored.as_ref().map(|taken| taken.snapshot_id.as_str()), "provisioned");
        Ok(Response::new(v1::ProvisionResponse {
            created: provisioned.created,
            backend: provisioned.backend,
            restored: provisioned.restored,
            restore_failures: provisioned.restore_failures,
        }))
    }

    async fn release(&self, request: Request<v1::ReleaseRequest>) -> Result<Response<v1::ReleaseResponse>, Status> {
        let generation = generation_of(&request);
        let id = workspace_id(&request.get_ref().workspace_id)?;
        let snapshot = self.workspaces().release(&id, generation).await?;
        Ok(Response::new(v1::ReleaseResponse { snapshot }))
    }

    async fn snapshot(&self, request: Request<v1::SnapshotRequest>) -> Result<Response<v1::SnapshotTaken>, Status> {
        self.gate.check_serving()?;
        let generation = generation_of(&request);
        let id = workspace_id(&request.get_ref().workspace_id)?;
        berth_proto::trace::record_workspace(id.as_str());
        if self.workspaces().snapshots().is_none() {
            return Err(NodeError::SnapshotsDisabled.into());
        }
        // Runs to completion even if the caller goes away (a drain waits for it).
        let workspaces = Arc::clone(self.workspaces());
        let task_id = id.clone();
        let taken = tokio::spawn(async move { workspaces.snapshot(&task_id, generation, true).await })
            .await
            .map_err(|error| NodeError::ProvisionTask { reason: error.to_string() })??;
        let taken = taken.ok_or_else(|| NodeError::Snapshot {
            workspace_id: id.clone(),
            what: "snapshot",
            reason: "its files are the provider's (a portable backend)".to_owned(),
        })?;
        Ok(Response::new(taken))
    }

    async fn destroy(&self, request: Request<v1::DestroyRequest>) -> Result<Response<v1::DestroyResponse>, Status> {
        let generation = generation_of(&request);
        let id = workspace_id(&request.get_ref().workspace_id)?;
        let existed = self.workspaces().delete(&id, generation).await?;
        Ok(Response::new(v1::DestroyResponse { existed }))
    }

    async fn list_quarantine(
        &self,
        _request: Request<v1::ListQuarantineRequest>,
    ) -> Result<Response<v1::ListQuarantineResponse>, Status> {
        let entries = self.workspaces().quarantine().list().await.map_err(status)?;
        Ok(Response::new(v1::ListQuarantineResponse { entries: entries.iter().map(quarantine_entry).collect() }))
    }

    async fn restore_quarantine(
        &self,
        request: Request<v1::RestoreQuarantineRequest>,
    ) -> Result<Response<v1::RestoreQuarantineResponse>, Status> {
        let (id, path) = self.workspaces().restore_quarantined(&request.get_ref().entry).await?;
        Ok(Response::new(v1::RestoreQuarantineResponse { workspace_id: id.to_string(), path }))
    }

    async fn list_labelled(
        &self,
        request: Request<v1::ListLabelledRequest>,
    ) -> Result<Response<v1::ListLabelledResponse>, Status> {
        let found = self.workspaces().list_labelled(&request.get_ref().backend).await?;
        let sandboxes = found
            .into_iter()
            .map(|sandbox| v1::LabelledSandbox {
                provider_id: sandbox.provider_id,
                workspace_id: sandbox.workspace_id.map(|id| id.to_string()).unwrap_or_default(),
                generation: sandbox.generation,
                created_at_unix_ms: sandbox.created_at_ms,
            })
            .collect();
        Ok(Response::new(v1::ListLabelledResponse { sandboxes }))
    }

    async fn remove_labelled(
        &self,
        request: Request<v1::RemoveLabelledRequest>,
    ) -> Result<Response<v1::RemoveLabelledResponse>, Status> {
        let request = request.into_inner();
        let sandbox = request.sandbox.unwrap_or_default();
        let labelled = berth_workspace::LabelledSandbox {
            provider_id: sandbox.provider_id,
            workspace_id: WorkspaceId::new(sandbox.workspace_id).ok(),
            generation: sandbox.generation,
            created_at_ms: sandbox.created_at_unix_ms,
        };
        self.workspaces().remove_labelled(&request.backend, &labelled).await?;
        Ok(Response::new(v1::RemoveLabelledResponse {}))
    }

    async fn list_local(
        &self,
        _request: Request<v1::ListLocalRequest>,
    ) -> Result<Response<v1::ListLocalResponse>, Status> {
        let mut workspaces: Vec<v1::LocalWorkspace> =
            // ListLocal does not feed the sweeper; the MCP pool is the heartbeat's to report.
            self.workspaces().all().iter().map(|entry| local_workspace(entry, 0)).collect();
        workspaces.sort_by(|left, right| left.workspace_id.cmp(&right.workspace_id));
        Ok(Response::new(v1::ListLocalResponse { workspaces }))
    }
}

/// The generation a replica's call names (`x-berth-generation`), if any.
fn generation_of<T>(request: &Request<T>) -> Option<u64> {
    request
        .metadata()
        .get(berth_proto::meta::GENERATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok())
}

fn quarantine_entry(entry: &QuarantineEntry) -> v1::QuarantineEntry {
    v1::QuarantineEntry {
        entry: entry.entry.clone(),
        workspace_id: entry.workspace_id.to_string(),
        generation: entry.generation,
        backend: entry.backend.clone(),
        reason: entry.reason.to_string(),
        quarantined_at: Some(berth_proto::convert::timestamp_from_unix_ms(entry.quarantined_at_ms)),
        bytes: entry.bytes,
    }
}

/// What the node reports of one workspace. Use is reported as an age on the node's own clock
/// (the replica turns it into its own time at receipt), so clocks are never compared.
/// `mcp_clients_live`: the workspace's MCP servers with a live client.
pub fn local_workspace(entry: &Entry, mcp_clients_live: u32) -> v1::LocalWorkspace {
    let last_access_ms = entry.last_access_ms.load(Ordering::Relaxed);
    v1::LocalWorkspace {
        workspace_id: entry.id.to_string(),
        generation: entry.generation,
        backend: entry.backend_name.clone(),
        running: entry.backend.is_some(),
        last_access_unix_ms: last_access_ms,
        idle_for_ms: Some((crate::state::now_ms() - last_access_ms).max(0)),
        execs_in_flight: entry.execs_in_flight.load(Ordering::Relaxed),
        mcp_clients_live,
    }
}
