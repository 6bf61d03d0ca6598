//! Forwarding of the data-plane calls (exec, files, the workspace contract) to the node
//! holding the workspace, declared once per RPC.
//!
//! A request message says which workspace it is about ([`Routed`], in `berth-proto`) and
//! what this replica checks before forwarding it ([`Forward`], the table below; the node
//! checks again). [`Forwarder`] is the one path every such call takes: authorize →
//! validate → resolve the route → forward with [`Router::forward`]'s one retry on a stale
//! route (client streams: [`router::pipe`](crate::router::pipe), no retry). A call that
//! runs something ([`Forward::RUNS`]) is retried after a broken connection only if it never
//! left this replica.
//! [`forwarding!`] writes a public service's handlers from its RPC table in `berth-proto`
//! (`routed.rs`); the node serves the same service definitions from the same table, so the
//! call goes out unchanged.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use berth_proto::contract::{
    check_mcp_target, check_skill_name, context_messages, mcp_spec_from_proto, tool_arguments, tree_destination,
};
use berth_proto::convert::{exec_spec_from_proto, exec_timeout_from_proto};
use berth_proto::routed::{self, Routed, Streamed};
use berth_proto::v1;
use berth_workspace::backend::MAX_EXEC_TIMEOUT;
use berth_workspace::offload::{MAX_TOOL_RESULT_BYTES, validate_session_id};
use berth_workspace::{RelPath, WorkspaceError, WorkspaceId};
use futures::{Stream, StreamExt};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::authz::{Access, Action, Caller};
use crate::error::ControlPlaneError;
use crate::node_client::DataPlaneClient;
use crate::quota::Slot;
use crate::router::{Replay, Router, pipe};

pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Extra time a node call gets past the exec's own timeout, so the node's timed-out answer
/// (not a transport deadline) reaches the client.
const EXEC_DEADLINE_MARGIN: Duration = Duration::from_secs(10);
/// Added to an MCP call's own timeout: the server may have to start first, and the node's
/// typed DEADLINE_EXCEEDED should reach the client before the transport deadline.
const MCP_DEADLINE_MARGIN: Duration = Duration::from_secs(45);
/// Node default of an MCP call when the request gives none.
const MCP_DEFAULT_CALL: Duration = Duration::from_secs(60);

/// A request this replica forwards to the node holding its workspace (for a client
/// stream: its header).
pub trait Forward: Routed + Clone + Send + Sync + 'static {
    /// What the caller must be allowed on the workspace. Everything forwarded reads or
    /// changes workspace content.
    const ACTION: Action = Action::Use;

    /// Checks made before the call leaves this replica (the node checks again), so a
    /// malformed request costs no node round trip. Errors: INVALID_ARGUMENT (or a typed
    /// limit) naming the field.
    fn validate(&self) -> Result<(), Status>;

    /// Counts against the caller's concurrent execs (`--max-execs-per-user`).
    const USER_EXEC: bool = false;

    /// Runs something on the node (an exec, a tool call): sending it twice may run it twice,
    /// so after a broken connection it is retried only if it provably never left this
    /// replica ([`Replay::OnlyUnsent`]).
    const RUNS: bool = false;

    /// The node call's deadline; `None` for long streams (the transport's keep-alive
    /// notices a dead node).
    fn deadline(&self, node_call_timeout: Duration) -> Option<Duration> {
        Some(node_call_timeout)
    }
}

/// The node call's deadline of an exec. A request without a timeout gets the node's
/// default, which this replica does not know (`--default-exec-timeout` of the node, at
/// most the static ceiling), so it is given the static ceiling.
fn exec_deadline(timeout_ms: u64) -> Option<Duration> {
    let timeout = if timeout_ms == 0 { MAX_EXEC_TIMEOUT } else { exec_timeout_from_proto(timeout_ms).ok()? };
    Some(timeout + EXEC_DEADLINE_MARGIN)
}

fn invalid(error: WorkspaceError) -> Status {
    ControlPlaneError::from(error).into()
}

fn relative(path: &str) -> Result<(), WorkspaceError> {
    RelPath::parse(path).map(drop)
}

fn mcp_deadline(timeout_ms: u64) -> Option<Duration> {
    let call = if timeout_ms == 0 { MCP_DEFAULT_CALL } else { Duration::from_millis(timeout_ms) };
    Some(call + MCP_DEADLINE_MARGIN)
}

fn tool_result_size(content: &[u8]) -> Result<(), WorkspaceError> {
    if content.len() > MAX_TOOL_RESULT_BYTES {
        return Err(WorkspaceError::LimitExceeded {
            limit: "tool result size",
            size: content.len() as u64,
            max: MAX_TOOL_RESULT_BYTES as u64,
        });
    }
    Ok(())
}

