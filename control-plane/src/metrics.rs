//! Every metric a replica records, in one place (`berth_control_plane_<thing>_<unit>`).
//!
//! Recording goes through the `metrics` facade: without an installed recorder (unit tests,
//! a process started without `--metrics-listen`) every call is a no-op. The binary installs
//! one Prometheus recorder per process and serves it on `/metrics`; `berth up` therefore
//! shows replica and node-agent series on one endpoint.
//!
//! Gauges that describe the cluster (live nodes, workspaces by state) are computed from this
//! replica's view by [`publish_view_gauges`], so every replica reports what it sees.

use std::sync::Arc;
use std::time::Duration;

use metrics::{counter, gauge, histogram};
use tokio_util::sync::CancellationToken;

use crate::registry::RegistryError;
use crate::view::{EffectiveState, ReplicaView};

pub const BINDS_STARTED: &str = "berth_control_plane_binds_started_total";
pub const BINDS_WON: &str = "berth_control_plane_binds_won_total";
pub const BINDS_WAITED: &str = "berth_control_plane_binds_waited_total";
pub const BINDS_TAKEN_OVER: &str = "berth_control_plane_binds_taken_over_total";
pub const PROVISION_SECONDS: &str = "berth_control_plane_provision_duration_seconds";
pub const LIVE_NODES: &str = "berth_control_plane_live_nodes";
pub const DRAINING_NODES: &str = "berth_control_plane_draining_nodes";
pub const WORKSPACES: &str = "berth_control_plane_workspaces";
pub const HEARTBEAT_GAP_SECONDS: &str = "berth_control_plane_heartbeat_gap_seconds";
pub const HEARTBEAT_STREAMS: &str = "berth_control_plane_heartbeat_streams";
pub const ETCD_CALL_SECONDS: &str = "berth_control_plane_etcd_call_duration_seconds";
pub const ETCD_CALL_ERRORS: &str = "berth_control_plane_etcd_call_errors_total";
pub const SANDBOXES_REMOVED: &str = "berth_control_plane_janitor_sandboxes_removed_total";
pub const SNAPSHOTS_REFUSED: &str = "berth_control_plane_snapshots_refused_total";
pub const RESTORES: &str = "berth_control_plane_restores_total";
pub const SNAPSHOT_GC_BLOBS: &str = "berth_control_plane_snapshot_gc_blobs_removed_total";
pub const SESSION_BATCH_SIZE: &str = "berth_control_plane_session_batch_size";

/// Registers help texts (once per process; harmless without a recorder).
pub fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(BINDS_STARTED, "binds started on this replica (single-flight leaders)");
    describe_counter!(SANDBOXES_REMOVED, "labelled cloud sandboxes without a workspace record the janitor removed");
    describe_counter!(BINDS_WON, "binds that took the cluster-wide bind lock");
    describe_counter!(BINDS_WAITED, "binds that found the lock held and waited for its holder");
    describe_counter!(BINDS_TAKEN_OVER, "binds that took the lock after its previous holder vanished without a result");
    describe_histogram!(PROVISION_SECONDS, Unit::Seconds, "Provision calls to node agents, by backend and outcome");
    describe_gauge!(LIVE_NODES, "node agents with a live lease, as this replica sees them");
    describe_gauge!(DRAINING_NODES, "live node agents that are drained (no new placements)");
    describe_gauge!(WORKSPACES, "workspaces by effective state and backend, as this replica sees them");
    describe_histogram!(
        HEARTBEAT_GAP_SECONDS,
        Unit::Seconds,
        "time between consecutive heartbeats on the streams this replica holds (the lag beyond the \
         interval eats into the node lease)"
    );
    describe_gauge!(HEARTBEAT_STREAMS, "heartbeat streams held by this replica");
    describe_histogram!(ETCD_CALL_SECONDS, Unit::Seconds, "etcd calls including retries, by operation");
    describe_counter!(
        SNAPSHOTS_REFUSED,
        "snapshots nodes reported that were not recorded as latest (fenced: an older placement's)"
    );
    describe_counter!(RESTORES, "re-placements with snapshot candidates, by outcome (restored, fell_back, failed)");
    describe_counter!(SNAPSHOT_GC_BLOBS, "orphaned snapshot blobs the elected sweeper removed");
    describe_counter!(ETCD_CALL_ERRORS, "etcd calls that failed after retries, by operation and error kind");
    describe_histogram!(
        SESSION_BATCH_SIZE,
        Unit::Count,
        "session creates committed together in one etcd transaction (group commit)"
    );
}

