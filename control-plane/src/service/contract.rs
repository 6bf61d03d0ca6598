//! `ContractService`: MCP servers, skills, context offload and tree transfer. Every RPC is
//! one line below: validated in `forward.rs` (the node validates again), then forwarded by
//! [`Forwarder`] to the node holding the workspace, with one retry on a stale route like
//! the file calls. Client-streaming calls (AddSkill, UploadTree) cannot be replayed, so
//! they resolve the target first and pipe; a broken client stream reaches the node as a
//! reset.

use std::sync::Arc;

use berth_proto::v1::contract_service_server::ContractService;

use crate::authz::Access;
use crate::forward::{Forwarder, forwarding};
use crate::router::Router;

pub struct ContractApi {
    forward: Forwarder,
}

impl ContractApi {
    pub fn new(router: Arc<Router>) -> Self {
        let access = Access::new(Arc::clone(router.binder()));
        Self { forward: Forwarder::new(router, access) }
    }
}

forwarding! {
    impl ContractService for ContractApi, to contract {
        unary add_mcp(AddMcpRequest) -> AddMcpResponse;
        unary remove_mcp(RemoveMcpRequest) -> RemoveMcpResponse;
        unary list_mcps(ListMcpsRequest) -> ListMcpsResponse;
        unary list_mcp_tools(ListMcpToolsRequest) -> ListMcpToolsResponse;
        unary call_mcp_tool(CallMcpToolRequest) -> CallMcpToolResponse;
        unary remove_skill(RemoveSkillRequest) -> RemoveSkillResponse;
        unary list_skills(ListSkillsRequest) -> ListSkillsResponse;
        unary get_skill(GetSkillRequest) -> GetSkillResponse;
        unary offload_context(OffloadContextRequest) -> OffloadContextResponse;
        unary offload_tool_result(OffloadToolResultRequest) -> OffloadToolResultResponse;
        server_streaming download_tree(DownloadTreeRequest) -> TreeChunk as DownloadTreeStream;
        client_streaming add_skill(AddSkillRequest) -> AddSkillResponse;
        client_streaming upload_tree(UploadTreeRequest) -> UploadTreeResponse;
    }
}
