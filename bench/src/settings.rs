//! Flags of `berth-bench`. Sizes and durations that differ between a full and a `--quick`
//! run are `Option`s here: unset means "the default of the chosen mode".

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser};

#[derive(Debug, Parser)]
#[command(name = "berth-bench", about = "Benchmark scenarios against real Berth processes")]
pub struct Cli {
    /// Scenario to run (see `--list`), or `all`.
    #[arg(default_value = "all")]
    pub scenario: String,
    /// Small sizes and short durations (`all --quick` takes under 3 minutes on 2 cores).
    #[arg(long)]
    pub quick: bool,
    /// Where to write results.json and results.md.
    #[arg(long, default_value = "bench-results")]
    pub out: PathBuf,
    /// Print the scenario names and exit.
    #[arg(long)]
    pub list: bool,
    #[command(flatten)]
    pub tuning: Tuning,
}

#[derive(Debug, Args)]
pub struct Tuning {
    /// Concurrent CreateSession calls per storm [full: 100,1000; quick: 100].
    #[arg(long, value_delimiter = ',')]
    pub storm_sizes: Option<Vec<usize>>,
    /// Replica counts the storms run against.
    #[arg(long, value_delimiter = ',', default_value = "1,3")]
    pub storm_replicas: Vec<usize>,
    /// Node agents of the storm clusters.
    #[arg(long, default_value_t = 2)]
    pub storm_nodes: usize,
    /// Concurrent calls per client connection (one HTTP/2 connection carries this many
    /// streams; more calls open more connections, spread round-robin over the replicas).
    #[arg(long, default_value_t = 100)]
    pub streams_per_connection: usize,
    /// Sequential GetWorkspace calls [full: 2000; quick: 500].
    #[arg(long)]
    pub resolve_sequential: Option<usize>,
    /// Total GetWorkspace calls of the concurrent run [full: 20000; quick: 4000].
    #[arg(long)]
    pub resolve_total: Option<usize>,
    /// In-flight calls of the concurrent run.
    #[arg(long, default_value_t = 64)]
    pub resolve_concurrency: usize,
    /// Sequential `true` execs per backend (and per floor) [full: 200; quick: 30].
    #[arg(long)]
    pub exec_iterations: Option<usize>,
    /// Fresh workspaces provisioned per backend [full: 10; quick: 3].
    #[arg(long)]
    pub provision_samples: Option<usize>,
    /// Image of docker workspaces (and of the `docker exec` floor's container).
    #[arg(long, default_value = "berth/base:latest")]
    pub docker_image: String,
    /// File sizes in MiB [full: 1,256; quick: 1,32].
    #[arg(long, value_delimiter = ',')]
    pub file_sizes_mib: Option<Vec<u64>>,
    /// Chunk sizes of the file streams, in KiB.
    #[arg(long, value_delimiter = ',', default_value = "64,1024")]
    pub file_chunks_kib: Vec<u64>,
    /// Repetitions of each file operation [full: 10 small / 3 large; quick: 5 / 2].
    #[arg(long)]
    pub file_repetitions: Option<usize>,
    /// Workspace records in etcd at each step [full: 1000,10000,100000,1000000; quick: 1000,10000].
    #[arg(long, value_delimiter = ',')]
    pub registry_levels: Option<Vec<usize>>,
    /// GetWorkspace lookups at each step [full: 2000; quick: 500].
    #[arg(long)]
    pub registry_lookups: Option<usize>,
    /// Records per etcd transaction when filling the registry (etcd allows 128 ops).
    #[arg(long, default_value_t = 128)]
    pub registry_batch: usize,
    /// Transactions in flight when filling the registry.
    #[arg(long, default_value_t = 16)]
    pub registry_write_concurrency: usize,
    /// Simulated node agents [full: 1000; quick: 50].
    #[arg(long)]
    pub sim_nodes: Option<usize>,
    /// Workspaces each simulated node reports in its heartbeats.
    #[arg(long, default_value_t = 10)]
    pub sim_workspaces_per_node: usize,
    /// Steady-state window of the node scenario [full: 60s; quick: 10s].
    #[arg(long, value_parser = parse_duration)]
    pub node_duration: Option<Duration>,
    /// Replicas of the node scenario.
    #[arg(long, default_value_t = 3)]
    pub node_replicas: usize,
    /// Heartbeat interval replicas ask of nodes.
    #[arg(long, default_value = "2s", value_parser = parse_duration)]
    pub heartbeat_interval: Duration,
    /// Node lease TTL (bounds the time to detect a dead node).
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub node_lease_ttl: Duration,
    /// Replica lease TTL.
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    pub replica_lease_ttl: Duration,
    /// Deadline of one bind.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub bind_timeout: Duration,
    /// RUST_LOG of the Berth processes (production-like: info).
    #[arg(long, default_value = "info")]
    pub log_filter: String,
}

/// `full` for a full run, `small` for a quick one.
fn pick<T>(quick: bool, full: T, small: T) -> T {
    if quick { small } else { full }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|error| format!("{text:?}: {error} (use units, e.g. 30s)"))
}

