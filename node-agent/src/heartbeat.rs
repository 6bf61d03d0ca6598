//! The node's heartbeat stream to a replica (docs/design.md §4.3).
//!
//! The agent starts at a replica picked from its node id (spreading nodes over replicas),
//! registers, then reports load and per-workspace last access every interval. When the
//! stream breaks, or two heartbeat intervals pass without an ack, it moves to the next
//! replica and presents its lease id, which that replica continues. After a fence it
//! registers with the next replica too. A watchdog fences the node a margin before the
//! lease TTL that etcd answered to the last acknowledged keep-alive runs out, counted from
//! that report's *send* time (no later than the keep-alive), so the node stops serving
//! before any replica can see its key vanish.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use berth_features::mcp::McpPool;
use berth_proto::auth::BearerInterceptor;
use berth_proto::v1::control_message::Msg as ControlMsg;
use berth_proto::v1::node_message::Msg as NodeMsg;
use berth_proto::v1::node_service_client::NodeServiceClient;
use berth_proto::v1::{self, NodeMessage};
use berth_workspace::WorkspaceId;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Endpoint;

use crate::config::NodeAgentConfig;
use crate::fence::Fence;
use crate::service::local_workspace;
use crate::state::Workspaces;

/// First and largest pause between two attempts to reach a replica.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// The node moves to another replica when a report is this many heartbeat intervals old
/// without an ack (less half an interval for the ticker's jitter).
const MISSED_ACKS: u32 = 2;
/// How long each step of a registration may take (the replica's answer; not the handling
/// of the superseded copies it names).
const REGISTER_TIMEOUT: Duration = Duration::from_secs(3);

/// Lease facts shared between the stream and the watchdog.
#[derive(Debug, Default)]
struct LeaseState {
    lease_id: i64,
    node_generation: u64,
    /// When the watchdog fences: send time of the last acknowledged report (or of the
    /// registration) + the TTL etcd answered to its keep-alive - [`fence_margin`].
    fence_at: Option<Instant>,
}

impl LeaseState {
    /// A keep-alive of a report (or registration) sent at `sent_at` succeeded and etcd
    /// answered `ttl`: the lease lives at least until `sent_at + ttl`. Returns the new
    /// fencing deadline.
    fn renewed(&mut self, sent_at: Instant, ttl: Duration) -> Instant {
        let fence_at = sent_at + ttl.saturating_sub(fence_margin(ttl));
        let fence_at = self.fence_at.map_or(fence_at, |earlier| earlier.max(fence_at));
        self.fence_at = Some(fence_at);
        fence_at
    }
}

/// How long before its lease can expire the node stops serving: covers the watchdog's
/// 100 ms tick, clock rate differences between node and etcd leader, and a node slowed by
/// load, so no replica sees the key vanish (and re-places its workspaces) while it serves.
fn fence_margin(ttl: Duration) -> Duration {
    (ttl / 5).clamp(Duration::from_millis(300), Duration::from_secs(2))
}

pub struct Heartbeater {
    config: NodeAgentConfig,
    address: String,
    workspaces: Arc<Workspaces>,
    fence: Arc<Fence>,
    lease: Arc<Mutex<LeaseState>>,
    /// Live MCP clients per workspace are reported: the sweeper must not idle those.
    mcp_pool: Option<McpPool>,
}

enum SessionEnd {
    /// The replica fenced us: register again at once.
    Fenced,
    Shutdown,
}

impl Heartbeater {
    pub fn new(config: NodeAgentConfig, address: String, workspaces: Arc<Workspaces>, fence: Arc<Fence>) -> Self {
        Self { config, address, workspaces, fence, lease: Arc::new(Mutex::new(LeaseState::default())), mcp_pool: None }
    }

    /// Reports each workspace's live MCP clients from `pool`.
    pub fn with_mcp_pool(mut self, pool: McpPool) -> Self {
        self.mcp_pool = Some(pool);
        self
    }

