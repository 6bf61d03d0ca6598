//! Control-plane configuration: defaults here, overridden by flags / env in the CLI.

use std::time::Duration;

use berth_proto::auth::Secret;
use berth_proto::credentials::NodeCredentialKey;
use berth_proto::tls::{ClientTls, TlsFiles};

use crate::auth::{AuthConfig, NodeAuth};
use crate::policy::IsolationPolicy;

#[derive(Clone, Debug)]
pub struct ControlPlaneConfig {
    /// Unique per replica; names its lease holder in locks and node records.
    pub replica_id: String,
    /// Address other processes reach this replica at (informational, in its record).
    pub advertise_address: String,
    /// Registry key prefix.
    pub key_prefix: String,
    pub isolation: IsolationPolicy,
    /// Workspaces idle longer than this have their runtime released.
    pub idle_ttl: Duration,
    /// TTL of the replica's own lease (bind locks, sweeper leadership). A dead replica's
    /// locks free up this long after it dies.
    pub replica_lease_ttl: Duration,
    /// TTL of node leases. A dead node is seen gone this long after its last heartbeat.
    pub node_lease_ttl: Duration,
    /// How often nodes heartbeat (sent to them at registration).
    pub heartbeat_interval: Duration,
    /// Deadline of a whole bind (lock, provision, record write, or the wait for another
    /// replica's bind).
    pub bind_timeout: Duration,
    /// Longest the view may go without the registry vouching it is current before routing
    /// refuses with a retryable UNAVAILABLE (docs/design.md §4.1).
    pub view_max_staleness: Duration,
    /// Deadline of one Provision call to a node.
    pub provision_timeout: Duration,
    /// How long a workspace whose node is gone waits for it (retryable UNAVAILABLE) before
    /// it is re-created empty elsewhere.
    pub lost_node_grace: Duration,
    /// Deadline of unary node calls other than exec.
    pub node_call_timeout: Duration,
    /// How public callers authenticate (`--auth`).
    pub auth: AuthConfig,
    /// Key every node's own credential and the replica credentials are derived from
    /// (`--node-credential-key-file`; `berth_proto::credentials`): a node registers only as
    /// the id its credential names, and each node accepts only the replica credential made
    /// for it. Needed beyond loopback.
    pub node_credential_key: Option<NodeCredentialKey>,
    /// The older shared secret of every replica and node (`--shared-node-secret-file`):
    /// no per-node identity, so loopback only. Excludes `node_credential_key`.
    pub node_secret: Option<Secret>,
    /// Serve plaintext beyond loopback (`--insecure-plaintext`): bearer tokens and node
    /// credentials then cross the network readable. Without it a non-loopback listener
    /// needs TLS.
    pub insecure_plaintext: bool,
    /// Accept the shared node secret beyond loopback (`--insecure-shared-node-secret`): a
    /// migration aid for deployments not yet on per-node credentials; every holder of the
    /// secret can then register as any node.
    pub insecure_shared_node_secret: bool,
    /// Mutual TLS towards node agents with `https://` addresses.
    pub node_tls: Option<ClientTls>,
    /// TLS of the public listener.
    pub tls: Option<TlsFiles>,
    /// Largest gRPC message accepted on the public API (file data is streamed in chunks).
    pub max_message_bytes: usize,
    /// Most workspaces one user may own, cluster-wide up to the watch lag (see `quota.rs`);
    /// 0 = unlimited.
    pub max_workspaces_per_user: u32,
    /// Most execs one user may run at once through this replica; 0 = unlimited.
    pub max_execs_per_user: u32,
    /// How often the elected sandbox janitor lists the cloud gateways' labelled sandboxes.
    pub sandbox_janitor_interval: Duration,
    /// How old a labelled sandbox without a workspace record must be before the janitor
    /// removes it (`--sandbox-janitor-grace`).
    pub sandbox_janitor_grace: Duration,
    /// The cluster's snapshot store (`--snapshot-store`), read for restore candidates, the
    /// snapshot listing and retention; `None`: snapshots off.
    pub snapshot_store: Option<String>,
    /// Snapshots kept per workspace by the elected sweeper (`--snapshot-keep`).
    pub snapshot_keep: usize,
    /// How often the elected sweeper prunes snapshots and collects orphaned blobs.
    pub snapshot_gc_interval: Duration,
    /// How old an unreferenced blob must be before it is collected (a snapshot in progress
    /// has uploaded blobs its manifest does not name yet).
    pub snapshot_gc_grace: Duration,
}

