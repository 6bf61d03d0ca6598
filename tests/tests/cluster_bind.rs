//! Binding across replicas with real processes: however many replicas race for one
//! workspace id — and even when the replica holding the bind lock dies mid-provision —
//! every caller gets the same workspace and exactly one copy exists on disk; a storm of
//! distinct first sessions is provisioned a bounded number at a time, the waiting ones
//! counted.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use berth_control_plane::records::StoredState;
use berth_proto::v1;
use berth_testkit::{wait_for, wait_until};
use berth_tests::cluster::{Cluster, ClusterConfig};
use nix::sys::signal::Signal;

/// What one CreateSession call did: the replica index it went to, its outcome, and when it
/// finished.
type CreateOutcome = (usize, Result<v1::Session, tonic::Status>, Instant);

/// Starts `count` CreateSession calls for `user`, call `index` for agent `agent(index)`,
/// spread round-robin over the replicas, all at once.
fn spawn_creates(
    cluster: &Cluster,
    count: usize,
    user: &str,
    agent: impl Fn(usize) -> String,
) -> Vec<tokio::task::JoinHandle<CreateOutcome>> {
    let replicas = cluster.replicas.len();
    (0..count)
        .map(|index| {
            let replica = index % replicas;
            let mut client = cluster.replicas[replica].server.workspace_client();
            let request =
                v1::CreateSessionRequest { user_id: user.into(), agent_id: agent(index), ..Default::default() };
            tokio::spawn(async move {
                let outcome = client.create_session(request).await.map(tonic::Response::into_inner);
                (replica, outcome, Instant::now())
            })
        })
        .collect()
}

