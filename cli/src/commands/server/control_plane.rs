//! `berth control-plane`: one replica against etcd.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use berth_control_plane::auth::AuthConfig;
use berth_control_plane::auth::jwt::{ClaimCheck, JwtConfig, JwtKey};
use berth_control_plane::registry::etcd::{EtcdConfig, EtcdRegistry};
use berth_control_plane::{ControlPlaneConfig, IsolationPolicy};
use berth_proto::auth::Secret;
use berth_proto::credentials::NodeCredentialKey;
use berth_proto::tls::{ClientTls, TlsFiles};
use clap::{Args, ValueEnum};
use tokio_util::sync::CancellationToken;

use crate::telemetry::MetricsTransport;

use super::flags::{default_id, parse_duration, shutdown_on_signal, split_list};

/// Flags of `berth control-plane`.
#[derive(Debug, Args)]
pub struct ControlPlaneArgs {
    /// etcd endpoints, comma-separated or repeated (`https://` with --etcd-ca).
    #[arg(long, env = "BERTH_ETCD", required = true, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// CA (PEM) of etcd's server certificates: etcd over TLS.
    #[arg(long, env = "BERTH_ETCD_CA")]
    pub etcd_ca: Option<PathBuf>,
    /// Client certificate (PEM) this replica presents to etcd (etcd's --client-cert-auth)…
    #[arg(long, env = "BERTH_ETCD_CERT", requires = "etcd_key", requires = "etcd_ca")]
    pub etcd_cert: Option<PathBuf>,
    /// …and its key.
    #[arg(long, env = "BERTH_ETCD_KEY", requires = "etcd_cert")]
    pub etcd_key: Option<PathBuf>,
    /// etcd user (etcd authentication), with its password in --etcd-password-file.
    #[arg(long, env = "BERTH_ETCD_USER", requires = "etcd_password_file")]
    pub etcd_user: Option<String>,
    /// File holding the etcd user's password.
    #[arg(long, env = "BERTH_ETCD_PASSWORD_FILE", requires = "etcd_user")]
    pub etcd_password_file: Option<PathBuf>,
    /// Address to serve gRPC on.
    #[arg(long, env = "BERTH_LISTEN", default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Unique id of this replica (default: derived from the hostname).
    #[arg(long, env = "BERTH_REPLICA_ID")]
    pub replica_id: Option<String>,
    /// URL other processes reach this replica at (default: http://<listen address>).
    #[arg(long, env = "BERTH_ADVERTISE")]
    pub advertise: Option<String>,
    /// File holding the key every node's own credential is derived from (make one node's
    /// with `berth node-credential`); nodes never hold it. Needed beyond loopback.
    #[arg(long, env = "BERTH_NODE_CREDENTIAL_KEY_FILE", conflicts_with = "shared_node_secret_file")]
    pub node_credential_key_file: Option<PathBuf>,
    /// Loopback development only: one secret shared by every replica and node, with no
    /// per-node identity (any holder may register as any node). Refused beyond loopback.
    #[arg(long, env = "BERTH_SHARED_NODE_SECRET_FILE")]
    pub shared_node_secret_file: Option<PathBuf>,
    /// Serve plaintext gRPC on a non-loopback --listen: bearer tokens and node credentials
    /// cross the network readable. Without it such a listener needs --tls-cert/--tls-key.
    #[arg(long, env = "BERTH_INSECURE_PLAINTEXT")]
    pub insecure_plaintext: bool,
    /// Migration aid: accept --shared-node-secret-file on a non-loopback --listen, although
    /// every holder of that secret can then act as any node. Move to per-node credentials.
    #[arg(long, env = "BERTH_INSECURE_SHARED_NODE_SECRET", requires = "shared_node_secret_file")]
    pub insecure_shared_node_secret: bool,
    /// Cluster CA (PEM) that signed node agents' certificates, for https:// nodes.
    #[arg(long, env = "BERTH_NODE_CA_CERT")]
    pub node_ca_cert: Option<PathBuf>,
    /// Client certificate this replica presents to node agents (mutual TLS).
    #[arg(long, env = "BERTH_NODE_CLIENT_CERT", requires = "node_client_key")]
    pub node_client_cert: Option<PathBuf>,
    #[arg(long, env = "BERTH_NODE_CLIENT_KEY", requires = "node_client_cert")]
    pub node_client_key: Option<PathBuf>,
    #[command(flatten)]
    pub config: super::flags::ConfigFlag,
    #[command(flatten)]
    pub common: ReplicaFlags,
    #[command(flatten)]
    pub snapshots: super::flags::SnapshotFlags,
    #[command(flatten)]
    pub gateway: super::gateway::GatewayFlags,
    #[command(flatten)]
    pub telemetry: crate::telemetry::TelemetryFlags,
}

