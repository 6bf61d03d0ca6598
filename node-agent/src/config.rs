//! Node-agent configuration.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use berth_proto::auth::Secret;
use berth_proto::credentials::NodeCredential;
use berth_proto::tls::{ClientTls, TlsFiles};

pub use berth_backend_bubblewrap::{BubblewrapConfig, CgroupPolicy, UidRange};

#[derive(Clone, Debug)]
pub struct NodeAgentConfig {
    pub node_id: String,
    /// URL replicas use to reach this agent; empty = `http://<listener address>`.
    pub advertise_address: String,
    /// Replica URLs to heartbeat to; the agent spreads over them and fails over.
    pub control_planes: Vec<String>,
    pub data_dir: PathBuf,
    /// Backends offered, in order; the first is the default.
    pub backends: Vec<String>,
    /// Offer unsandboxed backends (`local`) at all (`--allow-unsandboxed`). Without it a
    /// config naming one refuses to start; with it, an unsandboxed backend is still never
    /// the default next to a sandbox.
    pub allow_unsandboxed: bool,
    pub labels: BTreeMap<String, String>,
    /// 0 = unlimited.
    pub capacity_workspaces: u32,
    /// Largest file one WriteFile may create.
    pub max_file_bytes: u64,
    /// Image of docker workspaces whose spec names none.
    pub docker_image: String,
    /// Test hook: every Provision that makes or changes a copy waits this long in its slot of
    /// `max_concurrent_provisions`, before its host work (widens the bind window).
    pub debug_provision_delay: Duration,
    /// Test hook: every Destroy waits this long after removing the files, before it answers.
    pub debug_destroy_delay: Duration,
    /// How long quarantined copies are kept.
    pub quarantine_retention: Duration,
    /// MCP, skills and tree settings (client pool cap and idle timeout, `.mcp` defaults,
    /// archive limits, seed skills).
    pub contract: crate::contract::ContractConfig,
    /// This node's own credential (`--node-credential-file`, made from the replicas' node
    /// credential key): sent on heartbeats, and it gives the one replica credential this
    /// agent accepts. Needed beyond loopback.
    pub node_credential: Option<NodeCredential>,
    /// The older shared secret of every replica and node (`--shared-node-secret-file`):
    /// required on every call and sent on heartbeats; loopback only. Excludes
    /// `node_credential`.
    pub node_secret: Option<Secret>,
    /// Serve plaintext beyond loopback (`--insecure-plaintext`); without it a non-loopback
    /// listener needs `tls`.
    pub insecure_plaintext: bool,
    /// Accept the shared node secret beyond loopback (`--insecure-shared-node-secret`): a
    /// migration aid; every holder of the secret can then call this agent.
    pub insecure_shared_node_secret: bool,
    /// Serve over TLS with this identity…
    pub tls: Option<TlsFiles>,
    /// …and require client certificates signed by this CA (mutual TLS).
    pub client_ca: Option<PathBuf>,
    /// How heartbeats verify `https://` control-plane URLs.
    pub control_plane_tls: Option<ClientTls>,
    /// Most execs running at once in one workspace; more get RESOURCE_EXHAUSTED.
    pub max_execs_per_workspace: u32,
    /// Most provisions of one host backend doing their host work at once
    /// (`--max-concurrent-provisions`, default [`crate::state::default_provision_slots`]).
    pub max_concurrent_provisions: usize,
    /// Operator defaults and ceilings of spec and exec limits (`--default-*`,
    /// `--ceiling-*`).
    pub limits: crate::limits::NodeLimits,
    /// Node-wide bytes of exec output buffered at once by unary execs
    /// (`--exec-output-budget-bytes`); an exec that cannot reserve its share is refused.
    pub exec_output_budget_bytes: u64,
    /// Ranges networked sandboxes (bubblewrap, Docker) may reach although the default
    /// policy blocks them (`--sandbox-allow-cidr`; see `berth_backend_host::netns`).
    pub sandbox_allow_cidrs: Vec<berth_backend_host::netns::Cidr>,
    /// Settings of the `bubblewrap` driver (used when it is offered), e.g. the range of
    /// host uids its workspaces get (`--sandbox-uid-range`).
    pub bubblewrap: BubblewrapConfig,
    /// Cloud backends (a gateway): the cluster's key prefix and each provider's settings.
    pub cloud: crate::cloud::CloudConfig,
    /// Where this node's workspaces are snapshotted (`--snapshot-store`: `file://…`,
    /// `redis://…`, `s3://…`); `None`: no snapshots.
    pub snapshot_store: Option<String>,
    /// Snapshot every changed workspace this often (`--snapshot-interval`); `None`: only on
    /// Release, before a move and on demand.
    pub snapshot_interval: Option<Duration>,
    /// Snapshots kept per workspace (`--snapshot-keep`), the newest.
    pub snapshot_keep: usize,
    /// Warm pool size per backend (`--warm-pool docker=4`): containers made ahead of time
    /// that a fresh workspace with the node's default spec claims. Within the capacity:
    /// the pool never holds more than the room left under `capacity_workspaces`.
    pub warm_pool: BTreeMap<String, usize>,
}

