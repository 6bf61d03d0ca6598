//! `WorkspaceService`: the public API. Sessions and records are handled in
//! [`super::sessions`]; exec and file calls are validated here, then forwarded to the node
//! holding the workspace through the [`Router`].

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use berth_proto::convert::exec_spec_from_proto;
use berth_proto::v1::workspace_service_server::WorkspaceService;
use berth_proto::v1::{self, write_file_request::Msg as WriteMsg};
use berth_workspace::{RelPath, WorkspaceId};
use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use super::sessions::Sessions;
use crate::authz::{Access, Action, Caller};
use crate::error::ControlPlaneError;
use crate::router::{Router, pipe};

/// Extra time a node call gets past the exec's own timeout, so the node's timed-out answer
/// (not a transport deadline) reaches the client.
const EXEC_DEADLINE_MARGIN: Duration = Duration::from_secs(10);

pub struct WorkspaceApi {
    router: Arc<Router>,
    sessions: Sessions,
    access: Access,
    node_call_timeout: Duration,
}

impl WorkspaceApi {
    pub fn new(router: Arc<Router>, sessions: Sessions, access: Access, node_call_timeout: Duration) -> Self {
        Self { router, sessions, access, node_call_timeout }
    }

    /// Authorizes `action` on the workspace for the request's caller (the one check of
    /// every workspace call; see `authz.rs`).
    async fn authorize<T>(
        &self,
        request: &Request<T>,
        workspace_id: &str,
        action: Action,
    ) -> Result<WorkspaceId, Status> {
        let caller = Caller::of(request)?;
        Ok(self.access.workspace(&caller, workspace_id, action).await?.0)
    }
}

fn check_path(path: &str) -> Result<(), Status> {
    RelPath::parse(path).map_err(ControlPlaneError::from)?;
    Ok(())
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl WorkspaceService for WorkspaceApi {
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

    async fn exec(&self, request: Request<v1::ExecRequest>) -> Result<Response<v1::ExecResult>, Status> {
        let id = self.authorize(&request, &request.get_ref().workspace_id, Action::Use).await?;
        let message = request.into_inner();
        let spec = exec_spec_from_proto(&message).map_err(ControlPlaneError::from)?;
        let deadline = spec.timeout + EXEC_DEADLINE_MARGIN;
        let result = self
            .router
            .forward(&id, message, Some(deadline), |mut client, request| async move { client.exec(request).await })
            .await?;
        Ok(Response::new(result.into_inner()))
    }

    type ExecStreamStream = BoxStream<v1::ExecChunk>;

    async fn exec_stream(&self, request: Request<v1::ExecRequest>) -> Result<Response<Self::ExecStreamStream>, Status> {
        let id = self.authorize(&request, &request.get_ref().workspace_id, Action::Use).await?;
        let message = request.into_inner();
        let spec = exec_spec_from_proto(&message).map_err(ControlPlaneError::from)?;
        let deadline = spec.timeout + EXEC_DEADLINE_MARGIN;
        let response =
            self.router
                .forward(&id, message, Some(deadline), |mut client, request| async move {
                    client.exec_stream(request).await
                })
                .await?;
        Ok(Response::new(Box::pin(response.into_inner())))
    }

    type ReadFileStream = BoxStream<v1::FileChunk>;

    async fn read_file(&self, request: Request<v1::ReadFileRequest>) -> Result<Response<Self::ReadFileStream>, Status> {
        check_path(&request.get_ref().path)?;
        let id = self.authorize(&request, &request.get_ref().workspace_id, Action::Use).await?;
        let message = request.into_inner();
        // Streams can be long: no overall deadline, the transport's keep-alive notices a
        // dead node.
        let response = self
            .router
            .forward(&id, message, None, |mut client, request| async move { client.read_file(request).await })
            .await?;
        Ok(Response::new(Box::pin(response.into_inner())))
    }

    async fn write_file(
        &self,
        request: Request<Streaming<v1::WriteFileRequest>>,
    ) -> Result<Response<v1::WriteFileResponse>, Status> {
        let caller = Caller::of(&request)?;
        let mut inbound = request.into_inner();
        let header = match inbound.message().await? {
            Some(v1::WriteFileRequest { msg: Some(WriteMsg::Header(header)) }) => header,
            _ => return Err(ControlPlaneError::MissingHeader { rpc: "WriteFile" }.into()),
        };
        check_path(&header.path)?;
        let (id, _) = self.access.workspace(&caller, &header.workspace_id, Action::Use).await?;
        // The stream can be consumed once, so there is no retry: resolve first, then pipe.
        let target = self.router.target(&id).await?;
        let header = v1::WriteFileRequest { msg: Some(WriteMsg::Header(header)) };
        pipe(target, header, inbound, |mut client, request| async move { client.write_file(request).await }).await
    }

    async fn stat(&self, request: Request<v1::StatRequest>) -> Result<Response<v1::FileInfo>, Status> {
        check_path(&request.get_ref().path)?;
        let id = self.authorize(&request, &request.get_ref().workspace_id, Action::Use).await?;
        let message = request.into_inner();
        let timeout = self.node_call_timeout;
        let response = self
            .router
            .forward(&id, message, Some(timeout), |mut client, request| async move { client.stat(request).await })
            .await?;
        Ok(response)
    }

    async fn list_dir(&self, request: Request<v1::ListDirRequest>) -> Result<Response<v1::ListDirResponse>, Status> {
        check_path(&request.get_ref().path)?;
        let id = self.authorize(&request, &request.get_ref().workspace_id, Action::Use).await?;
        let message = request.into_inner();
        let timeout = self.node_call_timeout;
        self.router
            .forward(&id, message, Some(timeout), |mut client, request| async move { client.list_dir(request).await })
            .await
    }

    async fn remove_path(
        &self,
        request: Request<v1::RemovePathRequest>,
    ) -> Result<Response<v1::RemovePathResponse>, Status> {
        check_path(&request.get_ref().path)?;
        let id = self.authorize(&request, &request.get_ref().workspace_id, Action::Use).await?;
        let message = request.into_inner();
        let timeout = self.node_call_timeout;
        self.router
            .forward(
                &id,
                message,
                Some(timeout),
                |mut client, request| async move { client.remove_path(request).await },
            )
            .await
    }

    async fn make_dir(&self, request: Request<v1::MakeDirRequest>) -> Result<Response<v1::MakeDirResponse>, Status> {
        check_path(&request.get_ref().path)?;
        let id = self.authorize(&request, &request.get_ref().workspace_id, Action::Use).await?;
        let message = request.into_inner();
        let timeout = self.node_call_timeout;
        self.router
            .forward(&id, message, Some(timeout), |mut client, request| async move { client.make_dir(request).await })
            .await
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
}
