//! `ContractService`: MCP servers, skills, context offload and tree transfer. Every call
//! is validated here (the node validates again), then forwarded to the node holding the
//! workspace through the [`Router`], with one retry on a stale route like the file calls.
//! Client-streaming calls (AddSkill, UploadTree) cannot be replayed, so they resolve the
//! target first and pipe; a broken client stream reaches the node as a reset.

use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use berth_proto::contract::{
    check_mcp_target, check_skill_name, context_messages, mcp_spec_from_proto, tool_arguments, tree_destination,
};
use berth_proto::v1::contract_service_server::ContractService;
use berth_proto::v1::{self, add_skill_request, upload_tree_request};
use berth_workspace::{RelPath, WorkspaceId};
use futures::Stream;
use tonic::{Request, Response, Status, Streaming};

use crate::authz::{Access, Action, Caller};
use crate::error::ControlPlaneError;
use crate::router::{Router, pipe};

/// Added to an MCP call's own timeout: the server may have to start first, and the node's
/// typed DEADLINE_EXCEEDED should reach the client before the transport deadline.
const MCP_DEADLINE_MARGIN: Duration = Duration::from_secs(45);
/// Node default of an MCP call when the request gives none.
const MCP_DEFAULT_CALL: Duration = Duration::from_secs(60);

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

pub struct ContractApi {
    router: Arc<Router>,
    access: Access,
    node_call_timeout: Duration,
}

impl ContractApi {
    pub fn new(router: Arc<Router>, access: Access, node_call_timeout: Duration) -> Self {
        Self { router, access, node_call_timeout }
    }

    /// The caller may use the workspace (the one check of every contract call; see
    /// `authz.rs`). Everything here reads or changes workspace content: `Action::Use`.
    async fn authorize(&self, caller: &Caller, workspace_id: &str) -> Result<WorkspaceId, Status> {
        Ok(self.access.workspace(caller, workspace_id, Action::Use).await?.0)
    }
}

fn invalid(error: berth_workspace::WorkspaceError) -> Status {
    ControlPlaneError::from(error).into()
}

fn mcp_deadline(timeout_ms: u64) -> Duration {
    let call = if timeout_ms == 0 { MCP_DEFAULT_CALL } else { Duration::from_millis(timeout_ms) };
    call + MCP_DEADLINE_MARGIN
}

async fn header_of<M>(inbound: &mut Streaming<M>) -> Result<M, Status>
where
    M: Send + 'static,
{
    inbound.message().await?.ok_or_else(|| ControlPlaneError::EmptyStream.into())
}