/// `--auth` modes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AuthMode {
    /// Everyone is a trusted local operator (loopback listeners only).
    None,
    /// Static bearer tokens from --tokens-file (re-read on SIGHUP).
    Token,
    /// Bearer JWTs (HS256 with --jwt-secret-file, RS256 / ES256 with --jwt-public-key-file).
    Jwt,
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
    /// How long a workspace whose node is not live answers UNAVAILABLE (its files are kept
    /// on the node) before it is re-created empty on another node. Counted from when this
    /// replica first found the node gone.
    #[arg(long, env = "BERTH_LOST_NODE_GRACE", default_value = "60s", value_parser = parse_duration)]
    pub lost_node_grace: Duration,
    /// Longest the replica's view may go without etcd confirming it current (events or
    /// progress notifications) before routing answers a retryable UNAVAILABLE instead of
    /// routing from a frozen view (a replica cut off with a minority member).
    #[arg(long, env = "BERTH_VIEW_MAX_STALENESS", default_value = "5s", value_parser = parse_duration)]
    pub view_max_staleness: Duration,
    /// How callers authenticate.
    #[arg(long, env = "BERTH_AUTH", value_enum, default_value = "none")]
    pub auth: AuthMode,
    /// TOML file of bearer tokens (--auth token).
    #[arg(long, env = "BERTH_TOKENS_FILE")]
    pub tokens_file: Option<PathBuf>,
    /// File with the HS256 secret (--auth jwt).
    #[arg(long, env = "BERTH_JWT_SECRET_FILE", conflicts_with = "jwt_public_key_file")]
    pub jwt_secret_file: Option<PathBuf>,
    /// PEM RSA or EC public key for RS256 / ES256 (--auth jwt).
    #[arg(long, env = "BERTH_JWT_PUBLIC_KEY_FILE")]
    pub jwt_public_key_file: Option<PathBuf>,
    /// The `iss` every JWT must carry (--auth jwt needs it or --jwt-any-issuer).
    #[arg(long, env = "BERTH_JWT_ISSUER", conflicts_with = "jwt_any_issuer")]
    pub jwt_issuer: Option<String>,
    /// Accept JWTs of any issuer signed with the key (no `iss` check).
    #[arg(long, env = "BERTH_JWT_ANY_ISSUER")]
    pub jwt_any_issuer: bool,
    /// The `aud` every JWT must carry (--auth jwt needs it or --jwt-any-audience).
    #[arg(long, env = "BERTH_JWT_AUDIENCE", conflicts_with = "jwt_any_audience")]
    pub jwt_audience: Option<String>,
    /// Accept JWTs meant for any audience signed with the key (no `aud` check).
    #[arg(long, env = "BERTH_JWT_ANY_AUDIENCE")]
    pub jwt_any_audience: bool,
    /// Longest a JWT may be valid (`exp` - `iat`, or `exp` - now without `iat`).
    #[arg(long, env = "BERTH_JWT_MAX_LIFETIME", default_value = "24h", value_parser = parse_duration)]
    pub jwt_max_lifetime: Duration,
    /// Also read the older un-namespaced claims `admin`, `act_for_users` and
    /// `berth_backends` (without it a token carrying one is refused, naming `berth/…`).
    #[arg(long, env = "BERTH_JWT_LEGACY_CLAIMS")]
    pub jwt_legacy_claims: bool,
    /// Clock skew tolerated on JWT expiry.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub jwt_leeway: Duration,
    /// Serve the public API over TLS with this certificate (PEM)…
    #[arg(long, env = "BERTH_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// …and this private key (PEM).
    #[arg(long, env = "BERTH_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Largest gRPC message accepted on the public API, in bytes.
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub max_message_bytes: usize,
    /// Most workspaces one user may own (cluster-wide, from the registry's records; 0 =
    /// unlimited). More are refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 0)]
    pub max_workspaces_per_user: u32,
    /// Most execs one user may run at once through this replica (0 = unlimited). More are
    /// refused with RESOURCE_EXHAUSTED.
    #[arg(long, default_value_t = 0)]
    pub max_execs_per_user: u32,
    /// How old a cloud sandbox carrying this cluster's labels but no workspace record must
    /// be before the elected janitor removes it.
    #[arg(long, env = "BERTH_SANDBOX_JANITOR_GRACE", default_value = "10m", value_parser = parse_duration)]
    pub sandbox_janitor_grace: Duration,
    /// How often the elected janitor looks at the cloud providers' labelled sandboxes.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub sandbox_janitor_interval: Duration,
}

impl ReplicaFlags {
    /// The authentication settings, checked for the flags each mode needs.
    pub fn auth_config(&self) -> anyhow::Result<AuthConfig> {
        let jwt_flags = self.jwt_secret_file.is_some() || self.jwt_public_key_file.is_some();
        match self.auth {
            AuthMode::None => {
                anyhow::ensure!(
                    self.tokens_file.is_none() && !jwt_flags,
                    "--tokens-file and --jwt-* need --auth token / jwt"
                );
                Ok(AuthConfig::None)
            }
            AuthMode::Token => {
                let file = self.tokens_file.clone().context("--auth token needs --tokens-file")?;
                Ok(AuthConfig::Tokens { file })
            }
            AuthMode::Jwt => {
                let key = match (&self.jwt_secret_file, &self.jwt_public_key_file) {
                    (Some(secret), None) => JwtKey::Secret(secret.clone()),
                    (None, Some(public)) => JwtKey::PublicKey(public.clone()),
                    _ => anyhow::bail!("--auth jwt needs --jwt-secret-file or --jwt-public-key-file"),
                };
                let mut jwt = JwtConfig::new(key);
                let check = |value: &Option<String>, any: bool| match (value, any) {
                    (Some(value), _) => ClaimCheck::Required(value.clone()),
                    (None, true) => ClaimCheck::Waived,
                    (None, false) => ClaimCheck::Unset,
                };
                jwt.issuer = check(&self.jwt_issuer, self.jwt_any_issuer);
                jwt.audience = check(&self.jwt_audience, self.jwt_any_audience);
                jwt.leeway = self.jwt_leeway;
                jwt.max_lifetime = self.jwt_max_lifetime;
                jwt.legacy_claims = self.jwt_legacy_claims;
                Ok(AuthConfig::Jwt(jwt))
            }
        }
    }

