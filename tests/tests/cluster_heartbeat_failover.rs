//! The node <-> replica heartbeat path under partial failures (issue 13, findings 2, 6, 8),
//! with real processes and TCP proxies:
//! - a replica that loses etcd closes its streams and the node continues its lease on
//!   another replica within about two heartbeat intervals, never fenced;
//! - the node obeys the TTL etcd reports for its lease, not a replica's flag, and stops
//!   serving before its key can vanish;
//! - a fenced node registers with the next replica;
//! - a node registering again removes its superseded copies before it serves.

use std::path::Path;
use std::time::{Duration, Instant};

use berth_testkit::wait_until;
use berth_tests::berth::BerthProcess;
use berth_tests::berth::DEFAULT_LOG_FILTER;
use berth_tests::cluster::{Cluster, ClusterConfig, Node, socket_address, start_node_agent};
use berth_tests::proxy::{Proxy, ProxyMode};
use nix::sys::signal::Signal;

/// The harness's node lease TTL and heartbeat interval ([`ClusterConfig::new`]).
const NODE_LEASE_TTL: Duration = Duration::from_secs(3);
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(500);

/// (a) Finding 2. The replica holding the node's stream loses etcd (black hole): it cannot
/// keep the node's lease alive, so it closes the stream and the node continues the same
/// lease on the other replica within about two heartbeat intervals. The node is never
/// fenced: its workspace answers exec throughout, its lease id and node generation stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_leaves_a_replica_that_lost_etcd_without_being_fenced() {
    let mut config = ClusterConfig::on_shared_etcd(2, 1);
    config.proxy_replica_etcd = true;
    let cluster = Cluster::start(config).await.expect("cluster");
    let registry = cluster.registry().await;
    let node = &cluster.nodes[0];
    let before = cluster.node_record(registry.as_ref(), &node.id).await.expect("read").expect("node record");
    let holder = cluster.replicas.iter().position(|replica| replica.id == before.replica_id).expect("holder");
    let other = 1 - holder;
    let session = cluster.replicas[other].server.create_session("hb-a", "agent").await.expect("create");
    let workspace_id = session.workspace_id;

    cluster.set_replica_etcd(holder, ProxyMode::BlackHole);
    let cut_at = Instant::now();
    let mut moved_after = None;
    let mut execs = 0;
    // Watch for two lease TTLs: the node must move, and nothing may fence it meanwhile.
    while cut_at.elapsed() < NODE_LEASE_TTL * 2 {
        let ran = cluster.replicas[other].server.exec(&workspace_id, &["true"]).await;
        if let Err(status) = ran {
            panic!("exec failed {:?} after the cut: {status:?}\n{}", cut_at.elapsed(), cluster.logs(30));
        }
        execs += 1;
        let record = cluster.node_record(registry.as_ref(), &node.id).await.expect("read");
        let Some(record) = record else {
            panic!("the node's key vanished {:?} after the cut\n{}", cut_at.elapsed(), cluster.logs(30));
        };
        if moved_after.is_none() && record.replica_id == cluster.replicas[other].id {
            moved_after = Some(cut_at.elapsed());
        }
        if moved_after.is_some() {
            assert_eq!(
                (record.lease_id, record.node_generation),
                (before.lease_id, before.node_generation),
                "the node must continue its lease on the other replica"
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let moved_after = moved_after.unwrap_or_else(|| panic!("the node never moved\n{}", cluster.logs(30)));
    println!("failover after the replica lost etcd: {moved_after:?} ({execs} execs, all answered)");
    let bound = HEARTBEAT_INTERVAL * 2 + Duration::from_millis(1500);
    assert!(moved_after <= bound, "the node moved after {moved_after:?}, bound {bound:?}\n{}", cluster.logs(30));
    let log = node.server.log();
    assert!(!log.contains("fenced"), "the node was fenced:\n{}", node.server.process.log_tail(30));
}

/// (b) Finding 8. The node obeys the TTL etcd answers for its lease, with a margin, not the
/// `--node-lease-ttl` of the replica it heartbeats to. The node registers with a replica
/// granting 3 s leases, then moves to one whose flag says 20 s (it continues the 3 s lease),
/// then loses every replica. Polled every 50 ms, it must stop serving before its key
/// vanishes from etcd, and never serve once the key is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_obeys_the_ttl_etcd_reports_not_the_replica_flag() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(1, 0)).await.expect("cluster");
    let registry = cluster.registry().await;
    let long_ttl = BerthProcess::start(
        "replica-long-ttl",
        [
            "control-plane",
            "--etcd",
            &cluster.config.etcd_endpoints.join(","),
            "--replica-id",
            "replica-long-ttl",
            "--key-prefix",
            &cluster.prefix,
            "--replica-lease-ttl",
            "3s",
            "--node-lease-ttl",
            "20s",
            "--heartbeat-interval",
            "500ms",
            "--isolation",
            "per-agent",
        ]
        .map(str::to_owned)
        .to_vec(),
    )
    .await
    .expect("long-ttl replica");
    let short_proxy =
        Proxy::start(socket_address(&cluster.replicas[0].server.endpoint).expect("address")).await.expect("proxy");
    let long_proxy = Proxy::start(socket_address(&long_ttl.endpoint).expect("address")).await.expect("proxy");
    // First registration at the 3 s replica only.
    long_proxy.set_mode(ProxyMode::Reset);
    let data_dir = tempfile::tempdir().expect("tempdir");
    let node = start_node("node-ttl", &format!("{},{}", short_proxy.url(), long_proxy.url()), data_dir.path())
        .await
        .expect("node");
    let registered = wait_until(Duration::from_secs(20), || async { node.is_serving().await }).await;
    assert!(registered, "node never served\n{}", node.server.process.log_tail(30));
    let first = cluster.node_record(registry.as_ref(), &node.id).await.expect("read").expect("node record");
    assert_eq!(first.replica_id, cluster.replicas[0].id);

    // Move it to the 20 s replica.
    long_proxy.set_mode(ProxyMode::Pass);
    short_proxy.set_mode(ProxyMode::Reset);
    let moved = wait_until(Duration::from_secs(10), || async {
        cluster
            .node_record(registry.as_ref(), &node.id)
            .await
            .ok()
            .flatten()
            .is_some_and(|record| record.replica_id == "replica-long-ttl")
    })
    .await;
    assert!(moved, "node did not move\n{}\n{}", node.server.process.log_tail(30), long_ttl.process.log_tail(30));
    let second = cluster.node_record(registry.as_ref(), &node.id).await.expect("read").expect("node record");
    assert_eq!(second.lease_id, first.lease_id, "the lease is continued, so its TTL stays 3 s");
    assert!(node.is_serving().await);

    // Cut the node off every replica; the 3 s lease runs out.
    long_proxy.set_mode(ProxyMode::BlackHole);
    let cut_at = Instant::now();
    let mut stopped_serving = None;
    loop {
        let serving = node.is_serving().await;
        let key_present = cluster.node_record(registry.as_ref(), &node.id).await.expect("read").is_some();
        if !serving && stopped_serving.is_none() {
            stopped_serving = Some(cut_at.elapsed());
        }
        if !key_present {
            let vanished = cut_at.elapsed();
            println!("node stopped serving {stopped_serving:?} after the cut; its key vanished after {vanished:?}");
            assert!(
                !serving && stopped_serving.is_some(),
                "the node still served when its key vanished ({vanished:?} after the cut)\n{}",
                node.server.process.log_tail(30)
            );
            break;
        }
        assert!(cut_at.elapsed() < NODE_LEASE_TTL * 3, "the node's key never vanished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Serving again only after a registration: still cut off, it stays fenced.
    assert!(!node.is_serving().await);
}

/// (d) Finding 6, node part. A node paused past its lease TTL loses its workspace to the
/// other node. After SIGCONT it registers again; polled every 20 ms, it never serves while
/// the superseded copy is still on its disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_registering_again_removes_superseded_copies_before_it_serves() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(2, 2)).await.expect("cluster");
    let registry = cluster.registry().await;
    let session = cluster.replicas[0].server.create_session("hb-d", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    let record = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    let paused_id = record.node_id.clone().expect("placed");
    let paused = cluster.node(&paused_id).expect("node");
    let copy = paused.data_dir.join("workspaces").join(&workspace_id);
    assert!(copy.exists());

    paused.server.process.signal(Signal::SIGSTOP);
    let gone = wait_until(NODE_LEASE_TTL + Duration::from_secs(3), || async {
        cluster.node_record(registry.as_ref(), &paused_id).await.ok().is_some_and(|record| record.is_none())
    })
    .await;
    if !gone {
        paused.server.process.signal(Signal::SIGCONT);
        panic!("the paused node's lease did not lapse\n{}", cluster.logs(30));
    }
    let ran = cluster.replicas[1].server.exec(&workspace_id, &["true"]).await;
    if let Err(status) = ran {
        paused.server.process.signal(Signal::SIGCONT);
        panic!("exec while the node is paused: {status:?}\n{}", cluster.logs(30));
    }

    let log_before = paused.server.log().len();
    paused.server.process.signal(Signal::SIGCONT);
    let resumed_at = Instant::now();
    let mut polls = 0;
    loop {
        let serving = paused.is_serving().await;
        // Checked after `serving`: a copy present now was present when the node answered.
        let copy_present = copy.exists();
        assert!(
            !(serving && copy_present),
            "the node serves {:?} after SIGCONT while its superseded copy is still on disk\n{}",
            resumed_at.elapsed(),
            paused.server.process.log_tail(30)
        );
        polls += 1;
        if serving && !copy_present {
            break;
        }
        assert!(resumed_at.elapsed() < Duration::from_secs(15), "the node never served again\n{}", cluster.logs(30));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!("served again {:?} after SIGCONT ({polls} polls), copy removed first", resumed_at.elapsed());
    // The window between lifting the fence and removing the copy can be shorter than a
    // poll; the node's log orders the two exactly.
    let logged = wait_until(Duration::from_secs(5), || async {
        let log = paused.server.log();
        log[log_before..].contains("registered again; serving")
    })
    .await;
    let log = paused.server.log();
    let resumed = &log[log_before..];
    assert!(logged, "no re-registration after SIGCONT:\n{resumed}");
    let removed = resumed.find("moved a copy superseded").unwrap_or_else(|| panic!("no removal:\n{resumed}"));
    let serving = resumed.find("registered again; serving").expect("checked above");
    assert!(removed < serving, "the node served before removing its superseded copy:\n{resumed}");
}

/// Finding 2. A node fenced for a lapsed lease registers again with the *next* replica,
/// not the one it was heartbeating to (which may be the reason it lapsed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_node_registers_with_the_next_replica() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(2, 1)).await.expect("cluster");
    let registry = cluster.registry().await;
    let node = &cluster.nodes[0];
    let before = cluster.node_record(registry.as_ref(), &node.id).await.expect("read").expect("node record");

    node.server.process.signal(Signal::SIGSTOP);
    let gone = wait_until(NODE_LEASE_TTL + Duration::from_secs(3), || async {
        cluster.node_record(registry.as_ref(), &node.id).await.ok().is_some_and(|record| record.is_none())
    })
    .await;
    node.server.process.signal(Signal::SIGCONT);
    assert!(gone, "the paused node's lease did not lapse\n{}", cluster.logs(30));
    let registered = wait_until(Duration::from_secs(10), || async {
        cluster.node_record(registry.as_ref(), &node.id).await.ok().flatten().is_some()
    })
    .await;
    assert!(registered, "the node did not register again\n{}", cluster.logs(30));
    let after = cluster.node_record(registry.as_ref(), &node.id).await.expect("read").expect("node record");
    assert!(after.node_generation > before.node_generation, "{before:?} -> {after:?}");
    assert_ne!(
        after.replica_id,
        before.replica_id,
        "after a fence the node must try the next replica first\n{}",
        node.server.process.log_tail(30)
    );
}

/// `127.0.0.1:port` of `http://127.0.0.1:port`.
/// Starts a node agent outside the cluster's node list, heartbeating to `control_planes`.
async fn start_node(id: &str, control_planes: &str, data_dir: &Path) -> anyhow::Result<Node> {
    start_node_agent(id, control_planes, data_dir, &[], DEFAULT_LOG_FILTER).await
}
