//! What every scenario needs around it: the run context, etcd and clusters of real `berth`
//! processes (through the `berth-tests` harness), gRPC clients, etcd counters, and the
//! one floor several scenarios share (concurrent etcd writes).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use berth_control_plane::registry::RegistryRef;
use berth_control_plane::registry::etcd::{EtcdConfig, EtcdRegistry};
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use berth_tests::cluster::{Cluster, ClusterConfig};
use berth_tests::etcd::EtcdProcess;
use bytes::Bytes;
use futures::StreamExt;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;

use crate::machine::MachineInfo;
use crate::settings::Settings;

/// Prints a progress line to stderr.
macro_rules! progress {
    ($($arg:tt)*) => {
        eprintln!("[berth-bench {}] {}", $crate::env::clock(), format_args!($($arg)*))
    };
}
pub(crate) use progress;

/// Seconds since the bench started, for progress lines.
pub fn clock() -> String {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    format!("{:7.1}s", START.get_or_init(Instant::now).elapsed().as_secs_f64())
}

/// What a scenario gets: the resolved settings and the machine description.
pub struct Ctx {
    pub settings: Settings,
    pub machine: Arc<MachineInfo>,
    /// Data directories of stopped clusters, removed when the run ends (see [`Ctx::retire`]).
    retired: std::sync::Mutex<Vec<RetiredDir>>,
}

impl Ctx {
    pub fn new(settings: Settings, machine: Arc<MachineInfo>) -> Self {
        Self { settings, machine, retired: std::sync::Mutex::new(Vec::new()) }
    }

    /// Stops `cluster` and keeps its nodes' data directories until the run ends (or is
    /// interrupted), so one case's teardown does not tax the next case's file creation: on
    /// ext4 without a journal the inode allocator skips, one page-cache lookup each, every
    /// inode freed in the last 60 s (360 s while its inode-table block is dirty), and a
    /// thousand removed workspaces made the next storm's node agents spend a third of their
    /// CPU in that walk.
    pub fn retire(&self, cluster: Cluster) {
        let dir = RetiredDir(cluster.stop_keeping_data());
        progress!("cluster stopped; its data ({}) kept until the run ends", dir.0.display());
        self.retired.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(dir);
    }
}

/// A directory removed, with everything in it, when dropped.
struct RetiredDir(std::path::PathBuf);

impl Drop for RetiredDir {
    fn drop(&mut self) {
        if let Err(error) = std::fs::remove_dir_all(&self.0)
            && error.kind() != std::io::ErrorKind::NotFound
        {
            progress!("cannot remove {}: {error}", self.0.display());
        }
    }
}

/// Starts a single-member etcd on free ports (its data in a temp dir, killed on drop).
pub async fn start_etcd() -> anyhow::Result<EtcdProcess> {
    tokio::task::spawn_blocking(EtcdProcess::try_start).await.context("etcd start task")?
}

/// The `berth` duration flags want a `&'static str`; a run makes a handful of these.
fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// A cluster config with this run's lease and heartbeat settings (production defaults
/// unless overridden) and its log level.
pub fn cluster_config(ctx: &Ctx, etcd: &EtcdProcess, replicas: usize, nodes: usize) -> ClusterConfig {
    let settings = &ctx.settings;
    let mut config = ClusterConfig::new(vec![etcd.endpoint()], replicas, nodes);
    config.replica_lease_ttl = leak(Settings::flag(settings.replica_lease_ttl));
    config.node_lease_ttl = leak(Settings::flag(settings.node_lease_ttl));
    config.heartbeat_interval = leak(Settings::flag(settings.heartbeat_interval));
    config.bind_timeout = leak(Settings::flag(settings.bind_timeout));
    config.log_filter = settings.log_filter.clone();
    config
}

/// Starts a cluster, saying so on stderr.
pub async fn start_cluster(config: ClusterConfig) -> anyhow::Result<Cluster> {
    let started = Instant::now();
    let (replicas, nodes) = (config.replicas, config.nodes);
    let cluster = Cluster::start(config).await.context("starting the cluster")?;
    progress!("cluster up: {replicas} replicas, {nodes} nodes in {:.1}s", started.elapsed().as_secs_f64());
    Ok(cluster)
}

/// An eagerly connected channel (the connection is not part of any measured call).
pub async fn connect(endpoint: &str) -> anyhow::Result<Channel> {
    berth_proto::transport::client(Endpoint::from_shared(endpoint.to_owned()).context("endpoint URL")?)
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to {endpoint}"))
}

pub fn workspace_client(channel: Channel) -> WorkspaceServiceClient<Channel> {
    WorkspaceServiceClient::new(channel).max_decoding_message_size(64 * 1024 * 1024)
}

pub fn health_client(channel: Channel) -> HealthClient<Channel> {
    HealthClient::new(channel)
}

/// One gRPC health Check: the no-op floor of a unary call.
pub async fn health_check(client: &mut HealthClient<Channel>) -> anyhow::Result<()> {
    let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
    client.check(request).await.context("health check")?;
    Ok(())
}

/// Connections for `calls` concurrent calls: enough that none carries more than
/// `streams_per_connection`, a multiple of the replica count, connection `i` to replica
/// `i % replicas` (so call `j` on connection `j % n` goes round-robin over the replicas).
pub async fn spread_channels(
    endpoints: &[String],
    calls: usize,
    streams_per_connection: usize,
) -> anyhow::Result<Vec<Channel>> {
    let replicas = endpoints.len().max(1);
    let needed = calls.div_ceil(streams_per_connection.max(1)).max(1);
    let connections = needed.div_ceil(replicas) * replicas;
    let mut channels = Vec::with_capacity(connections);
    for index in 0..connections {
        channels.push(connect(&endpoints[index % replicas]).await?);
    }
    Ok(channels)
}

