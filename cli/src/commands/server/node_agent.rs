//! `berth node-agent`: hosts workspaces on this machine for the control plane.

use std::path::PathBuf;
use std::time::Duration;

use crate::telemetry::MetricsTransport;
use anyhow::Context;
use berth_node_agent::NodeAgentConfig;
use berth_node_agent::config::{CgroupPolicy, UidRange};
use berth_node_agent::limits::{Bound, NodeLimits};
use berth_proto::auth::Secret;
use berth_proto::credentials::NodeCredential;
use berth_proto::tls::{ClientTls, TlsFiles};
use clap::Args;

use super::flags::{default_id, parse_duration, shutdown_on_signal, split_list};
use crate::commands::parse_key_value;

/// Flags of `berth node-agent`.
#[derive(Debug, Args)]
pub struct NodeAgentArgs {
    /// Control-plane replica URLs, comma-separated or repeated; the agent spreads over them
    /// and fails over.
    #[arg(long = "control-plane", env = "BERTH_CONTROL_PLANE", required = true, value_delimiter = ',')]
    pub control_planes: Vec<String>,
    /// Address to serve the node agent on (its lifecycle service and data plane; replicas only).
    #[arg(long, env = "BERTH_NODE_LISTEN", default_value = "127.0.0.1:7071")]
    pub listen: String,
    /// URL replicas reach this agent at (default: http://<listen address>).
    #[arg(long, env = "BERTH_NODE_ADVERTISE")]
    pub advertise: Option<String>,
    /// Where workspaces live on this host.
    #[arg(long, env = "BERTH_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Unique id of this node (default: derived from the hostname).
    #[arg(long, env = "BERTH_NODE_ID")]
    pub node_id: Option<String>,
    /// File holding this node's own credential (`berth node-credential` makes it from the
    /// replicas' key): heartbeats carry it, and it gives the one replica credential this
    /// agent accepts. Needed beyond loopback.
    #[arg(long, env = "BERTH_NODE_CREDENTIAL_FILE", conflicts_with = "shared_node_secret_file")]
    pub node_credential_file: Option<PathBuf>,
    /// Loopback development only: the secret shared by every replica and node (no per-node
    /// identity). Refused beyond loopback.
    #[arg(long, env = "BERTH_SHARED_NODE_SECRET_FILE")]
    pub shared_node_secret_file: Option<PathBuf>,
    /// Serve plaintext gRPC on a non-loopback --listen: the replica credential and workspace
    /// traffic cross the network readable. Without it such a listener needs --tls-cert/--tls-key.
    #[arg(long, env = "BERTH_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,
    /// Migration aid: accept --shared-node-secret-file on a non-loopback --listen, although
    /// every holder of that secret can then act as any node. Move to per-node credentials.
    #[arg(long, env = "BERTH_INSECURE_SHARED_NODE_SECRET", requires = "shared_node_secret_file")]
    pub insecure_shared_node_secret: bool,
    /// Serve the node agent over TLS with this certificate (PEM)…
    #[arg(long, env = "BERTH_NODE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// …and key (PEM).
    #[arg(long, env = "BERTH_NODE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require replicas to present a client certificate signed by this CA (mutual TLS).
    #[arg(long, env = "BERTH_NODE_CLIENT_CA_CERT", requires = "tls_cert")]
    pub client_ca_cert: Option<PathBuf>,
    /// CA (PEM) that signed https:// control planes' certificates (heartbeats).
    #[arg(long, env = "BERTH_CONTROL_PLANE_CA_CERT")]
    pub control_plane_ca_cert: Option<PathBuf>,
    /// The cluster's registry key prefix (the replicas' --key-prefix): cloud backends label
    /// their sandboxes with it, and replicas refuse a gateway whose prefix is not theirs.
    #[arg(long, env = "BERTH_KEY_PREFIX", default_value = "/berth")]
    pub key_prefix: String,
    #[command(flatten)]
    pub config: super::flags::ConfigFlag,
    #[command(flatten)]
    pub common: NodeFlags,
    #[command(flatten)]
    pub snapshots: super::flags::SnapshotFlags,
    #[command(flatten)]
    pub telemetry: crate::telemetry::TelemetryFlags,
}

