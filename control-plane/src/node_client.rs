//! Pooled gRPC clients to node agents, one lazily connected channel per node address, for
//! the node-only lifecycle service ([`NodeAgentClient`]) and the node's data plane (the
//! public services, [`DataPlaneClient`]); [`read_file_relayed`] is the node's `ReadFile`
//! call whose answer the replica relays undecoded (`passthrough.rs`).
//! Every call about a workspace carries the generation the replica expects the node to hold,
//! and every call carries the replica credential made for that node (`authorization:
//! Bearer …`, [`NodeAuth::outbound`]), which no other node accepts; `https://` node
//! addresses are reached over (mutual) TLS with the cluster CA.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use berth_proto::auth::BearerInterceptor;
use berth_proto::frames;
use berth_proto::meta;
use berth_proto::tls::ClientTls;
use berth_proto::v1;
use berth_proto::v1::contract_service_client::ContractServiceClient;
use berth_proto::v1::node_agent_service_client::NodeAgentServiceClient;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderValue, Method, StatusCode, Uri, Version};
use http_body_util::Full;
use tonic::body::Body;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};
use tower::Service;

use crate::auth::NodeAuth;
use crate::error::ControlPlaneError;

pub type NodeChannel = InterceptedService<Channel, NodeInterceptor>;

/// Largest message to or from a node agent (file data travels in smaller chunks).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

pub type NodeAgentClient = NodeAgentServiceClient<NodeChannel>;

/// The node's data plane: the public services, served by the node for replicas only.
#[derive(Clone)]
pub struct DataPlaneClient {
    pub workspace: WorkspaceServiceClient<NodeChannel>,
    pub contract: ContractServiceClient<NodeChannel>,
    /// The same channel for calls whose response is relayed as HTTP/2 frames, undecoded
    /// (`passthrough.rs`).
    pub channel: NodeChannel,
}

/// Adds what every node call carries: the node credential and the caller's trace context
/// (so the node's request span joins the replica's trace).
#[derive(Clone, Default)]
pub struct NodeInterceptor {
    credential: BearerInterceptor,
}

impl tonic::service::Interceptor for NodeInterceptor {
    fn call(&mut self, request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        let mut request = self.credential.call(request)?;
        berth_proto::trace::inject(request.metadata_mut());
        Ok(request)
    }
}

/// Channels to node agents keyed by node id and address, each with the credential made for
/// that node; a channel reconnects by itself.
pub struct NodeClients {
    channels: Mutex<HashMap<(String, String), (Channel, NodeInterceptor)>>,
    auth: NodeAuth,
    tls: Option<ClientTlsConfig>,
}

impl NodeClients {
    /// `auth` says what each node call carries; `tls` is used for `https://` addresses.
    pub fn new(auth: NodeAuth, tls: Option<ClientTls>) -> Result<Self, String> {
        let tls = tls.map(|tls| tls.config()).transpose().map_err(|error| format!("node tls: {error}"))?;
        Ok(Self { channels: Mutex::new(HashMap::new()), auth, tls })
    }

    /// No credentials, no TLS (loopback tests).
    pub fn insecure() -> Self {
        Self { channels: Mutex::new(HashMap::new()), auth: NodeAuth::Open, tls: None }
    }

    /// A lifecycle client for node `node_id` at `address` (`http://host:port` or
    /// `https://host:port`).
    pub fn get(&self, node_id: &str, address: &str) -> Result<NodeAgentClient, ControlPlaneError> {
        Ok(NodeAgentServiceClient::new(self.channel(node_id, address)?)
            .max_decoding_message_size(MAX_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_MESSAGE_BYTES))
    }

    /// Data-plane clients for node `node_id` at `address`, on the same channel as [`Self::get`].
    pub fn data_plane(&self, node_id: &str, address: &str) -> Result<DataPlaneClient, ControlPlaneError> {
        let channel = self.channel(node_id, address)?;
        Ok(DataPlaneClient {
            workspace: WorkspaceServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            contract: ContractServiceClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            channel,
        })
    }

