//! Fault tests across hosts: the compose cluster of `deploy/compose/` (3 etcd members, 3
//! replicas, node agents, each its own container on a private network), broken with the
//! docker CLI. Each test brings up its own compose project and tears it down at the end,
//! also on failure (the `ComposeCluster` drop guard). The tests run one at a time (the
//! `compose` test group in `.config/nextest.toml`): each cluster is nine processes.
//!
//! Needs `deploy/compose/build-images.sh` to have built the images (`.ci/run` does).
//! Measurements are printed with `measured:` (visible with `--nocapture`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use berth_proto::meta::ErrorKind;
use berth_proto::v1;
use berth_testkit::{wait_for, wait_until};
use berth_tests::berth::{is_transient, retry_transient};
use berth_tests::compose::{ComposeCluster, ComposeConfig, ComposeReplica, ETCD_SERVICES, REPLICA_SERVICES, docker};
use tokio::sync::Semaphore;

/// How long the test client keeps retrying one call that fails transiently.
const RETRY_WINDOW: Duration = Duration::from_secs(10);

async fn start() -> ComposeCluster {
    let cluster =
        ComposeCluster::start(ComposeConfig::default()).await.unwrap_or_else(|error| panic!("compose up: {error:#}"));
    println!("measured: bring-up of {} (3 nodes) took {:?}", cluster.project, cluster.bring_up);
    cluster
}

/// The node a workspace is placed on, as `replica` reports it.
async fn placement(replica: &ComposeReplica, workspace_id: &str) -> String {
    replica.get_workspace(workspace_id).await.unwrap_or_else(|status| panic!("get {workspace_id}: {status:?}")).node_id
}

/// The hostname of the container a workspace's commands run in: with the `local` backend,
/// the node agent's container, whose hostname is the node id.
async fn runs_on(replica: &ComposeReplica, workspace_id: &str) -> Result<String, tonic::Status> {
    let result = replica.exec(workspace_id, &["hostname"]).await?;
    assert_eq!(result.exit_code, 0, "hostname failed: {}", String::from_utf8_lossy(&result.stderr));
    Ok(String::from_utf8_lossy(&result.stdout).trim().to_owned())
}

/// From nothing to a cluster that serves CreateSession + Exec through every replica; a
/// workspace created through one replica runs the same commands through the others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_bring_up_serves_sessions_and_exec_through_every_replica() {
    let cluster = start().await;
    let nodes = cluster.node_ids().await.expect("node ids");
    for (index, replica) in cluster.replicas.iter().enumerate() {
        let user = format!("user-{index}");
        let session = replica.create_session(&user, "coder", "").await.expect("create session");
        let ran = replica.exec(&session.workspace_id, &["sh", "-c", "echo hello > greeting && cat greeting"]).await;
        let ran = ran.unwrap_or_else(|status| panic!("exec through {}: {status:?}", replica.service));
        assert_eq!((ran.exit_code, ran.stdout.as_slice()), (0, &b"hello\n"[..]));
        for other in &cluster.replicas {
            let read = other.exec(&session.workspace_id, &["cat", "greeting"]).await.expect("exec elsewhere");
            assert_eq!(read.stdout, b"hello\n", "through {}", other.service);
            let host = runs_on(other, &session.workspace_id).await.expect("hostname");
            assert!(nodes.contains(&host), "{host} is not one of the nodes {nodes:?}");
        }
    }
    metrics_of_every_process(&cluster, &nodes).await;
    plaintext_is_refused_everywhere(&cluster, &nodes).await;
}

