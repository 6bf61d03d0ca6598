//! Which requests are about one workspace, and so are served by the node holding it.
//!
//! A replica forwards exactly these (after authorizing and validating them,
//! `berth-control-plane`'s `forward.rs`); a node agent checks its fence and the workspace's
//! generation for each of them before any work (`berth-node-agent`'s `gate.rs`). Both read
//! the workspace through [`Routed`], so a new data-plane RPC is one line here.

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
