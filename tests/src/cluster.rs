//! A Berth cluster of real processes: R `berth control-plane` replicas and M
//! `berth node-agent`s on an etcd, under a random key prefix so clusters can share one etcd.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use berth_control_plane::keys::Keys;
use berth_control_plane::records::{self, NodeRecord, WorkspaceRecord};
use berth_control_plane::registry::Registry;
use berth_control_plane::registry::etcd::EtcdRegistry;
use berth_proto::meta::ErrorKind;
use berth_proto::v1;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use berth_workspace::WorkspaceId;
use tempfile::TempDir;

use crate::berth::{BerthProcess, DEFAULT_LOG_FILTER};
use crate::proxy::{Proxy, ProxyMode};
use berth_testkit::wait_until;

/// Settings of a test cluster. Leases are short so failures show quickly.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    pub replicas: usize,
    pub nodes: usize,
    pub etcd_endpoints: Vec<String>,
    pub replica_lease_ttl: &'static str,
    pub node_lease_ttl: &'static str,
    pub heartbeat_interval: &'static str,
    pub idle_ttl: &'static str,
    pub bind_timeout: &'static str,
    /// `--lost-node-grace`: 0s (re-place at once) unless a test is about the grace.
    pub lost_node_grace: &'static str,
    pub isolation: &'static str,
    /// Extra flags for every node agent (e.g. `--debug-provision-delay 3s`).
    pub node_flags: Vec<String>,
    /// Extra flags for every replica (e.g. `--otlp-endpoint URL`).
    pub replica_flags: Vec<String>,
    /// Start every replica with `--metrics-listen` on a port of its own
    /// ([`Replica::metrics_port`]).
    pub replica_metrics: bool,
    /// `RUST_LOG` of every process.
    pub log_filter: String,
    /// Each replica reaches etcd through a [`Proxy`] of its own
    /// ([`Cluster::replica_etcd_proxy`]), so a test can partition one replica from etcd.
    pub proxy_replica_etcd: bool,
    /// Each node reaches each replica through a [`Proxy`] of its own
    /// ([`Cluster::node_replica_proxy`]), so a test can partition one node from one replica.
    pub proxy_node_replicas: bool,
}

impl ClusterConfig {
    pub fn new(etcd_endpoints: Vec<String>, replicas: usize, nodes: usize) -> Self {
        Self {
            replicas,
            nodes,
            etcd_endpoints,
            replica_lease_ttl: "3s",
            node_lease_ttl: "3s",
            heartbeat_interval: "500ms",
            idle_ttl: "1h",
            bind_timeout: "30s",
            lost_node_grace: "0s",
            isolation: "per-agent",
            node_flags: Vec::new(),
            replica_flags: Vec::new(),
            replica_metrics: false,
            log_filter: DEFAULT_LOG_FILTER.to_owned(),
            proxy_replica_etcd: false,
            proxy_node_replicas: false,
        }
    }

    /// A cluster on the test binary's shared etcd ([`crate::etcd::shared`]); the cluster's
    /// random key prefix keeps it apart from other clusters there.
    pub fn on_shared_etcd(replicas: usize, nodes: usize) -> Self {
        Self::new(vec![crate::etcd::shared().endpoint()], replicas, nodes)
    }
}

/// A replica process with its id.
pub struct Replica {
    pub id: String,
    pub server: BerthProcess,
    /// Where it serves `/metrics` ([`ClusterConfig::replica_metrics`]).
    pub metrics_port: Option<u16>,
}

/// A node agent process; its data directory outlives the process (restarts keep data).
pub struct Node {
    pub id: String,
    pub server: BerthProcess,
    pub data_dir: PathBuf,
}

impl Node {
    /// True when the node answers a workspace call as a serving node: "not provisioned
    /// here" (wrong generation) rather than "fenced".
    pub async fn is_serving(&self) -> bool {
        let mut client = WorkspaceServiceClient::new(self.server.channel());
        let probe = v1::StatRequest { workspace_id: "ws-serving-probe".into(), path: String::new() };
        match client.stat(probe).await {
            Err(status) => ErrorKind::of(&status) == Some(ErrorKind::WrongGeneration),
            Ok(_) => false,
        }
    }
}