/// Backends that keep a warm pool.
pub const WARM_POOL_BACKENDS: &[&str] = &["docker"];
/// Largest warm pool of one backend.
pub const MAX_WARM_POOL: usize = 256;

/// Default of [`NodeAgentConfig::snapshot_keep`].
pub const DEFAULT_SNAPSHOT_KEEP: usize = 5;

/// Default of [`NodeAgentConfig::exec_output_budget_bytes`]: two unary execs at the
/// 64 MiB per-stream ceiling, or 128 at the 1 MiB default.
pub const DEFAULT_EXEC_OUTPUT_BUDGET_BYTES: u64 = 256 * 1024 * 1024;

impl NodeAgentConfig {
    pub fn new(node_id: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        Self {
            node_id: node_id.into(),
            advertise_address: String::new(),
            control_planes: Vec::new(),
            data_dir: data_dir.into(),
            // Invalid until `allow_unsandboxed` is set: offering `local` is a decision.
            backends: vec!["local".into()],
            allow_unsandboxed: false,
            labels: BTreeMap::new(),
            capacity_workspaces: 0,
            max_file_bytes: 4 * 1024 * 1024 * 1024,
            docker_image: berth_backend_docker::DEFAULT_IMAGE.to_owned(),
            debug_provision_delay: Duration::ZERO,
            debug_destroy_delay: Duration::ZERO,
            quarantine_retention: Duration::from_secs(7 * 24 * 3600),
            contract: crate::contract::ContractConfig::default(),
            node_credential: None,
            node_secret: None,
            insecure_plaintext: false,
            insecure_shared_node_secret: false,
            tls: None,
            client_ca: None,
            control_plane_tls: None,
            max_execs_per_workspace: 32,
            max_concurrent_provisions: crate::state::default_provision_slots(),
            limits: crate::limits::NodeLimits::default(),
            exec_output_budget_bytes: DEFAULT_EXEC_OUTPUT_BUDGET_BYTES,
            sandbox_allow_cidrs: Vec::new(),
            bubblewrap: BubblewrapConfig::default(),
            cloud: crate::cloud::CloudConfig::default(),
            snapshot_store: None,
            snapshot_interval: None,
            snapshot_keep: DEFAULT_SNAPSHOT_KEEP,
            warm_pool: BTreeMap::new(),
        }
    }