/// Node settings shared by `berth node-agent` and `berth up`.
#[derive(Debug, Args)]
pub struct NodeFlags {
    /// Backends to offer (repeatable or comma-separated); the first is the default.
    /// `local` is unsandboxed and needs --allow-unsandboxed.
    #[arg(long = "backend", env = "BERTH_BACKENDS", default_value = "local", value_delimiter = ',')]
    pub backends: Vec<String>,
    /// Offer the unsandboxed `local` backend: commands run as this process's user, with its
    /// secrets and every workspace on the node in reach. Callers still need an admin role or
    /// a grant (token `backends`, JWT `berth_backends`) to pick it.
    #[arg(long, env = "BERTH_ALLOW_UNSANDBOXED")]
    pub allow_unsandboxed: bool,
    #[command(flatten)]
    pub limits: LimitFlags,
    /// Node label for placement selectors (repeatable).
    #[arg(long = "label", value_parser = parse_key_value)]
    pub labels: Vec<(String, String)>,
    /// Most workspaces this node accepts (0 = unlimited).
    #[arg(long, default_value_t = 0)]
    pub capacity: u32,
    /// Warm pool: containers made ahead of time per backend (`docker=4`; comma-separated
    /// or repeated), claimed by fresh workspaces with the node's default spec, refilled in
    /// the background, within --capacity. Only docker has one.
    #[arg(long, env = "BERTH_WARM_POOL", value_delimiter = ',', value_parser = parse_pool_size)]
    pub warm_pool: Vec<(String, usize)>,
    /// Largest file one write may create, in bytes.
    #[arg(long, default_value_t = 4 * 1024 * 1024 * 1024)]
    pub max_file_bytes: u64,
    /// Image of docker workspaces whose spec names none (build it with
    /// deploy/images/build-base.sh; nothing is ever pulled).
    #[arg(long, env = "BERTH_DOCKER_IMAGE", default_value = "berth/base:latest")]
    pub docker_image: String,
    /// Most execs running at once in one workspace (more get RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = 32)]
    pub max_execs_per_workspace: u32,
    /// Most provisions of one host backend (local, bubblewrap, docker) doing their host work
    /// at once; the others wait their turn. Default: four per core.
    #[arg(long)]
    pub max_concurrent_provisions: Option<usize>,
    /// Address range (CIDR or single address) networked sandboxes may reach although the
    /// default policy blocks it: private, loopback, link-local, CGNAT ranges and the
    /// host's own addresses (repeatable or comma-separated).
    #[arg(long = "sandbox-allow-cidr", env = "BERTH_SANDBOX_ALLOW_CIDRS", value_delimiter = ',')]
    pub sandbox_allow_cidrs: Vec<String>,
    /// Host uids (= gids) of bubblewrap sandboxes when the node agent runs as root,
    /// FIRST-LAST: two per workspace (its processes, its secret holders).
    #[arg(long, env = "BERTH_SANDBOX_UID_RANGE", default_value = "1879048192-1879113727", value_parser = UidRange::parse)]
    pub sandbox_uid_range: UidRange,
    /// Per-workspace cgroups of bubblewrap sandboxes (memory, CPU, pids): auto (when root
    /// and writable; else per-process rlimits, with a warning), required, or off.
    #[arg(long, env = "BERTH_SANDBOX_CGROUPS", default_value = "auto", value_parser = CgroupPolicy::parse)]
    pub sandbox_cgroups: CgroupPolicy,
    /// Start every bubblewrap command in a fresh sandbox, and every Docker command as a
    /// Docker exec, instead of forking it from the workspace's resident supervisor (slower:
    /// a sandbox build or a Docker exec per command; each bubblewrap exec then has a pid
    /// namespace of its own). Docker needs it when the engine runs on another host.
    #[arg(long, env = "BERTH_NO_SUPERVISOR")]
    pub no_supervisor: bool,
    /// How long a bubblewrap workspace's idle supervisor lives on before it exits (a
    /// Docker container's lives on for 5 minutes).
    #[arg(long, env = "BERTH_SUPERVISOR_IDLE", default_value = "30s", value_parser = parse_duration)]
    pub supervisor_idle: Duration,
    /// How long copies moved to the quarantine (superseded, orphaned, replaced by a fresh
    /// workspace of the same id) are kept before they are deleted.
    #[arg(long, env = "BERTH_QUARANTINE_RETENTION", default_value = "7d", value_parser = parse_duration)]
    pub quarantine_retention: Duration,
    /// Test hook: delay every provision that makes or changes a copy, in its provision slot
    /// (widens the bind window in failover tests).
    #[arg(long, default_value = "0s", value_parser = parse_duration, hide = true)]
    pub debug_provision_delay: Duration,
    /// Test hook: delay every destroy's answer after its files are gone (lets a test cut
    /// the replica off etcd between the node's destroy and the record's delete).
    #[arg(long, default_value = "0s", value_parser = parse_duration, hide = true)]
    pub debug_destroy_delay: Duration,
    /// Host directory of skill directories copied into every new workspace once.
    #[arg(long, env = "BERTH_SKILLS_SEED")]
    pub skills_seed: Option<PathBuf>,
    /// JSON file with the MCP declarations a corrupt `.mcp` is re-seeded with (default: none).
    #[arg(long, env = "BERTH_MCP_DEFAULTS")]
    pub mcp_defaults: Option<PathBuf>,
    /// Most live MCP clients on this node; past it the least recently used is closed.
    #[arg(long, default_value_t = 64)]
    pub mcp_max_live: usize,
    /// An MCP client unused this long is closed.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub mcp_idle_timeout: Duration,
    /// Address range (CIDR, or one address) HTTP MCP servers may be reached at although it
    /// is loopback, private, link-local, CGNAT... (repeatable; default: public addresses only).
    #[arg(long = "mcp-allow-cidr", value_parser = parse_cidr)]
    pub mcp_allow_cidr: Vec<berth_node_agent::contract::Cidr>,
    /// Largest content of one skill or tree archive, in bytes.
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub tree_max_bytes: u64,
    /// Most entries of one skill or tree archive.
    #[arg(long, default_value_t = 10_000)]
    pub tree_max_files: u64,
    #[command(flatten)]
    pub cloud: super::cloud::CloudFlags,
}