pub struct Cluster {
    pub config: ClusterConfig,
    pub prefix: String,
    pub replicas: Vec<Replica>,
    pub nodes: Vec<Node>,
    /// Per replica index, the proxies to each etcd endpoint (`proxy_replica_etcd`).
    replica_etcd_proxies: Vec<Vec<Proxy>>,
    /// Per node index, the proxies to each replica (`proxy_node_replicas`).
    node_replica_proxies: Vec<Vec<Proxy>>,
    /// Holds every node's data directory.
    data_root: TempDir,
}

impl Drop for Cluster {
    /// Stops every process, then removes the Docker workspaces its nodes made (a node agent
    /// keeps them when it stops); the data directories go with `data_root`.
    fn drop(&mut self) {
        for node in &self.nodes {
            node.server.kill();
        }
        for replica in &self.replicas {
            replica.server.kill();
        }
        crate::leftovers::remove_workspace_containers_under(self.data_root.path());
    }
}

impl Cluster {
    /// Starts the replicas, then the nodes, and waits until every replica lists every node.
    pub async fn start(config: ClusterConfig) -> anyhow::Result<Self> {
        let prefix = format!("/berth-test-{:016x}", rand::random::<u64>());
        let data_root = tempfile::Builder::new().prefix("berth-cluster-").tempdir()?;
        let mut cluster = Self {
            config: config.clone(),
            prefix,
            replicas: Vec::new(),
            nodes: Vec::new(),
            replica_etcd_proxies: Vec::new(),
            node_replica_proxies: Vec::new(),
            data_root,
        };
        for index in 0..config.replicas {
            if config.proxy_replica_etcd {
                let mut proxies = Vec::new();
                for endpoint in &config.etcd_endpoints {
                    proxies.push(Proxy::start(socket_address(endpoint)?).await?);
                }
                cluster.replica_etcd_proxies.push(proxies);
            }
            let replica = cluster.spawn_replica(index).await?;
            cluster.replicas.push(replica);
        }
        for index in 0..config.nodes {
            if config.proxy_node_replicas {
                let mut proxies = Vec::new();
                for endpoint in cluster.replica_endpoints() {
                    proxies.push(Proxy::start(socket_address(&endpoint)?).await?);
                }
                cluster.node_replica_proxies.push(proxies);
            }
            let node = cluster.spawn_node(index).await?;
            cluster.nodes.push(node);
        }
        cluster.wait_nodes_listed(config.nodes, Duration::from_secs(20)).await?;
        cluster.wait_nodes_serving(Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    /// Waits until every node serves workspace calls. Listed is not yet serving: a node lifts
    /// its startup fence when the registration answer reaches it, a moment after its record
    /// appears; a provision in between is refused and retried at the next generation.
    pub async fn wait_nodes_serving(&self, timeout: Duration) -> anyhow::Result<()> {
        for node in &self.nodes {
            let serving = wait_until(timeout, || node.is_serving()).await;
            if !serving {
                anyhow::bail!("{} is listed but does not serve\n{}", node.id, self.logs(20));
            }
        }
        Ok(())
    }

    /// The proxy between replica `replica` and etcd endpoint `endpoint`
    /// (with [`ClusterConfig::proxy_replica_etcd`]).
    pub fn replica_etcd_proxy(&self, replica: usize, endpoint: usize) -> &Proxy {
        &self.replica_etcd_proxies[replica][endpoint]
    }

    /// Sets every proxy between replica `replica` and etcd to `mode`.
    pub fn set_replica_etcd(&self, replica: usize, mode: ProxyMode) {
        for proxy in &self.replica_etcd_proxies[replica] {
            proxy.set_mode(mode);
        }
    }

    /// The proxy between node `node` and replica `replica`
    /// (with [`ClusterConfig::proxy_node_replicas`]).
    pub fn node_replica_proxy(&self, node: usize, replica: usize) -> &Proxy {
        &self.node_replica_proxies[node][replica]
    }

    fn replica_args(&self, index: usize) -> Vec<String> {
        let config = &self.config;
        let etcd = match self.replica_etcd_proxies.get(index) {
            Some(proxies) => proxies.iter().map(Proxy::url).collect::<Vec<_>>().join(","),
            None => config.etcd_endpoints.join(","),
        };
        [
            "control-plane",
            "--etcd",
            &etcd,
            "--replica-id",
            &format!("replica-{index}"),
            "--key-prefix",
            &self.prefix,
            "--replica-lease-ttl",
            config.replica_lease_ttl,
            "--node-lease-ttl",
            config.node_lease_ttl,
            "--heartbeat-interval",
            config.heartbeat_interval,
            "--idle-ttl",
            config.idle_ttl,
            "--bind-timeout",
            config.bind_timeout,
            "--lost-node-grace",
            config.lost_node_grace,
            "--isolation",
            config.isolation,
        ]
        .iter()
        .map(|arg| (*arg).to_owned())
        .chain(config.replica_flags.iter().cloned())
        .collect()
    }

    async fn spawn_replica(&self, index: usize) -> anyhow::Result<Replica> {
        let mut args = self.replica_args(index);
        let metrics_port = if self.config.replica_metrics { Some(crate::process::free_port()?) } else { None };
        if let Some(port) = metrics_port {
            args.extend(["--metrics-listen".to_owned(), format!("127.0.0.1:{port}")]);
        }
        let server = BerthProcess::start_with_log(&format!("replica-{index}"), args, &self.config.log_filter)
            .await
            .with_context(|| format!("replica {index}"))?;
        Ok(Replica { id: format!("replica-{index}"), server, metrics_port })
    }

    /// Starts (or restarts) node `index` with its persistent data directory.
    async fn spawn_node(&self, index: usize) -> anyhow::Result<Node> {
        let id = format!("node-{index}");
        let data_dir = self.data_root.path().join(&id);
        std::fs::create_dir_all(&data_dir)?;
        let control_planes = match self.node_replica_proxies.get(index) {
            Some(proxies) => proxies.iter().map(Proxy::url).collect::<Vec<_>>().join(","),
            None => self.replica_endpoints().join(","),
        };
        // Gateways label cloud sandboxes with the cluster's key prefix and must name it.
        let mut flags = vec!["--key-prefix".to_owned(), self.prefix.clone()];
        flags.extend(self.config.node_flags.iter().cloned());
        start_node_agent(&id, &control_planes, &data_dir, &flags, &self.config.log_filter)
            .await
            .with_context(|| format!("node {index}"))
    }

    pub fn replica_endpoints(&self) -> Vec<String> {
        self.replicas.iter().map(|replica| replica.server.endpoint.clone()).collect()
    }

    /// Restarts node `index` (after a kill), keeping its data directory.
    pub async fn restart_node(&mut self, index: usize) -> anyhow::Result<()> {
        self.nodes[index].server.kill();
        let node = self.spawn_node(index).await?;
        self.nodes[index] = node;
        Ok(())
    }

    /// Restarts replica `index` (after a kill) on a new port. Nodes keep the old URL list,
    /// so only use this where nodes need not reach the new port.
    pub async fn restart_replica(&mut self, index: usize) -> anyhow::Result<()> {
        self.replicas[index].server.kill();
        let replica = self.spawn_replica(index).await?;
        self.replicas[index] = replica;
        Ok(())
    }

    /// Restarts replica `index` (after a kill) on the port it had, so nodes and proxies that
    /// name that port reach the new process.
    pub async fn restart_replica_in_place(&mut self, index: usize) -> anyhow::Result<()> {
        let port = self.replicas[index].server.port();
        self.replicas[index].server.kill();
        let mut args = self.replica_args(index);
        if let Some(metrics_port) = self.replicas[index].metrics_port {
            args.extend(["--metrics-listen".to_owned(), format!("127.0.0.1:{metrics_port}")]);
        }
        let name = format!("replica-{index}");
        let server = BerthProcess::start_on(&name, args, &self.config.log_filter, port)
            .await
            .with_context(|| format!("replica {index} again on port {port}"))?;
        self.replicas[index].server = server;
        Ok(())
    }

    /// Sets every proxy between node `node` and the replicas to `mode`.
    pub fn set_node_replicas(&self, node: usize, mode: ProxyMode) {
        for proxy in &self.node_replica_proxies[node] {
            proxy.set_mode(mode);
        }
    }

    /// The replica with this id.
    pub fn replica(&self, id: &str) -> Option<&Replica> {
        self.replicas.iter().find(|replica| replica.id == id)
    }

    /// Replicas whose process still runs.
    pub fn live_replicas(&self) -> Vec<&Replica> {
        self.replicas.iter().filter(|replica| replica.server.is_running()).collect()
    }

    /// The node with this id.
    pub fn node(&self, id: &str) -> Option<&Node> {
        self.nodes.iter().find(|node| node.id == id)
    }

    /// The cluster's key layout (the same builder the replicas use).
    pub fn keys(&self) -> Keys {
        Keys::new(&self.prefix)
    }

    /// A fresh registry client on the cluster's etcd (a client belongs to the runtime that
    /// made it, so each test makes its own).
    pub async fn registry(&self) -> Arc<EtcdRegistry> {
        crate::etcd::connect(self.config.etcd_endpoints.clone()).await
    }

    /// The stored workspace record, read from etcd (not through any replica).
    pub async fn workspace_record(
        &self,
        registry: &dyn Registry,
        workspace_id: &str,
    ) -> anyhow::Result<Option<WorkspaceRecord>> {
        let key = self.keys().workspace(&WorkspaceId::new(workspace_id)?);
        match registry.get(&key).await? {
            Some(kv) => Ok(Some(records::decode(&key, &kv.value)?)),
            None => Ok(None),
        }
    }

    /// The stored node record, if the node's lease is alive.
    pub async fn node_record(&self, registry: &dyn Registry, node_id: &str) -> anyhow::Result<Option<NodeRecord>> {
        let key = self.keys().node(node_id);
        match registry.get(&key).await? {
            Some(kv) => Ok(Some(records::decode(&key, &kv.value)?)),
            None => Ok(None),
        }
    }

    /// The replica id holding the bind lock of a workspace: the lock's value is
    /// `<replica-id>/<nonce>` (see `Binder::acquire_lock`).
    pub async fn lock_holder(&self, registry: &dyn Registry, workspace_id: &str) -> anyhow::Result<Option<String>> {
        let key = self.keys().lock(&WorkspaceId::new(workspace_id)?);
        let Some(kv) = registry.get(&key).await? else { return Ok(None) };
        let value = String::from_utf8(kv.value.to_vec()).context("lock value is not UTF-8")?;
        let (replica_id, _nonce) =
            value.rsplit_once('/').with_context(|| format!("lock value {value:?} is not <replica-id>/<nonce>"))?;
        Ok(Some(replica_id.to_owned()))
    }

    /// Lines of a replica's log that mention `needle` (e.g. a workspace id).
    pub fn replica_log_lines(&self, replica_id: &str, needle: &str) -> Vec<String> {
        let Some(replica) = self.replica(replica_id) else { return Vec::new() };
        replica.server.log().lines().filter(|line| line.contains(needle)).map(str::to_owned).collect()
    }

    /// Node ids each live replica lists, in replica order (killed replicas give `None`).
    pub async fn listed_nodes(&self) -> Vec<Option<Vec<String>>> {
        let mut all = Vec::new();
        for replica in &self.replicas {
            if !replica.server.is_running() {
                all.push(None);
                continue;
            }
            let listed = replica.server.admin_client().list_nodes(v1::ListNodesRequest {}).await;
            all.push(
                listed.ok().map(|response| response.into_inner().nodes.into_iter().map(|node| node.node_id).collect()),
            );
        }
        all
    }

    /// Waits until every live replica lists exactly `count` nodes.
    pub async fn wait_nodes_listed(&self, count: usize, timeout: Duration) -> anyhow::Result<()> {
        let listed = wait_until(timeout, || async {
            self.listed_nodes().await.iter().flatten().all(|nodes| nodes.len() == count)
                && self.listed_nodes().await.iter().any(Option::is_some)
        })
        .await;
        if !listed {
            anyhow::bail!(
                "replicas list {:?}, expected {count} nodes each\n{}",
                self.listed_nodes().await,
                self.logs(20)
            );
        }
        Ok(())
    }

    /// Workspace directories on every node's disk (the ground truth of what was provisioned).
    pub fn workspace_dirs(&self) -> Vec<(String, String)> {
        let mut found = Vec::new();
        for node in &self.nodes {
            found.extend(workspace_dirs_in(&node.data_dir).into_iter().map(|name| (node.id.clone(), name)));
        }
        found
    }

    /// Stops every process like a drop does, but leaves the nodes' data directories on disk
    /// and returns the directory that holds them: the caller removes it when it chooses (the
    /// bench, at the end of its run: `berth-bench`'s `Ctx::retire` says why).
    pub fn stop_keeping_data(mut self) -> PathBuf {
        self.data_root.disable_cleanup(true);
        self.data_root.path().to_path_buf()
    }

    /// Keeps every process's log and every node's data directory on disk (a failed check
    /// wants them read), and says where they are.
    pub fn keep_for_inspection(&mut self) -> String {
        self.data_root.disable_cleanup(true);
        let mut kept = format!("node data directories kept under {}\n", self.data_root.path().display());
        for replica in &self.replicas {
            kept.push_str(&format!(
                "{} log: {}\n",
                replica.id,
                replica.server.process.keep_dir().join("log.txt").display()
            ));
        }
        for node in &self.nodes {
            kept.push_str(&format!("{} log: {}\n", node.id, node.server.process.keep_dir().join("log.txt").display()));
        }
        kept
    }

    /// The tails of every process log, for failure messages.
    pub fn logs(&self, lines: usize) -> String {
        let mut text = String::new();
        for replica in &self.replicas {
            text.push_str(&format!("--- {} log:\n{}\n", replica.id, replica.server.process.log_tail(lines)));
        }
        for node in &self.nodes {
            text.push_str(&format!("--- {} log:\n{}\n", node.id, node.server.process.log_tail(lines)));
        }
        text
    }
}

/// Names of the workspace directories under a node data dir.
pub fn workspace_dirs_in(data_dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("workspaces")) else { return Vec::new() };
    let mut names: Vec<String> =
        entries.flatten().map(|entry| entry.file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// Starts a node agent `id` heartbeating to `control_planes` (comma-separated URLs) with its
/// data in `data_dir`, plus `extra` flags; also for nodes outside a [`Cluster`]'s list.
pub async fn start_node_agent(
    id: &str,
    control_planes: &str,
    data_dir: &Path,
    extra: &[String],
    log_filter: &str,
) -> anyhow::Result<Node> {
    let mut args: Vec<String> = vec![
        "node-agent".into(),
        "--control-plane".into(),
        control_planes.to_owned(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--node-id".into(),
        id.to_owned(),
        // The default backend is `local`; tests that pass `--backend` keep this harmless.
        "--allow-unsandboxed".into(),
    ];
    args.extend(extra.iter().cloned());
    let server = BerthProcess::start_with_log(id, args, log_filter).await?;
    Ok(Node { id: id.to_owned(), server, data_dir: data_dir.to_path_buf() })
}

/// `127.0.0.1:2379` of `http://127.0.0.1:2379`.
pub fn socket_address(endpoint: &str) -> anyhow::Result<std::net::SocketAddr> {
    let authority = endpoint.trim_start_matches("http://").trim_start_matches("https://").trim_end_matches('/');
    authority.parse().with_context(|| format!("endpoint {endpoint:?} is not host:port"))
}