    pub fn validate(&self) -> Result<(), String> {
        berth_workspace::validate_id("node id", &self.node_id).map_err(|error| error.to_string())?;
        if self.control_planes.is_empty() {
            return Err("at least one control-plane URL is needed".into());
        }
        if self.backends.is_empty() {
            return Err("at least one backend is needed".into());
        }
        self.check_unsandboxed()?;
        self.limits.validate()?;
        for (backend, size) in &self.warm_pool {
            if !self.backends.contains(backend) {
                return Err(format!("--warm-pool names {backend}, which this node does not offer"));
            }
            if !WARM_POOL_BACKENDS.contains(&backend.as_str()) {
                return Err(format!(
                    "--warm-pool: {backend} has no warm pool (only {} does; bubblewrap and local make a \
                     workspace in a few milliseconds without one)",
                    WARM_POOL_BACKENDS.join(", ")
                ));
            }
            if *size > MAX_WARM_POOL {
                return Err(format!("--warm-pool {backend}={size}: at most {MAX_WARM_POOL}"));
            }
        }
        if self.exec_output_budget_bytes < 1024 * 1024 {
            return Err("the exec output budget (--exec-output-budget-bytes) must be at least 1 MiB".into());
        }
        berth_workspace::mcp::config::validate_all(&self.contract.mcp.defaults)
            .map_err(|error| format!("default mcp servers: {error}"))?;
        if self.contract.mcp.pool.max_live == 0 {
            return Err("the mcp client cap must be at least 1".into());
        }
        if let Some(seed) = &self.contract.skills_seed
            && !seed.is_dir()
        {
            return Err(format!("skills seed {} is not a directory", seed.display()));
        }
        if let Some(secret) = &self.node_secret {
            secret.validate().map_err(|reason| format!("node secret: {reason}"))?;
        }
        match (&self.node_credential, &self.node_secret) {
            (Some(_), Some(_)) => {
                return Err("--node-credential-file and --shared-node-secret-file exclude each other".into());
            }
            (Some(credential), None) if credential.node_id() != self.node_id => {
                return Err(format!(
                    "the node credential is node {:?}'s, this node is {:?}",
                    credential.node_id(),
                    self.node_id
                ));
            }
            _ => {}
        }
        if self.client_ca.is_some() && self.tls.is_none() {
            return Err("a client CA (mutual TLS) needs the node's own certificate and key too".into());
        }
        if self.snapshot_keep == 0 {
            return Err("--snapshot-keep must be at least 1".into());
        }
        if self.snapshot_interval.is_some_and(|interval| interval < Duration::from_secs(1)) {
            return Err("--snapshot-interval must be at least 1s".into());
        }
        if self.snapshot_interval.is_some() && self.snapshot_store.is_none() {
            return Err("--snapshot-interval needs --snapshot-store".into());
        }
        if self.max_execs_per_workspace == 0 {
            return Err("max execs per workspace must be at least 1".into());
        }
        if self.max_concurrent_provisions == 0 {
            return Err("--max-concurrent-provisions must be at least 1".into());
        }
        if self.backends.iter().any(|name| name == "bubblewrap") {
            self.bubblewrap.validate().map_err(|error| error.to_string())?;
        }
        if let Some(cidr) = self.sandbox_allow_cidrs.iter().find(|cidr| !cidr.is_ipv4()) {
            return Err(format!(
                "--sandbox-allow-cidr {cidr}: sandboxes have IPv4 only, an IPv6 range would open nothing"
            ));
        }
        Ok(())
    }

    /// An unsandboxed backend runs commands as this process's user: offered only when the
    /// operator says so, and never the default next to a sandbox (a caller naming no
    /// backend must not get the host).
    fn check_unsandboxed(&self) -> Result<(), String> {
        let unsandboxed: Vec<&str> = self
            .backends
            .iter()
            .map(String::as_str)
            .filter(|name| berth_proto::backends::is_unsandboxed(name))
            .collect();
        if let Some(first) = unsandboxed.first()
            && !self.allow_unsandboxed
        {
            return Err(format!(
                "backend {first:?} is unsandboxed: it runs every command as this node agent's user, with access to \
                 its secrets and every workspace on the node; offer it only with --allow-unsandboxed \
                 (config key allow-unsandboxed = true), or offer a sandbox (--backend bubblewrap or docker)"
            ));
        }
        let sandboxed = self.backends.iter().find(|name| !berth_proto::backends::is_unsandboxed(name));
        if let (Some(sandbox), true) = (sandboxed, berth_proto::backends::is_unsandboxed(self.default_backend())) {
            return Err(format!(
                "backend {:?} is unsandboxed and may not be the default next to {sandbox:?}: list the sandbox first",
                self.default_backend()
            ));
        }
        Ok(())
    }

    /// Beyond loopback a node agent needs its own credential (the shared secret would let
    /// every holder call it and register as it) and TLS (unless `--insecure-plaintext`).
    pub fn check_listener(&self, address: std::net::SocketAddr) -> Result<(), String> {
        if address.ip().is_loopback() {
            return Ok(());
        }
        let migrating = self.node_secret.is_some() && self.insecure_shared_node_secret;
        if self.node_credential.is_none() && !migrating {
            let why = if self.node_secret.is_some() {
                "the shared node secret (--shared-node-secret-file) is for loopback development only: every holder \
                 could call this agent and register as it"
            } else {
                "without credentials anyone who reaches it could run commands in every workspace"
            };
            return Err(format!(
                "node agent on {address}: {why}; give it its own credential (--node-credential-file, made with \
                 `berth node-credential`){}",
                if self.node_secret.is_some() { ", or say --insecure-shared-node-secret while migrating" } else { "" }
            ));
        }
        if self.tls.is_none() && !self.insecure_plaintext {
            return Err(format!(
                "node agent on {address} without TLS would send its credential and workspace traffic in the clear: \
                 give --tls-cert/--tls-key, or say --insecure-plaintext if the network is protected otherwise"
            ));
        }
        Ok(())
    }