    fn lease(&self) -> std::sync::MutexGuard<'_, LeaseState> {
        self.lease.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub async fn run(self, cancel: CancellationToken) {
        tokio::spawn(watchdog(Arc::clone(&self.lease), Arc::clone(&self.fence), cancel.clone()));
        let endpoints = &self.config.control_planes;
        let mut index = spread(&self.config.node_id, endpoints.len());
        let mut backoff = MIN_BACKOFF;
        loop {
            let endpoint = &endpoints[index];
            let mut acknowledged = false;
            let end = self.session(endpoint, &cancel, &mut acknowledged).await;
            // A session that renewed the lease was good: the next failure starts afresh.
            if acknowledged {
                backoff = MIN_BACKOFF;
            }
            // Whatever ended the session, the next attempt goes to the next replica: the one
            // that just failed or fenced us is the least likely to serve us now.
            index = (index + 1) % endpoints.len();
            match end {
                Ok(SessionEnd::Shutdown) => return,
                // Register again at once.
                Ok(SessionEnd::Fenced) => continue,
                Err(error) => {
                    tracing::warn!(node_id = %self.config.node_id, endpoint = %endpoint, %error, "heartbeat stream failed; trying the next replica");
                }
            }
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }

    /// One stream to one replica: registration, then reports until it ends. Sets
    /// `acknowledged` once the replica acknowledged a report.
    async fn session(
        &self,
        endpoint: &str,
        cancel: &CancellationToken,
        acknowledged: &mut bool,
    ) -> Result<SessionEnd, String> {
        let mut target = Endpoint::from_shared(endpoint.to_owned())
            .map_err(|error| format!("bad control-plane URL {endpoint:?}: {error}"))?
            .connect_timeout(Duration::from_secs(2))
            .http2_keep_alive_interval(Duration::from_secs(2))
            .keep_alive_timeout(Duration::from_secs(2));
        if endpoint.starts_with("https://") {
            let tls = self.config.control_plane_tls.as_ref().ok_or_else(|| {
                format!("{endpoint} is https but no control-plane CA is configured (--control-plane-ca-cert)")
            })?;
            target = target.tls_config(tls.config()?).map_err(|error| format!("tls: {error}"))?;
        }
        let channel = target.connect().await.map_err(|error| format!("connect: {error}"))?;
        // The replica refuses a heartbeat without a node credential, and one that names
        // another node than the registration.
        let credential = BearerInterceptor::new(self.config.heartbeat_credential());
        let mut client = NodeServiceClient::with_interceptor(channel, credential);
        let (outbound, receiver) = mpsc::channel(8);
        let (lease_id, node_generation) = {
            let lease = self.lease();
            (lease.lease_id, lease.node_generation)
        };
        let register = v1::Register {
            node_id: self.config.node_id.clone(),
            address: self.address.clone(),
            backends: self.config.backends.clone(),
            default_backend: self.config.default_backend().to_owned(),
            labels: self.config.labels.clone().into_iter().collect(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            lease_id,
            node_generation,
            capacity_workspaces: self.config.capacity_workspaces,
            workspaces: self.workspaces.all().iter().map(|entry| local_workspace(entry, 0)).collect(),
            key_prefix: self.config.cloud.key_prefix.clone(),
            snapshots: self.workspaces.snapshots().is_some(),
        };
        let register_sent = Instant::now();
        outbound
            .send(NodeMessage { msg: Some(NodeMsg::Register(register)) })
            .await
            .map_err(|_| "stream closed before register".to_owned())?;
        let opened = tokio::time::timeout(REGISTER_TIMEOUT, client.heartbeat(ReceiverStream::new(receiver)))
            .await
            .map_err(|_| format!("no answer to the registration within {REGISTER_TIMEOUT:?}"))?;
        let mut inbound = opened.map_err(|status| format!("register refused: {}", status.message()))?.into_inner();
        // The replica names the copies superseded while we were away before it answers
        // `Registered`; they go before the fence lifts, so this node never serves a copy
        // another node now holds (issue 13, finding 6).
        let registered = loop {
            let message = tokio::time::timeout(REGISTER_TIMEOUT, inbound.message())
                .await
                .map_err(|_| format!("no registration answer within {REGISTER_TIMEOUT:?}"))?
                .map_err(|status| status.message().to_owned())?;
            match message.and_then(|message| message.msg) {
                Some(ControlMsg::Registered(registered)) => break registered,
                Some(ControlMsg::Command(command)) => {
                    if let Some(stale) = destroy_stale_of(command) {
                        destroy_stale(Arc::clone(&self.workspaces), stale).await;
                    }
                }
                other => return Err(format!("expected a registration answer, got {other:?}")),
            }
        };
        let interval = Duration::from_millis(registered.heartbeat_interval_ms.max(100));
        let registered_ttl = Duration::from_millis(registered.lease_ttl_ms);
        {
            let mut lease = self.lease();
            lease.lease_id = registered.lease_id;
            lease.node_generation = registered.node_generation;
            let serve_until = lease.renewed(register_sent, registered_ttl);
            self.fence.serve_until(Some(serve_until));
        }
        if self.fence.lift() {
            tracing::info!(node_id = %self.config.node_id, node_generation = registered.node_generation, "registered again; serving");
        }
        tracing::info!(node_id = %self.config.node_id, replica = %registered.replica_id, lease = registered.lease_id, "heartbeating");

        let mut sent: HashMap<u64, Instant> = HashMap::new();
        // Interval snapshots sent in unacknowledged reports: queued again if the stream ends
        // before the ack (the replica records a snapshot once, whatever the repeats).
        let mut unacked_snapshots = UnackedSnapshots { snapshots: self.workspaces.snapshots(), by_seq: HashMap::new() };
        let mut seq = 0u64;
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return Ok(SessionEnd::Shutdown),
                _ = ticker.tick() => {
                    // The watchdog fenced us while this stream lives on (acks came too late,
                    // e.g. while etcd elected a leader). Only a registration lifts a fence,
                    // so end the stream and register again rather than stay fenced forever.
                    if self.fence.is_fenced() {
                        tracing::info!(node_id = %self.config.node_id, "fenced by the watchdog; registering again");
                        return Ok(SessionEnd::Fenced);
                    }
                    // The replica neither acks nor closes the stream (stalled, or cut off):
                    // move on while the lease still has time, long before the watchdog.
                    let oldest_unacked = sent.values().min().map(|sent_at| sent_at.elapsed());
                    if oldest_unacked.is_some_and(|age| age >= interval * MISSED_ACKS - interval / 2) {
                        return Err(format!("no heartbeat acknowledged for {MISSED_ACKS} intervals"));
                    }
                    seq += 1;
                    sent.insert(seq, Instant::now());
                    // Reports older than a few intervals will never be acknowledged.
                    sent.retain(|&sequence, _| sequence + 16 > seq);
                    let mut report = self.report(seq);
                    report.snapshots = unacked_snapshots.take(seq);
                    if outbound.send(NodeMessage { msg: Some(NodeMsg::Report(report)) }).await.is_err() {
                        return Err("stream closed".into());
                    }
                }
                message = inbound.message() => {
                    let message = message.map_err(|status| status.message().to_owned())?;
                    match message.and_then(|message| message.msg) {
                        Some(ControlMsg::Ack(ack)) => {
                            unacked_snapshots.acked(ack.seq);
                            if let Some(sent_at) = sent.remove(&ack.seq) {
                                // The TTL etcd answered to this report's keep-alive (a replica
                                // that does not send it: the registration's).
                                let ttl = match ack.lease_ttl_ms {
                                    0 => registered_ttl,
                                    ms => Duration::from_millis(ms),
                                };
                                let serve_until = self.lease().renewed(sent_at, ttl);
                                self.fence.serve_until(Some(serve_until));
                                *acknowledged = true;
                            }
                        }
                        Some(ControlMsg::Fence(fence)) => {
                            self.fence_now(&fence.reason);
                            return Ok(SessionEnd::Fenced);
                        }
                        Some(ControlMsg::Command(command)) => {
                            if let Some(stale) = destroy_stale_of(command) {
                                tokio::spawn(destroy_stale(Arc::clone(&self.workspaces), stale));
                            }
                        }
                        Some(ControlMsg::SnapshotRefused(refused)) => {
                            crate::metrics::snapshot_failed("refused");
                            tracing::error!(ws_id = %refused.workspace_id, snapshot = %refused.snapshot_id,
                                generation = refused.generation, record_generation = refused.record_generation,
                                reason = %refused.reason, "the control plane refused a snapshot of this node as the workspace's latest");
                        }
                        Some(ControlMsg::Registered(_)) => {}
                        None => return Err("replica closed the stream".into()),
                    }
                }
            }
        }
    }