/// Every listener of the cluster speaks TLS only: gRPC of replicas and nodes, their metrics,
/// etcd's client and peer ports. A plaintext client gets no answer it could use.
async fn plaintext_is_refused_everywhere(cluster: &ComposeCluster, nodes: &[String]) {
    let mut listeners: Vec<(String, u16)> = Vec::new();
    for service in REPLICA_SERVICES {
        listeners.extend([(service.to_owned(), 7070), (service.to_owned(), 9100)]);
    }
    for node in nodes {
        listeners.extend([(node.clone(), 7071), (node.clone(), 9100)]);
    }
    for member in ETCD_SERVICES {
        listeners.extend([(member.to_owned(), 2379), (member.to_owned(), 2380)]);
    }
    for (service, port) in listeners {
        let answer = cluster.plaintext_get(&service, port).await.expect("plaintext probe");
        // etcd (Go) answers "400 Bad Request: client sent an HTTP request to an HTTPS server".
        let refused = answer.is_empty() || answer.starts_with("HTTP/1.0 400") || !answer.starts_with("HTTP/");
        assert!(refused && !answer.contains("_total"), "{service}:{port} answered plaintext: {answer:?}");
    }
    // And a plaintext gRPC client of a replica's published port fails.
    let published = cluster.replicas[0].endpoint.replace("https://", "http://");
    let mut health = tonic_health::pb::health_client::HealthClient::new(berth_tests::berth::channel(&published));
    let checked = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await;
    assert!(checked.is_err(), "plaintext gRPC answered: {checked:?}");
    // etcd refuses a client without a certificate of the cluster CA.
    assert!(cluster.https_get(ETCD_SERVICES[0], 2379, "/metrics", None).await.is_err(), "etcd without client cert");
}

/// The value of the first sample of `series` whose labels contain every one of `labels`.
fn sample(text: &str, series: &str, labels: &[&str]) -> Option<f64> {
    text.lines().filter(|line| !line.starts_with('#')).find_map(|line| {
        let (name_and_labels, value) = line.rsplit_once(' ')?;
        let name = name_and_labels.split('{').next()?;
        (name == series && labels.iter().all(|label| name_and_labels.contains(label))).then(|| value.parse().ok())?
    })
}

