//! `berth control-plane --gateway-backend …`: a cloud gateway embedded in the replica, so a
//! cloud-only deployment is replicas + etcd and nothing else. The gateway is an ordinary node
//! agent running as a task of this process, offering only cloud backends; it heartbeats to
//! this replica like any node and is reached by every replica at its advertised address.

use std::path::PathBuf;

use anyhow::Context;
use berth_control_plane::auth::NodeAuth;
use berth_node_agent::NodeAgentConfig;
use clap::Args;
use tokio_util::sync::CancellationToken;

use super::cloud::CloudFlags;
use super::flags::split_list;

#[derive(Debug, Args)]
pub struct GatewayFlags {
    /// Cloud backends to serve from a gateway embedded in this replica (comma-separated;
    /// e.g. `e2b`). Host backends need a node agent of their own.
    #[arg(long = "gateway-backend", env = "BERTH_GATEWAY_BACKEND", value_delimiter = ',')]
    pub gateway_backends: Vec<String>,
    /// Where the embedded gateway keeps its state (generations; no workspace data).
    #[arg(long, env = "BERTH_GATEWAY_DATA_DIR")]
    pub gateway_data_dir: Option<PathBuf>,
    /// Address the embedded gateway serves replicas on.
    #[arg(long, env = "BERTH_GATEWAY_LISTEN", default_value = "127.0.0.1:0")]
    pub gateway_listen: String,
    /// URL other replicas reach the embedded gateway at (default: http://<its listen address>).
    #[arg(long, env = "BERTH_GATEWAY_ADVERTISE")]
    pub gateway_advertise: Option<String>,
    #[command(flatten)]
    pub cloud: CloudFlags,
}

/// A configured embedded gateway, ready to serve once the replica listens.
pub struct Gateway {
    listener: tokio::net::TcpListener,
    config: NodeAgentConfig,
}

impl GatewayFlags {
    /// The embedded gateway, if any backend is asked for: checked before anything serves.
    pub async fn prepare(
        &self,
        replica_id: &str,
        key_prefix: &str,
        node_auth: &NodeAuth,
        replica_endpoint: String,
    ) -> anyhow::Result<Option<Gateway>> {
        let backends = split_list(&self.gateway_backends);
        if backends.is_empty() {
            return Ok(None);
        }
        if let Some(host) = backends.iter().find(|backend| !berth_proto::backends::is_portable(backend)) {
            anyhow::bail!(
                "--gateway-backend {host}: a replica embeds cloud gateways only ({}); run a node agent for host backends",
                berth_proto::backends::PORTABLE_BACKENDS.join(", ")
            );
        }
        let data_dir = self.gateway_data_dir.clone().context("--gateway-backend needs --gateway-data-dir")?;
        let mut config = NodeAgentConfig::new(format!("{replica_id}-gateway"), data_dir);
        config.backends = backends;
        config.cloud = self.cloud.config(key_prefix);
        // The replica derives the gateway's own credential as it would any node's.
        match node_auth {
            NodeAuth::Open => {}
            NodeAuth::Shared(secret) => config.node_secret = Some(secret.clone()),
            NodeAuth::Keyed(key) => config.node_credential = Some(key.node_credential(&config.node_id)),
        }
        config.control_planes = vec![replica_endpoint];
        let listener = tokio::net::TcpListener::bind(&self.gateway_listen)
            .await
            .with_context(|| format!("listening on {} for the embedded gateway", self.gateway_listen))?;
        config.advertise_address = match &self.gateway_advertise {
            Some(advertise) => advertise.clone(),
            None => format!("http://{}", listener.local_addr()?),
        };
        config.validate().map_err(|error| anyhow::anyhow!("invalid embedded gateway configuration: {error}"))?;
        Ok(Some(Gateway { listener, config }))
    }
}

impl Gateway {
    /// Serves until `shutdown` fires (the caller cancels it after the replica stopped).
    pub fn spawn(self, shutdown: CancellationToken) -> tokio::task::JoinHandle<anyhow::Result<()>> {
        tokio::spawn(async move {
            berth_node_agent::serve(self.listener, self.config, shutdown).await.context("embedded gateway")
        })
    }
}