    fn fence_now(&self, reason: &str) {
        if self.fence.fence() {
            tracing::warn!(node_id = %self.config.node_id, reason, "fenced: not serving until registered again");
        }
        let mut lease = self.lease();
        lease.lease_id = 0;
        lease.fence_at = None;
        self.fence.serve_until(None);
    }

    fn report(&self, seq: u64) -> v1::HeartbeatReport {
        let entries = self.workspaces.all();
        let load = v1::NodeLoad {
            workspaces: entries.len() as u32,
            running: entries.iter().filter(|entry| entry.backend.is_some()).count() as u32,
            execs_in_flight: entries.iter().map(|entry| entry.execs_in_flight.load(Ordering::Relaxed)).sum(),
            load_avg_1m: load_average(),
            mem_available_bytes: mem_available(),
        };
        crate::metrics::node_state(entries.len(), self.fence.is_fenced());
        v1::HeartbeatReport {
            seq,
            load: Some(load),
            workspaces: entries
                .iter()
                .map(|entry| {
                    let mcp_live = self.mcp_pool.as_ref().map_or(0, |pool| pool.live_servers(&entry.id).len());
                    local_workspace(entry, u32::try_from(mcp_live).unwrap_or(u32::MAX))
                })
                .collect(),
            snapshots: Vec::new(),
        }
    }
}

