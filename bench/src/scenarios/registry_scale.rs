//! `registry-scale`: a replica over 1k, 10k, 100k, 1M workspace records. The records are
//! written straight into etcd in the real format (`records::encode(WorkspaceRecord)` under
//! the cluster's key prefix), then a fresh replica is started at each step and measured:
//! start-up (process start to health SERVING; the replica lists and watches the prefix
//! before it serves), resident memory, and GetWorkspace latency.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use berth_control_plane::IsolationPolicy;
use berth_control_plane::keys::Keys;
use berth_control_plane::records::{self, RECORD_VERSION, StoredState, WorkspaceRecord};
use berth_control_plane::registry::etcd::EtcdRegistry;
use berth_control_plane::registry::{Registry, Txn, TxnOp};
use berth_control_plane::view;
use berth_proto::v1;
use berth_tests::berth::{BerthProcess, is_serving};
use berth_tests::etcd::EtcdProcess;
use berth_workspace::{WorkspaceId, WorkspaceSpec};
use futures::StreamExt;
use rand::Rng;

use super::common;
use crate::env::progress;
use crate::env::{self, Ctx};
use crate::machine::{command_line, resident_bytes};
use crate::report::{Floor, Quantity, ScenarioResult};
use crate::settings::Settings;
use crate::stats::{self, Summary};

pub const NAME: &str = "registry-scale";

const MIB: f64 = 1024.0 * 1024.0;
/// How often start-up polls the health service.
const READY_POLL: Duration = Duration::from_millis(5);
const START_TIMEOUT: Duration = Duration::from_secs(180);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<ScenarioResult>> {
    let etcd = env::start_etcd().await?;
    let registry = env::registry(&etcd).await?;
    let prefix = format!("/bench-registry-{:08x}", rand::random::<u32>());
    let keys = Keys::new(&prefix);
    let spawn_cost = process_spawn_cost()?;

    // The same replica over an empty prefix: the memory every step is compared with.
    let empty = start_replica(ctx, &etcd, &prefix, 0).await?;
    let baseline_rss = resident_bytes(empty.process.pid()).unwrap_or(0);
    drop(empty);
    progress!("{NAME}: empty replica: {:.1} MiB resident", baseline_rss as f64 / MIB);

    let mut results = Vec::new();
    let mut written = 0usize;
    for &level in &ctx.settings.registry_levels {
        let started = Instant::now();
        fill(ctx, &registry, &keys, written..level).await?;
        progress!("{NAME}: {} records written in {:.1}s", level - written, started.elapsed().as_secs_f64());
        written = level.max(written);
        let rows = measure_level(ctx, &etcd, &registry, &prefix, written, spawn_cost, baseline_rss).await;
        match rows {
            Ok(rows) => results.extend(rows),
            Err(error) => results.push(common::error_row(NAME, &format!("records={written}"), &ctx.machine, &error)),
        }
    }
    Ok(results)
}

/// Writes records `range` in transactions of `registry_batch` puts, several in flight.
async fn fill(
    ctx: &Ctx,
    registry: &Arc<EtcdRegistry>,
    keys: &Keys,
    range: std::ops::Range<usize>,
) -> anyhow::Result<()> {
    let now = records::now_ms();
    let batches: Vec<Vec<usize>> =
        range.collect::<Vec<_>>().chunks(ctx.settings.registry_batch).map(<[usize]>::to_vec).collect();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(batches)
        .map(|batch| {
            let registry = Arc::clone(registry);
            let puts: anyhow::Result<Vec<TxnOp>> = batch
                .iter()
                .map(|index| {
                    let record = record(*index, now)?;
                    Ok(TxnOp::put(keys.workspace(&record.id), records::encode(&record)))
                })
                .collect();
            async move {
                registry.txn(Txn::new().and_then(puts?)).await.context("writing records")?;
                Ok(())
            }
        })
        .buffer_unordered(ctx.settings.registry_write_concurrency)
        .collect()
        .await;
    results.into_iter().collect()
}

fn workspace_id(index: usize) -> String {
    format!("ws-bench-{index:07}")
}

