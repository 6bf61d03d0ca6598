//! `node-scale`: many simulated node agents heartbeating to R replicas. The nodes are light
//! clients in this process speaking `NodeService.Heartbeat` like a node agent (register,
//! then a report every interval the replica asks for, answering fences by registering
//! again). Measured over a steady window: each replica's CPU (from /proc), etcd's write
//! rates (from its /metrics), heartbeat acknowledgement latency; then the time until every
//! replica stops listing a node whose heartbeats stopped.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use berth_proto::v1::control_message::Msg as ControlMsg;
use berth_proto::v1::node_message::Msg as NodeMsg;
use berth_proto::v1::node_service_client::NodeServiceClient;
use berth_proto::v1::{self, NodeMessage};
use berth_tests::cluster::Cluster;
use rand::Rng;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::env::progress;
use crate::env::{self, Ctx, EtcdCounters};
use crate::machine::{clock_ticks_per_second, cpu_ticks};
use crate::report::{Floor, Quantity, ScenarioResult};
use crate::stats::{self, Summary};

pub const NAME: &str = "node-scale";

/// Idle CPU of the replicas is measured over this long before the nodes start.
const IDLE_WINDOW: Duration = Duration::from_secs(3);

/// What the simulated nodes share with the scenario.
#[derive(Default)]
struct Shared {
    /// Report → ack latencies, recorded only while `recording`.
    acks: Mutex<Vec<Duration>>,
    recording: std::sync::atomic::AtomicBool,
    registered: AtomicUsize,
    registrations: AtomicUsize,
    fences: AtomicUsize,
    stream_failures: AtomicUsize,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<ScenarioResult>> {
    let settings = &ctx.settings;
    let (node_count, replicas) = (settings.sim_nodes, settings.node_replicas);
    let etcd = env::start_etcd().await?;
    let cluster = env::start_cluster(env::cluster_config(ctx, &etcd, replicas, 0)).await?;
    let endpoints = cluster.replica_endpoints();
    let pids: Vec<u32> = cluster.replicas.iter().map(|replica| replica.server.pid()).collect();
    let ticks_per_second = clock_ticks_per_second() as f64;

    let idle_before = ticks(&pids);
    tokio::time::sleep(IDLE_WINDOW).await;
    let idle_cpu = cpu_percent(&idle_before, &ticks(&pids), IDLE_WINDOW, ticks_per_second);

    progress!("{NAME}: starting {node_count} simulated nodes against {replicas} replicas");
    let shared = Arc::new(Shared::default());
    let cancels: Vec<CancellationToken> = (0..node_count).map(|_| CancellationToken::new()).collect();
    let mut tasks = Vec::with_capacity(node_count);
    for (index, cancel) in cancels.iter().enumerate() {
        let node = SimNode {
            node_id: node_id(index),
            endpoints: endpoints.clone(),
            first_replica: index % replicas,
            workspaces: settings.sim_workspaces_per_node,
            shared: Arc::clone(&shared),
        };
        tasks.push(tokio::spawn(node.run(cancel.clone())));
    }
    let all_listed = berth_testkit::wait_until_every(Duration::from_secs(60), Duration::from_millis(200), || async {
        listed_counts(&cluster, &node_id(0)).await.iter().all(|(count, _)| *count == node_count)
    })
    .await;
    anyhow::ensure!(
        all_listed,
        "replicas list {:?} nodes, expected {node_count} each",
        listed_counts(&cluster, "").await
    );
    // Let every node's first reports through before the window opens.
    tokio::time::sleep(settings.heartbeat_interval).await;

    progress!("{NAME}: steady window of {:?}", settings.node_duration);
    let health_floor = tokio::spawn(health_samples(endpoints.clone(), settings.node_duration));
    let etcd_before = EtcdCounters::read(&etcd)?;
    let cpu_before = ticks(&pids);
    let etcd_cpu_before = cpu_ticks(etcd.pid()).unwrap_or(0);
    let bench_cpu_before = cpu_ticks(std::process::id()).unwrap_or(0);
    let window_started = Instant::now();
    shared.recording.store(true, Ordering::SeqCst);
    tokio::time::sleep(settings.node_duration).await;
    shared.recording.store(false, Ordering::SeqCst);
    let window = window_started.elapsed();
    let cpu = cpu_percent(&cpu_before, &ticks(&pids), window, ticks_per_second);
    let etcd_cpu = (cpu_ticks(etcd.pid()).unwrap_or(0).saturating_sub(etcd_cpu_before)) as f64
        / ticks_per_second
        / window.as_secs_f64()
        * 100.0;
    let bench_cpu = (cpu_ticks(std::process::id()).unwrap_or(0).saturating_sub(bench_cpu_before)) as f64
        / ticks_per_second
        / window.as_secs_f64()
        * 100.0;
    let etcd_rates = EtcdCounters::read(&etcd)?.rates_since(&etcd_before, window);
    let floor_latencies = health_floor.await.context("health sampler")??;
    let acks = std::mem::take(&mut *shared.acks.lock().unwrap_or_else(|poisoned| poisoned.into_inner()));

    let case = format!("nodes={node_count} R={replicas}");
    let mut heartbeat = ScenarioResult::new(NAME, format!("heartbeat {case}"), &ctx.machine)
        .param("nodes", node_count)
        .param("replicas", replicas)
        .param("heartbeat_interval_ms", settings.heartbeat_interval.as_millis() as u64)
        .param("node_lease_ttl_ms", settings.node_lease_ttl.as_millis() as u64)
        .param("workspaces_per_node", settings.sim_workspaces_per_node)
        .param("window_s", window.as_secs_f64());
    heartbeat.latency_ms = Summary::of(&acks);
    heartbeat.throughput = Some(Quantity::new(acks.len() as f64 / window.as_secs_f64(), "heartbeats/s"));
    heartbeat.wall_s = window.as_secs_f64();
    for (index, (busy, idle)) in cpu.iter().zip(&idle_cpu).enumerate() {
        heartbeat.metric(&format!("replica_{index}_cpu_pct"), *busy);
        heartbeat.metric(&format!("replica_{index}_idle_cpu_pct"), *idle);
    }
    heartbeat.metric("replicas_cpu_pct_total", cpu.iter().sum());
    heartbeat.metric("cpu_ms_per_heartbeat", cpu_ms_per_heartbeat(&cpu, &idle_cpu, acks.len(), window));
    heartbeat.metric("etcd_cpu_pct", etcd_cpu);
    heartbeat.metric("bench_process_cpu_pct", bench_cpu);
    heartbeat.metric("etcd_puts_per_s", etcd_rates.puts);
    heartbeat.metric("etcd_deletes_per_s", etcd_rates.deletes);
    heartbeat.metric("etcd_txns_per_s", etcd_rates.txns);
    heartbeat.metric("etcd_writes_per_s", etcd_rates.puts + etcd_rates.deletes);
    heartbeat.metric("etcd_proposals_per_s", etcd_rates.proposals_committed);
    heartbeat.metric("etcd_lease_renewals_per_s", etcd_rates.lease_renewals);
    heartbeat.count("registrations", shared.registrations.load(Ordering::SeqCst));
    heartbeat.count("fences", shared.fences.load(Ordering::SeqCst));
    heartbeat.count("stream_failures", shared.stream_failures.load(Ordering::SeqCst));
    heartbeat.set_floor(Floor {
        name: "gRPC health Check".into(),
        latency_ms: Summary::of(&floor_latencies),
        throughput: None,
    });
    if shared.fences.load(Ordering::SeqCst) > 0 {
        heartbeat.fail(format!("{} nodes were fenced during the run", shared.fences.load(Ordering::SeqCst)));
    }
    progress!(
        "{NAME}: {} acks, replica CPU {:?} %, etcd {:.1} writes/s, {:.1} proposals/s",
        acks.len(),
        cpu.iter().map(|value| (value * 10.0).round() / 10.0).collect::<Vec<_>>(),
        etcd_rates.puts + etcd_rates.deletes,
        etcd_rates.proposals_committed
    );

    let death = death_detection(ctx, &cluster, &cancels[0], &case).await;
    for cancel in &cancels {
        cancel.cancel();
    }
    for task in tasks {
        let _ = task.await;
    }
    Ok(vec![heartbeat, super::common::row_or_error(NAME, &format!("death detection {case}"), &ctx.machine, death)])
}

/// Stops node 0's heartbeats (its stream and connection go away, as when the process dies)
/// and measures until no replica lists it any more.
async fn death_detection(
    ctx: &Ctx,
    cluster: &Cluster,
    victim: &CancellationToken,
    case: &str,
) -> anyhow::Result<ScenarioResult> {
    let victim_id = node_id(0);
    progress!("{NAME}: stopping {victim_id}'s heartbeats");
    let ttl = ctx.settings.node_lease_ttl;
    let started = Instant::now();
    victim.cancel();
    let gone =
        berth_testkit::wait_until_every(ttl * 3 + Duration::from_secs(10), Duration::from_millis(20), || async {
            listed_counts(cluster, &victim_id).await.iter().all(|(_, listed)| !listed)
        })
        .await;
    let detection = started.elapsed();
    anyhow::ensure!(gone, "{victim_id} is still listed {detection:?} after its heartbeats stopped");
    progress!("{NAME}: every replica dropped {victim_id} after {:.2}s", detection.as_secs_f64());
    let mut result = ScenarioResult::new(NAME, format!("death detection {case}"), &ctx.machine)
        .param("node_lease_ttl_ms", ttl.as_millis() as u64)
        .param("heartbeat_interval_ms", ctx.settings.heartbeat_interval.as_millis() as u64);
    result.latency_ms = Some(Summary::single(detection));
    result.wall_s = detection.as_secs_f64();
    result.set_floor(Floor { name: "node lease TTL".into(), latency_ms: Some(Summary::single(ttl)), throughput: None });
    Ok(result)
}

fn node_id(index: usize) -> String {
    format!("sim-node-{index:04}")
}

/// Per replica: how many nodes it lists, and whether `node` is among them (an unreachable
/// replica counts as listing nothing).
async fn listed_counts(cluster: &Cluster, node: &str) -> Vec<(usize, bool)> {
    let mut counts = Vec::new();
    for replica in &cluster.replicas {
        let mut admin = replica.server.admin_client();
        let nodes = match admin.list_nodes(v1::ListNodesRequest {}).await {
            Ok(response) => response.into_inner().nodes,
            Err(_) => Vec::new(),
        };
        counts.push((nodes.len(), nodes.iter().any(|info| info.node_id == node)));
    }
    counts
}

fn ticks(pids: &[u32]) -> Vec<u64> {
    pids.iter().map(|pid| cpu_ticks(*pid).unwrap_or(0)).collect()
}

fn cpu_percent(before: &[u64], after: &[u64], window: Duration, ticks_per_second: f64) -> Vec<f64> {
    before
        .iter()
        .zip(after)
        .map(|(start, end)| end.saturating_sub(*start) as f64 / ticks_per_second / window.as_secs_f64() * 100.0)
        .collect()
}

/// Replica CPU above idle, per acknowledged heartbeat.
fn cpu_ms_per_heartbeat(busy: &[f64], idle: &[f64], heartbeats: usize, window: Duration) -> f64 {
    let extra_pct: f64 = busy.iter().zip(idle).map(|(busy, idle)| (busy - idle).max(0.0)).sum();
    let cpu_ms = extra_pct / 100.0 * stats::millis(window);
    cpu_ms / heartbeats.max(1) as f64
}

/// Health Check round trips to each replica in turn, every 100 ms, during the window.
async fn health_samples(endpoints: Vec<String>, window: Duration) -> anyhow::Result<Vec<Duration>> {
    let mut clients = Vec::new();
    for endpoint in &endpoints {
        clients.push(env::health_client(env::connect(endpoint).await?));
    }
    let started = Instant::now();
    let mut samples = Vec::new();
    let mut turn = 0usize;
    while started.elapsed() < window {
        let client = &mut clients[turn % endpoints.len()];
        let call_started = Instant::now();
        env::health_check(client).await?;
        samples.push(call_started.elapsed());
        turn += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(samples)
}

/// One simulated node agent.
struct SimNode {
    node_id: String,
    endpoints: Vec<String>,
    first_replica: usize,
    workspaces: usize,
    shared: Arc<Shared>,
}

impl SimNode {
    /// Heartbeats until cancelled, reconnecting (to the next replica) when a stream fails
    /// and registering again when fenced — what the real agent does.
    async fn run(self, cancel: CancellationToken) {
        let mut lease = (0i64, 0u64);
        let mut replica = self.first_replica;
        let mut counted = false;
        loop {
            let session = self.session(&self.endpoints[replica], &mut lease, &mut counted, &cancel);
            match session.await {
                Ok(true) => return,
                Ok(false) => {}
                Err(_) => {
                    self.shared.stream_failures.fetch_add(1, Ordering::Relaxed);
                    replica = (replica + 1) % self.endpoints.len();
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
    }

    /// One stream. `Ok(true)`: cancelled; `Ok(false)`: fenced, register again.
    async fn session(
        &self,
        endpoint: &str,
        lease: &mut (i64, u64),
        counted: &mut bool,
        cancel: &CancellationToken,
    ) -> anyhow::Result<bool> {
        let channel = env::connect(endpoint).await?;
        let mut client = NodeServiceClient::new(channel);
        let (outbound, receiver) = mpsc::channel(8);
        let register = v1::Register {
            node_id: self.node_id.clone(),
            // Nothing is placed on simulated nodes; the address is never dialled.
            address: "http://127.0.0.1:9".into(),
            backends: vec!["local".into()],
            default_backend: "local".into(),
            version: "berth-bench".into(),
            lease_id: lease.0,
            node_generation: lease.1,
            ..Default::default()
        };
        outbound.send(NodeMessage { msg: Some(NodeMsg::Register(register)) }).await?;
        let mut inbound = client.heartbeat(ReceiverStream::new(receiver)).await?.into_inner();
        let registered = match inbound.message().await?.and_then(|message| message.msg) {
            Some(ControlMsg::Registered(registered)) => registered,
            other => anyhow::bail!("expected Registered, got {other:?}"),
        };
        *lease = (registered.lease_id, registered.node_generation);
        self.shared.registrations.fetch_add(1, Ordering::Relaxed);
        if !*counted {
            *counted = true;
            self.shared.registered.fetch_add(1, Ordering::Relaxed);
        }
        let interval = Duration::from_millis(registered.heartbeat_interval_ms.max(100));
        // A random phase spreads the nodes' reports over the interval, as independent
        // agents would be.
        let phase = interval.mul_f64(rand::rng().random_range(0.0..1.0));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + phase, interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut sent: Vec<(u64, Instant)> = Vec::new();
        let mut seq = 0u64;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(true),
                _ = ticker.tick() => {
                    seq += 1;
                    sent.push((seq, Instant::now()));
                    if sent.len() > 16 {
                        sent.remove(0);
                    }
                    outbound.send(NodeMessage { msg: Some(NodeMsg::Report(self.report(seq))) }).await?;
                }
                message = inbound.message() => {
                    match message?.and_then(|message| message.msg) {
                        Some(ControlMsg::Ack(ack)) => {
                            if let Some(position) = sent.iter().position(|(sequence, _)| *sequence == ack.seq) {
                                let (_, sent_at) = sent.remove(position);
                                if self.shared.recording.load(Ordering::Relaxed) {
                                    let mut acks = self.shared.acks.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                                    acks.push(sent_at.elapsed());
                                }
                            }
                        }
                        Some(ControlMsg::Fence(_)) => {
                            self.shared.fences.fetch_add(1, Ordering::Relaxed);
                            *lease = (0, lease.1);
                            return Ok(false);
                        }
                        Some(_) => {}
                        None => anyhow::bail!("the replica closed the stream"),
                    }
                }
            }
        }
    }

    fn report(&self, seq: u64) -> v1::HeartbeatReport {
        let now_ms = berth_control_plane::records::now_ms();
        v1::HeartbeatReport {
            seq,
            load: Some(v1::NodeLoad {
                workspaces: self.workspaces as u32,
                running: self.workspaces as u32,
                ..Default::default()
            }),
            workspaces: (0..self.workspaces)
                .map(|index| v1::LocalWorkspace {
                    workspace_id: format!("ws-{}-{index}", self.node_id),
                    generation: 1,
                    backend: "local".into(),
                    running: true,
                    last_access_unix_ms: now_ms,
                    idle_for_ms: Some(0),
                    execs_in_flight: 0,
                    mcp_clients_live: 0,
                })
                .collect(),
            snapshots: Vec::new(),
        }
    }
}
