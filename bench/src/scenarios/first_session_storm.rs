//! `first-session-storm`: N concurrent CreateSession calls for ONE (user, agent), spread
//! round-robin over R replicas. Exactly one workspace may come out of it, counted on the
//! node agents' disks, and every answer must name it.

use std::collections::BTreeSet;
use std::time::Duration;

use berth_tests::cluster::Cluster;
use berth_tests::etcd::EtcdProcess;

use super::common::{self, burst, create_request, on_disk};
use crate::env::progress;
use crate::env::{self, Ctx};
use crate::report::{Quantity, ScenarioResult};
use crate::stats::Summary;

pub const NAME: &str = "first-session-storm";

/// How long to wait after the last answer before counting directories, so a duplicate
/// provision still in flight would be seen.
const SETTLE: Duration = Duration::from_millis(500);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<ScenarioResult>> {
    let mut results = Vec::new();
    for &replicas in &ctx.settings.storm_replicas {
        let etcd = env::start_etcd().await?;
        let cluster = env::start_cluster(env::cluster_config(ctx, &etcd, replicas, ctx.settings.storm_nodes)).await?;
        for &size in &ctx.settings.storm_sizes {
            let case = format!("R={replicas} N={size}");
            let row = storm(ctx, &etcd, &cluster, replicas, size).await;
            results.push(common::row_or_error(NAME, &case, &ctx.machine, row));
        }
    }
    Ok(results)
}

async fn storm(
    ctx: &Ctx,
    etcd: &EtcdProcess,
    cluster: &Cluster,
    replicas: usize,
    size: usize,
) -> anyhow::Result<ScenarioResult> {
    let user = format!("storm-{:08x}", rand::random::<u32>());
    let before = on_disk(cluster);
    let channels =
        env::spread_channels(&cluster.replica_endpoints(), size, ctx.settings.streams_per_connection).await?;
    let clients = common::clients(channels);
    progress!("{NAME}: {size} concurrent CreateSession for one (user, agent) over {replicas} replicas");
    let (outcomes, wall) = burst(size, |index| {
        let mut client = clients[index % clients.len()].clone();
        let request = create_request(&user, "coder", "");
        async move {
            client
                .create_session(request)
                .await
                .map(|response| response.into_inner().workspace_id)
                .map_err(|status| format!("{:?}: {}", status.code(), status.message()))
        }
    })
    .await;
    tokio::time::sleep(SETTLE).await;
    let provisioned: Vec<(String, String)> = on_disk(cluster).difference(&before).cloned().collect();
    let (latencies, workspace_ids, errors) = common::split(outcomes);
    let distinct_ids: BTreeSet<&String> = workspace_ids.iter().collect();

    let mut result = ScenarioResult::new(NAME, format!("R={replicas} N={size}"), &ctx.machine)
        .param("replicas", replicas)
        .param("requests", size)
        .param("nodes", ctx.settings.storm_nodes)
        .param("connections", clients.len());
    result.latency_ms = Summary::of(&latencies);
    result.throughput = Some(Quantity::new(workspace_ids.len() as f64 / wall.as_secs_f64(), "sessions/s"));
    result.wall_s = wall.as_secs_f64();
    result.count("answered", workspace_ids.len());
    result.count("errors", errors.len());
    result.count("distinct_workspace_ids", distinct_ids.len());
    result.count("workspaces_on_disk", provisioned.len());
    result.count("workspace_dirs", provisioned.iter().map(|(node, id)| format!("{node}/{id}")).collect::<Vec<_>>());
    progress!(
        "{NAME}: {} answered, {} errors, {} distinct ids, {} workspace dirs on disk, {:.2}s",
        workspace_ids.len(),
        errors.len(),
        distinct_ids.len(),
        provisioned.len(),
        wall.as_secs_f64()
    );

    if !errors.is_empty() {
        result.fail(common::errors_reason(&errors, size));
    }
    if distinct_ids.len() > 1 {
        result.fail(format!("answers name {} different workspaces: {distinct_ids:?}", distinct_ids.len()));
    }
    if provisioned.len() != 1 {
        result.fail(format!(
            "{} workspaces provisioned on the nodes' disks, expected 1: {provisioned:?}",
            provisioned.len()
        ));
    } else if let Some(answered) = distinct_ids.iter().next()
        && provisioned[0].1 != **answered
    {
        result.fail(format!("the workspace on disk is {:?} but the answers name {answered}", provisioned[0]));
    }
    result.set_floor(common::storm_floor(etcd, size).await?);
    Ok(result)
}
