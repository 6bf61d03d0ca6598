//! A randomized fault test of the no-silent-data-loss promises (docs/design.md §8): clients
//! write numbered records into files of many workspaces and read them back while a nemesis
//! SIGKILLs and SIGSTOPs replicas and node agents, kills an etcd member, black-holes a
//! replica's etcd traffic and a node's replica traffic, fills the nodes to capacity, and the
//! idle sweeper runs (a short idle TTL). Seeded (`NemesisConfig::seed`), bounded in time.
//!
//! The checker (`workload.rs`) proves: every acknowledged write is readable later unless the
//! workspace says its files were replaced (and then only the files of the replaced lineage
//! are missing); no file of a deleted workspace is ever served again; and, once the faults
//! end and the cluster settles, no workspace exists on two nodes.

pub mod client;
pub mod faults;
pub mod workload;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::Mutex;

use crate::cluster::{Cluster, ClusterConfig};
use crate::etcd::EtcdCluster;
use client::Clients;
use faults::Fault;
use workload::{Counters, Violation, Worker};

/// How a run is shaped.
#[derive(Clone, Debug)]
pub struct NemesisConfig {
    pub seed: u64,
    /// How long faults are injected (the settling and the final checks come after).
    pub duration: Duration,
    pub workers: usize,
    pub workspaces_per_worker: usize,
    /// `--capacity` of every node.
    pub node_capacity: u32,
}

impl NemesisConfig {
    /// `BERTH_NEMESIS_SEED` (else a random seed, printed) and `BERTH_NEMESIS_SECS` (default
    /// `default_secs`) from the environment.
    pub fn from_env(default_secs: u64) -> Self {
        let seed =
            std::env::var("BERTH_NEMESIS_SEED").ok().and_then(|seed| seed.parse().ok()).unwrap_or_else(rand::random);
        let secs = std::env::var("BERTH_NEMESIS_SECS").ok().and_then(|secs| secs.parse().ok()).unwrap_or(default_secs);
        Self { seed, duration: Duration::from_secs(secs), workers: 3, workspaces_per_worker: 3, node_capacity: 5 }
    }
}

/// What a run did and found.
#[derive(Debug)]
pub struct Summary {
    pub seed: u64,
    pub elapsed: Duration,
    pub counters: Arc<Counters>,
    pub faults: BTreeMap<Fault, u32>,
    pub violations: Vec<Violation>,
}

impl Summary {
    /// One line for CI logs.
    pub fn line(&self) -> String {
        let load = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        let counters = &self.counters;
        let faults: Vec<String> =
            self.faults.iter().map(|(fault, count)| format!("{} {count}", fault.name())).collect();
        format!(
            "nemesis summary: seed {} ran {:.0?}; operations {} (writes acked {}, counted {}, reads checked {}, \
             deleted files checked absent {}, deletes {}, lineage changes {}, failed calls {}); faults {} ({}); violations {}",
            self.seed,
            self.elapsed,
            load(&counters.operations),
            load(&counters.writes_acked),
            load(&counters.writes_counted),
            load(&counters.reads_checked),
            load(&counters.deleted_reads_checked),
            load(&counters.deletes),
            load(&counters.lineage_changes),
            load(&counters.failed_calls),
            self.faults.values().sum::<u32>(),
            faults.join(", "),
            self.violations.len()
        )
    }
}