/// Interval snapshots in flight on one heartbeat stream, by report.
struct UnackedSnapshots {
    snapshots: Option<crate::snapshots::NodeSnapshotsRef>,
    by_seq: HashMap<u64, Vec<v1::SnapshotTaken>>,
}

impl UnackedSnapshots {
    /// The queued snapshots for report `seq`.
    fn take(&mut self, seq: u64) -> Vec<v1::SnapshotTaken> {
        let Some(snapshots) = &self.snapshots else { return Vec::new() };
        let taken = snapshots.drain_unreported();
        if !taken.is_empty() {
            self.by_seq.insert(seq, taken.clone());
        }
        taken
    }

    fn acked(&mut self, seq: u64) {
        self.by_seq.remove(&seq);
    }
}

impl Drop for UnackedSnapshots {
    fn drop(&mut self) {
        if let Some(snapshots) = &self.snapshots {
            for (_, taken) in self.by_seq.drain() {
                snapshots.requeue(taken);
            }
        }
    }
}

fn destroy_stale_of(command: v1::NodeCommand) -> Option<v1::DestroyStale> {
    // More commands may come: the match stays explicit rather than a `map`.
    let Some(v1::node_command::Cmd::DestroyStale(stale)) = command.cmd else { return None };
    Some(stale)
}

/// Moves a copy a newer placement superseded to the quarantine, if it is still at or below
/// that generation.
async fn destroy_stale(workspaces: Arc<Workspaces>, stale: v1::DestroyStale) {
    let Ok(id) = WorkspaceId::new(stale.workspace_id) else { return };
    match workspaces.destroy_stale(&id, stale.generation).await {
        Ok(true) => {
            tracing::info!(ws_id = %id, generation = stale.generation, "moved a copy superseded by a newer placement to the quarantine")
        }
        Ok(false) => {}
        Err(error) => tracing::warn!(ws_id = %id, %error, "removing a superseded copy failed"),
    }
}

/// Fences the node a margin before its lease can expire (see [`LeaseState::fence_at`]). The
/// lease id is kept: the lease may well be alive (etcd extends leases across a leader change), and the
/// next registration presents it, so the replica continues it if it still exists — then no
/// replica can have seen the node leave — or grants a new one with a new generation.
async fn watchdog(lease: Arc<Mutex<LeaseState>>, fence: Arc<Fence>, cancel: CancellationToken) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_millis(100)) => {}
        }
        let mut state = lease.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let expiring = state.fence_at.is_some_and(|fence_at| Instant::now() >= fence_at);
        if expiring {
            state.fence_at = None;
            drop(state);
            // The deadline already fences every caller; the flag keeps it fenced until a
            // registration, whatever a late renewal does to the deadline.
            if fence.fence() {
                tracing::warn!(
                    "lease about to expire without an acknowledged heartbeat: fenced until registered again"
                );
            }
        }
    }
}

/// Index of the first replica to try: nodes spread evenly over the replica list.
fn spread(node_id: &str, replicas: usize) -> usize {
    let hash =
        node_id.bytes().fold(0xcbf29ce484222325u64, |hash, byte| (hash ^ byte as u64).wrapping_mul(0x100000001b3));
    (hash % replicas.max(1) as u64) as usize
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|text| text.split_whitespace().next().and_then(|first| first.parse().ok()))
        .unwrap_or(0.0)
}

fn mem_available() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("MemAvailable:"))
                .and_then(|line| line.split_whitespace().nth(1).and_then(|kib| kib.parse::<u64>().ok()))
        })
        .map(|kib| kib * 1024)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_fences_a_margin_before_the_ttl_etcd_answered() {
        let sent_at = Instant::now();
        let mut lease = LeaseState::default();
        lease.renewed(sent_at, Duration::from_secs(3));
        assert_eq!(lease.fence_at, Some(sent_at + Duration::from_millis(2400)), "3 s TTL, 600 ms margin");
        // An ack that arrives late for an older report never moves the deadline back.
        lease.renewed(sent_at - Duration::from_secs(1), Duration::from_secs(3));
        assert_eq!(lease.fence_at, Some(sent_at + Duration::from_millis(2400)));
        // A longer TTL from etcd moves it forward; the margin stays within 0.3-2 s.
        lease.renewed(sent_at, Duration::from_secs(60));
        assert_eq!(lease.fence_at, Some(sent_at + Duration::from_secs(58)));
        assert_eq!(fence_margin(Duration::from_secs(1)), Duration::from_millis(300));
    }
}