pub(crate) fn snapshot_refused() {
    counter!(SNAPSHOTS_REFUSED).increment(1);
}
pub(crate) fn restore_done(outcome: &'static str) {
    counter!(RESTORES, "outcome" => outcome).increment(1);
}
pub(crate) fn snapshot_gc(blobs: u64) {
    counter!(SNAPSHOT_GC_BLOBS).increment(blobs);
}
pub(crate) fn session_batch(size: usize) {
    histogram!(SESSION_BATCH_SIZE).record(size as f64);
}
pub(crate) fn bind_started() {
    counter!(BINDS_STARTED).increment(1);
}
pub(crate) fn bind_won() {
    counter!(BINDS_WON).increment(1);
}
pub(crate) fn bind_waited() {
    counter!(BINDS_WAITED).increment(1);
}
pub(crate) fn bind_taken_over() {
    counter!(BINDS_TAKEN_OVER).increment(1);
}

pub(crate) fn sandbox_removed(backend: &str) {
    counter!(SANDBOXES_REMOVED, "backend" => backend.to_owned()).increment(1);
}

pub(crate) fn provision_done(backend: &str, ok: bool, elapsed: Duration) {
    let outcome = if ok { "ok" } else { "error" };
    histogram!(PROVISION_SECONDS, "backend" => backend.to_owned(), "outcome" => outcome).record(elapsed);
}

pub(crate) fn heartbeat_gap(elapsed: Duration) {
    histogram!(HEARTBEAT_GAP_SECONDS).record(elapsed);
}

pub(crate) fn heartbeat_streams(delta: f64) {
    gauge!(HEARTBEAT_STREAMS).increment(delta);
}

pub(crate) fn etcd_call(operation: &'static str, elapsed: Duration, error: Option<&RegistryError>) {
    histogram!(ETCD_CALL_SECONDS, "op" => operation).record(elapsed);
    if let Some(error) = error {
        counter!(ETCD_CALL_ERRORS, "op" => operation, "kind" => error_kind(error)).increment(1);
    }
}

fn error_kind(error: &RegistryError) -> &'static str {
    match error {
        RegistryError::Unavailable(_) => "unavailable",
        RegistryError::Timeout { .. } => "timeout",
        RegistryError::LeaseNotFound(_) => "lease_not_found",
        RegistryError::Compacted { .. } => "compacted",
        RegistryError::InvalidRequest(_) => "invalid_request",
        RegistryError::Corrupt { .. } => "corrupt",
        RegistryError::Other(_) => "other",
    }
}

/// Keeps the view gauges current until `cancel` fires: recomputed after the view changes,
/// at most once per `min_interval` (a full pass over the view costs O(workspaces)), and at
/// least every few seconds (a node's departure turns its workspaces LOST without a workspace
/// event).
pub(crate) async fn publish_view_gauges(view: Arc<ReplicaView>, min_interval: Duration, cancel: CancellationToken) {
    let mut workspaces_changed = view.workspaces.subscribe();
    let mut nodes_changed = view.nodes.subscribe();
    // A drain turns the node's workspaces LOST without a workspace or node event.
    let mut drains_changed = view.drains.subscribe();
    let mut published: Vec<(String, String)> = Vec::new();
    loop {
        published = set_view_gauges(&view, published);
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = workspaces_changed.changed() => {}
            _ = nodes_changed.changed() => {}
            _ = drains_changed.changed() => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(min_interval) => {}
        }
    }
}

/// Sets the gauges once; returns the (state, backend) series set, so a series whose count
/// dropped to zero is set to 0 rather than left at its last value.
fn set_view_gauges(view: &ReplicaView, previous: Vec<(String, String)>) -> Vec<(String, String)> {
    let nodes = view.live_nodes();
    gauge!(LIVE_NODES).set(nodes.len() as f64);
    gauge!(DRAINING_NODES).set(nodes.iter().filter(|node| view.is_draining(&node.node_id)).count() as f64);
    let mut counts: std::collections::BTreeMap<(String, String), u64> =
        previous.into_iter().map(|series| (series, 0)).collect();
    for entry in view.workspaces.all() {
        let state = state_label(view.effective_state(&entry.record));
        *counts.entry((state.to_owned(), entry.record.backend.clone())).or_default() += 1;
    }
    for ((state, backend), count) in &counts {
        gauge!(WORKSPACES, "state" => state.clone(), "backend" => backend.clone()).set(*count as f64);
    }
    counts.into_keys().collect()
}

pub fn state_label(state: EffectiveState) -> &'static str {
    match state {
        EffectiveState::Ready => "ready",
        EffectiveState::Idle => "idle",
        EffectiveState::Lost => "lost",
        EffectiveState::Failed => "failed",
    }
}