    fn channel(&self, node_id: &str, address: &str) -> Result<NodeChannel, ControlPlaneError> {
        let mut channels = self.channels.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let entry = (node_id.to_owned(), address.to_owned());
        if let Some((channel, credential)) = channels.get(&entry) {
            return Ok(InterceptedService::new(channel.clone(), credential.clone()));
        }
        let bad_address = |reason: String| ControlPlaneError::BadNodeAddress { address: address.to_owned(), reason };
        let mut endpoint = berth_proto::transport::client(
            Endpoint::from_shared(address.to_owned()).map_err(|error| bad_address(error.to_string()))?,
        )
        .connect_timeout(Duration::from_secs(3))
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
        if address.starts_with("https://") {
            // A node that advertises TLS is only reached with the cluster CA configured:
            // never over an unverified connection.
            let tls =
                self.tls.clone().ok_or_else(|| ControlPlaneError::NodeTlsMissing { address: address.to_owned() })?;
            endpoint = endpoint.tls_config(tls).map_err(|error| bad_address(error.to_string()))?;
        }
        let channel = endpoint.connect_lazy();
        let credential = NodeInterceptor { credential: BearerInterceptor::new(self.auth.outbound(node_id).as_ref()) };
        channels.insert(entry, (channel.clone(), credential.clone()));
        Ok(InterceptedService::new(channel, credential))
    }
}

/// Wraps a message for a node call: generation metadata and a deadline.
pub fn node_request<T>(message: T, generation: u64, timeout: Duration) -> tonic::Request<T> {
    let mut request = untimed_node_request(message, generation);
    request.set_timeout(timeout);
    request
}

/// A node call without an overall deadline (long streams: the transport's keep-alive
/// notices a dead node), with generation metadata.
pub fn untimed_node_request<T>(message: T, generation: u64) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Ok(value) = generation.to_string().parse() {
        request.metadata_mut().insert(meta::GENERATION, value);
    }
    request
}

/// The node's `ReadFile` answer, undecoded: its status if it refused at once, else its
/// response (headers, the body's frames as they come, trailers).
pub async fn read_file_relayed(
    mut channel: NodeChannel,
    request: tonic::Request<v1::ReadFileRequest>,
) -> Result<tonic::Response<http::Response<Body>>, Status> {
    let (metadata, extensions, message) = request.into_parts();
    let frame = frames::message_frame(&message)?;
    let mut outbound = http::Request::new(Body::new(Full::new(frame)));
    *outbound.method_mut() = Method::POST;
    *outbound.uri_mut() = Uri::from_static(frames::READ_FILE_PATH);
    *outbound.version_mut() = Version::HTTP_2;
    // The generation and any deadline (`grpc-timeout`) travel as metadata, as with a
    // generated client; the channel's interceptor adds the node credential and trace.
    *outbound.headers_mut() = metadata.into_headers();
    outbound.headers_mut().insert(TE, HeaderValue::from_static("trailers"));
    outbound.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    *outbound.extensions_mut() = extensions;

    // The errors map as a generated client maps them, so the router's retry rules (which
    // look for a connect error in the source chain) apply unchanged.
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|error| Status::unknown(format!("Service was not ready: {error}")))?;
    let response = channel.call(outbound).await.map_err(|error| Status::from_error(error.into()))?;
    if let Some(status) = Status::from_header_map(response.headers())
        && status.code() != Code::Ok
    {
        return Err(status);
    }
    if response.status() != StatusCode::OK {
        return Err(Status::unknown(format!("the node answered ReadFile with HTTP {}", response.status())));
    }
    let (parts, body) = response.into_parts();
    let mut relayed = http::Response::new(Body::new(body));
    *relayed.headers_mut() = parts.headers;
    Ok(tonic::Response::new(relayed))
}