/// One line per forwarded message: `Message => |message| validation` (a
/// `Result<(), WorkspaceError>`), then optionally `, deadline: |message| expression` (an
/// `Option<Duration>`; the default is the node call timeout). `Message [CONST, ...]` sets
/// `bool` consts of [`Forward`] (e.g. `USER_EXEC`, `RUNS`) to true.
macro_rules! forward {
    ($($message:ident $([$($flag:ident),+])? => |$m:ident| $check:expr $(, deadline: |$d:ident| $deadline:expr)?;)*) => {$(
        impl Forward for v1::$message {
            $($(const $flag: bool = true;)+)?
            fn validate(&self) -> Result<(), Status> {
                let $m = self;
                $check.map_err(invalid)
            }
            $(fn deadline(&self, _node_call_timeout: Duration) -> Option<Duration> {
                let $d = self;
                $deadline
            })?
        }
    )*};
}

forward! {
    ExecRequest [USER_EXEC, RUNS] => |m| exec_spec_from_proto(m).map(drop),
        deadline: |m| exec_deadline(m.timeout_ms);
    ReadFileRequest => |m| relative(&m.path), deadline: |_m| None;
    WriteFileHeader => |m| relative(&m.path);
    StatRequest => |m| relative(&m.path);
    ListDirRequest => |m| relative(&m.path);
    RemovePathRequest => |m| relative(&m.path);
    MakeDirRequest => |m| relative(&m.path);
    AddMcpRequest => |m| mcp_spec_from_proto(m.server.clone()).map(drop);
    RemoveMcpRequest => |m| check_mcp_target(&m.name, None);
    ListMcpsRequest => |_m| Ok(());
    ListMcpToolsRequest [USER_EXEC] => |m| check_mcp_target(&m.server, None), deadline: |m| mcp_deadline(m.timeout_ms);
    CallMcpToolRequest [USER_EXEC, RUNS] => |m| check_mcp_target(&m.server, Some(&m.tool))
        .and_then(|()| tool_arguments(&m.arguments_json).map(drop)),
        deadline: |m| mcp_deadline(m.timeout_ms);
    AddSkillHeader => |m| check_skill_name(&m.name, false);
    RemoveSkillRequest => |m| check_skill_name(&m.name, true);
    ListSkillsRequest => |_m| Ok(());
    GetSkillRequest => |m| check_skill_name(&m.name, true);
    OffloadContextRequest => |m| validate_session_id(&m.session_id)
        .and_then(|()| context_messages(&m.messages_json).map(drop));
    OffloadToolResultRequest => |m| validate_session_id(&m.session_id).and_then(|()| tool_result_size(&m.content));
    UploadTreeHeader => |m| tree_destination(&m.path).map(drop);
    DownloadTreeRequest => |m| relative(&m.path), deadline: |_m| None;
}

/// The one path of every forwarded call.
pub struct Forwarder {
    router: Arc<Router>,
    access: Access,
    node_call_timeout: Duration,
}

impl Forwarder {
    pub fn new(router: Arc<Router>, access: Access, node_call_timeout: Duration) -> Self {
        Self { router, access, node_call_timeout }
    }

    /// Authorizes, then validates: a workspace the caller may not see is NOT_FOUND whatever
    /// the rest of the request says (see `authz.rs`).
    /// Then a `USER_EXEC` call takes one of the user's exec slots, held as long as the
    /// returned guard.
    async fn admit<M: Forward>(&self, caller: &Caller, message: &M) -> Result<(WorkspaceId, Option<Slot>), Status> {
        let (id, _) = self.access.workspace(caller, message.workspace_id(), M::ACTION).await?;
        message.validate()?;
        let slot = if M::USER_EXEC { self.access.exec_slot(caller)? } else { None };
        Ok((id, slot))
    }

    /// A unary call: `call` runs against the node's data plane, with one retry on a stale
    /// route.
    pub async fn unary<M, R, F, Fut>(&self, request: Request<M>, call: F) -> Result<Response<R>, Status>
    where
        M: Forward,
        F: Fn(DataPlaneClient, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let (response, _slot) = self.unary_holding(request, call).await?;
        Ok(response)
    }