/// Resolved sizes of this run.
#[derive(Clone, Debug)]
pub struct Settings {
    pub quick: bool,
    pub storm_sizes: Vec<usize>,
    pub storm_replicas: Vec<usize>,
    pub storm_nodes: usize,
    pub streams_per_connection: usize,
    pub resolve_sequential: usize,
    pub resolve_total: usize,
    pub resolve_concurrency: usize,
    pub exec_iterations: usize,
    pub provision_samples: usize,
    pub docker_image: String,
    pub file_sizes_mib: Vec<u64>,
    pub file_chunks_kib: Vec<u64>,
    /// Repetitions of small files (≤ 8 MiB) and of large ones.
    pub file_repetitions: (usize, usize),
    pub registry_levels: Vec<usize>,
    pub registry_lookups: usize,
    pub registry_batch: usize,
    pub registry_write_concurrency: usize,
    pub sim_nodes: usize,
    pub sim_workspaces_per_node: usize,
    pub node_duration: Duration,
    pub node_replicas: usize,
    pub heartbeat_interval: Duration,
    pub node_lease_ttl: Duration,
    pub replica_lease_ttl: Duration,
    pub bind_timeout: Duration,
    pub log_filter: String,
}

impl Settings {
    pub fn resolve(quick: bool, tuning: Tuning) -> anyhow::Result<Self> {
        let settings = Self {
            quick,
            storm_sizes: tuning.storm_sizes.unwrap_or_else(|| pick(quick, vec![100, 1000], vec![100])),
            storm_replicas: tuning.storm_replicas,
            storm_nodes: tuning.storm_nodes,
            streams_per_connection: tuning.streams_per_connection,
            resolve_sequential: tuning.resolve_sequential.unwrap_or(pick(quick, 2000, 500)),
            resolve_total: tuning.resolve_total.unwrap_or(pick(quick, 20_000, 4000)),
            resolve_concurrency: tuning.resolve_concurrency,
            exec_iterations: tuning.exec_iterations.unwrap_or(pick(quick, 200, 30)),
            provision_samples: tuning.provision_samples.unwrap_or(pick(quick, 10, 3)),
            docker_image: tuning.docker_image,
            file_sizes_mib: tuning.file_sizes_mib.unwrap_or_else(|| pick(quick, vec![1, 256], vec![1, 32])),
            file_chunks_kib: tuning.file_chunks_kib,
            file_repetitions: tuning.file_repetitions.map_or(pick(quick, (10, 3), (5, 2)), |count| (count, count)),
            registry_levels: tuning
                .registry_levels
                .unwrap_or_else(|| pick(quick, vec![1000, 10_000, 100_000, 1_000_000], vec![1000, 10_000])),
            registry_lookups: tuning.registry_lookups.unwrap_or(pick(quick, 2000, 500)),
            registry_batch: tuning.registry_batch,
            registry_write_concurrency: tuning.registry_write_concurrency,
            sim_nodes: tuning.sim_nodes.unwrap_or(pick(quick, 1000, 50)),
            sim_workspaces_per_node: tuning.sim_workspaces_per_node,
            node_duration: tuning.node_duration.unwrap_or(pick(
                quick,
                Duration::from_secs(60),
                Duration::from_secs(10),
            )),
            node_replicas: tuning.node_replicas,
            heartbeat_interval: tuning.heartbeat_interval,
            node_lease_ttl: tuning.node_lease_ttl,
            replica_lease_ttl: tuning.replica_lease_ttl,
            bind_timeout: tuning.bind_timeout,
            log_filter: tuning.log_filter,
        };
        settings.validate()?;
        Ok(settings)
    }

    fn validate(&self) -> anyhow::Result<()> {
        let positive = [
            ("--storm-nodes", self.storm_nodes),
            ("--streams-per-connection", self.streams_per_connection),
            ("--resolve-sequential", self.resolve_sequential),
            ("--resolve-total", self.resolve_total),
            ("--resolve-concurrency", self.resolve_concurrency),
            ("--exec-iterations", self.exec_iterations),
            ("--provision-samples", self.provision_samples),
            ("--file-repetitions", self.file_repetitions.0.min(self.file_repetitions.1)),
            ("--registry-lookups", self.registry_lookups),
            ("--registry-write-concurrency", self.registry_write_concurrency),
            ("--sim-nodes", self.sim_nodes),
            ("--node-replicas", self.node_replicas),
        ];
        for (flag, value) in positive {
            anyhow::ensure!(value > 0, "{flag} must be positive");
        }
        anyhow::ensure!((1..=128).contains(&self.registry_batch), "--registry-batch must be 1..=128 (etcd's limit)");
        anyhow::ensure!(self.storm_replicas.iter().all(|replicas| *replicas > 0), "--storm-replicas must be positive");
        anyhow::ensure!(self.storm_sizes.iter().all(|size| *size > 0), "--storm-sizes must be positive");
        anyhow::ensure!(
            self.file_chunks_kib.iter().all(|kib| (1..=4096).contains(kib)),
            "--file-chunks-kib must be 1..=4096"
        );
        anyhow::ensure!(self.file_sizes_mib.iter().all(|mib| *mib > 0), "--file-sizes-mib must be positive");
        anyhow::ensure!(
            self.node_lease_ttl >= self.heartbeat_interval * 2,
            "--node-lease-ttl must be at least twice --heartbeat-interval"
        );
        Ok(())
    }

    /// Durations as the `berth` flags spell them.
    pub fn flag(duration: Duration) -> String {
        format!("{}ms", duration.as_millis())
    }
}
