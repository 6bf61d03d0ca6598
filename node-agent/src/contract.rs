//! The workspace contract on a node: MCP, skills, offload and tree transfer
//! (`ContractService`'s data plane). `data_plane.rs` admits each call through the
//! [`Gate`](crate::gate::Gate) (fence and generation), then delegates here; everything
//! below goes through `berth_workspace`'s modules and so through the backend's primitives.
//!
//! Node-level state: the MCP service (client pool, secret store under
//! `<data-dir>/secrets/`), one cached skill index per workspace. All of it is rebuilt at
//! start; lifecycle hooks clean it up when a workspace is released or destroyed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// An `--mcp-allow-cidr` range (`ContractConfig::mcp.allowed_cidrs`).
pub use berth_features::mcp::Cidr;
use berth_features::mcp::{McpService, McpServiceConfig, SecretStore};
use berth_features::offload;
use berth_features::skills::{self, SkillIndex};
use berth_features::tree::{self, TreeLimits};
use berth_proto::contract::{
    check_mcp_target, check_skill_name, context_messages, context_offloaded_to_proto, mcp_call_to_proto,
    mcp_server_to_proto, mcp_spec_from_proto, mcp_status_to_proto, mcp_tool_to_proto, skill_info_to_proto,
    timeout_from_ms, tool_arguments, tool_result_to_proto, tree_destination, upload_stats_to_proto,
};
use berth_proto::v1::{self, add_skill_request, upload_tree_request};
use berth_workspace::{BackendRef, ByteStream, RelPath, WorkspaceError, WorkspaceId};
use bytes::Bytes;
use futures::StreamExt;
use tonic::{Status, Streaming};

use crate::error::status;
use crate::files::BoxStream;
use crate::gate::Admitted;
use crate::limits::OutputBudget;
use crate::state::LifecycleHook;

type Reply<T> = Result<T, Status>;

/// Settings of the contract on this node.
#[derive(Clone, Debug, Default)]
pub struct ContractConfig {
    pub mcp: McpServiceConfig,
    /// Bounds of one skill or tree archive.
    pub tree_limits: TreeLimits,
    /// Host directory of seed skills copied into each new workspace once.
    pub skills_seed: Option<PathBuf>,
}

/// What one MCP tool call (or tool listing) reserves from the node's output budget: the
/// most a result can hold, since the MCP client reads a message of up to 16 MiB whole.
pub const MCP_RESULT_RESERVE_BYTES: u64 = 16 * 1024 * 1024;

pub struct Contract {
    mcp: McpService,
    /// The node's output budget: a tool call reserves the most one result can hold.
    output_budget: OutputBudget,
    limits: TreeLimits,
    skills_seed: Option<PathBuf>,
    indexes: Mutex<HashMap<WorkspaceId, Arc<SkillIndex>>>,
}

impl Contract {
    /// Secrets live in `secrets_dir` (the node's `<data-dir>/secrets`).
    pub fn new(config: ContractConfig, secrets_dir: PathBuf, output_budget: OutputBudget) -> Self {
        Self {
            mcp: McpService::new(config.mcp, Arc::new(SecretStore::new(secrets_dir))),
            output_budget,
            limits: config.tree_limits,
            skills_seed: config.skills_seed,
            indexes: Mutex::new(HashMap::new()),
        }
    }

    pub fn mcp(&self) -> &McpService {
        &self.mcp
    }

    fn index(&self, id: &WorkspaceId) -> Arc<SkillIndex> {
        let mut indexes = self.indexes.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        Arc::clone(indexes.entry(id.clone()).or_default())
    }

    /// The cached skill index of a workspace (tests read its hash counter).
    pub fn skill_index(&self, id: &WorkspaceId) -> Arc<SkillIndex> {
        self.index(id)
    }

    // ---- MCP ---------------------------------------------------------------------------

    pub async fn add_mcp(&self, workspace: Admitted, request: v1::AddMcpRequest) -> Reply<v1::AddMcpResponse> {
        let (id, backend) = (workspace.id(), &workspace.backend);
        let spec = mcp_spec_from_proto(request.server).map_err(status)?;
        let stored = self.mcp.add(backend.as_ref(), id, &spec, request.replace).await.map_err(status)?;
        tracing::info!(ws_id = %id, server = %stored.name, transport = stored.transport_name(), "mcp server added");
        Ok(v1::AddMcpResponse { server: Some(mcp_server_to_proto(&stored)) })
    }

