//! A Berth cluster on a 3-member etcd keeps creating and executing while one member dies:
//! a follower in one test, the leader in the other. The replicas are configured with all
//! three endpoints; the test client retries transient failures (UNAVAILABLE,
//! DEADLINE_EXCEEDED, ABORTED or marked retryable) for at most [`RETRY_WINDOW`] per call
//! (a retry may start until the window ends). A third test takes quorum away for longer
//! than the node lease TTL and gives it back: the nodes fence themselves, then serve again.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use berth_control_plane::records::StoredState;
use berth_testkit::wait_until;
use berth_tests::berth::retry_transient;
use berth_tests::cluster::{Cluster, ClusterConfig};
use berth_tests::etcd::EtcdCluster;
use nix::sys::signal::Signal;

/// How long the test client keeps retrying one call that fails transiently.
const RETRY_WINDOW: Duration = Duration::from_secs(8);
/// Concurrent clients, and create + exec rounds per client.
const CLIENTS: usize = 3;
const ROUNDS: usize = 12;
/// The member dies once this many operations have completed.
const KILL_AFTER_OPS: usize = 12;

/// What one call did.
#[derive(Debug)]
struct Op {
    what: String,
    started_after_kill: bool,
    attempts: u32,
    took: Duration,
    /// The final error, if the call never succeeded.
    error: Option<String>,
    /// Errors of the attempts that were retried.
    retried: Vec<String>,
}

/// Runs `call` under [`retry_transient`], keeping the errors of the attempts it retried.
async fn retried<T, F, Fut>(call: F) -> (Result<T, tonic::Status>, u32, Vec<String>)
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, tonic::Status>>,
{
    let errors = std::sync::Mutex::new(Vec::new());
    let (outcome, attempts) = retry_transient(RETRY_WINDOW, || async {
        let outcome = call().await;
        if let Err(status) = &outcome {
            errors.lock().expect("errors").push(format!("{:?}: {}", status.code(), status.message()));
        }
        outcome
    })
    .await;
    let mut errors = errors.into_inner().expect("errors");
    if outcome.is_err() {
        errors.pop();
    }
    (outcome, attempts, errors)
}