/// 300 concurrent first CreateSession calls for one (user, agent) over three replicas: one
/// workspace id for all, one Provision on one node, one directory on disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_creates_over_three_replicas_make_one_workspace() {
    let mut config = ClusterConfig::on_shared_etcd(3, 2);
    // Holds the winning bind long enough that every call, on every replica, arrives while it
    // is in flight: all three replicas really race for the lock.
    config.node_flags = vec!["--debug-provision-delay".into(), "1s".into()];
    let cluster = Cluster::start(config).await.expect("cluster");

    let handles = spawn_creates(&cluster, 300, "alice", |_| "coder".into());
    let mut workspace_ids = BTreeSet::new();
    let mut session_ids = BTreeSet::new();
    let mut failures = Vec::new();
    for handle in handles {
        let (replica, outcome, _) = handle.await.expect("create task");
        match outcome {
            Ok(session) => {
                workspace_ids.insert(session.workspace_id);
                session_ids.insert(session.session_id);
            }
            Err(status) => failures.push(format!("replica-{replica}: {status:?}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} calls failed: {:?}\n{}",
        failures.len(),
        &failures[..3.min(failures.len())],
        cluster.logs(30)
    );
    assert_eq!(workspace_ids.len(), 1, "calls got different workspaces: {workspace_ids:?}");
    assert_eq!(session_ids.len(), 300, "every call mints its own session");
    let workspace_id = workspace_ids.into_iter().next().expect("one id");

    // Every replica reports the same READY placement.
    let registry = cluster.registry().await;
    let record = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    for replica in &cluster.replicas {
        let seen = replica.server.get_workspace(&workspace_id).await.expect("get workspace");
        assert_eq!(seen.state(), v1::WorkspaceState::Ready, "{}: {seen:?}", replica.id);
        assert_eq!(Some(seen.node_id.as_str()), record.node_id.as_deref(), "{}", replica.id);
        assert_eq!(seen.generation, record.generation, "one placement: {seen:?}");
    }

    // The ground truth: one directory across both nodes' disks, on the recorded node, and
    // exactly one Provision that created something.
    let node_id = record.node_id.clone().expect("placed");
    assert_eq!(cluster.workspace_dirs(), vec![(node_id, workspace_id.clone())], "{}", cluster.logs(30));
    let created: usize = cluster
        .nodes
        .iter()
        .map(|node| {
            node.server
                .log()
                .lines()
                .filter(|line| line.contains(&workspace_id) && line.contains("created=true"))
                .count()
        })
        .sum();
    assert_eq!(created, 1, "provisions that created the workspace\n{}", cluster.logs(30));
}

/// The replica holding the bind lock is SIGKILLed while its node provisions. The callers on
/// the other replicas wait for the lock to go with the dead replica's lease, compete again,
/// and all get one workspace; exactly one directory remains on disk, on the recorded node.
///
/// Invariant asserted about the dead holder's half-made copy: it may exist for a while (the
/// node may have started provisioning), but once the workspace is READY on the record's
/// node, no other copy may remain beyond a few heartbeats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_lock_holder_mid_provision_still_binds_one_workspace() {
    const PROVISION_DELAY: Duration = Duration::from_secs(3);
    const REPLICA_LEASE_TTL: Duration = Duration::from_secs(3);
    let mut config = ClusterConfig::on_shared_etcd(3, 2);
    config.node_flags = vec!["--debug-provision-delay".into(), "3s".into()];
    config.replica_metrics = true;
    let cluster = Cluster::start(config).await.expect("cluster");
    let registry = cluster.registry().await;
    let workspace_id = berth_control_plane::assign_workspace_id(
        berth_control_plane::IsolationPolicy::PerAgent,
        "bob",
        "builder",
        "unused",
    );

    let handles = spawn_creates(&cluster, 30, "bob", |_| "builder".into());
    let holder = wait_for(Duration::from_secs(10), || async {
        cluster.lock_holder(registry.as_ref(), &workspace_id).await.ok().flatten()
    })
    .await
    .unwrap_or_else(|| panic!("no replica took the bind lock of {workspace_id}\n{}", cluster.logs(30)));
    let holder_index = cluster.replicas.iter().position(|replica| replica.id == holder).expect("a cluster replica");
    // Kill it while a node is provisioning for it (the node logs the start).
    let provisioning = wait_until(Duration::from_secs(10), || async {
        cluster.nodes.iter().any(|node| node.server.log().contains(&format!("provisioning ws_id={workspace_id}")))
    })
    .await;
    assert!(provisioning, "the holder's provision never reached a node\n{}", cluster.logs(30));
    cluster.replicas[holder_index].server.kill();
    let killed_at = Instant::now();

    let mut workspace_ids = BTreeSet::new();
    let mut slowest = Duration::ZERO;
    let mut failures = Vec::new();
    for handle in handles {
        let (replica, outcome, finished_at) = handle.await.expect("create task");
        if replica == holder_index {
            // Its transport died with it; whatever it answered does not count.
            continue;
        }
        match outcome {
            Ok(session) => {
                workspace_ids.insert(session.workspace_id);
                slowest = slowest.max(finished_at.saturating_duration_since(killed_at));
            }
            Err(status) => failures.push(format!("replica-{replica}: {status:?}")),
        }
    }
    assert!(failures.is_empty(), "callers on surviving replicas failed: {failures:?}\n{}", cluster.logs(40));
    assert_eq!(workspace_ids.into_iter().collect::<Vec<_>>(), vec![workspace_id.clone()]);
    // The lock frees within the lease TTL, then the next holder provisions once. (The dead
    // holder's provision does not hold the node up: its connection died with it, and the
    // node dropped that call while it was still waiting out the delay.)
    let bound = REPLICA_LEASE_TTL + PROVISION_DELAY + Duration::from_secs(3);
    eprintln!("the last surviving caller got its session {slowest:?} after the kill (bound {bound:?})");
    assert!(slowest <= bound, "the last surviving caller took {slowest:?} after the kill (bound {bound:?})");

    let record = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    assert_eq!(record.state, StoredState::Ready, "{record:?}");
    assert_ne!(record.changed_by, holder, "the dead holder cannot have written the record");
    // The replica that finished the bind counted it as a take-over, and waited first.
    let finisher = cluster.replica(&record.changed_by).and_then(|replica| replica.metrics_port).expect("metrics port");
    let scraped = berth_tests::observe::scrape(finisher).await.expect("scrape the finishing replica");
    let counted = |name: &str| scraped.value(name, &[]).unwrap_or(0.0);
    assert!(counted("berth_control_plane_binds_taken_over_total") >= 1.0, "no take-over counted:\n{}", scraped.text);
    assert!(counted("berth_control_plane_binds_waited_total") >= 1.0, "no wait counted:\n{}", scraped.text);
    let node_id = record.node_id.clone().expect("placed");
    let expected = vec![(node_id, workspace_id.clone())];
    let single = wait_until(Duration::from_secs(5), || async { cluster.workspace_dirs() == expected }).await;
    assert!(single, "workspace dirs {:?}, expected {expected:?}\n{}", cluster.workspace_dirs(), cluster.logs(40));
    for replica in cluster.live_replicas() {
        let seen = replica.server.get_workspace(&workspace_id).await.expect("get workspace");
        assert_eq!(seen.state(), v1::WorkspaceState::Ready, "{}: {seen:?}", replica.id);
        assert_eq!(seen.generation, record.generation, "{}", replica.id);
    }
    let ran = cluster.live_replicas()[0].server.exec(&workspace_id, &["sh", "-c", "echo ok"]).await.expect("exec");
    assert_eq!(ran.stdout, b"ok\n");
}

/// A lock holder that stalls (SIGSTOP: its connections stay open, its lease runs out) after
/// its node finished provisioning, and that node then dies: the next holder places the
/// workspace on the other node — at the same generation, since the stalled holder never
/// recorded its attempt. When the first node comes back with its copy, the copy must go:
/// one workspace, one directory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_left_by_a_stalled_holder_goes_when_its_node_returns() {
    let mut config = ClusterConfig::on_shared_etcd(3, 2);
    config.node_flags = vec!["--debug-provision-delay".into(), "1s".into()];
    let mut cluster = Cluster::start(config).await.expect("cluster");
    let registry = cluster.registry().await;
    let workspace_id =
        berth_control_plane::assign_workspace_id(berth_control_plane::IsolationPolicy::PerAgent, "carol", "fixer", "");

    // The stalling replica must not hold a node's heartbeat stream, or stopping it would
    // also cost that node its lease (a different scenario).
    let streams: BTreeSet<String> = cluster.replicas[0]
        .server
        .list_nodes()
        .await
        .expect("list nodes")
        .into_iter()
        .map(|node| node.replica_id)
        .collect();
    let stalled = cluster.replicas.iter().position(|replica| !streams.contains(&replica.id)).expect("a free replica");
    let stalled_call = {
        let server = &cluster.replicas[stalled].server;
        let mut client = server.workspace_client();
        let request =
            v1::CreateSessionRequest { user_id: "carol".into(), agent_id: "fixer".into(), ..Default::default() };
        tokio::spawn(async move { client.create_session(request).await })
    };
    let holder = wait_for(Duration::from_secs(10), || async {
        cluster.lock_holder(registry.as_ref(), &workspace_id).await.ok().flatten()
    })
    .await;
    assert_eq!(holder.as_deref(), Some(cluster.replicas[stalled].id.as_str()), "{}", cluster.logs(30));
    // Stall the holder only once its Provision reached a node (the node logs its start).
    let reached = wait_until(Duration::from_secs(10), || async {
        cluster.nodes.iter().any(|node| node.server.log().contains(&format!("provisioning ws_id={workspace_id}")))
    })
    .await;
    assert!(reached, "the holder's provision never reached a node\n{}", cluster.logs(30));
    cluster.replicas[stalled].server.process.signal(Signal::SIGSTOP);

    // The node finishes the stalled holder's provision; then it dies.
    let provisioned_on = wait_for(Duration::from_secs(10), || async {
        cluster.nodes.iter().position(|node| node.server.log().contains(&format!("provisioned ws_id={workspace_id}")))
    })
    .await
    .unwrap_or_else(|| panic!("no node provisioned {workspace_id}\n{}", cluster.logs(30)));
    let dead_node = cluster.nodes[provisioned_on].id.clone();
    cluster.nodes[provisioned_on].server.kill();
    let others: Vec<usize> = (0..cluster.replicas.len()).filter(|index| *index != stalled).collect();
    let gone = wait_until(Duration::from_secs(10), || async {
        for index in &others {
            match cluster.replicas[*index].server.list_nodes().await {
                Ok(nodes) if nodes.iter().all(|node| node.node_id != dead_node) => {}
                _ => return false,
            }
        }
        true
    })
    .await;
    assert!(gone, "replicas still list {dead_node}\n{}", cluster.logs(30));

    // Another replica binds it anew (the stalled holder's lock goes with its lease).
    let session = cluster.replicas[others[0]].server.create_session("carol", "fixer").await;
    let session = session.unwrap_or_else(|status| panic!("create after the stall: {status:?}\n{}", cluster.logs(30)));
    assert_eq!(session.workspace_id, workspace_id);
    let record = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    let live_node = record.node_id.clone().expect("placed");
    assert_ne!(live_node, dead_node, "{record:?}");

    // The dead node comes back with its copy and must remove it.
    cluster.restart_node(provisioned_on).await.expect("restart node");
    let expected = vec![(live_node.clone(), workspace_id.clone())];
    let single = wait_until(Duration::from_secs(10), || async { cluster.workspace_dirs() == expected }).await;
    assert!(single, "workspace dirs {:?}, expected {expected:?}\n{}", cluster.workspace_dirs(), cluster.logs(40));

    // The stalled holder wakes up: its fenced record write must fail and change nothing.
    cluster.replicas[stalled].server.process.signal(Signal::SIGCONT);
    let woke =
        tokio::time::timeout(Duration::from_secs(20), stalled_call).await.expect("stalled call ends").expect("task");
    if let Ok(response) = &woke {
        assert_eq!(response.get_ref().workspace_id, workspace_id, "{response:?}");
    }
    let after = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    assert_eq!((after.node_id.as_deref(), after.generation), (Some(live_node.as_str()), record.generation));
    assert_eq!(cluster.workspace_dirs(), expected, "{}", cluster.logs(40));
    let ran = cluster.replicas[stalled].server.exec(&workspace_id, &["sh", "-c", "echo ok"]).await;
    assert_eq!(ran.expect("exec through the woken replica").stdout, b"ok\n");
}

