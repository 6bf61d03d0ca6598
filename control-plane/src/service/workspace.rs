//! `WorkspaceService`: the public API. Sessions and records are handled in
//! [`super::sessions`] (the `replica_only` RPCs, written out below); the exec and file calls
//! of `berth_proto::workspace_rpcs!` are forwarded to the node holding the workspace by
//! [`Forwarder`] (validation in `forward.rs`).

use std::sync::Arc;
use std::time::Duration;

use berth_proto::v1;
use berth_proto::v1::workspace_service_server::WorkspaceService;
use tonic::{Request, Response, Status};

use super::sessions::Sessions;
use crate::authz::{Access, Caller};
use crate::forward::{Forwarder, forwarding};
use crate::router::Router;

pub struct WorkspaceApi {
    sessions: Sessions,
    forward: Forwarder,
}

impl WorkspaceApi {
    pub fn new(router: Arc<Router>, sessions: Sessions, access: Access, node_call_timeout: Duration) -> Self {
        Self { sessions, forward: Forwarder::new(router, access, node_call_timeout) }
    }
}

berth_proto::workspace_rpcs! {
    forwarding!(impl WorkspaceService for WorkspaceApi, to workspace)

    // The `replica_only` RPCs: sessions, records, sharing.

    async fn create_session(
        &self,
        request: Request<v1::CreateSessionRequest>,
    ) -> Result<Response<v1::Session>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.sessions.create(&caller, request.into_inner()).await?))
    }

    async fn get_session(&self, request: Request<v1::GetSessionRequest>) -> Result<Response<v1::Session>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.sessions.get(&caller, &request.into_inner().session_id).await?))
    }

    async fn close_session(
        &self,
        request: Request<v1::CloseSessionRequest>,
    ) -> Result<Response<v1::CloseSessionResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.sessions.close(&caller, &request.into_inner().session_id).await?))
    }

    async fn get_workspace(
        &self,
        request: Request<v1::GetWorkspaceRequest>,
    ) -> Result<Response<v1::Workspace>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.sessions.get_workspace(&caller, &request.into_inner().workspace_id).await?))
    }

    async fn list_workspaces(
        &self,
        request: Request<v1::ListWorkspacesRequest>,
    ) -> Result<Response<v1::ListWorkspacesResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.sessions.list_workspaces(&caller, request.get_ref())?))
    }

    async fn close_workspace(
        &self,
        request: Request<v1::CloseWorkspaceRequest>,
    ) -> Result<Response<v1::CloseWorkspaceResponse>, Status> {
        let caller = Caller::of(&request)?;
        let request = request.into_inner();
        Ok(Response::new(self.sessions.close_workspace(&caller, &request.workspace_id, request.destroy).await?))
    }

    async fn share_workspace(
        &self,
        request: Request<v1::ShareWorkspaceRequest>,
    ) -> Result<Response<v1::Workspace>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        Ok(Response::new(self.sessions.set_shared(&caller, &message.workspace_id, &message.user_id, true).await?))
    }

    async fn unshare_workspace(
        &self,
        request: Request<v1::UnshareWorkspaceRequest>,
    ) -> Result<Response<v1::Workspace>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        Ok(Response::new(self.sessions.set_shared(&caller, &message.workspace_id, &message.user_id, false).await?))
    }

    async fn snapshot_workspace(
        &self,
        request: Request<v1::SnapshotWorkspaceRequest>,
    ) -> Result<Response<v1::Snapshot>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.sessions.snapshot_workspace(&caller, &request.get_ref().workspace_id).await?))
    }

    async fn list_snapshots(
        &self,
        request: Request<v1::ListSnapshotsRequest>,
    ) -> Result<Response<v1::ListSnapshotsResponse>, Status> {
        let caller = Caller::of(&request)?;
        Ok(Response::new(self.sessions.list_snapshots(&caller, &request.get_ref().workspace_id).await?))
    }

    async fn restore_workspace(
        &self,
        request: Request<v1::RestoreWorkspaceRequest>,
    ) -> Result<Response<v1::Workspace>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        Ok(Response::new(self.sessions.restore_workspace(&caller, &message.workspace_id, &message.snapshot_id).await?))
    }
}
