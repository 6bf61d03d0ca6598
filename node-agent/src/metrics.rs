//! Every metric a node agent records, in one place (`berth_node_agent_<thing>_<unit>`).
//! A no-op unless the binary installed a recorder (`--metrics-listen`).

use std::time::Duration;

use metrics::{counter, gauge, histogram};

pub const PROVISION_SECONDS: &str = "berth_node_agent_provision_duration_seconds";
pub const PROVISIONS_WAITING: &str = "berth_node_agent_provisions_waiting";
pub const EXEC_SECONDS: &str = "berth_node_agent_exec_duration_seconds";
pub const WORKSPACES: &str = "berth_node_agent_workspaces";
pub const FENCED: &str = "berth_node_agent_fenced";
pub const SNAPSHOT_SECONDS: &str = "berth_node_agent_snapshot_duration_seconds";
pub const RESTORE_SECONDS: &str = "berth_node_agent_restore_duration_seconds";
pub const SNAPSHOT_UPLOADED_BYTES: &str = "berth_node_agent_snapshot_uploaded_bytes_total";
pub const SNAPSHOT_DEDUPLICATED_BYTES: &str = "berth_node_agent_snapshot_deduplicated_bytes_total";
pub const SNAPSHOT_FAILURES: &str = "berth_node_agent_snapshot_failures_total";
pub const WARM_POOL_READY: &str = "berth_node_agent_warm_pool_ready";
pub const WARM_POOL_CLAIMS: &str = "berth_node_agent_warm_pool_claims_total";

/// Registers help texts (once per process; harmless without a recorder).
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_histogram!(PROVISION_SECONDS, Unit::Seconds, "provisions on this node, by backend and outcome");
    describe_gauge!(
        PROVISIONS_WAITING,
        "provisions waiting for a slot of --max-concurrent-provisions (their duration includes the wait), by backend"
    );
    describe_histogram!(
        EXEC_SECONDS,
        Unit::Seconds,
        "execs on this node from admission to result (streamed: to the end of the stream), by backend and outcome"
    );
    describe_gauge!(WORKSPACES, "workspaces held by this node (provisioned or released with data kept)");
    describe_histogram!(SNAPSHOT_SECONDS, Unit::Seconds, "workspace snapshots taken by this node");
    describe_histogram!(RESTORE_SECONDS, Unit::Seconds, "workspace restores from snapshots on this node, by outcome");
    describe_counter!(SNAPSHOT_UPLOADED_BYTES, Unit::Bytes, "compressed chunk bytes snapshots uploaded to the store");
    describe_counter!(
        SNAPSHOT_DEDUPLICATED_BYTES,
        Unit::Bytes,
        "file bytes snapshots did not upload because the store already held their chunks"
    );
    describe_counter!(
        SNAPSHOT_FAILURES,
        "failed snapshots and restores (a restore falling back counts each candidate that failed), and snapshots the \
         control plane refused, by kind"
    );
    describe_gauge!(WARM_POOL_READY, "warm pool runtimes ready to be claimed, by backend");
    describe_counter!(WARM_POOL_CLAIMS, "workspaces served from the warm pool, by backend");
    describe_gauge!(FENCED, "1 while the node is fenced (lease possibly expired) and serves no workspace call");
}

pub(crate) fn provision_done(backend: &str, ok: bool, elapsed: Duration) {
    let outcome = if ok { "ok" } else { "error" };
    histogram!(PROVISION_SECONDS, "backend" => backend.to_owned(), "outcome" => outcome).record(elapsed);
}

pub(crate) fn exec_done(backend: &str, ok: bool, elapsed: Duration) {
    let outcome = if ok { "ok" } else { "error" };
    histogram!(EXEC_SECONDS, "backend" => backend.to_owned(), "outcome" => outcome).record(elapsed);
}

pub(crate) fn node_state(workspaces: usize, fenced: bool) {
    gauge!(WORKSPACES).set(workspaces as f64);
    gauge!(FENCED).set(if fenced { 1.0 } else { 0.0 });
}

pub(crate) fn snapshot_done(info: &berth_snapshot::SnapshotInfo, elapsed: Duration) {
    histogram!(SNAPSHOT_SECONDS).record(elapsed);
    counter!(SNAPSHOT_UPLOADED_BYTES).increment(info.uploaded_bytes);
    counter!(SNAPSHOT_DEDUPLICATED_BYTES).increment(info.deduplicated_bytes);
}

pub(crate) fn restore_done(ok: bool, elapsed: Duration) {
    let outcome = if ok { "ok" } else { "error" };
    histogram!(RESTORE_SECONDS, "outcome" => outcome).record(elapsed);
}

pub(crate) fn snapshot_failed(kind: &'static str) {
    counter!(SNAPSHOT_FAILURES, "kind" => kind).increment(1);
}

pub(crate) fn warm_pool(backend: &str, level: berth_workspace::PoolLevel) {
    gauge!(WARM_POOL_READY, "backend" => backend.to_owned()).set(level.ready as f64);
    counter!(WARM_POOL_CLAIMS, "backend" => backend.to_owned()).absolute(level.claimed);
}

pub(crate) fn provision_waiting(backend: &str, change: f64) {
    gauge!(PROVISIONS_WAITING, "backend" => backend.to_owned()).increment(change);
}
