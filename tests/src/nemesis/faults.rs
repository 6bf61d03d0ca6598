//! The nemesis: one fault at a time, chosen by a seeded random stream, held for a random
//! while and then healed. Kills and stops are real signals to real processes by PID;
//! partitions are the harness's TCP proxies black-holing one process's traffic.

use std::collections::BTreeMap;
use std::time::Duration;

use nix::sys::signal::Signal;
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::cluster::Cluster;
use crate::etcd::EtcdCluster;
use crate::proxy::ProxyMode;

/// The kinds of fault, as counted in the summary.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    KillReplica,
    StopReplica,
    KillNode,
    StopNode,
    KillEtcdMember,
    PartitionReplicaFromEtcd,
    PartitionNodeFromReplicas,
    FillNodes,
}

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Self::KillReplica => "sigkill-replica",
            Self::StopReplica => "sigstop-replica",
            Self::KillNode => "sigkill-node",
            Self::StopNode => "sigstop-node",
            Self::KillEtcdMember => "kill-etcd-member",
            Self::PartitionReplicaFromEtcd => "black-hole-replica-etcd",
            Self::PartitionNodeFromReplicas => "black-hole-node-replicas",
            Self::FillNodes => "fill-to-capacity",
        }
    }
}

/// Injects faults until `duration` has passed, then heals everything. Returns the faults
/// injected, by kind. The directories (logs) of killed processes are kept and added to
/// `kept` for the caller to remove or show.
pub async fn run(
    cluster: &mut Cluster,
    etcd: &EtcdCluster,
    seed: u64,
    duration: Duration,
    fill: &dyn Fn(usize) -> futures::future::BoxFuture<'static, ()>,
    kept: &mut Vec<std::path::PathBuf>,
) -> anyhow::Result<BTreeMap<Fault, u32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut injected: BTreeMap<Fault, u32> = BTreeMap::new();
    let mut etcd_member_killed = false;
    let until = tokio::time::Instant::now() + duration;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(rng.random_range(500..2_500))).await;
        let hold = Duration::from_millis(rng.random_range(1_000..8_000));
        let fault = match rng.random_range(0..8) {
            0 => Fault::KillReplica,
            1 => Fault::StopReplica,
            2 => Fault::KillNode,
            3 => Fault::StopNode,
            4 if !etcd_member_killed => Fault::KillEtcdMember,
            4 | 5 => Fault::PartitionReplicaFromEtcd,
            6 => Fault::PartitionNodeFromReplicas,
            _ => Fault::FillNodes,
        };
        let replica = rng.random_range(0..cluster.replicas.len());
        let node = rng.random_range(0..cluster.nodes.len());
        eprintln!("[nemesis] {} (replica {replica}, node {node}) for {hold:?}", fault.name());
        match fault {
            Fault::KillReplica => {
                cluster.replicas[replica].server.kill();
                kept.push(cluster.replicas[replica].server.process.keep_dir());
                tokio::time::sleep(hold).await;
                cluster.restart_replica_in_place(replica).await?;
            }
            Fault::StopReplica => {
                cluster.replicas[replica].server.process.signal(Signal::SIGSTOP);
                tokio::time::sleep(hold).await;
                cluster.replicas[replica].server.process.signal(Signal::SIGCONT);
            }
            Fault::KillNode => {
                cluster.nodes[node].server.kill();
                kept.push(cluster.nodes[node].server.process.keep_dir());
                tokio::time::sleep(hold).await;
                cluster.restart_node(node).await?;
            }
            Fault::StopNode => {
                cluster.nodes[node].server.process.signal(Signal::SIGSTOP);
                tokio::time::sleep(hold).await;
                cluster.nodes[node].server.process.signal(Signal::SIGCONT);
            }
            Fault::KillEtcdMember => {
                // One member for the rest of the run: the other two keep the quorum.
                let member = rng.random_range(0..etcd.members().len());
                etcd.kill_member(member);
                // The replicas' way to it now ends in "connection refused", as it would at
                // a dead member's own address.
                for index in 0..cluster.replicas.len() {
                    cluster.replica_etcd_proxy(index, member).close();
                }
                etcd_member_killed = true;
            }
            Fault::PartitionReplicaFromEtcd => {
                cluster.set_replica_etcd(replica, ProxyMode::BlackHole);
                tokio::time::sleep(hold).await;
                cluster.set_replica_etcd(replica, ProxyMode::Pass);
            }
            Fault::PartitionNodeFromReplicas => {
                cluster.set_node_replicas(node, ProxyMode::BlackHole);
                tokio::time::sleep(hold).await;
                cluster.set_node_replicas(node, ProxyMode::Pass);
            }
            Fault::FillNodes => fill(rng.random_range(4..10)).await,
        }
        *injected.entry(fault).or_default() += 1;
    }
    heal(cluster);
    Ok(injected)
}

/// Lets every process run and every proxy pass.
pub fn heal(cluster: &Cluster) {
    for index in 0..cluster.replicas.len() {
        cluster.replicas[index].server.process.signal(Signal::SIGCONT);
        cluster.set_replica_etcd(index, ProxyMode::Pass);
    }
    for index in 0..cluster.nodes.len() {
        cluster.nodes[index].server.process.signal(Signal::SIGCONT);
        cluster.set_node_replicas(index, ProxyMode::Pass);
    }
}
