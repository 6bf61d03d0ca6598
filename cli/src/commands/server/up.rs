//! `berth up`: control plane, node agent and an embedded registry in one process, with no
//! external service. The node agent listens on an ephemeral loopback port and talks to the
//! control plane over gRPC exactly as in a cluster.

use std::path::PathBuf;

use anyhow::Context;
use berth_control_plane::ControlPlaneConfig;
use berth_control_plane::registry::embedded::{EmbeddedConfig, EmbeddedRegistry};
use berth_node_agent::NodeAgentConfig;
use berth_proto::credentials::NodeCredentialKey;
use berth_proto::tls::ClientTls;
use clap::Args;
use tokio_util::sync::CancellationToken;

use crate::telemetry::MetricsTransport;

use super::control_plane::ReplicaFlags;
use super::flags::shutdown_on_signal;
use super::node_agent::NodeFlags;

/// Flags of `berth up`.
#[derive(Debug, Args)]
pub struct UpArgs {
    /// Address to serve the public gRPC API on.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Where workspaces live (default: /var/lib/berth as root, else
    /// $HOME/.local/share/berth).
    #[arg(long, env = "BERTH_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    #[command(flatten)]
    pub config: super::flags::ConfigFlag,
    #[command(flatten)]
    pub replica: ReplicaFlags,
    /// CA certificate (PEM) that issued --tls-cert: the in-process node agent verifies the
    /// public listener with it. Default: --tls-cert itself, which suits a self-signed
    /// certificate (or a file holding the chain up to its CA).
    #[arg(long, env = "BERTH_TLS_CA", requires = "tls_cert")]
    pub tls_ca: Option<PathBuf>,
    #[command(flatten)]
    pub node: NodeFlags,
    #[command(flatten)]
    pub snapshots: super::flags::SnapshotFlags,
    #[command(flatten)]
    pub telemetry: crate::telemetry::TelemetryFlags,
}

pub async fn up(args: UpArgs) -> anyhow::Result<i32> {
    let data_dir = args.data_dir.clone().unwrap_or_else(default_data_dir);
    std::fs::create_dir_all(&data_dir).with_context(|| format!("creating data dir {}", data_dir.display()))?;
    let mut replica = ControlPlaneConfig::new("replica-up");
    args.replica.apply(&mut replica)?;
    // One store for the replica and the node: by default a directory under the data dir.
    let snapshot_store = Some(args.snapshots.snapshot_store.clone().unwrap_or_else(|| {
        let absolute = data_dir.canonicalize().unwrap_or_else(|_| data_dir.clone());
        format!("file://{}", absolute.join("snapshots").display())
    }));
    args.snapshots.apply_to_replica(&mut replica, snapshot_store.clone());
    // A fresh node credential key: the in-process node agent gets its own credential from
    // it, exactly as in a cluster; nothing else on the machine can call the node agent or
    // register a node, whatever --auth says.
    let node_key = NodeCredentialKey::random();
    replica.node_credential_key = Some(node_key.clone());
    replica.validate().map_err(|error| anyhow::anyhow!("invalid configuration: {error}"))?;

    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let public = listener.local_addr()?;
    // Refuse an open listener before anything starts (serve checks again).
    replica.check_listener(public).map_err(|error| anyhow::anyhow!("invalid configuration: {error}"))?;
    let node_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.context("listening for the node agent")?;
    let mut node = NodeAgentConfig::new("node-up", data_dir.join("node"));
    args.node.apply(&mut node)?;
    node.cloud = args.node.cloud.config(&replica.key_prefix);
    args.snapshots.apply_to_node(&mut node, snapshot_store);
    // With --auth none the only caller is the local operator (loopback only, checked
    // above), who owns this host anyway: `local` stays the out-of-the-box dev loop. With
    // real authentication, offering it is the operator's explicit decision again.
    if matches!(replica.auth, berth_control_plane::auth::AuthConfig::None) {
        node.allow_unsandboxed = true;
    }
    node.node_credential = Some(node_key.node_credential(&node.node_id));
    let scheme = if replica.tls.is_some() { "https" } else { "http" };
    node.control_planes = vec![format!("{scheme}://{public}")];
    if let Some(tls) = &replica.tls {
        // The node heartbeats to our own public listener: trust its certificate, or the CA
        // that issued it.
        let ca = args.tls_ca.clone().unwrap_or_else(|| tls.cert.clone());
        node.control_plane_tls = Some(ClientTls { ca, identity: None, domain: None });
    }
    // The node agent runs as a task: refuse its configuration here, before anything serves,
    // or `berth up` would run a control plane with no node (e.g. `local` without
    // --allow-unsandboxed under --auth token).
    node.validate().map_err(|error| anyhow::anyhow!("invalid node configuration: {error}"))?;

    // Workspace and session records survive a restart; nodes and locks are re-created.
    let registry = EmbeddedRegistry::open(&data_dir.join("registry.journal"), EmbeddedConfig::default())
        .with_context(|| format!("opening the registry journal in {}", data_dir.display()))?;
    let shutdown = shutdown_on_signal();
    args.telemetry.serve_metrics(MetricsTransport::of(replica.tls.as_ref(), false), shutdown.clone()).await?;
    // The node agent stops after the control plane so in-flight forwarded calls finish.
    let node_shutdown = CancellationToken::new();
    let node_task = tokio::spawn(berth_node_agent::serve(node_listener, node, node_shutdown.clone()));
    tracing::info!(endpoint = %format!("{scheme}://{public}"), data_dir = %data_dir.display(), "berth up ready");
    let served = berth_control_plane::serve(listener, replica, registry, shutdown).await;
    node_shutdown.cancel();
    let node_result = node_task.await.context("node agent task")?;
    served.context("control plane")?;
    node_result.context("node agent")?;
    Ok(0)
}

/// A root daemon keeps its data under /var/lib (sandboxed backends run as an unprivileged
/// uid that must be able to traverse the parents of the data dir, which rules out /root).
fn default_data_dir() -> PathBuf {
    if nix::unistd::Uid::effective().is_root() {
        return PathBuf::from("/var/lib/berth");
    }
    match std::env::var_os("HOME") {
        Some(home) => PathBuf::from(home).join(".local/share/berth"),
        None => PathBuf::from("berth-data"),
    }
}
