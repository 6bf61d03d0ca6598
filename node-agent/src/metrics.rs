//! Every metric a node agent records, in one place (`berth_node_agent_<thing>_<unit>`).
//! A no-op unless the binary installed a recorder (`--metrics-listen`).

use std::time::Duration;

use metrics::{gauge, histogram};

pub const PROVISION_SECONDS: &str = "berth_node_agent_provision_duration_seconds";
pub const EXEC_SECONDS: &str = "berth_node_agent_exec_duration_seconds";
pub const WORKSPACES: &str = "berth_node_agent_workspaces";
pub const FENCED: &str = "berth_node_agent_fenced";

/// Registers help texts (once per process; harmless without a recorder).
pub fn describe() {
    use metrics::{Unit, describe_gauge, describe_histogram};
    describe_histogram!(PROVISION_SECONDS, Unit::Seconds, "provisions on this node, by backend and outcome");
    describe_histogram!(
        EXEC_SECONDS,
        Unit::Seconds,
        "execs on this node from admission to result (streamed: to the end of the stream), by backend and outcome"
    );
    describe_gauge!(WORKSPACES, "workspaces held by this node (provisioned or released with data kept)");
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