    pub async fn remove_mcp(&self, workspace: Admitted, request: v1::RemoveMcpRequest) -> Reply<v1::RemoveMcpResponse> {
        let existed =
            self.mcp.remove(workspace.backend.as_ref(), workspace.id(), &request.name).await.map_err(status)?;
        Ok(v1::RemoveMcpResponse { existed })
    }

    pub async fn list_mcps(&self, workspace: Admitted, _request: v1::ListMcpsRequest) -> Reply<v1::ListMcpsResponse> {
        let (servers, reseeded) = self.mcp.list(workspace.backend.as_ref(), workspace.id()).await.map_err(status)?;
        Ok(v1::ListMcpsResponse { servers: servers.iter().map(mcp_status_to_proto).collect(), reseeded })
    }

    pub async fn list_mcp_tools(
        &self,
        workspace: Admitted,
        request: v1::ListMcpToolsRequest,
    ) -> Reply<v1::ListMcpToolsResponse> {
        check_mcp_target(&request.server, None).map_err(status)?;
        let _buffer = self.output_budget.reserve_bytes(MCP_RESULT_RESERVE_BYTES)?;
        let tools = self
            .mcp
            .list_tools(&workspace.backend, workspace.id(), &request.server, timeout_from_ms(request.timeout_ms))
            .await
            .map_err(status)?;
        Ok(v1::ListMcpToolsResponse { tools: tools.into_iter().map(mcp_tool_to_proto).collect() })
    }

    pub async fn call_mcp_tool(
        &self,
        workspace: Admitted,
        request: v1::CallMcpToolRequest,
    ) -> Reply<v1::CallMcpToolResponse> {
        let (id, backend) = (workspace.id(), &workspace.backend);
        check_mcp_target(&request.server, Some(&request.tool)).map_err(status)?;
        let arguments = tool_arguments(&request.arguments_json).map_err(status)?;
        // Held until the answer is built; refused at once when the node cannot cover it.
        let _buffer = self.output_budget.reserve_bytes(MCP_RESULT_RESERVE_BYTES)?;
        let output = self
            .mcp
            .call_tool(backend, id, &request.server, &request.tool, arguments, timeout_from_ms(request.timeout_ms))
            .await
            .map_err(status)?;
        Ok(mcp_call_to_proto(output))
    }

    // ---- skills ------------------------------------------------------------------------

    pub async fn add_skill(
        &self,
        workspace: Admitted,
        header: v1::AddSkillHeader,
        inbound: Streaming<v1::AddSkillRequest>,
    ) -> Reply<v1::AddSkillResponse> {
        check_skill_name(&header.name, false).map_err(status)?;
        let chunks = chunk_stream(inbound, |message: v1::AddSkillRequest| match message.msg {
            Some(add_skill_request::Msg::Chunk(chunk)) => Some(chunk),
            _ => None,
        });
        let name = (!header.name.is_empty()).then_some(header.name.as_str());
        let (id, backend) = (workspace.id(), workspace.backend.as_ref());
        let (info, stats) = skills::add(backend, name, chunks, self.limits, header.replace).await.map_err(status)?;
        tracing::info!(ws_id = %id, skill = %info.name, files = stats.files, bytes = stats.bytes, "skill added");
        Ok(v1::AddSkillResponse { skill: Some(skill_info_to_proto(&info)), files: stats.files, bytes: stats.bytes })
    }

    pub async fn remove_skill(
        &self,
        workspace: Admitted,
        request: v1::RemoveSkillRequest,
    ) -> Reply<v1::RemoveSkillResponse> {
        let existed = skills::remove(workspace.backend.as_ref(), &request.name).await.map_err(status)?;
        Ok(v1::RemoveSkillResponse { existed })
    }

    pub async fn list_skills(
        &self,
        workspace: Admitted,
        _request: v1::ListSkillsRequest,
    ) -> Reply<v1::ListSkillsResponse> {
        let listed = self.index(workspace.id()).list(workspace.backend.as_ref()).await.map_err(status)?;
        Ok(v1::ListSkillsResponse { skills: listed.iter().map(skill_info_to_proto).collect() })
    }

    pub async fn get_skill(&self, workspace: Admitted, request: v1::GetSkillRequest) -> Reply<v1::GetSkillResponse> {
        let (info, body) = skills::get(workspace.backend.as_ref(), &request.name).await.map_err(status)?;
        Ok(v1::GetSkillResponse { skill: Some(skill_info_to_proto(&info)), body })
    }