/// Operator defaults (`--default-*`, used when a request says 0) and ceilings
/// (`--ceiling-*`, above which a request is refused) of spec and exec limits; 0 = none.
#[derive(Debug, Args)]
pub struct LimitFlags {
    #[arg(long, default_value_t = 0)]
    pub default_memory_bytes: u64,
    #[arg(long, default_value_t = 0)]
    pub ceiling_memory_bytes: u64,
    #[arg(long, default_value_t = 0)]
    pub default_cpu_millis: u32,
    #[arg(long, default_value_t = 0)]
    pub ceiling_cpu_millis: u32,
    #[arg(long, default_value_t = 0)]
    pub default_pids: u32,
    #[arg(long, default_value_t = 0)]
    pub ceiling_pids: u32,
    /// Largest file a workspace process may write (the spec's file_size_bytes).
    #[arg(long, default_value_t = 0)]
    pub default_file_size_bytes: u64,
    #[arg(long, default_value_t = 0)]
    pub ceiling_file_size_bytes: u64,
    #[arg(long, default_value_t = 0)]
    pub default_cpu_time_secs: u32,
    #[arg(long, default_value_t = 0)]
    pub ceiling_cpu_time_secs: u32,
    /// Timeout of an exec that names none.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub default_exec_timeout: Duration,
    /// Longest exec timeout a caller may ask for (at most 24h).
    #[arg(long, default_value = "24h", value_parser = parse_duration)]
    pub ceiling_exec_timeout: Duration,
    /// Output cap per stream of an exec that names none, in bytes.
    #[arg(long, default_value_t = 1024 * 1024)]
    pub default_output_bytes: u64,
    /// Largest output cap per stream a caller may ask for, in bytes (at most 64 MiB).
    #[arg(long, default_value_t = 64 * 1024 * 1024)]
    pub ceiling_output_bytes: u64,
    /// Bytes of exec output all unary execs on this node may buffer at once (each reserves
    /// 2 × its output cap; one that cannot is refused with RESOURCE_EXHAUSTED).
    #[arg(long, default_value_t = berth_node_agent::config::DEFAULT_EXEC_OUTPUT_BUDGET_BYTES)]
    pub exec_output_budget_bytes: u64,
}

impl LimitFlags {
    fn limits(&self) -> NodeLimits {
        NodeLimits {
            memory_bytes: Bound::new(self.default_memory_bytes, self.ceiling_memory_bytes),
            cpu_millis: Bound::new(self.default_cpu_millis.into(), self.ceiling_cpu_millis.into()),
            pids: Bound::new(self.default_pids.into(), self.ceiling_pids.into()),
            file_size_bytes: Bound::new(self.default_file_size_bytes, self.ceiling_file_size_bytes),
            cpu_time_secs: Bound::new(self.default_cpu_time_secs.into(), self.ceiling_cpu_time_secs.into()),
            exec_timeout_ms: Bound::new(
                self.default_exec_timeout.as_millis() as u64,
                self.ceiling_exec_timeout.as_millis() as u64,
            ),
            exec_output_bytes: Bound::new(self.default_output_bytes, self.ceiling_output_bytes),
        }
    }
}