    /// [`Self::unary`], also returning the exec slot the call took, for a stream to hold.
    async fn unary_holding<M, R, F, Fut>(
        &self,
        request: Request<M>,
        call: F,
    ) -> Result<(Response<R>, Option<Slot>), Status>
    where
        M: Forward,
        F: Fn(DataPlaneClient, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let caller = Caller::of(&request)?;
        let message = request.into_inner();
        let (id, slot) = self.admit(&caller, &message).await?;
        let deadline = message.deadline(self.node_call_timeout);
        let replay = if M::RUNS { Replay::OnlyUnsent } else { Replay::Any };
        let response = self.router.forward(&id, message, deadline, replay, call).await?;
        Ok((response, slot))
    }

    /// A server-streaming call: like [`Self::unary`]; the retry covers opening the stream.
    pub async fn server_streaming<M, R, F, Fut>(
        &self,
        request: Request<M>,
        call: F,
    ) -> Result<Response<BoxStream<R>>, Status>
    where
        M: Forward,
        R: Send + 'static,
        F: Fn(DataPlaneClient, Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<Streaming<R>>, Status>>,
    {
        let (response, slot) = self.unary_holding(request, call).await?;
        // A streamed exec holds its user's slot until the stream is dropped.
        let stream = response.into_inner().map(move |item| {
            let _held = &slot;
            item
        });
        Ok(Response::new(Box::pin(stream)))
    }

    /// `ReadFile`, its answer relayed as the node's HTTP/2 response, undecoded
    /// (`passthrough.rs`); authorized, validated and routed like every other call.
    pub async fn read_file_passthrough(
        &self,
        request: Request<v1::ReadFileRequest>,
    ) -> Result<http::Response<tonic::body::Body>, Status> {
        let (response, _slot) = self
            .unary_holding(request, |node, request| crate::node_client::read_file_relayed(node.channel, request))
            .await?;
        Ok(response.into_inner())
    }

    /// A client-streaming call: the header is authorized and validated, the route resolved
    /// once (a stream cannot be replayed), then the stream piped to the node; a broken
    /// client stream reaches the node as a reset.
    pub async fn client_streaming<M, R, F, Fut>(
        &self,
        request: Request<Streaming<M>>,
        call: F,
    ) -> Result<Response<R>, Status>
    where
        M: Streamed,
        M::Header: Forward,
        F: FnOnce(DataPlaneClient, Request<ReceiverStream<M>>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        let caller = Caller::of(&request)?;
        let mut inbound = request.into_inner();
        let (header, first) = routed::open(&mut inbound).await?;
        let (id, _slot) = self.admit(&caller, &header).await?;
        let target = self.router.target(&id).await?;
        pipe(target, first, inbound, call).await
    }
}

/// Writes `impl $service for $api` (the type has a `forward: Forwarder` field) from the
/// service's RPC table in `berth-proto` (`berth_proto::workspace_rpcs!` /
/// `contract_rpcs!`, called with `forwarding!(impl Service for Api, to client)`): each
/// node-served RPC is forwarded to the same RPC of the node's `$client` (a field of
/// [`DataPlaneClient`]); the handlers after it, the `replica_only` RPCs this replica serves
/// itself, are passed through unchanged.
macro_rules! forwarding {
    (
        (impl $service:ident for $api:ty, to $client:ident)
        {
            $(unary $unary:ident($unary_request:ident) -> $unary_response:ident;)*
            $(server_streaming $server:ident($server_request:ident) -> $chunk:ident as $stream:ident;)*
            $(client_streaming $streamed:ident($streamed_request:ident) -> $streamed_response:ident;)*
            $(replica_only $local:ident($local_request:ident) -> $local_response:ident;)*
        }
        $($own:tt)*
    ) => {
        #[tonic::async_trait]
        impl $service for $api {
            $(async fn $unary(
                &self,
                request: tonic::Request<berth_proto::v1::$unary_request>,
            ) -> Result<tonic::Response<berth_proto::v1::$unary_response>, tonic::Status> {
                self.forward.unary(request, |mut node, request| async move { node.$client.$unary(request).await }).await
            })*

            $(type $stream = $crate::forward::BoxStream<berth_proto::v1::$chunk>;

            async fn $server(
                &self,
                request: tonic::Request<berth_proto::v1::$server_request>,
            ) -> Result<tonic::Response<Self::$stream>, tonic::Status> {
                self.forward
                    .server_streaming(request, |mut node, request| async move { node.$client.$server(request).await })
                    .await
            })*

            $(async fn $streamed(
                &self,
                request: tonic::Request<tonic::Streaming<berth_proto::v1::$streamed_request>>,
            ) -> Result<tonic::Response<berth_proto::v1::$streamed_response>, tonic::Status> {
                self.forward
                    .client_streaming(request, |mut node, request| async move { node.$client.$streamed(request).await })
                    .await
            })*

            $($own)*
        }
    };
}

pub(crate) use forwarding;
