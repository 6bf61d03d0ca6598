//! Which requests are about one workspace, and so are served by the node holding it.
//!
//! A replica forwards exactly these (after authorizing and validating them,
//! `berth-control-plane`'s `forward.rs`); a node agent checks its fence and the workspace's
//! generation for each of them before any work (`berth-node-agent`'s `gate.rs`). Both read
//! the workspace through [`Routed`], and both write their handlers from the one table of
//! each service's RPCs ([`workspace_rpcs!`](crate::workspace_rpcs),
//! [`contract_rpcs!`](crate::contract_rpcs)), so a new data-plane RPC is declared here.

use tonic::{Status, Streaming};

use crate::v1;

/// A request message (or a client stream's header) about one workspace.
pub trait Routed {
    /// The workspace the call is about, as sent (not yet parsed into a `WorkspaceId`).
    fn workspace_id(&self) -> &str;
}

/// A client-streaming request: a header first (naming the workspace), then data. A stream
/// cannot be replayed, so it is routed by its header alone.
pub trait Streamed: Sized + Send + 'static {
    type Header: Routed + Clone + Send + 'static;

    /// The RPC's name, for the error about a stream that opens without a header.
    const RPC: &'static str;

    /// The header, if this message is one.
    fn header(&self) -> Option<&Self::Header>;
}

macro_rules! routed {
    ($($message:ident),* $(,)?) => {
        $(impl Routed for v1::$message {
            fn workspace_id(&self) -> &str {
                &self.workspace_id
            }
        })*
    };
}

routed!(
    ExecRequest,
    ReadFileRequest,
    WriteFileHeader,
    StatRequest,
    ListDirRequest,
    RemovePathRequest,
    MakeDirRequest,
    AddMcpRequest,
    RemoveMcpRequest,
    ListMcpsRequest,
    ListMcpToolsRequest,
    CallMcpToolRequest,
    AddSkillHeader,
    RemoveSkillRequest,
    ListSkillsRequest,
    GetSkillRequest,
    OffloadContextRequest,
    OffloadToolResultRequest,
    UploadTreeHeader,
    DownloadTreeRequest,
);

macro_rules! streamed {
    ($($message:ident($module:ident::Msg::Header: $header:ident) = $rpc:literal;)*) => {
        $(impl Streamed for v1::$message {
            type Header = v1::$header;
            const RPC: &'static str = $rpc;

            fn header(&self) -> Option<&v1::$header> {
                match &self.msg {
                    Some(v1::$module::Msg::Header(header)) => Some(header),
                    _ => None,
                }
            }
        })*
    };
}

streamed! {
    WriteFileRequest(write_file_request::Msg::Header: WriteFileHeader) = "WriteFile";
    AddSkillRequest(add_skill_request::Msg::Header: AddSkillHeader) = "AddSkill";
    UploadTreeRequest(upload_tree_request::Msg::Header: UploadTreeHeader) = "UploadTree";
}

/// Reads a client stream's first message, which must be its header; returns the header and
/// the message it came in (a replica passes that on unchanged).
pub async fn open<M: Streamed>(inbound: &mut Streaming<M>) -> Result<(M::Header, M), Status> {
    let Some(first) = inbound.message().await? else {
        return Err(Status::invalid_argument("the stream is empty; a header comes first"));
    };
    match first.header() {
        Some(header) => Ok((header.clone(), first)),
        None => Err(Status::invalid_argument(format!("the first {} message must be a header", M::RPC))),
    }
}

/// The RPCs of `WorkspaceService` by shape: those a node serves (exec and files, by the
/// replica forwarded unchanged), then those only a replica serves (`replica_only`).
/// `workspace_rpcs! { callback!(arguments) rest }` expands to
/// `callback! { (arguments) { table } rest }`.
#[macro_export]
macro_rules! workspace_rpcs {
    ($callback:ident!($($arguments:tt)*) $($rest:tt)*) => {
        $callback! {
            ($($arguments)*)
            {
                unary exec(ExecRequest) -> ExecResult;
                unary stat(StatRequest) -> FileInfo;
                unary list_dir(ListDirRequest) -> ListDirResponse;
                unary remove_path(RemovePathRequest) -> RemovePathResponse;
                unary make_dir(MakeDirRequest) -> MakeDirResponse;
                server_streaming exec_stream(ExecRequest) -> ExecChunk as ExecStreamStream;
                server_streaming read_file(ReadFileRequest) -> FileChunk as ReadFileStream;
                client_streaming write_file(WriteFileRequest) -> WriteFileResponse;
                replica_only create_session(CreateSessionRequest) -> Session;
                replica_only get_session(GetSessionRequest) -> Session;
                replica_only close_session(CloseSessionRequest) -> CloseSessionResponse;
                replica_only get_workspace(GetWorkspaceRequest) -> Workspace;
                replica_only list_workspaces(ListWorkspacesRequest) -> ListWorkspacesResponse;
                replica_only close_workspace(CloseWorkspaceRequest) -> CloseWorkspaceResponse;
                replica_only share_workspace(ShareWorkspaceRequest) -> Workspace;
                replica_only unshare_workspace(UnshareWorkspaceRequest) -> Workspace;
                replica_only snapshot_workspace(SnapshotWorkspaceRequest) -> Snapshot;
                replica_only list_snapshots(ListSnapshotsRequest) -> ListSnapshotsResponse;
                replica_only restore_workspace(RestoreWorkspaceRequest) -> Workspace;
            }
            $($rest)*
        }
    };
}

/// The RPCs of `ContractService` by shape, all served by the node; the form of
/// [`workspace_rpcs!`](crate::workspace_rpcs).
#[macro_export]
macro_rules! contract_rpcs {
    ($callback:ident!($($arguments:tt)*) $($rest:tt)*) => {
        $callback! {
            ($($arguments)*)
            {
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
            $($rest)*
        }
    };
}
