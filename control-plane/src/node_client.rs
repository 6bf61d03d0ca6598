//! Pooled gRPC clients to node agents, one lazily connected channel per node address.
//! Every call about a workspace carries the generation the replica expects the node to hold.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use berth_proto::meta;
use berth_proto::v1::node_agent_service_client::NodeAgentServiceClient;
use tonic::transport::{Channel, Endpoint};

pub type NodeAgentClient = NodeAgentServiceClient<Channel>;

/// Channels to node agents keyed by address; a channel reconnects by itself.
#[derive(Default)]
pub struct NodeClients {
    channels: Mutex<HashMap<String, NodeAgentClient>>,
}

impl NodeClients {
    pub fn new() -> Self {
        Self::default()
    }

    /// A client for the node at `address` (`http://host:port`).
    pub fn get(&self, address: &str) -> Result<NodeAgentClient, tonic::Status> {
        let mut channels = self.channels.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(client) = channels.get(address) {
            return Ok(client.clone());
        }
        let endpoint = Endpoint::from_shared(address.to_owned())
            .map_err(|error| tonic::Status::internal(format!("bad node address {address:?}: {error}")))?
            .connect_timeout(Duration::from_secs(3))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_timeout(Duration::from_secs(5));
        let client = NodeAgentServiceClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(64 * 1024 * 1024)
            .max_encoding_message_size(64 * 1024 * 1024);
        channels.insert(address.to_owned(), client.clone());
        Ok(client)
    }
}

/// Wraps a message for a node call: generation metadata and a deadline.
pub fn node_request<T>(message: T, generation: u64, timeout: Duration) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.set_timeout(timeout);
    if let Ok(value) = generation.to_string().parse() {
        request.metadata_mut().insert(meta::GENERATION, value);
    }
    request
}