/// The threads of process `pid` now (`Threads:` of `/proc/<pid>/status`).
fn threads_of(pid: u32) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read the node's /proc status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("Threads:"))
        .and_then(|count| count.trim().parse().ok())
        .expect("a Threads line")
}

/// 200 concurrent first sessions of distinct agents on one node: each gets a workspace of
/// its own, while the node provisions `--max-concurrent-provisions` of them at a time. Idle
/// blocking-pool threads stay ten seconds, so the count right after the storm shows what it
/// needed: unbounded, the node started a thread per provision in flight (~200 more here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_distinct_first_sessions_provisions_a_bounded_number_at_once() {
    const CALLS: usize = 200;
    const SLOTS: usize = 2;
    let mut config = ClusterConfig::on_shared_etcd(1, 1);
    config.node_flags = vec!["--max-concurrent-provisions".into(), SLOTS.to_string()];
    let cluster = Cluster::start(config).await.expect("cluster");
    let node = cluster.nodes[0].server.pid();
    let before = threads_of(node);

    let handles = spawn_creates(&cluster, CALLS, "alice", |index| format!("agent-{index}"));
    let mut workspace_ids = BTreeSet::new();
    for handle in handles {
        let (_, session, _) = handle.await.expect("create task");
        let session = session.unwrap_or_else(|status| panic!("create: {status:?}\n{}", cluster.logs(30)));
        workspace_ids.insert(session.workspace_id);
    }
    let after = threads_of(node);

    assert_eq!(workspace_ids.len(), CALLS, "one workspace per agent");
    assert_eq!(cluster.workspace_dirs().len(), CALLS, "one directory per workspace on the node's disk");
    // Each slot's provision makes a few trips to the blocking pool, and a thread that just
    // finished one is not always idle again when the next trip starts: a few per slot.
    assert!(
        after <= before + 8 * SLOTS,
        "the node went from {before} to {after} threads for {CALLS} provisions, {SLOTS} at a time"
    );
}