/// Starts a 3-member etcd, 3 replicas and 3 node agents (every replica's etcd traffic and
/// every node's replica traffic through proxies), runs the workload under the nemesis,
/// settles, and checks.
pub async fn run(config: NemesisConfig) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let etcd = EtcdCluster::try_start(3)?;
    let mut cluster_config = ClusterConfig::new(etcd.endpoints(), 3, 3);
    cluster_config.proxy_replica_etcd = true;
    cluster_config.proxy_node_replicas = true;
    cluster_config.idle_ttl = "3s";
    // Short enough that a node stopped or killed for a few seconds loses its workspaces to
    // other nodes (RECREATED_EMPTY), long enough that a brief stop keeps them.
    cluster_config.lost_node_grace = "1s";
    cluster_config.bind_timeout = "20s";
    cluster_config.node_flags = vec!["--capacity".into(), config.node_capacity.to_string()];
    let mut cluster = Cluster::start(cluster_config).await?;
    let registry = crate::etcd::connect(etcd.endpoints()).await;
    let clients = Clients::new(&cluster.replica_endpoints(), registry, cluster.keys());

    let counters = Arc::new(Counters::default());
    let violations = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for index in 0..config.workers {
        let users = (0..config.workspaces_per_worker).map(|slot| format!("user-{index}-{slot}")).collect();
        let mut worker =
            Worker::new(index, config.seed, users, clients.clone(), Arc::clone(&counters), Arc::clone(&violations));
        let stop = Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let outcome = worker.run(stop).await;
            (worker, outcome)
        }));
    }

    // Filler workspaces crowd the nodes: each fill deletes the previous fillers and creates
    // a new batch, so capacity comes and goes under the workload.
    let fillers = Arc::new(Mutex::new(Vec::<String>::new()));
    let fill_clients = clients.clone();
    let fill = move |count: usize| {
        let clients = fill_clients.clone();
        let fillers = Arc::clone(&fillers);
        async move {
            let mut fillers = fillers.lock().await;
            for workspace_id in fillers.drain(..) {
                let _ = clients.destroy(0, &workspace_id).await;
            }
            for index in 0..count {
                let user = format!("filler-{}", rand::random::<u32>());
                if let Ok(workspace_id) = clients.create_session(index, &user).await {
                    fillers.push(workspace_id);
                }
            }
        }
        .boxed()
    };
    let mut kept = Vec::new();
    let injected = faults::run(&mut cluster, &etcd, config.seed, config.duration, &fill, &mut kept).await;
    stop.store(true, Ordering::Relaxed);
    faults::heal(&cluster);
    let injected = injected?;

    let mut finished = Vec::new();
    for worker in workers {
        let (worker, outcome) = worker.await?;
        outcome?;
        finished.push(worker);
    }
    cluster.wait_nodes_listed(cluster.nodes.len(), Duration::from_secs(30)).await?;
    for worker in &mut finished {
        worker.verify_final().await?;
    }
    verify_copies(&cluster, &finished, &violations).await?;

    let violations = violations.lock().await.clone();
    if violations.is_empty() {
        for dir in kept {
            let _ = std::fs::remove_dir_all(dir);
        }
    } else {
        let earlier: Vec<String> = kept.iter().map(|dir| dir.join("log.txt").display().to_string()).collect();
        eprintln!("[nemesis] {}logs of killed processes: {}", cluster.keep_for_inspection(), earlier.join(" "));
    }
    Ok(Summary { seed: config.seed, elapsed: started.elapsed(), counters, faults: injected, violations })
}

/// No workspace exists twice: once the cluster has settled, each workspace the workers own
/// has a copy only on the node its record names (none when deleted). Superseded copies are
/// moved to a node's quarantine by reconciliation, so this waits for it, up to 40 s.
async fn verify_copies(
    cluster: &Cluster,
    workers: &[Worker],
    violations: &Mutex<Vec<Violation>>,
) -> anyhow::Result<()> {
    let registry = cluster.registry().await;
    let deadline = Instant::now() + Duration::from_secs(40);
    for worker in workers {
        for model in &worker.models {
            let Some(workspace_id) = &model.workspace_id else { continue };
            loop {
                let record = cluster.workspace_record(registry.as_ref(), workspace_id).await?;
                let expected: BTreeSet<String> = record.and_then(|record| record.node_id).into_iter().collect();
                let holders = copies_of(cluster, workspace_id);
                if holders.is_subset(&expected) {
                    break;
                }
                if Instant::now() >= deadline {
                    let what = format!("copies on {holders:?}, its record names {expected:?}");
                    violations.lock().await.push(Violation { workspace: workspace_id.clone(), what });
                    break;
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
    Ok(())
}

/// Nodes holding a live copy (a state file) of `workspace_id`.
fn copies_of(cluster: &Cluster, workspace_id: &str) -> BTreeSet<String> {
    cluster
        .nodes
        .iter()
        .filter(|node| node.data_dir.join("state").join(format!("{workspace_id}.json")).exists())
        .map(|node| node.id.clone())
        .collect()
}