/// A READY record on a node that does not exist (so it reads as LOST and nothing acts on
/// it), shaped like one a bind writes.
fn record(index: usize, now: i64) -> anyhow::Result<WorkspaceRecord> {
    Ok(WorkspaceRecord {
        version: RECORD_VERSION,
        id: WorkspaceId::new(workspace_id(index))?,
        owner: format!("user-{index}"),
        agent: "coder".into(),
        policy: IsolationPolicy::PerAgent,
        backend: "local".into(),
        spec: WorkspaceSpec::default(),
        state: StoredState::Ready,
        node_id: Some(format!("node-{}", index % 16)),
        generation: 1,
        created_at_ms: now,
        updated_at_ms: now,
        failure: None,
        changed_by: "replica-bench".into(),
        shared_with: Vec::new(),
        origin: Default::default(),
        origin_generation: 0,
        snapshot: None,
    })
}

/// Starts a replica over `prefix` and waits until its health service says SERVING.
async fn start_replica(ctx: &Ctx, etcd: &EtcdProcess, prefix: &str, records: usize) -> anyhow::Result<Started> {
    let settings = &ctx.settings;
    let args: Vec<String> = [
        "control-plane",
        "--etcd",
        &etcd.endpoint(),
        "--replica-id",
        &format!("replica-scale-{records}"),
        "--key-prefix",
        prefix,
        "--replica-lease-ttl",
        &Settings::flag(settings.replica_lease_ttl),
        "--node-lease-ttl",
        &Settings::flag(settings.node_lease_ttl),
        "--heartbeat-interval",
        &Settings::flag(settings.heartbeat_interval),
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    let started = Instant::now();
    let server = BerthProcess::spawn(&format!("replica-scale-{records}"), args, &settings.log_filter)?;
    let endpoint = server.endpoint.clone();
    let serving = berth_testkit::wait_until_every(START_TIMEOUT, READY_POLL, || {
        let endpoint = endpoint.clone();
        let server = &server;
        async move { !server.is_running() || is_serving(&endpoint).await }
    })
    .await;
    let startup = started.elapsed();
    anyhow::ensure!(
        serving && server.is_running(),
        "replica over {records} records did not serve within {START_TIMEOUT:?}; log:\n{}",
        server.process.log_tail(20)
    );
    Ok(Started { process: server, startup })
}

struct Started {
    process: BerthProcess,
    startup: Duration,
}

async fn measure_level(
    ctx: &Ctx,
    etcd: &EtcdProcess,
    registry: &Arc<EtcdRegistry>,
    prefix: &str,
    records: usize,
    spawn_cost: Duration,
    baseline_rss: u64,
) -> anyhow::Result<Vec<ScenarioResult>> {
    let workspaces_prefix = Keys::new(prefix).workspaces_prefix();
    let list_before = list_and_decode(registry, &workspaces_prefix, records).await?;
    let replica = start_replica(ctx, etcd, prefix, records).await?;
    // Listed again after the start: right after a large fill etcd may still be busy, so the
    // quicker of the two is the floor.
    let list_cost = list_before.min(list_and_decode(registry, &workspaces_prefix, records).await?);
    let rss_started = resident_bytes(replica.process.pid()).unwrap_or(0);
    progress!(
        "{NAME}: replica over {records} records serving after {:.0} ms, {:.1} MiB resident",
        stats::millis(replica.startup),
        rss_started as f64 / MIB
    );
    let channel = env::connect(&replica.process.endpoint).await?;
    let mut client = env::workspace_client(channel.clone());
    let mut health = env::health_client(channel.clone());
    let lookups = ctx.settings.registry_lookups;
    let mut latencies = Vec::with_capacity(lookups);
    let mut floor_latencies = Vec::with_capacity(lookups);
    for index in 0..100 + lookups {
        let id = workspace_id(rand::rng().random_range(0..records.max(1)));
        let started = Instant::now();
        let workspace = client.get_workspace(v1::GetWorkspaceRequest { workspace_id: id.clone() }).await;
        let elapsed = started.elapsed();
        anyhow::ensure!(workspace.is_ok_and(|found| found.into_inner().workspace_id == id), "GetWorkspace {id} failed");
        let started = Instant::now();
        env::health_check(&mut health).await?;
        let floor_elapsed = started.elapsed();
        if index >= 100 {
            latencies.push(elapsed);
            floor_latencies.push(floor_elapsed);
        }
    }
    let listing_started = Instant::now();
    let listed = count_listed(&mut client).await?;
    let listing = listing_started.elapsed();
    let rss = resident_bytes(replica.process.pid()).unwrap_or(rss_started);
    anyhow::ensure!(listed == records, "the replica lists {listed} workspaces, {records} are stored");

    let case = |what: &str| format!("{what} records={records}");
    let mut startup = ScenarioResult::new(NAME, case("startup"), &ctx.machine).param("records", records);
    startup.latency_ms = Some(Summary::single(replica.startup));
    startup.metric("list_and_decode_ms", stats::millis(list_cost));
    startup.metric("process_spawn_ms", stats::millis(spawn_cost));
    startup.metric("startup_ms_per_1k_records", stats::millis(replica.startup) / (records.max(1) as f64 / 1000.0));
    startup.wall_s = replica.startup.as_secs_f64();
    startup.set_floor(Floor {
        name: "spawn + list&decode in-process".into(),
        latency_ms: Some(Summary::single(spawn_cost + list_cost)),
        throughput: None,
    });

    let mut lookup =
        ScenarioResult::new(NAME, case("lookup"), &ctx.machine).param("records", records).param("lookups", lookups);
    let total: Duration = latencies.iter().sum();
    lookup.latency_ms = Summary::of(&latencies);
    lookup.throughput = Some(Quantity::new(lookups as f64 / total.as_secs_f64(), "calls/s"));
    lookup.wall_s = total.as_secs_f64();
    lookup.set_floor(Floor {
        name: "gRPC health Check".into(),
        latency_ms: Summary::of(&floor_latencies),
        throughput: None,
    });

    let mut memory = ScenarioResult::new(NAME, case("rss"), &ctx.machine).param("records", records);
    memory.throughput = Some(Quantity::new(rss as f64 / MIB, "MiB RSS"));
    memory.metric("rss_bytes", rss as f64);
    memory.metric("rss_at_serving_bytes", rss_started as f64);
    memory.metric("bytes_per_record_over_empty", (rss as f64 - baseline_rss as f64) / records.max(1) as f64);
    memory.count("records_listed_by_replica", listed);
    // Paging through everything with ListWorkspaces (1000 a page): an operator's view.
    memory.metric("list_workspaces_all_pages_ms", stats::millis(listing));
    memory.set_floor(Floor {
        name: "empty replica RSS".into(),
        latency_ms: None,
        throughput: Some(Quantity::new(baseline_rss as f64 / MIB, "MiB RSS")),
    });
    // Memory: lower is better, so the ratio is ours over the floor's.
    memory.ratio = stats::ratio(rss as f64, baseline_rss as f64);
    Ok(vec![startup, lookup, memory])
}

/// What a replica must at least do at start, done in this process: list the prefix in the
/// view's page sizes (`view::next_page_limit`: 1000, then growing) and decode every record,
/// one page after the other (the view fetches the next page while it decodes).
async fn list_and_decode(registry: &Arc<EtcdRegistry>, prefix: &str, expected: usize) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut after = String::new();
    let mut decoded = 0usize;
    let mut limit = view::LIST_PAGE;
    loop {
        let page = registry.range_page(prefix, &after, limit).await?;
        for kv in &page.kvs {
            records::decode::<WorkspaceRecord>(&kv.key, &kv.value)?;
            decoded += 1;
        }
        match page.kvs.last() {
            Some(last) if page.kvs.len() == limit => after = last.key.clone(),
            _ => break,
        }
        limit = view::next_page_limit(limit, view::page_bytes(&page.kvs));
    }
    let elapsed = started.elapsed();
    anyhow::ensure!(decoded == expected, "listed {decoded} records, wrote {expected}");
    Ok(elapsed)
}

/// Workspaces the replica's view holds, through ListWorkspaces pages.
async fn count_listed(
    client: &mut v1::workspace_service_client::WorkspaceServiceClient<tonic::transport::Channel>,
) -> anyhow::Result<usize> {
    let mut count = 0;
    let mut page_token = String::new();
    loop {
        let request =
            v1::ListWorkspacesRequest { page_size: 1000, page_token: page_token.clone(), ..Default::default() };
        let page = client.list_workspaces(request).await.context("ListWorkspaces")?.into_inner();
        count += page.workspaces.len();
        if page.next_page_token.is_empty() || page.workspaces.is_empty() {
            return Ok(count);
        }
        page_token = page.next_page_token;
    }
}

/// Median time to start the `berth` binary and have it exit (`berth --version`).
fn process_spawn_cost() -> anyhow::Result<Duration> {
    let binary = berth_tests::berth::berth_binary();
    let mut samples = Vec::new();
    for _ in 0..5 {
        let started = Instant::now();
        command_line(&binary.display().to_string(), &["--version"]).context("berth --version")?;
        samples.push(started.elapsed());
    }
    samples.sort();
    Ok(samples[samples.len() / 2])
}