/// Provisions beyond a node's `--max-concurrent-provisions` wait their turn in
/// `berth_node_agent_provisions_waiting`: with one slot, each provision holding it for the
/// debug delay, two of three distinct first sessions are seen waiting, and none once all
/// three are answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisions_waiting_for_a_slot_are_counted_until_their_turn() {
    const DEADLINE: Duration = Duration::from_secs(30);
    let metrics = berth_tests::process::free_port().expect("port");
    let mut config = ClusterConfig::on_shared_etcd(1, 1);
    config.node_flags = vec![
        "--metrics-listen".into(),
        format!("127.0.0.1:{metrics}"),
        "--max-concurrent-provisions".into(),
        "1".into(),
        "--debug-provision-delay".into(),
        "3s".into(),
    ];
    let cluster = Cluster::start(config).await.expect("cluster");
    let waiting = || async {
        let scraped = berth_tests::observe::scrape(metrics).await.ok()?;
        scraped.value("berth_node_agent_provisions_waiting", &[("backend", "local")])
    };

    let handles = spawn_creates(&cluster, 3, "alice", |index| format!("agent-{index}"));
    let seen = wait_for(DEADLINE, || async { waiting().await.filter(|count| *count == 2.0) }).await;
    assert_eq!(seen, Some(2.0), "two provisions wait while the third holds the one slot");
    for handle in handles {
        let (_, session, _) = handle.await.expect("create task");
        session.unwrap_or_else(|status| panic!("create: {status:?}\n{}", cluster.logs(30)));
    }
    assert_eq!(waiting().await, Some(0.0), "none waits once every provision has run");
}