#[tonic::async_trait]
impl ContractService for ContractApi {
    async fn add_mcp(&self, request: Request<v1::AddMcpRequest>) -> Result<Response<v1::AddMcpResponse>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        mcp_spec_from_proto(message.server.clone()).map_err(invalid)?;
        self.router
            .forward(&id, message, Some(self.node_call_timeout), |mut client, request| async move {
                client.add_mcp(request).await
            })
            .await
    }

    async fn remove_mcp(
        &self,
        request: Request<v1::RemoveMcpRequest>,
    ) -> Result<Response<v1::RemoveMcpResponse>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        check_mcp_target(&message.name, None).map_err(invalid)?;
        self.router
            .forward(&id, message, Some(self.node_call_timeout), |mut client, request| async move {
                client.remove_mcp(request).await
            })
            .await
    }

    async fn list_mcps(&self, request: Request<v1::ListMcpsRequest>) -> Result<Response<v1::ListMcpsResponse>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        self.router
            .forward(&id, message, Some(self.node_call_timeout), |mut client, request| async move {
                client.list_mcps(request).await
            })
            .await
    }

    async fn list_mcp_tools(
        &self,
        request: Request<v1::ListMcpToolsRequest>,
    ) -> Result<Response<v1::ListMcpToolsResponse>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        check_mcp_target(&message.server, None).map_err(invalid)?;
        let deadline = mcp_deadline(message.timeout_ms);
        self.router
            .forward(
                &id,
                message,
                Some(deadline),
                |mut client, request| async move { client.list_mcp_tools(request).await },
            )
            .await
    }

    async fn call_mcp_tool(
        &self,
        request: Request<v1::CallMcpToolRequest>,
    ) -> Result<Response<v1::CallMcpToolResponse>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        check_mcp_target(&message.server, Some(&message.tool)).map_err(invalid)?;
        tool_arguments(&message.arguments_json).map_err(invalid)?;
        let deadline = mcp_deadline(message.timeout_ms);
        self.router
            .forward(
                &id,
                message,
                Some(deadline),
                |mut client, request| async move { client.call_mcp_tool(request).await },
            )
            .await
    }

    async fn add_skill(
        &self,
        request: Request<Streaming<v1::AddSkillRequest>>,
    ) -> Result<Response<v1::AddSkillResponse>, Status> {
        let caller = Caller::of(&request)?;
        let mut inbound = request.into_inner();
        let first = header_of(&mut inbound).await?;
        let Some(add_skill_request::Msg::Header(header)) = &first.msg else {
            return Err(ControlPlaneError::MissingHeader { rpc: "AddSkill" }.into());
        };
        let id = self.authorize(&caller, &header.workspace_id).await?;
        check_skill_name(&header.name, false).map_err(invalid)?;
        let target = self.router.target(&id).await?;
        pipe(target, first, inbound, |mut client, request| async move { client.add_skill(request).await }).await
    }

    async fn remove_skill(
        &self,
        request: Request<v1::RemoveSkillRequest>,
    ) -> Result<Response<v1::RemoveSkillResponse>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        check_skill_name(&message.name, true).map_err(invalid)?;
        self.router
            .forward(&id, message, Some(self.node_call_timeout), |mut client, request| async move {
                client.remove_skill(request).await
            })
            .await
    }

    async fn list_skills(
        &self,
        request: Request<v1::ListSkillsRequest>,
    ) -> Result<Response<v1::ListSkillsResponse>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        self.router
            .forward(&id, message, Some(self.node_call_timeout), |mut client, request| async move {
                client.list_skills(request).await
            })
            .await
    }

    async fn get_skill(&self, request: Request<v1::GetSkillRequest>) -> Result<Response<v1::GetSkillResponse>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        check_skill_name(&message.name, true).map_err(invalid)?;
        self.router
            .forward(&id, message, Some(self.node_call_timeout), |mut client, request| async move {
                client.get_skill(request).await
            })
            .await
    }

    async fn offload_context(
        &self,
        request: Request<v1::OffloadContextRequest>,
    ) -> Result<Response<v1::OffloadContextResponse>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        berth_workspace::offload::validate_session_id(&message.session_id).map_err(invalid)?;
        context_messages(&message.messages_json).map_err(invalid)?;
        self.router
            .forward(&id, message, Some(self.node_call_timeout), |mut client, request| async move {
                client.offload_context(request).await
            })
            .await
    }

    async fn offload_tool_result(
        &self,
        request: Request<v1::OffloadToolResultRequest>,
    ) -> Result<Response<v1::OffloadToolResultResponse>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        berth_workspace::offload::validate_session_id(&message.session_id).map_err(invalid)?;
        if message.content.len() > berth_workspace::offload::MAX_TOOL_RESULT_BYTES {
            return Err(invalid(berth_workspace::WorkspaceError::LimitExceeded {
                limit: "tool result size",
                size: message.content.len() as u64,
                max: berth_workspace::offload::MAX_TOOL_RESULT_BYTES as u64,
            }));
        }
        self.router
            .forward(&id, message, Some(self.node_call_timeout), |mut client, request| async move {
                client.offload_tool_result(request).await
            })
            .await
    }

    async fn upload_tree(
        &self,
        request: Request<Streaming<v1::UploadTreeRequest>>,
    ) -> Result<Response<v1::UploadTreeResponse>, Status> {
        let caller = Caller::of(&request)?;
        let mut inbound = request.into_inner();
        let first = header_of(&mut inbound).await?;
        let Some(upload_tree_request::Msg::Header(header)) = &first.msg else {
            return Err(ControlPlaneError::MissingHeader { rpc: "UploadTree" }.into());
        };
        let id = self.authorize(&caller, &header.workspace_id).await?;
        tree_destination(&header.path).map_err(invalid)?;
        let target = self.router.target(&id).await?;
        pipe(target, first, inbound, |mut client, request| async move { client.upload_tree(request).await }).await
    }

    type DownloadTreeStream = BoxStream<v1::TreeChunk>;

    async fn download_tree(
        &self,
        request: Request<v1::DownloadTreeRequest>,
    ) -> Result<Response<Self::DownloadTreeStream>, Status> {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let id = self.authorize(&caller, &message.workspace_id).await?;
        RelPath::parse(&message.path).map_err(invalid)?;
        // Streams can be long: no overall deadline (keep-alive notices a dead node).
        let response = self
            .router
            .forward(&id, message, None, |mut client, request| async move { client.download_tree(request).await })
            .await?;
        Ok(Response::new(Box::pin(response.into_inner())))
    }
}
