//! `distinct-storm`: N concurrent CreateSession calls for N distinct users over R replicas.
//! Every user gets their own workspace: N on the node agents' disks, N distinct answers.

use std::collections::BTreeSet;
use std::time::Duration;

use berth_tests::cluster::Cluster;
use berth_tests::etcd::EtcdProcess;

use super::common::{self, burst, create_request, on_disk};
use crate::env::progress;
use crate::env::{self, Ctx};
use crate::report::{Quantity, ScenarioResult};
use crate::stats::Summary;

pub const NAME: &str = "distinct-storm";

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
        // Thousands of workspaces: removed when the run ends, not before the next cluster's storm.
        ctx.retire(cluster);
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
    let run_tag = format!("{:08x}", rand::random::<u32>());
    let before = on_disk(cluster);
    let channels =
        env::spread_channels(&cluster.replica_endpoints(), size, ctx.settings.streams_per_connection).await?;
    let clients = common::clients(channels);
    progress!("{NAME}: {size} concurrent CreateSession for {size} users over {replicas} replicas");
    let (outcomes, wall) = burst(size, |index| {
        let mut client = clients[index % clients.len()].clone();
        let request = create_request(&format!("user-{run_tag}-{index}"), "coder", "");
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
    let provisioned: BTreeSet<(String, String)> = on_disk(cluster).difference(&before).cloned().collect();
    let (latencies, workspace_ids, errors) = common::split(outcomes);
    let distinct_ids: BTreeSet<String> = workspace_ids.iter().cloned().collect();
    let provisioned_ids: BTreeSet<String> = provisioned.iter().map(|(_, id)| id.clone()).collect();

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
    for node in &cluster.nodes {
        let on_node = provisioned.iter().filter(|(holder, _)| holder == &node.id).count();
        result.count(&format!("workspaces_on_{}", node.id), on_node);
    }
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
    if distinct_ids.len() != workspace_ids.len() {
        result.fail(format!("{} answers name only {} distinct workspaces", workspace_ids.len(), distinct_ids.len()));
    }
    if provisioned.len() != size {
        result.fail(format!("{} workspaces on the nodes' disks, expected {size}", provisioned.len()));
    }
    if provisioned_ids != distinct_ids && errors.is_empty() {
        let missing = distinct_ids.difference(&provisioned_ids).count();
        result.fail(format!("{missing} answered workspaces are not on any node's disk"));
    }
    result.set_floor(common::storm_floor(etcd, size).await?);
    Ok(result)
}