/// A scrape of `/metrics` on every replica, node agent and etcd member after the sessions
/// and execs of the bring-up test returns the operator's series with plausible values.
async fn metrics_of_every_process(cluster: &ComposeCluster, nodes: &[String]) {
    let mut execs_on_nodes = 0.0;
    for node in nodes {
        let text = cluster.scrape(node).await.expect("scrape a node agent");
        assert!(text.contains("berth_node_agent_workspaces"), "node {node}:\n{text}");
        execs_on_nodes +=
            sample(&text, "berth_node_agent_exec_duration_seconds_count", &[r#"backend="local""#]).unwrap_or(0.0);
    }
    // Three workspaces, each ran a command through every replica (two each: write and
    // hostname, plus one read through each of the three).
    assert!(execs_on_nodes >= 9.0, "only {execs_on_nodes} execs counted on the node agents");
    for service in REPLICA_SERVICES {
        let text = cluster.scrape(service).await.expect("scrape a replica");
        let expect = |series: &str, labels: &[&str]| {
            sample(&text, series, labels).unwrap_or_else(|| panic!("{service}: no {series}{labels:?} in\n{text}"))
        };
        assert!(expect("berth_control_plane_binds_started_total", &[]) >= 1.0, "{service}: no bind started");
        assert!(expect("berth_control_plane_binds_won_total", &[]) >= 1.0, "{service}: no bind won");
        assert_eq!(expect("berth_control_plane_live_nodes", &[]), nodes.len() as f64, "{service}: live nodes");
        assert!(expect("berth_control_plane_workspaces", &[r#"state="ready""#]) >= 3.0, "{service}: workspaces");
        assert!(expect("berth_control_plane_provision_duration_seconds_count", &[r#"backend="local""#]) >= 1.0);
        assert!(expect("berth_control_plane_etcd_call_duration_seconds_count", &[]) >= 1.0);
    }
    // Heartbeats land on whichever replica holds a node's stream: over all replicas, one
    // stream per node, and a gap measured for each (a heartbeat every 2 s: wait for them).
    let heartbeats = || async {
        let (mut streams, mut gaps) = (0.0, 0.0);
        for service in REPLICA_SERVICES {
            let text = cluster.scrape(service).await.ok()?;
            streams += sample(&text, "berth_control_plane_heartbeat_streams", &[]).unwrap_or(0.0);
            gaps += sample(&text, "berth_control_plane_heartbeat_gap_seconds_count", &[]).unwrap_or(0.0);
        }
        (streams == nodes.len() as f64 && gaps >= nodes.len() as f64).then_some(())
    };
    assert!(
        wait_for(Duration::from_secs(15), heartbeats).await.is_some(),
        "no heartbeat stream and gap per node in the replicas' metrics within 15 s"
    );
    for member in ETCD_SERVICES {
        let text = cluster.scrape(member).await.expect("scrape etcd");
        assert_eq!(sample(&text, "etcd_server_has_leader", &[]), Some(1.0), "{member} has no leader");
    }
}

/// A node agent cut off the network is gone from ListNodes within its lease TTL + 2 s; its
/// workspace answers UNAVAILABLE for the lost-node grace, then is re-created empty on the
/// next access (and says so); reconnected, the node fences itself, registers anew and
/// quarantines its superseded copy, and every replica keeps routing to the new place.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_partitioned_node_is_dropped_its_workspace_moves_and_it_fences_on_return() {
    let cluster = start().await;
    let session = cluster.replicas[0].create_session("partition", "coder", "").await.expect("create");
    let workspace_id = session.workspace_id;
    cluster.replicas[0].exec(&workspace_id, &["sh", "-c", "echo before > marker"]).await.expect("exec");
    let placed = cluster.replicas[0].get_workspace(&workspace_id).await.expect("get workspace");
    let cut_id = placed.node_id.clone();
    let cut_container = cluster.node_container(&cut_id).await.expect("container");
    let network = cluster.network();
    // The probe used after reconnecting, while the node still holds the workspace: served.
    stat_on_node(&cluster, &cut_id, &workspace_id, placed.generation).await.expect("the node serves its workspace");
    // The node fences itself while cut off: its log from here on must show that first.
    let log_before = cluster.container_log(&cut_container).await.len();

    let cut_at = Instant::now();
    docker(&["network", "disconnect", "--force", &network, &cut_container]).await.expect("disconnect");
    let remaining: Vec<String> =
        cluster.node_ids().await.expect("ids").into_iter().filter(|id| *id != cut_id).collect();
    let limit = cluster.config.node_lease_ttl + Duration::from_secs(2);
    let gone = cluster.wait_nodes_listed(&remaining, limit + Duration::from_secs(10)).await;
    let detected = cut_at.elapsed();
    assert!(gone, "{cut_id} still listed {detected:?} after the partition\n{}", cluster.logs(30).await);
    println!("measured: partitioned node gone from every replica's ListNodes after {detected:?} (limit {limit:?})");
    assert!(detected <= limit, "{cut_id} was listed for {detected:?}, more than lease TTL + 2 s ({limit:?})");

    // Next access re-places it (the data stayed on the cut node: the marker is not there).
    let (moved_to, attempts) = retry_transient(RETRY_WINDOW, || runs_on(&cluster.replicas[1], &workspace_id)).await;
    let moved_to = moved_to.unwrap_or_else(|status| panic!("exec after the partition: {status:?}"));
    assert_ne!(moved_to, cut_id, "the workspace still runs on the cut node");
    assert!(remaining.contains(&moved_to), "moved to {moved_to}, not one of {remaining:?}");
    assert_eq!(placement(&cluster.replicas[2], &workspace_id).await, moved_to);
    println!("measured: re-placed on {moved_to} after {attempts} attempt(s)");
    let moved = cluster.replicas[2].get_workspace(&workspace_id).await.expect("get workspace");
    assert_eq!(moved.origin(), v1::WorkspaceOrigin::RecreatedEmpty, "the move did not say the files were lost");
    assert!(moved.origin_reason.contains(&cut_id), "reason names the lost node: {}", moved.origin_reason);

    docker(&["network", "connect", "--alias", &cut_id, &network, &cut_container]).await.expect("reconnect");
    let mut all = cluster.node_ids().await.expect("ids");
    all.sort();
    assert!(
        cluster.wait_nodes_listed(&all, Duration::from_secs(30)).await,
        "the reconnected node did not register again\n{}",
        cluster.logs(30).await
    );
    let dropped = wait_until(Duration::from_secs(20), || async {
        cluster.workspace_dirs(&cut_id).await.is_ok_and(|dirs| !dirs.contains(&workspace_id))
    })
    .await;
    assert!(dropped, "the reconnected node kept its superseded copy\n{}", cluster.logs(30).await);
    let log = cluster.container_log(&cut_container).await;
    let after = &log[log_before.min(log.len())..];
    let fenced = after.find("fenced").unwrap_or_else(|| panic!("no fence after reconnecting:\n{after}"));
    let serving = after.find("registered again; serving").unwrap_or_else(|| panic!("no re-registration:\n{after}"));
    assert!(fenced < serving, "served before fencing:\n{after}");
    assert!(after.contains("moved a copy superseded"), "no quarantine logged:\n{after}");

    // Asked directly, as a replica with a stale route would, the returned node refuses the
    // workspace at the generation it used to hold: that copy is gone.
    let refused = wait_for(Duration::from_secs(10), || async {
        match stat_on_node(&cluster, &cut_id, &workspace_id, placed.generation).await {
            Ok(()) => Some(Err("served".to_owned())),
            Err(status) if ErrorKind::of(&status) == Some(ErrorKind::WrongGeneration) => Some(Ok(())),
            Err(status) if status.code() == tonic::Code::Unavailable => None,
            Err(status) => Some(Err(format!("{status:?}"))),
        }
    })
    .await;
    assert_eq!(refused, Some(Ok(())), "the returned node still answers for the moved workspace");

    // Every replica routes the workspace to its new node, never to the returned one.
    for replica in &cluster.replicas {
        let host = runs_on(replica, &workspace_id).await.expect("exec after reconnect");
        assert_eq!(host, moved_to, "through {}", replica.service);
    }
}

/// Stat of a workspace's root asked of node `node_id` directly, at `generation`, as a
/// replica routing there would.
async fn stat_on_node(
    cluster: &ComposeCluster,
    node_id: &str,
    workspace_id: &str,
    generation: u64,
) -> Result<(), tonic::Status> {
    let mut client =
        cluster.node_client(node_id).await.map_err(|error| tonic::Status::unavailable(error.to_string()))?;
    let mut request = tonic::Request::new(v1::StatRequest { workspace_id: workspace_id.into(), path: String::new() });
    request.metadata_mut().insert(berth_proto::meta::GENERATION, generation.to_string().parse().expect("ascii"));
    request.set_timeout(Duration::from_secs(3));
    client.stat(request).await.map(|_| ())
}

/// One CreateSession of the storm and how it went.
struct StormCall {
    key: String,
    workspace_id: Option<String>,
    attempts: u32,
    error: Option<String>,
}

/// The etcd leader dies during a storm of 300 first sessions — 150 for one (user, agent),
/// so one workspace, and 150 for distinct users — spread over the three replicas (killed
/// after 30 calls finished; the last 200 start after the kill): no call
/// fails once retried within the client's window, and every workspace exists exactly once
/// (counted on the node agents' disks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_etcd_member_killed_during_storm_of_first_sessions() {
    const CALLS: usize = 300;
    const KILL_AFTER: usize = 30;
    const FREE_RUNNING: usize = 100;
    let cluster = start().await;
    let nodes = cluster.node_ids().await.expect("ids");
    let mut before = BTreeSet::new();
    for node in &nodes {
        before.extend(cluster.workspace_dirs(node).await.expect("dirs"));
    }
    let leader = etcd_leader(&cluster).await;

    let done = Arc::new(AtomicUsize::new(0));
    let limit = Arc::new(Semaphore::new(16));
    // Calls from FREE_RUNNING on start only once the member is dead, so that however fast
    // the first ones go, two thirds of the storm meets a cluster missing its leader.
    let (killed_sender, killed) = tokio::sync::watch::channel(false);
    let started = Instant::now();
    let mut tasks = Vec::new();
    for index in 0..CALLS {
        let replica = cluster.replicas[index % 3].clone();
        let (user, key) = if index % 2 == 0 {
            ("storm-shared".to_owned(), "shared".to_owned())
        } else {
            (format!("storm-{index}"), format!("distinct-{index}"))
        };
        let (done, limit, mut killed) = (Arc::clone(&done), Arc::clone(&limit), killed.clone());
        tasks.push(tokio::spawn(async move {
            if index >= FREE_RUNNING {
                killed.wait_for(|killed| *killed).await.expect("killer");
            }
            let _permit = limit.acquire_owned().await.expect("semaphore");
            let session_id = format!("sess-storm-{index}");
            let (outcome, attempts) =
                retry_transient(RETRY_WINDOW, || replica.create_session(&user, "coder", &session_id)).await;
            done.fetch_add(1, Ordering::SeqCst);
            StormCall {
                key,
                workspace_id: outcome.as_ref().ok().map(|session| session.workspace_id.clone()),
                attempts,
                error: outcome.err().map(|status| format!("{:?}: {}", status.code(), status.message())),
            }
        }));
    }
    let killer = {
        let done = Arc::clone(&done);
        let container = cluster.container(&leader).await.expect("leader container");
        tokio::spawn(async move {
            let reached = wait_until(Duration::from_secs(60), || {
                let done = Arc::clone(&done);
                async move { done.load(Ordering::SeqCst) >= KILL_AFTER }
            })
            .await;
            assert!(reached, "the storm stalled before the kill");
            docker(&["kill", &container]).await.expect("kill etcd member");
            // Calls finished by the time the member is surely dead.
            let done_at_kill = done.load(Ordering::SeqCst);
            killed_sender.send_replace(true);
            done_at_kill
        })
    };
    let mut calls = Vec::new();
    for task in tasks {
        calls.push(task.await.expect("storm task"));
    }
    let done_at_kill = killer.await.expect("killer");
    let took = started.elapsed();
    assert!(CALLS - done_at_kill >= CALLS - FREE_RUNNING, "only {} calls ran after the kill", CALLS - done_at_kill);

    let failed: Vec<&StormCall> = calls.iter().filter(|call| call.error.is_some()).collect();
    let retried = calls.iter().filter(|call| call.attempts > 1).count();
    let max_attempts = calls.iter().map(|call| call.attempts).max().unwrap_or(0);
    println!(
        "measured: storm of {CALLS} first sessions, etcd leader {leader} killed after {KILL_AFTER} ({} finished after the kill): {} failed, {retried} retried (max {max_attempts} attempts), took {took:?}",
        CALLS - done_at_kill,
        failed.len()
    );
    assert!(
        failed.is_empty(),
        "{} calls failed after the retry window: {:?}\n{}",
        failed.len(),
        failed.iter().take(5).map(|call| call.error.clone()).collect::<Vec<_>>(),
        cluster.logs(20).await
    );
    let mut by_key: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for call in &calls {
        by_key.entry(&call.key).or_default().insert(call.workspace_id.as_deref().expect("succeeded"));
    }
    let shared = &by_key["shared"];
    assert_eq!(shared.len(), 1, "one (user, agent) got several workspaces: {shared:?}");
    let expected: BTreeSet<&str> = by_key.values().flatten().copied().collect();
    assert_eq!(expected.len(), 1 + CALLS / 2);

    // On the disks: every workspace of the storm exactly once, nothing else new.
    let mut copies: BTreeMap<String, usize> = BTreeMap::new();
    for node in &nodes {
        for dir in cluster.workspace_dirs(node).await.expect("dirs") {
            *copies.entry(dir).or_default() += 1;
        }
    }
    let duplicated: Vec<_> = copies.iter().filter(|(_, count)| **count > 1).collect();
    assert!(duplicated.is_empty(), "workspaces on several nodes: {duplicated:?}");
    let new: BTreeSet<&str> = copies.keys().map(String::as_str).filter(|dir| !before.contains(*dir)).collect();
    assert_eq!(new, expected, "the disks hold other workspaces than the storm got");
}

/// The etcd member that leads, read from each member's /metrics inside its container.
async fn etcd_leader(cluster: &ComposeCluster) -> String {
    let leader = wait_for(Duration::from_secs(20), || async {
        for service in ETCD_SERVICES {
            let metrics = cluster.scrape(service).await.ok()?;
            if metrics.lines().any(|line| line.trim() == "etcd_server_is_leader 1") {
                return Some(service.to_owned());
            }
        }
        None
    })
    .await;
    leader.expect("an etcd leader")
}

/// Steady Exec load while the three replicas restart one at a time (SIGTERM, then start,
/// waiting for each to serve and list every node before the next): a call that fails on
/// one replica succeeds on its single retry through the next one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_rolling_restart_of_replicas_under_exec_load() {
    const CLIENTS: usize = 4;
    let cluster = start().await;
    let mut workspaces = Vec::new();
    for client in 0..CLIENTS {
        let session = cluster.replicas[client % 3].create_session(&format!("rolling-{client}"), "coder", "").await;
        workspaces.push(session.expect("create").workspace_id);
    }
    let nodes = cluster.node_ids().await.expect("ids");

    let stop = Arc::new(AtomicBool::new(false));
    // Calls finished by all clients together, so the test can wait for load after the restarts.
    let finished = Arc::new(AtomicUsize::new(0));
    let mut load = Vec::new();
    for (client, workspace_id) in workspaces.iter().enumerate() {
        let replicas = cluster.replicas.clone();
        let (stop, finished, workspace_id) = (Arc::clone(&stop), Arc::clone(&finished), workspace_id.clone());
        load.push(tokio::spawn(async move {
            // (calls, calls that needed their retry, longest failure window, failures)
            let mut calls = 0usize;
            let mut retried = 0usize;
            let mut worst = Duration::ZERO;
            let mut failures = Vec::new();
            let mut next = client;
            while !stop.load(Ordering::SeqCst) {
                let first = &replicas[next % 3];
                next += 1;
                let began = Instant::now();
                calls += 1;
                let argv = ["sh", "-c", "echo ok"];
                match first.exec(&workspace_id, &argv).await {
                    Ok(result) => assert_eq!(result.stdout, b"ok\n"),
                    Err(status) => {
                        assert!(
                            is_transient(&status) || from_transport(&status),
                            "non-transient failure on {}: {status:?}",
                            first.service
                        );
                        retried += 1;
                        let second = &replicas[next % 3];
                        match second.exec(&workspace_id, &argv).await {
                            Ok(_) => worst = worst.max(began.elapsed()),
                            Err(again) => failures
                                .push(format!("{} then {}: {status:?} / {again:?}", first.service, second.service)),
                        }
                    }
                }
                finished.fetch_add(1, Ordering::SeqCst);
                // Steady load, not a flood: about 50 calls/s per client.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (calls, retried, worst, failures)
        }));
    }

    let started = Instant::now();
    for service in REPLICA_SERVICES {
        let replica = cluster.replicas.iter().find(|replica| replica.service == service).expect("replica").clone();
        let container = cluster.container(service).await.expect("container");
        docker(&["restart", "--time", "10", &container]).await.expect("restart");
        let back = wait_until(Duration::from_secs(30), || async {
            replica.is_serving().await && replica.node_ids().await.as_deref() == Some(nodes.as_slice())
        })
        .await;
        assert!(back, "{service} did not come back\n{}", cluster.logs(30).await);
    }
    // Load on the fully restarted cluster, so a late failure would show: every client
    // finishes a few more calls.
    let after_restarts = finished.load(Ordering::SeqCst);
    let more = wait_until(Duration::from_secs(30), || async {
        finished.load(Ordering::SeqCst) >= after_restarts + 10 * CLIENTS
    })
    .await;
    assert!(more, "the load stalled after the rolling restart");
    stop.store(true, Ordering::SeqCst);
    let mut totals = (0, 0, Duration::ZERO, Vec::new());
    for task in load {
        let (calls, retried, worst, failures) = task.await.expect("load task");
        totals.0 += calls;
        totals.1 += retried;
        totals.2 = totals.2.max(worst);
        totals.3.extend(failures);
    }
    println!(
        "measured: rolling restart took {:?}; {} execs, {} needed their one retry, longest failure window {:?}, {} failed twice",
        started.elapsed(),
        totals.0,
        totals.1,
        totals.2,
        totals.3.len()
    );
    assert!(totals.0 > 50, "too little load to judge: {} calls", totals.0);
    assert!(totals.3.is_empty(), "calls failed on their retry too: {:?}\n{}", totals.3, cluster.logs(30).await);
}

/// A status made on the client side because the connection broke (reset, closed while the
/// call was in flight): the call got no answer, so a client tries it again elsewhere. The
/// server's own statuses carry no transport error as their source.
fn from_transport(status: &tonic::Status) -> bool {
    std::error::Error::source(status).is_some_and(|source| source.is::<tonic::transport::Error>())
}

/// Adding node agents 3 → 5 (node4 and node5, each with its own credential): they register and new workspaces
/// are placed on them (placement prefers the least loaded node).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compose_scaling_node_agents_spreads_new_workspaces() {
    let cluster = start().await;
    for index in 0..6 {
        cluster.replicas[index % 3].create_session(&format!("early-{index}"), "coder", "").await.expect("create");
    }
    let old = cluster.node_ids().await.expect("ids");
    let scaled_at = Instant::now();
    cluster
        .compose(&["--profile", "scale", "up", "--detach", "--no-color", "--no-recreate", "node4", "node5"])
        .await
        .expect("scale");
    let all = cluster.node_ids().await.expect("ids");
    assert_eq!(all.len(), 5);
    assert!(cluster.wait_nodes_listed(&all, Duration::from_secs(30)).await, "{}", cluster.logs(30).await);
    println!("measured: 5 nodes listed by every replica {:?} after scaling", scaled_at.elapsed());
    let new: Vec<&String> = all.iter().filter(|id| !old.contains(id)).collect();

    let mut placed: BTreeMap<String, usize> = BTreeMap::new();
    for index in 0..8 {
        let replica = &cluster.replicas[index % 3];
        let user = format!("late-{index}");
        let (session, _) = retry_transient(RETRY_WINDOW, || replica.create_session(&user, "coder", "")).await;
        let workspace_id = session.expect("create after scaling").workspace_id;
        let (host, _) = retry_transient(RETRY_WINDOW, || runs_on(replica, &workspace_id)).await;
        *placed.entry(host.expect("exec")).or_default() += 1;
    }
    println!("measured: 8 workspaces after scaling placed {placed:?} (new nodes {new:?})");
    for node in new {
        assert!(placed.get(node).copied().unwrap_or(0) >= 1, "no new workspace on new node {node}: {placed:?}");
    }
}