/// Runs the workload, killing member `victim` (chosen once the cluster is up) mid-run, and
/// checks that every call succeeded within the retry window and exactly one copy of every
/// workspace exists.
async fn workload_survives_losing(victim: impl FnOnce(&EtcdCluster) -> usize) {
    let etcd = EtcdCluster::start(3);
    let cluster = Arc::new(Cluster::start(ClusterConfig::new(etcd.endpoints(), 3, 2)).await.expect("cluster"));
    let completed = Arc::new(AtomicUsize::new(0));
    let killed_at: Arc<std::sync::OnceLock<Instant>> = Arc::new(std::sync::OnceLock::new());

    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| {
            let cluster = Arc::clone(&cluster);
            let completed = Arc::clone(&completed);
            let killed_at = Arc::clone(&killed_at);
            tokio::spawn(async move {
                let mut ops = Vec::new();
                let mut workspaces = Vec::new();
                for round in 0..ROUNDS {
                    let creator = &cluster.replicas[(client + round) % cluster.replicas.len()].server;
                    let agent = format!("agent-{client}-{round}");
                    let started = Instant::now();
                    let after_kill = killed_at.get().is_some();
                    let (created, attempts, retried_errors) = retried(|| creator.create_session("ivy", &agent)).await;
                    ops.push(Op {
                        what: format!("create {agent}"),
                        started_after_kill: after_kill,
                        attempts,
                        took: started.elapsed(),
                        error: created.as_ref().err().map(|status| format!("{status:?}")),
                        retried: retried_errors,
                    });
                    completed.fetch_add(1, Ordering::SeqCst);
                    let Ok(session) = created else { continue };
                    workspaces.push(session.workspace_id.clone());

                    let executor = &cluster.replicas[(client + round + 1) % cluster.replicas.len()].server;
                    let command = format!("echo {agent}");
                    let started = Instant::now();
                    let after_kill = killed_at.get().is_some();
                    let argv = ["sh", "-c", command.as_str()];
                    let (ran, attempts, retried_errors) = retried(|| executor.exec(&session.workspace_id, &argv)).await;
                    let error = match &ran {
                        Ok(result) if result.stdout == format!("{agent}\n").as_bytes() => None,
                        Ok(result) => Some(format!("unexpected output {result:?}")),
                        Err(status) => Some(format!("{status:?}")),
                    };
                    ops.push(Op {
                        what: format!("exec {agent}"),
                        started_after_kill: after_kill,
                        attempts,
                        took: started.elapsed(),
                        error,
                        retried: retried_errors,
                    });
                    completed.fetch_add(1, Ordering::SeqCst);
                }
                (ops, workspaces)
            })
        })
        .collect();

    let ready =
        wait_until(Duration::from_secs(60), || async { completed.load(Ordering::SeqCst) >= KILL_AFTER_OPS }).await;
    assert!(ready, "the workload made no progress before the kill\n{}", cluster.logs(30));
    let victim = victim(&etcd);
    etcd.kill_member(victim);
    killed_at.set(Instant::now()).expect("killed once");

    let mut ops = Vec::new();
    let mut workspaces = Vec::new();
    for client in clients {
        let (client_ops, client_workspaces) = client.await.expect("client task");
        ops.extend(client_ops);
        workspaces.extend(client_workspaces);
    }
    let failed: Vec<&Op> = ops.iter().filter(|op| op.error.is_some()).collect();
    let slowest = ops.iter().max_by_key(|op| op.took).expect("ops");
    let retried_ops: Vec<String> = ops
        .iter()
        .filter(|op| !op.retried.is_empty() || op.took > Duration::from_secs(2))
        .map(|op| format!("{} ({} attempts, {:?}): {:?}", op.what, op.attempts, op.took, op.retried))
        .collect();
    eprintln!(
        "{} ops, {} after the kill, slowest {:?} ({}); retried: {retried_ops:#?}",
        ops.len(),
        ops.iter().filter(|op| op.started_after_kill).count(),
        slowest.took,
        slowest.what
    );
    assert!(
        failed.is_empty(),
        "calls failed within the {RETRY_WINDOW:?} retry window: {failed:#?}\n{}",
        cluster.logs(40)
    );
    assert_eq!(ops.len(), CLIENTS * ROUNDS * 2);
    assert!(ops.iter().filter(|op| op.started_after_kill).count() >= CLIENTS * 2, "too few calls after the kill");

    // Afterwards every workspace answers again, on both nodes: a node that fenced itself
    // while etcd had no leader must be serving again, not listed live yet refusing calls.
    for (index, workspace_id) in workspaces.iter().enumerate() {
        let replica = &cluster.replicas[index % cluster.replicas.len()].server;
        let (ran, attempts, retried) = retried(|| replica.exec(workspace_id, &["true"])).await;
        assert!(
            ran.is_ok_and(|result| result.exit_code == 0),
            "{workspace_id} does not answer after the kill ({attempts} attempts: {retried:?})\n{}",
            cluster.logs(40)
        );
    }

    // Every workspace once, READY, on the node its record names.
    let registry = cluster.registry().await;
    let mut expected = Vec::new();
    for workspace_id in &workspaces {
        let record = cluster.workspace_record(registry.as_ref(), workspace_id).await.expect("read").expect("record");
        assert_eq!(record.state, StoredState::Ready, "{record:?}");
        expected.push((record.node_id.clone().expect("placed"), workspace_id.clone()));
    }
    expected.sort();
    let single = wait_until(Duration::from_secs(5), || async {
        let mut dirs = cluster.workspace_dirs();
        dirs.sort();
        dirs == expected
    })
    .await;
    assert!(single, "workspace dirs {:?}, expected {expected:?}\n{}", cluster.workspace_dirs(), cluster.logs(30));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_exec_keep_working_when_an_etcd_follower_dies() {
    workload_survives_losing(|etcd| {
        let leader = etcd.wait_for_leader(Duration::from_secs(10));
        (leader + 1) % etcd.members().len()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_and_exec_keep_working_when_the_etcd_leader_dies() {
    workload_survives_losing(|etcd| etcd.wait_for_leader(Duration::from_secs(10))).await;
}

/// Both followers paused (SIGSTOP) for longer than the node lease TTL: no keep-alive gets
/// through, so every node's watchdog fences it. When quorum returns, etcd's new leader
/// extends the leases, so the nodes must register again on the same leases and serve every
/// workspace — not stay fenced behind a live-looking node record. No replica ever lists a
/// node as gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_fenced_by_a_quorum_loss_serve_again_on_their_leases() {
    const PAUSE: Duration = Duration::from_secs(5);
    let etcd = EtcdCluster::start(3);
    let cluster = Cluster::start(ClusterConfig::new(etcd.endpoints(), 3, 2)).await.expect("cluster");
    let registry = cluster.registry().await;
    let mut workspaces = Vec::new();
    for index in 0..6 {
        let replica = &cluster.replicas[index % cluster.replicas.len()].server;
        let session = replica.create_session("jack", &format!("agent-{index}")).await.expect("create");
        workspaces.push(session.workspace_id);
    }
    let mut leases = Vec::new();
    for node in &cluster.nodes {
        let record = cluster.node_record(registry.as_ref(), &node.id).await.expect("read").expect("node record");
        leases.push((node.id.clone(), record.lease_id, record.node_generation));
    }
    let placed: std::collections::BTreeSet<String> =
        cluster.workspace_dirs().into_iter().map(|(node, _)| node).collect();
    assert_eq!(placed.len(), cluster.nodes.len(), "workspaces on every node");
    let node_log_starts: Vec<usize> = cluster.nodes.iter().map(|node| node.server.log().len()).collect();

    // Pause the followers: the leader, still running, steps down for want of a quorum and
    // stops expiring leases, and whoever leads next extends every lease. (Pausing the leader
    // instead lets it revoke the leases that expired by its clock as soon as it resumes —
    // etcd's behaviour, not a Berth bug — and the nodes then rightly register anew.)
    let leader = etcd.wait_for_leader(Duration::from_secs(10));
    let paused = [(leader + 1) % etcd.members().len(), (leader + 2) % etcd.members().len()];
    for member in paused {
        etcd.members()[member].signal(Signal::SIGSTOP);
    }
    let paused_at = Instant::now();
    // Poll the replicas' node lists through the pause and until every workspace answers.
    let mut resumed = false;
    let answering = wait_until(PAUSE + Duration::from_secs(30), || {
        let resume_now = !resumed && paused_at.elapsed() >= PAUSE;
        if resume_now {
            for member in paused {
                etcd.members()[member].signal(Signal::SIGCONT);
            }
            resumed = true;
        }
        let resumed = resumed;
        let cluster = &cluster;
        let workspaces = &workspaces;
        async move {
            for replica in &cluster.replicas {
                let listed = replica.server.list_nodes().await.expect("list nodes");
                assert_eq!(
                    listed.len(),
                    cluster.nodes.len(),
                    "{} lost a node: {listed:?}\n{}",
                    replica.id,
                    cluster.logs(30)
                );
            }
            if !resumed {
                return false;
            }
            for (index, workspace_id) in workspaces.iter().enumerate() {
                let replica = &cluster.replicas[index % cluster.replicas.len()].server;
                if !replica.exec(workspace_id, &["true"]).await.is_ok_and(|result| result.exit_code == 0) {
                    return false;
                }
            }
            true
        }
    })
    .await;
    if !resumed {
        for member in paused {
            etcd.members()[member].signal(Signal::SIGCONT);
        }
    }
    assert!(answering, "workspaces do not answer after quorum returned\n{}", cluster.logs(30));
    eprintln!("every workspace answered {:?} after the pause began", paused_at.elapsed());

    for (node, log_start) in cluster.nodes.iter().zip(node_log_starts) {
        let log = node.server.log();
        assert!(
            // The watchdog's line; the node may be between replicas when it fences.
            log[log_start..].contains("fenced until registered again"),
            "{} never fenced itself, so this test tested nothing:\n{}",
            node.id,
            &log[log_start..]
        );
    }
    for (node_id, lease_id, node_generation) in leases {
        let record = cluster.node_record(registry.as_ref(), &node_id).await.expect("read").expect("node record");
        assert_eq!(
            (record.lease_id, record.node_generation),
            (lease_id, node_generation),
            "{node_id} must continue the lease etcd kept for it"
        );
    }
}
