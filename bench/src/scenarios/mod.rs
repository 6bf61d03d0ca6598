//! The scenarios, one file each. Each `run` starts what it needs (etcd, replicas, node
//! agents as real processes), measures, stops everything by PID (on drop) and returns one
//! result row per case. A case whose invariant fails is an error row; `run` itself fails
//! only when nothing could be measured.

pub mod cloud;
pub mod common;
pub mod distinct_storm;
pub mod exec_rtt;
pub mod file_throughput;
pub mod first_session_storm;
pub mod hot_resolve;
pub mod node_scale;
pub mod registry_scale;
pub mod snapshot;
pub mod transport_floor;

use crate::env::Ctx;
use crate::report::ScenarioResult;

/// Every scenario, in the order `all` runs them.
pub const ALL: [&str; 9] = [
    first_session_storm::NAME,
    distinct_storm::NAME,
    hot_resolve::NAME,
    exec_rtt::NAME,
    file_throughput::NAME,
    registry_scale::NAME,
    node_scale::NAME,
    snapshot::NAME,
    cloud::NAME,
];

pub async fn run(name: &str, ctx: &Ctx) -> anyhow::Result<Vec<ScenarioResult>> {
    match name {
        first_session_storm::NAME => first_session_storm::run(ctx).await,
        distinct_storm::NAME => distinct_storm::run(ctx).await,
        hot_resolve::NAME => hot_resolve::run(ctx).await,
        exec_rtt::NAME => exec_rtt::run(ctx).await,
        file_throughput::NAME => file_throughput::run(ctx).await,
        registry_scale::NAME => registry_scale::run(ctx).await,
        node_scale::NAME => node_scale::run(ctx).await,
        snapshot::NAME => snapshot::run(ctx).await,
        cloud::NAME => cloud::run(ctx).await,
        other => anyhow::bail!("unknown scenario {other:?}; one of: all, {}", ALL.join(", ")),
    }
}