    pub fn apply(&self, config: &mut ControlPlaneConfig) -> anyhow::Result<()> {
        config.auth = self.auth_config()?;
        config.tls = match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert: cert.clone(), key: key.clone() }),
            _ => None,
        };
        config.max_message_bytes = self.max_message_bytes;
        config.max_workspaces_per_user = self.max_workspaces_per_user;
        config.max_execs_per_user = self.max_execs_per_user;
        config.isolation = self.isolation;
        config.idle_ttl = self.idle_ttl;
        config.key_prefix = self.key_prefix.clone();
        config.replica_lease_ttl = self.replica_lease_ttl;
        config.node_lease_ttl = self.node_lease_ttl;
        config.heartbeat_interval = self.heartbeat_interval;
        config.bind_timeout = self.bind_timeout;
        config.lost_node_grace = self.lost_node_grace;
        config.view_max_staleness = self.view_max_staleness;
        config.provision_timeout = self.bind_timeout.mul_f64(0.75);
        config.sandbox_janitor_grace = self.sandbox_janitor_grace;
        config.sandbox_janitor_interval = self.sandbox_janitor_interval;
        Ok(())
    }
}

pub async fn control_plane(args: ControlPlaneArgs) -> anyhow::Result<i32> {
    let mut config = ControlPlaneConfig::new(args.replica_id.unwrap_or_else(|| default_id("replica")));
    args.common.apply(&mut config)?;
    args.snapshots.apply_to_replica(&mut config, args.snapshots.snapshot_store.clone());
    config.advertise_address = args.advertise.unwrap_or_default();
    config.node_credential_key = args
        .node_credential_key_file
        .as_deref()
        .map(NodeCredentialKey::from_file)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    config.node_secret =
        args.shared_node_secret_file.as_deref().map(Secret::from_file).transpose().map_err(anyhow::Error::msg)?;
    config.insecure_plaintext = args.insecure_plaintext;
    config.insecure_shared_node_secret = args.insecure_shared_node_secret;
    config.node_tls = args.node_ca_cert.map(|ca| ClientTls {
        ca,
        identity: match (args.node_client_cert, args.node_client_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            _ => None,
        },
        domain: None,
    });
    config.validate().map_err(|error| anyhow::anyhow!("invalid configuration: {error}"))?;
    let endpoints = split_list(&args.etcd);
    let mut etcd = EtcdConfig::new(endpoints.clone());
    etcd.tls = args.etcd_ca.map(|ca| ClientTls {
        ca,
        identity: match (args.etcd_cert, args.etcd_key) {
            (Some(cert), Some(key)) => Some(TlsFiles { cert, key }),
            _ => None,
        },
        domain: None,
    });
    if let (Some(user), Some(path)) = (args.etcd_user, args.etcd_password_file) {
        let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        let password = text.trim_end_matches(['\n', '\r']);
        anyhow::ensure!(!password.is_empty(), "--etcd-password-file {} is empty", path.display());
        etcd.user = Some((user, Secret::new(password)));
    }
    let registry =
        EtcdRegistry::connect(etcd).await.with_context(|| format!("connecting to etcd at {}", endpoints.join(",")))?;
    let listener =
        tokio::net::TcpListener::bind(&args.listen).await.with_context(|| format!("listening on {}", args.listen))?;
    let scheme = if config.tls.is_some() { "https" } else { "http" };
    let own_endpoint = format!("{scheme}://{}", listener.local_addr()?);
    let gateway =
        args.gateway.prepare(&config.replica_id, &config.key_prefix, &config.node_auth(), own_endpoint).await?;
    let shutdown = shutdown_on_signal();
    args.telemetry
        .serve_metrics(MetricsTransport::of(config.tls.as_ref(), config.insecure_plaintext), shutdown.clone())
        .await?;
    // The gateway stops after the replica, so calls the replica forwarded to it finish.
    let gateway_shutdown = CancellationToken::new();
    let gateway_task = gateway.map(|gateway| gateway.spawn(gateway_shutdown.clone()));
    let served = berth_control_plane::serve(listener, config, registry, shutdown).await;
    gateway_shutdown.cancel();
    if let Some(task) = gateway_task {
        task.await.context("embedded gateway task")??;
    }
    served.context("control plane")?;
    Ok(0)
}
