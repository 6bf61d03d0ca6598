//! The node's data plane: the public `WorkspaceService` (exec and file calls) and
//! `ContractService`, served with the same service definitions as a replica, for replicas
//! only (`auth.rs`). Every call passes the [`Gate`] (fence, then the workspace at the
//! generation in `x-berth-generation`) through one generic function before its handler in
//! `files.rs` or `contract.rs` runs. [`serve!`] writes the handlers from the RPC tables in
//! `berth-proto` the replica forwards by. The session and record calls of
//! `WorkspaceService` belong to replicas: UNIMPLEMENTED here.

use std::future::Future;
use std::sync::Arc;

use berth_proto::routed::{self, Routed, Streamed};
use berth_proto::v1;
use berth_proto::v1::contract_service_server::ContractService;
use berth_proto::v1::workspace_service_server::WorkspaceService;
use tonic::{Request, Response, Status, Streaming};

use crate::contract::Contract;
use crate::error::NodeError;
use crate::files::{BoxStream, Files};
use crate::gate::{Admitted, Gate};

pub struct DataPlane {
    gate: Arc<Gate>,
    files: Files,
    contract: Arc<Contract>,
}

impl DataPlane {
    pub fn new(gate: Arc<Gate>, files: Files, contract: Arc<Contract>) -> Self {
        Self { gate, files, contract }
    }

    /// `ReadFile`'s bytes for `read_frames.rs`: admitted by the same gate as every call.
    pub async fn read_pieces(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        request: v1::ReadFileRequest,
    ) -> Result<BoxStream<bytes::Bytes>, Status> {
        let workspace = self.gate.admit(metadata, request.workspace_id())?;
        self.files.read_pieces(workspace, request).await
    }

    /// The one path of every unary and server-streaming call: admit, then handle.
    async fn unary<M, R, F, Fut>(&self, request: Request<M>, handle: F) -> Result<Response<R>, Status>
    where
        M: Routed,
        F: FnOnce(Admitted, M) -> Fut,
        Fut: Future<Output = Result<R, Status>>,
    {
        let workspace = self.gate.admit(request.metadata(), request.get_ref().workspace_id())?;
        handle(workspace, request.into_inner()).await.map(Response::new)
    }

    /// The one path of every client-streaming call: read the header, admit it, then handle
    /// the header and the rest of the stream.
    async fn client_stream<M, R, F, Fut>(
        &self,
        request: Request<Streaming<M>>,
        handle: F,
    ) -> Result<Response<R>, Status>
    where
        M: Streamed,
        F: FnOnce(Admitted, M::Header, Streaming<M>) -> Fut,
        Fut: Future<Output = Result<R, Status>>,
    {
        let (metadata, _, mut inbound) = request.into_parts();
        let (header, _) = routed::open(&mut inbound).await?;
        let workspace = self.gate.admit(&metadata, header.workspace_id())?;
        handle(workspace, header, inbound).await.map(Response::new)
    }
}

fn replica_only() -> Status {
    NodeError::ReplicaOnly.into()
}

/// Implements a service on [`DataPlane`] from its RPC table in `berth-proto`
/// (`berth_proto::workspace_rpcs!` / `contract_rpcs!`): `unary` / `server_streaming` /
/// `client_streaming` calls go through the generic path to the handler of the same name on
/// `self.$handler`; `replica_only` calls answer UNIMPLEMENTED.
macro_rules! serve {
    (
        (impl $service:ident via $handler:ident)
        {
            $(unary $unary:ident($unary_request:ident) -> $unary_response:ident;)*
            $(server_streaming $server:ident($server_request:ident) -> $chunk:ident as $stream:ident;)*
            $(client_streaming $client:ident($client_request:ident) -> $client_response:ident;)*
            $(replica_only $local:ident($local_request:ident) -> $local_response:ident;)*
        }
    ) => {
        #[tonic::async_trait]
        impl $service for DataPlane {
            $(async fn $unary(
                &self,
                request: Request<v1::$unary_request>,
            ) -> Result<Response<v1::$unary_response>, Status> {
                self.unary(request, |workspace, message| self.$handler.$unary(workspace, message)).await
            })*

            $(type $stream = BoxStream<v1::$chunk>;

            async fn $server(&self, request: Request<v1::$server_request>) -> Result<Response<Self::$stream>, Status> {
                self.unary(request, |workspace, message| self.$handler.$server(workspace, message)).await
            })*

            $(async fn $client(
                &self,
                request: Request<Streaming<v1::$client_request>>,
            ) -> Result<Response<v1::$client_response>, Status> {
                self.client_stream(request, |workspace, header, inbound| {
                    self.$handler.$client(workspace, header, inbound)
                })
                .await
            })*

            $(async fn $local(
                &self,
                _request: Request<v1::$local_request>,
            ) -> Result<Response<v1::$local_response>, Status> {
                Err(replica_only())
            })*
        }
    };
}

berth_proto::workspace_rpcs!(serve!(impl WorkspaceService via files));
berth_proto::contract_rpcs!(serve!(impl ContractService via contract));
