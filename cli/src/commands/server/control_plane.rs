//! `berth control-plane`: one replica against etcd.

use std::time::Duration;

use anyhow::Context;
use berth_control_plane::registry::etcd::{EtcdConfig, EtcdRegistry};
use berth_control_plane::{ControlPlaneConfig, IsolationPolicy};
use clap::Args;

use super::{default_id, parse_duration, shutdown_on_signal, split_list};

/// Flags of `berth control-plane`.
#[derive(Debug, Args)]
pub struct ControlPlaneArgs {
    /// etcd endpoints, comma-separated or repeated.
    #[arg(long, env = "BERTH_ETCD", required = true, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Address to serve gRPC on.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Unique id of this replica (default: derived from the hostname).
    #[arg(long, env = "BERTH_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// URL other processes reach this replica at (default: http://<listen address>).
    #[arg(long, env = "BERTH_ADVERTISE")]
    pub advertise: Option<String>,
    #[command(flatten)]
    pub common: ReplicaFlags,
}

/// Replica settings shared by `berth control-plane` and `berth up`.
#[derive(Debug, Args)]
pub struct ReplicaFlags {
    /// How (user, agent, session) maps to a workspace.
    #[arg(long, env = "BERTH_ISOLATION", default_value = "per-agent")]
    pub isolation: IsolationPolicy,
    /// Release the runtime of workspaces idle this long.
    #[arg(long, env = "BERTH_IDLE_TTL", default_value = "1h", value_parser = parse_duration)]
    pub idle_ttl: Duration,
    /// Registry key prefix.
    #[arg(long, env = "BERTH_KEY_PREFIX", default_value = "/berth")]
    pub key_prefix: String,
    /// TTL of this replica's lease (its bind locks free up this long after it dies).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub replica_lease_ttl: Duration,
    /// TTL of node leases (a dead node is seen gone this long after its last heartbeat).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub node_lease_ttl: Duration,
    /// Heartbeat interval asked of node agents.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// Deadline of a whole bind (lock, provision, record write).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub bind_timeout: Duration,
}

impl ReplicaFlags {
    pub fn apply(&self, config: &mut ControlPlaneConfig) {
        config.isolation = self.isolation;
        config.idle_ttl = self.idle_ttl;
        config.key_prefix = self.key_prefix.clone();
        config.replica_lease_ttl = self.replica_lease_ttl;
        config.node_lease_ttl = self.node_lease_ttl;
        config.heartbeat_interval = self.heartbeat_interval;
        config.bind_timeout = self.bind_timeout;
        config.provision_timeout = self.bind_timeout.mul_f64(0.75);
    }
}

pub async fn control_plane(args: ControlPlaneArgs) -> anyhow::Result<i32> {
    let mut config = ControlPlaneConfig::new(args.replica_id.unwrap_or_else(|| default_id("replica")));
    args.common.apply(&mut config);
    config.advertise_address = args.advertise.unwrap_or_default();
    config.validate().map_err(|error| anyhow::anyhow!("invalid configuration: {error}"))?;
    let endpoints = split_list(&args.etcd);
    let registry = EtcdRegistry::connect(EtcdConfig::new(endpoints.clone()))
        .await
        .with_context(|| format!("connecting to etcd at {}", endpoints.join(",")))?;
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let shutdown = shutdown_on_signal();
    berth_control_plane::serve(listener, config, registry, shutdown).await.context("control plane")?;
    Ok(0)
}