    /// Network policy of this node's sandboxes; namespace state lives under the data dir
    /// (unique per node, so two agents on one host never touch each other's).
    pub fn sandbox_network(&self) -> berth_backend_host::netns::SandboxNetConfig {
        berth_backend_host::netns::SandboxNetConfig {
            allow: self.sandbox_allow_cidrs.clone(),
            state_dir: self.data_dir.join("netns"),
            ..Default::default()
        }
    }

    /// What replicas must present on every call: the replica credential made for this node,
    /// or the shared secret; `None` accepts anyone (loopback only).
    pub fn expected_caller(&self) -> Option<Secret> {
        match &self.node_credential {
            Some(credential) => Some(credential.replica_credential()),
            None => self.node_secret.clone(),
        }
    }

    /// What heartbeats carry: this node's own credential, or the shared secret.
    pub fn heartbeat_credential(&self) -> Option<&Secret> {
        match &self.node_credential {
            Some(credential) => Some(credential.secret()),
            None => self.node_secret.as_ref(),
        }
    }

    pub fn default_backend(&self) -> &str {
        self.backends.first().map(String::as_str).unwrap_or("local")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_allow_cidrs_reach_both_sandbox_backends_ipv4_only() {
        let mut config = NodeAgentConfig::new("node-1", "/data/node-1");
        config.control_planes = vec!["http://127.0.0.1:7070".into()];
        config.allow_unsandboxed = true;
        config.sandbox_allow_cidrs = vec!["10.1.0.0/16".parse().unwrap()];
        config.validate().unwrap();
        let network = config.sandbox_network();
        assert_eq!(network.allow, config.sandbox_allow_cidrs);
        assert_eq!(network.state_dir, PathBuf::from("/data/node-1/netns"));
        config.sandbox_allow_cidrs.push("fd00::/8".parse().unwrap());
        assert!(config.validate().unwrap_err().contains("IPv4 only"));
    }

    #[test]
    fn a_warm_pool_is_for_an_offered_backend_that_has_one() {
        let mut config = NodeAgentConfig::new("node-1", "/data/node-1");
        config.control_planes = vec!["http://127.0.0.1:7070".into()];
        config.backends = vec!["docker".into(), "bubblewrap".into()];
        config.warm_pool = [("docker".to_owned(), 4)].into();
        config.validate().unwrap();
        config.warm_pool = [("bubblewrap".to_owned(), 4)].into();
        assert!(config.validate().unwrap_err().contains("bubblewrap has no warm pool"));
        config.backends = vec!["bubblewrap".into()];
        config.warm_pool = [("docker".to_owned(), 4)].into();
        assert!(config.validate().unwrap_err().contains("does not offer"));
        config.backends = vec!["docker".into()];
        config.warm_pool = [("docker".to_owned(), MAX_WARM_POOL + 1)].into();
        assert!(config.validate().unwrap_err().contains("at most"));
    }

    #[test]
    fn provisions_at_once_default_to_four_per_core_and_never_to_none() {
        let mut config = NodeAgentConfig::new("node-1", "/data/node-1");
        config.control_planes = vec!["http://127.0.0.1:7070".into()];
        config.backends = vec!["docker".into()];
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        assert_eq!(config.max_concurrent_provisions, 4 * cores);
        config.validate().unwrap();
        config.max_concurrent_provisions = 0;
        assert!(config.validate().unwrap_err().contains("--max-concurrent-provisions must be at least 1"));
    }

    #[test]
    fn local_needs_the_switch_and_is_never_the_default_next_to_a_sandbox() {
        let mut config = NodeAgentConfig::new("node-1", "/data/node-1");
        config.control_planes = vec!["http://127.0.0.1:7070".into()];
        assert!(config.validate().unwrap_err().contains("--allow-unsandboxed"), "local by default needs the switch");
        config.backends = vec!["bubblewrap".into(), "local".into()];
        assert!(config.validate().unwrap_err().contains("--allow-unsandboxed"));
        config.allow_unsandboxed = true;
        config.validate().unwrap();
        config.backends = vec!["local".into(), "bubblewrap".into()];
        assert!(config.validate().unwrap_err().contains("may not be the default"));
        config.backends = vec!["local".into()];
        config.validate().unwrap();
    }
}