    // ---- offload -----------------------------------------------------------------------

    pub async fn offload_context(
        &self,
        workspace: Admitted,
        request: v1::OffloadContextRequest,
    ) -> Reply<v1::OffloadContextResponse> {
        let messages = context_messages(&request.messages_json).map_err(status)?;
        let done = offload::offload_context(workspace.backend.as_ref(), &request.session_id, messages)
            .await
            .map_err(status)?;
        Ok(context_offloaded_to_proto(done))
    }

    pub async fn offload_tool_result(
        &self,
        workspace: Admitted,
        request: v1::OffloadToolResultRequest,
    ) -> Reply<v1::OffloadToolResultResponse> {
        let done = offload::offload_tool_result(
            workspace.backend.as_ref(),
            &request.session_id,
            &request.tool_call_id,
            Bytes::from(request.content),
            request.threshold_bytes,
            request.preview_bytes as usize,
        )
        .await
        .map_err(status)?;
        Ok(tool_result_to_proto(done))
    }

    // ---- trees -------------------------------------------------------------------------

    pub async fn upload_tree(
        &self,
        workspace: Admitted,
        header: v1::UploadTreeHeader,
        inbound: Streaming<v1::UploadTreeRequest>,
    ) -> Reply<v1::UploadTreeResponse> {
        let dest = tree_destination(&header.path).map_err(status)?;
        let chunks = chunk_stream(inbound, |message: v1::UploadTreeRequest| match message.msg {
            Some(upload_tree_request::Msg::Chunk(chunk)) => Some(chunk),
            _ => None,
        });
        let (id, backend) = (workspace.id(), workspace.backend.as_ref());
        let stats = tree::upload(backend, &dest, chunks, self.limits, header.overwrite).await.map_err(status)?;
        tracing::info!(ws_id = %id, dest = %dest, files = stats.files, bytes = stats.bytes, "tree uploaded");
        Ok(upload_stats_to_proto(stats))
    }

    pub async fn download_tree(
        &self,
        workspace: Admitted,
        request: v1::DownloadTreeRequest,
    ) -> Reply<BoxStream<v1::TreeChunk>> {
        let dir = RelPath::parse(&request.path).map_err(status)?;
        let chunks = tree::pack(workspace.backend, dir).await.map_err(status)?;
        Ok(Box::pin(chunks.map(|chunk| chunk.map(|data| v1::TreeChunk { data: data.to_vec() }).map_err(status))))
    }
}

/// The chunks after a stream's header as a byte stream. A broken client stream, or a
/// second header, becomes an error item, so the extraction fails and leaves nothing.
fn chunk_stream<M: Send + 'static>(
    inbound: Streaming<M>,
    chunk_of: impl Fn(M) -> Option<Vec<u8>> + Send + 'static,
) -> ByteStream {
    inbound
        .map(move |message| match message {
            Ok(message) => chunk_of(message)
                .map(Bytes::from)
                .ok_or_else(|| WorkspaceError::InvalidArgument("only chunks may follow the header".into())),
            Err(status) => Err(WorkspaceError::InvalidArgument(format!("upload stream broken: {}", status.message()))),
        })
        .boxed()
}

#[tonic::async_trait]
impl LifecycleHook for Contract {
    async fn provisioned(&self, id: &WorkspaceId, backend: &BackendRef) {
        let Some(seed_dir) = &self.skills_seed else { return };
        match skills::seed::seed(backend.as_ref(), seed_dir, self.limits).await {
            Ok(outcome) if outcome.ran => {
                tracing::info!(ws_id = %id, copied = ?outcome.copied, skipped = ?outcome.skipped, "seeded skills");
            }
            Ok(_) => {}
            Err(error) => tracing::warn!(ws_id = %id, %error, "seeding skills failed"),
        }
    }

    async fn released(&self, id: &WorkspaceId) {
        if let Err(error) = self.mcp.forget_workspace(id, false).await {
            tracing::warn!(ws_id = %id, %error, "closing mcp clients failed");
        }
    }

    async fn destroyed(&self, id: &WorkspaceId) {
        self.indexes.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).remove(id);
        if let Err(error) = self.mcp.forget_workspace(id, true).await {
            tracing::warn!(ws_id = %id, %error, "removing the workspace's mcp secrets failed");
        }
    }
}
