//! `hot-resolve`: GetWorkspace on a READY workspace, sequentially and with many calls in
//! flight, against the gRPC health Check (a no-op) on the same connection with the same
//! concurrency. Resolving is a map lookup in the replica's view, so the gap to the floor is
//! the cost of the handler, the record-to-proto conversion and the larger message.

use std::time::{Duration, Instant};

use anyhow::Context;
use berth_proto::v1;
use tonic::transport::Channel;

use super::common::{self, create_request};
use crate::env::progress;
use crate::env::{self, Ctx};
use crate::report::{Floor, Quantity, ScenarioResult};
use crate::stats::Summary;

pub const NAME: &str = "hot-resolve";

const WARM_UP: usize = 200;

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<ScenarioResult>> {
    let etcd = env::start_etcd().await?;
    let cluster = env::start_cluster(env::cluster_config(ctx, &etcd, 1, 1)).await?;
    let channel = env::connect(&cluster.replicas[0].server.endpoint).await?;
    let mut client = env::workspace_client(channel.clone());
    let session = client.create_session(create_request("resolver", "coder", "")).await.context("CreateSession")?;
    let workspace_id = session.into_inner().workspace_id;
    let workspace = get(&channel, &workspace_id).await?;
    anyhow::ensure!(
        workspace.state == v1::WorkspaceState::Ready as i32,
        "workspace {workspace_id} is {:?}, not READY",
        v1::WorkspaceState::try_from(workspace.state)
    );
    for _ in 0..WARM_UP {
        get(&channel, &workspace_id).await?;
        env::health_check(&mut env::health_client(channel.clone())).await?;
    }

    let settings = &ctx.settings;
    let mut results = Vec::new();
    for (label, total, concurrency) in [
        ("sequential", settings.resolve_sequential, 1),
        ("concurrent", settings.resolve_total, settings.resolve_concurrency),
    ] {
        let case = format!("{label} c={concurrency}");
        let row = measure(ctx, &channel, &workspace_id, &case, total, concurrency).await;
        results.push(common::row_or_error(NAME, &case, &ctx.machine, row));
    }
    Ok(results)
}

async fn measure(
    ctx: &Ctx,
    channel: &Channel,
    workspace_id: &str,
    case: &str,
    total: usize,
    concurrency: usize,
) -> anyhow::Result<ScenarioResult> {
    progress!("{NAME}: {total} GetWorkspace calls and {total} health Checks (floor), {concurrency} in flight");
    let started = Instant::now();
    // Two halves in A B B A order, so neither side gains from running second (warmer caches,
    // a quieter machine).
    let half = total.div_ceil(2);
    let mut latencies = Vec::with_capacity(total);
    let mut floor_latencies = Vec::with_capacity(total);
    let (mut wall, mut floor_wall) = (Duration::ZERO, Duration::ZERO);
    for floor_first in [false, true] {
        for floor in [floor_first, !floor_first] {
            let (samples, elapsed) = if floor {
                env::closed_loop(half, concurrency, |_| async move {
                    env::health_check(&mut env::health_client(channel.clone())).await
                })
                .await?
            } else {
                env::closed_loop(half, concurrency, |_| async move { get(channel, workspace_id).await.map(|_| ()) })
                    .await?
            };
            let (sink, clock) =
                if floor { (&mut floor_latencies, &mut floor_wall) } else { (&mut latencies, &mut wall) };
            sink.extend(samples);
            *clock += elapsed;
        }
    }
    let total = latencies.len();
    let mut result = ScenarioResult::new(NAME, case, &ctx.machine)
        .param("calls", total)
        .param("concurrency", concurrency)
        .param("transport", "one HTTP/2 connection");
    result.latency_ms = Summary::of(&latencies);
    result.throughput = Some(Quantity::new(total as f64 / wall.as_secs_f64(), "calls/s"));
    result.wall_s = started.elapsed().as_secs_f64();
    result.count("calls", total);
    result.set_floor(Floor {
        name: "gRPC health Check".into(),
        latency_ms: Summary::of(&floor_latencies),
        throughput: Some(Quantity::new(total as f64 / floor_wall.as_secs_f64(), "calls/s")),
    });
    Ok(result)
}

async fn get(channel: &Channel, workspace_id: &str) -> anyhow::Result<v1::Workspace> {
    let mut client = env::workspace_client(channel.clone());
    let request = v1::GetWorkspaceRequest { workspace_id: workspace_id.to_owned() };
    Ok(client.get_workspace(request).await.context("GetWorkspace")?.into_inner())
}