/// A registry client on `etcd`, as a replica has one.
pub async fn registry(etcd: &EtcdProcess) -> anyhow::Result<Arc<EtcdRegistry>> {
    EtcdRegistry::connect(EtcdConfig::new([etcd.endpoint()])).await.context("connecting to etcd")
}

/// Floor of the storms: `count` concurrent create-if-absent transactions on fresh keys
/// with a session-record-sized value, made directly through the registry client. Every
/// CreateSession must at least durably write its session record this way.
pub async fn etcd_create_floor(
    registry: &Arc<EtcdRegistry>,
    count: usize,
    value_bytes: usize,
) -> anyhow::Result<(Vec<Duration>, Duration)> {
    let prefix = format!("/bench-floor-{:016x}/sessions/", rand::random::<u64>());
    let value = Bytes::from(vec![b'x'; value_bytes]);
    let registry: RegistryRef = Arc::clone(registry) as RegistryRef;
    let started = Instant::now();
    let calls = (0..count).map(|index| {
        let registry = Arc::clone(&registry);
        let key = format!("{prefix}{index:08}");
        let value = value.clone();
        tokio::spawn(async move {
            let call_started = Instant::now();
            registry.create_if_absent(&key, value, 0).await.map(|_| call_started.elapsed())
        })
    });
    let mut latencies = Vec::with_capacity(count);
    for joined in futures::future::join_all(calls).await {
        latencies.push(joined.context("floor task")?.context("etcd create")?);
    }
    // The floor's keys stay (under their own prefix, which no replica watches).
    let wall = started.elapsed();
    Ok((latencies, wall))
}

/// Selected etcd counters from its `/metrics` (etcd 3.4 names).
#[derive(Clone, Copy, Debug, Default)]
pub struct EtcdCounters {
    pub puts: f64,
    pub deletes: f64,
    pub txns: f64,
    pub proposals_committed: f64,
    pub lease_renewals: f64,
}

impl EtcdCounters {
    pub fn read(etcd: &EtcdProcess) -> anyhow::Result<Self> {
        let text = etcd.metrics().context("reading etcd /metrics")?;
        Ok(Self::parse(&text))
    }

    pub fn parse(text: &str) -> Self {
        let value = |name: &str| {
            text.lines()
                .filter(|line| !line.starts_with('#'))
                .find_map(|line| {
                    let (metric, number) = line.rsplit_once(' ')?;
                    (metric == name).then(|| number.parse::<f64>().ok()).flatten()
                })
                .unwrap_or(0.0)
        };
        Self {
            puts: value("etcd_mvcc_put_total"),
            deletes: value("etcd_mvcc_delete_total"),
            txns: value("etcd_mvcc_txn_total"),
            proposals_committed: value("etcd_server_proposals_committed_total"),
            lease_renewals: value("etcd_debugging_lease_renewed_total"),
        }
    }

    /// Per-second rates from `earlier` to `self` over `wall`.
    pub fn rates_since(&self, earlier: &Self, wall: Duration) -> Self {
        let seconds = wall.as_secs_f64().max(1e-9);
        Self {
            puts: (self.puts - earlier.puts) / seconds,
            deletes: (self.deletes - earlier.deletes) / seconds,
            txns: (self.txns - earlier.txns) / seconds,
            proposals_committed: (self.proposals_committed - earlier.proposals_committed) / seconds,
            lease_renewals: (self.lease_renewals - earlier.lease_renewals) / seconds,
        }
    }
}

/// Runs `total` calls with `concurrency` in flight (closed loop): each worker takes the
/// next index until none is left. Returns every call's latency and the wall time.
pub async fn closed_loop<F, Fut>(total: usize, concurrency: usize, call: F) -> anyhow::Result<(Vec<Duration>, Duration)>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let started = Instant::now();
    let results: Vec<anyhow::Result<Duration>> = futures::stream::iter(0..total)
        .map(|index| {
            let future = call(index);
            async move {
                let call_started = Instant::now();
                future.await.map(|()| call_started.elapsed())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .collect()
        .await;
    let wall = started.elapsed();
    let latencies = results.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
    Ok((latencies, wall))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etcd_counters_parse_and_rate() {
        let text = "# HELP etcd_mvcc_put_total x\netcd_mvcc_put_total 10\netcd_mvcc_delete_total 2\n\
                    etcd_mvcc_txn_total 4\netcd_server_proposals_committed_total 1e+02\n";
        let earlier = EtcdCounters::parse(text);
        assert_eq!(earlier.puts, 10.0);
        assert_eq!(earlier.proposals_committed, 100.0);
        let later = EtcdCounters { puts: 30.0, ..earlier };
        assert_eq!(later.rates_since(&earlier, Duration::from_secs(2)).puts, 10.0);
    }

    #[tokio::test]
    async fn closed_loop_runs_every_call() {
        let (latencies, _) = closed_loop(10, 3, |_| async { Ok(()) }).await.unwrap();
        assert_eq!(latencies.len(), 10);
        assert!(
            closed_loop(3, 2, |index| async move {
                anyhow::ensure!(index != 1, "boom");
                Ok(())
            })
            .await
            .is_err()
        );
    }
}