fn parse_cidr(text: &str) -> Result<berth_node_agent::contract::Cidr, String> {
    text.parse()
}

impl NodeFlags {
    pub fn apply(&self, config: &mut NodeAgentConfig) -> anyhow::Result<()> {
        config.backends = split_list(&self.backends);
        config.allow_unsandboxed = self.allow_unsandboxed;
        config.limits = self.limits.limits();
        config.exec_output_budget_bytes = self.limits.exec_output_budget_bytes;
        config.labels = self.labels.iter().cloned().collect();
        config.capacity_workspaces = self.capacity;
        config.warm_pool = self.warm_pool.iter().cloned().collect();
        config.max_file_bytes = self.max_file_bytes;
        config.debug_provision_delay = self.debug_provision_delay;
        config.debug_destroy_delay = self.debug_destroy_delay;
        config.quarantine_retention = self.quarantine_retention;
        config.docker_image = self.docker_image.clone();
        config.max_execs_per_workspace = self.max_execs_per_workspace;
        if let Some(provisions) = self.max_concurrent_provisions {
            config.max_concurrent_provisions = provisions;
        }
        config.sandbox_allow_cidrs = split_list(&self.sandbox_allow_cidrs)
            .iter()
            .map(|cidr| cidr.parse().with_context(|| format!("--sandbox-allow-cidr {cidr:?}")))
            .collect::<anyhow::Result<_>>()?;
        config.bubblewrap.sandbox_uid_range = self.sandbox_uid_range;
        config.bubblewrap.cgroups = self.sandbox_cgroups;
        config.bubblewrap.supervisor = !self.no_supervisor;
        config.bubblewrap.supervisor_idle = self.supervisor_idle;
        let contract = &mut config.contract;
        contract.skills_seed = self.skills_seed.clone();
        contract.mcp.pool.max_live = self.mcp_max_live;
        contract.mcp.pool.idle_timeout = self.mcp_idle_timeout;
        contract.mcp.allowed_cidrs = self.mcp_allow_cidr.clone();
        contract.tree_limits =
            berth_workspace::tree::TreeLimits { max_bytes: self.tree_max_bytes, max_files: self.tree_max_files };
        if let Some(path) = &self.mcp_defaults {
            let text = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            contract.mcp.defaults =
                serde_json::from_slice(&text).with_context(|| format!("parsing {} (a JSON array)", path.display()))?;
        }
        Ok(())
    }
}

/// `BACKEND=SIZE` of `--warm-pool`.
fn parse_pool_size(text: &str) -> Result<(String, usize), String> {
    let (backend, size) = crate::commands::parse_key_value(text)?;
    let size = size.parse().map_err(|_| format!("--warm-pool {text:?}: the size must be a whole number"))?;
    Ok((backend, size))
}

pub async fn node_agent(args: NodeAgentArgs) -> anyhow::Result<i32> {
    let mut config = NodeAgentConfig::new(args.node_id.unwrap_or_else(|| default_id("node")), args.data_dir);
    args.common.apply(&mut config)?;
    args.snapshots.apply_to_node(&mut config, args.snapshots.snapshot_store.clone());
    config.cloud = args.common.cloud.config(&args.key_prefix);
    config.control_planes = split_list(&args.control_planes).into_iter().map(|url| with_scheme(&url)).collect();
    config.advertise_address = args.advertise.unwrap_or_default();
    config.node_credential = args
        .node_credential_file
        .as_deref()
        .map(|path| NodeCredential::from_file(path, &config.node_id))
        .transpose()?;
    config.node_secret =
        args.shared_node_secret_file.as_deref().map(Secret::from_file).transpose().map_err(anyhow::Error::msg)?;
    config.insecure_plaintext = args.insecure_plaintext;
    config.insecure_shared_node_secret = args.insecure_shared_node_secret;
    if let (Some(cert), Some(key)) = (args.tls_cert, args.tls_key) {
        config.tls = Some(TlsFiles { cert, key });
    }
    config.client_ca = args.client_ca_cert;
    config.control_plane_tls = args.control_plane_ca_cert.map(|ca| ClientTls { ca, identity: None, domain: None });
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let shutdown = shutdown_on_signal();
    args.telemetry
        .serve_metrics(MetricsTransport::of(config.tls.as_ref(), config.insecure_plaintext), shutdown.clone())
        .await?;
    berth_node_agent::serve(listener, config, shutdown).await.context("node agent")?;
    Ok(0)
}

/// `host:port` means `http://host:port`.
pub(crate) fn with_scheme(url: &str) -> String {
    if url.contains("://") { url.to_owned() } else { format!("http://{url}") }
}
