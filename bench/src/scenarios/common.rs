//! Pieces several scenarios share: bursts of concurrent calls, the ground truth of what is
//! on the node agents' disks, and turning a failed case into an error row.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use berth_proto::v1;
use berth_tests::cluster::Cluster;
use tonic::transport::Channel;

use crate::env;
use crate::machine::MachineInfo;
use crate::report::{Floor, Quantity, ScenarioResult};
use crate::stats::Summary;

/// One call of a burst: its latency and its answer (or the error text).
pub struct Outcome<T> {
    pub latency: Duration,
    pub answer: Result<T, String>,
}

/// Starts `count` calls at once, each in a task of its own (as the storm floors' etcd
/// creates are, and as an agent service's concurrent requests would be), and waits for all
/// of them. Each latency runs from the call's first poll to its answer; the wall time from
/// the first start to the last answer. (With every call in one task, each answer also waited
/// for that task's turn: in eight interleaved R=3 N=1000 storms the p99 was 46–138 ms that
/// way, 45–58 ms this way.)
pub async fn burst<F, Fut, T>(count: usize, call: F) -> (Vec<Outcome<T>>, Duration)
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<T, String>> + Send + 'static,
    T: Send + 'static,
{
    let started = Instant::now();
    let calls: Vec<_> = (0..count)
        .map(|index| {
            let future = call(index);
            tokio::spawn(async move {
                let call_started = Instant::now();
                let answer = future.await;
                Outcome { latency: call_started.elapsed(), answer }
            })
        })
        .collect();
    let mut outcomes = Vec::with_capacity(count);
    for call in calls {
        outcomes.push(call.await.unwrap_or_else(|error| Outcome {
            latency: started.elapsed(),
            answer: Err(format!("the call's task failed: {error}")),
        }));
    }
    (outcomes, started.elapsed())
}

/// A fresh CreateSession for `user` (the session id is minted by the replica).
pub fn create_request(user: &str, agent: &str, backend: &str) -> v1::CreateSessionRequest {
    v1::CreateSessionRequest {
        user_id: user.to_owned(),
        agent_id: agent.to_owned(),
        backend: backend.to_owned(),
        ..Default::default()
    }
}

/// Workspace directories on every node's disk, as `(node, workspace id)`.
pub fn on_disk(cluster: &Cluster) -> BTreeSet<(String, String)> {
    cluster.workspace_dirs().into_iter().collect()
}

/// The storm floor: `count` concurrent etcd create-if-absent transactions (one session
/// record write each, the least durable work a CreateSession does).
pub async fn storm_floor(etcd: &berth_tests::etcd::EtcdProcess, count: usize) -> anyhow::Result<Floor> {
    let registry = env::registry(etcd).await?;
    // A session record is ~150 bytes of JSON.
    let (latencies, wall) = env::etcd_create_floor(&registry, count, 150).await?;
    Ok(Floor {
        name: format!("{count} concurrent etcd creates"),
        latency_ms: Summary::of(&latencies),
        throughput: Some(Quantity::new(count as f64 / wall.as_secs_f64(), "writes/s")),
    })
}

/// One connection's workspace client per channel.
pub fn clients(channels: Vec<Channel>) -> Vec<v1::workspace_service_client::WorkspaceServiceClient<Channel>> {
    channels.into_iter().map(env::workspace_client).collect()
}

/// The row of a case that could not be measured at all.
pub fn error_row(scenario: &str, case: &str, machine: &Arc<MachineInfo>, error: &anyhow::Error) -> ScenarioResult {
    let mut result = ScenarioResult::new(scenario, case, machine);
    result.fail(format!("{error:#}"));
    result
}

/// `Ok(row)` as is, an error as an error row (so one failed case does not hide the others).
pub fn row_or_error(
    scenario: &str,
    case: &str,
    machine: &Arc<MachineInfo>,
    row: anyhow::Result<ScenarioResult>,
) -> ScenarioResult {
    row.unwrap_or_else(|error| {
        crate::env::progress!("{scenario} {case}: error: {error:#}");
        error_row(scenario, case, machine, &error)
    })
}

/// Summarises a burst: latencies of the answered calls and the first few errors.
pub fn split<T>(outcomes: Vec<Outcome<T>>) -> (Vec<Duration>, Vec<T>, Vec<String>) {
    let mut latencies = Vec::with_capacity(outcomes.len());
    let mut answers = Vec::with_capacity(outcomes.len());
    let mut errors = Vec::new();
    for outcome in outcomes {
        match outcome.answer {
            Ok(answer) => {
                latencies.push(outcome.latency);
                answers.push(answer);
            }
            Err(error) => errors.push(error),
        }
    }
    (latencies, answers, errors)
}

/// "3 calls failed, e.g. ..." for a failure reason.
pub fn errors_reason(errors: &[String], total: usize) -> String {
    let examples: BTreeSet<&str> = errors.iter().map(String::as_str).take(3).collect();
    format!("{} of {total} calls failed, e.g. {examples:?}", errors.len())
}

/// Runs a berth-testkit call (a server start, a venv: they panic with what went wrong) on
/// the blocking pool as a fallible call; `what` leads the error.
pub async fn testkit_call<T: Send + 'static>(
    what: &str,
    call: impl FnOnce() -> T + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(call).await.map_err(|error| {
        let reason = match error.try_into_panic() {
            Ok(panic) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|text| (*text).to_owned()))
                .unwrap_or_default(),
            Err(error) => error.to_string(),
        };
        anyhow::anyhow!("{what} failed: {reason}")
    })
}