impl ControlPlaneConfig {
    pub fn validate(&self) -> Result<(), String> {
        berth_workspace::validate_id("replica id", &self.replica_id).map_err(|error| error.to_string())?;
        if self.heartbeat_interval * 2 > self.node_lease_ttl {
            return Err(format!(
                "node lease ttl ({:?}) must be at least twice the heartbeat interval ({:?})",
                self.node_lease_ttl, self.heartbeat_interval
            ));
        }
        if self.replica_lease_ttl < Duration::from_secs(2) || self.node_lease_ttl < Duration::from_secs(2) {
            return Err("lease ttls must be at least 2s (etcd's minimum)".into());
        }
        if self.view_max_staleness < crate::view::PROGRESS_INTERVAL * 2 {
            return Err(format!(
                "the view staleness bound must be at least twice the progress interval ({:?})",
                crate::view::PROGRESS_INTERVAL
            ));
        }
        if self.idle_ttl < Duration::from_secs(1) {
            return Err("idle ttl must be at least 1s".into());
        }
        if let Some(secret) = &self.node_secret {
            secret.validate().map_err(|reason| format!("node secret: {reason}"))?;
        }
        if self.node_secret.is_some() && self.node_credential_key.is_some() {
            return Err("--shared-node-secret-file and --node-credential-key-file exclude each other: per-node \
                        credentials replace the shared secret"
                .into());
        }
        if self.max_message_bytes < 64 * 1024 {
            return Err("max message size must be at least 64 KiB".into());
        }
        if self.snapshot_keep == 0 {
            return Err("--snapshot-keep must be at least 1".into());
        }
        if !self.key_prefix.starts_with('/') {
            return Err(format!("key prefix {:?} must start with '/'", self.key_prefix));
        }
        Ok(())
    }

    /// Defaults for a replica with this id.
    pub fn new(replica_id: impl Into<String>) -> Self {
        Self {
            replica_id: replica_id.into(),
            advertise_address: String::new(),
            key_prefix: "/berth".into(),
            isolation: IsolationPolicy::PerAgent,
            idle_ttl: Duration::from_secs(3600),
            replica_lease_ttl: Duration::from_secs(5),
            node_lease_ttl: Duration::from_secs(10),
            heartbeat_interval: Duration::from_secs(2),
            bind_timeout: Duration::from_secs(60),
            lost_node_grace: Duration::from_secs(60),
            view_max_staleness: Duration::from_secs(5),
            provision_timeout: Duration::from_secs(45),
            node_call_timeout: Duration::from_secs(30),
            auth: AuthConfig::None,
            node_credential_key: None,
            node_secret: None,
            insecure_plaintext: false,
            insecure_shared_node_secret: false,
            node_tls: None,
            tls: None,
            max_message_bytes: 32 * 1024 * 1024,
            max_workspaces_per_user: 0,
            max_execs_per_user: 0,
            sandbox_janitor_interval: Duration::from_secs(30),
            sandbox_janitor_grace: Duration::from_secs(600),
            snapshot_store: None,
            snapshot_keep: 5,
            snapshot_gc_interval: Duration::from_secs(600),
            snapshot_gc_grace: Duration::from_secs(3600),
        }
    }

    /// How node agents authenticate to this replica and it to them.
    pub fn node_auth(&self) -> NodeAuth {
        match (&self.node_credential_key, &self.node_secret) {
            (Some(key), _) => NodeAuth::Keyed(key.clone()),
            (None, Some(secret)) => NodeAuth::Shared(secret.clone()),
            (None, None) => NodeAuth::Open,
        }
    }

    /// Refuses configurations that would expose an unauthenticated or readable listener:
    /// `--auth none`, a replica without per-node credentials, and plaintext (unless
    /// `--insecure-plaintext` says so) are for loopback only.
    pub fn check_listener(&self, address: std::net::SocketAddr) -> Result<(), String> {
        if address.ip().is_loopback() {
            return Ok(());
        }
        if matches!(self.auth, AuthConfig::None) {
            return Err(format!(
                "--auth none is allowed only when every listener is on loopback, and {address} is not: \
                 anyone who can reach it could act as any user (use --auth token or --auth jwt)"
            ));
        }
        match self.node_auth() {
            NodeAuth::Keyed(_) => {}
            NodeAuth::Open => {
                return Err(format!(
                    "a node credential key (--node-credential-key-file) is needed when listening on {address}: \
                     without it anyone who can reach the replica could register a node and receive workspaces"
                ));
            }
            NodeAuth::Shared(_) if self.insecure_shared_node_secret => {}
            NodeAuth::Shared(_) => {
                return Err(format!(
                    "the shared node secret (--shared-node-secret-file) is for loopback development only, and \
                     {address} is not loopback: every holder could register as any node; give each node its own \
                     credential (--node-credential-key-file here, `berth node-credential` for each node), or \
                     say --insecure-shared-node-secret while migrating"
                ));
            }
        }
        if self.tls.is_none() && !self.insecure_plaintext {
            return Err(format!(
                "listening on {address} without TLS would send bearer tokens and node credentials in the clear: \
                 give --tls-cert/--tls-key, or say --insecure-plaintext if the network is protected otherwise"
            ));
        }
        Ok(())
    }

    /// How often the sweeper looks for idle workspaces.
    pub fn sweep_interval(&self) -> Duration {
        (self.idle_ttl / 4).clamp(Duration::from_millis(500), Duration::from_secs(60))
    }

    /// How often a node record is rewritten with fresh load and access times.
    pub fn node_record_refresh(&self) -> Duration {
        (self.idle_ttl / 4).clamp(Duration::from_millis(500), Duration::from_secs(10))
    }
}
