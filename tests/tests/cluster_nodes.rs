//! Node liveness with real processes: a killed node is seen gone by every replica and its
//! workspaces move on the next access; a node whose replica dies keeps its lease; a node
//! that lost its lease (paused past the TTL) fences itself, registers again and drops the
//! copies that moved meanwhile.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use berth_proto::v1;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use berth_testkit::wait_until;
use berth_tests::cluster::{Cluster, ClusterConfig};
use nix::sys::signal::Signal;

/// The harness's node lease TTL ([`ClusterConfig::new`]).
const NODE_LEASE_TTL: Duration = Duration::from_secs(3);

/// Creates workspaces (one per agent) round-robin over the replicas until every node holds
/// at least one; returns node id -> workspace ids, from the records in etcd.
async fn workspaces_on_every_node(cluster: &Cluster, user: &str) -> BTreeMap<String, Vec<String>> {
    let registry = cluster.registry().await;
    let mut placed: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for index in 0..16 {
        let replica = &cluster.replicas[index % cluster.replicas.len()].server;
        let session = replica.create_session(user, &format!("agent-{index}")).await;
        let session = session.unwrap_or_else(|status| panic!("create: {status:?}\n{}", cluster.logs(30)));
        let record = cluster.workspace_record(registry.as_ref(), &session.workspace_id).await.expect("read");
        let node = record.and_then(|record| record.node_id).expect("placed");
        placed.entry(node).or_default().push(session.workspace_id);
        if placed.len() == cluster.nodes.len() {
            return placed;
        }
    }
    panic!("placement never used every node: {placed:?}\n{}", cluster.logs(30));
}

/// True when every live replica no longer lists `node_id` and reports every workspace in
/// `workspaces` as `state`.
async fn all_replicas_see(cluster: &Cluster, node_id: &str, workspaces: &[String], state: v1::WorkspaceState) -> bool {
    for replica in cluster.live_replicas() {
        match replica.server.list_nodes().await {
            Ok(nodes) if nodes.iter().all(|node| node.node_id != node_id) => {}
            _ => return false,
        }
        for workspace_id in workspaces {
            if replica.server.workspace_state(workspace_id).await.ok() != Some(state) {
                return false;
            }
        }
    }
    true
}

/// A SIGKILLed node: within its lease TTL + 2 s every replica reports it gone and its
/// workspaces LOST; the next Exec re-places each on the other node at a higher generation.
/// When the node comes back, the copies that moved are removed from its disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_is_seen_gone_and_its_workspaces_move_on_next_exec() {
    let mut cluster = Cluster::start(ClusterConfig::on_shared_etcd(3, 2)).await.expect("cluster");
    let registry = cluster.registry().await;
    let placed = workspaces_on_every_node(&cluster, "dave").await;
    let victim_index = 0;
    let victim = cluster.nodes[victim_index].id.clone();
    let survivor = cluster.nodes[1].id.clone();
    let moved = placed[&victim].clone();
    let mut old_generations = BTreeMap::new();
    for workspace_id in &moved {
        let record = cluster.workspace_record(registry.as_ref(), workspace_id).await.expect("read").expect("record");
        old_generations.insert(workspace_id.clone(), record.generation);
    }

    cluster.nodes[victim_index].server.kill();
    let killed_at = Instant::now();
    let bound = NODE_LEASE_TTL + Duration::from_secs(2);
    let seen = wait_until(bound, || all_replicas_see(&cluster, &victim, &moved, v1::WorkspaceState::Lost)).await;
    let elapsed = killed_at.elapsed();
    assert!(seen, "after {elapsed:?} not every replica shows {victim} gone and {moved:?} LOST\n{}", cluster.logs(30));

    for (index, workspace_id) in moved.iter().enumerate() {
        let replica = &cluster.replicas[index % cluster.replicas.len()];
        let ran = replica.server.exec(workspace_id, &["sh", "-c", "echo moved"]).await;
        let ran = ran.unwrap_or_else(|status| panic!("exec on a LOST workspace: {status:?}\n{}", cluster.logs(30)));
        assert_eq!((ran.exit_code, ran.stdout.as_slice()), (0, b"moved\n".as_slice()));
        let old_generation = old_generations[workspace_id];
        for replica in &cluster.replicas {
            let moved_here = wait_until(Duration::from_secs(5), || async {
                replica.server.get_workspace(workspace_id).await.is_ok_and(|seen| {
                    seen.state() == v1::WorkspaceState::Ready
                        && seen.node_id == survivor
                        && seen.generation > old_generation
                })
            })
            .await;
            assert!(
                moved_here,
                "{} reports {:?} for {workspace_id} (was generation {old_generation} on {victim})",
                replica.id,
                replica.server.get_workspace(workspace_id).await
            );
        }
    }

    // The node returns with its old copies; they are superseded and must go.
    cluster.restart_node(victim_index).await.expect("restart node");
    let mut expected: Vec<(String, String)> =
        placed.values().flatten().map(|workspace_id| (survivor.clone(), workspace_id.clone())).collect();
    expected.sort();
    let clean = wait_until(Duration::from_secs(10), || async { cluster.workspace_dirs() == expected }).await;
    assert!(clean, "workspace dirs {:?}, expected {expected:?}\n{}", cluster.workspace_dirs(), cluster.logs(30));
}

/// The replica holding a node's heartbeat stream is SIGKILLed: the node reconnects to
/// another replica, which continues the same lease. Polled every 50 ms for twice the lease
/// TTL, no surviving replica ever shows the node gone or its workspace LOST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_keeps_its_lease_when_its_replica_dies() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(3, 2)).await.expect("cluster");
    let registry = cluster.registry().await;
    let session = cluster.replicas[0].server.create_session("erin", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    let record = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    let node_id = record.node_id.clone().expect("placed");
    let before = cluster.node_record(registry.as_ref(), &node_id).await.expect("read").expect("node record");
    let holder = before.replica_id.clone();
    let survivors: Vec<&str> =
        cluster.replicas.iter().map(|replica| replica.id.as_str()).filter(|id| *id != holder).collect();

    cluster.replica(&holder).expect("holder replica").server.kill();
    let killed_at = Instant::now();
    let mut polls = 0;
    let mut holders_seen: BTreeMap<String, String> = BTreeMap::new();
    while killed_at.elapsed() < NODE_LEASE_TTL * 2
        || holders_seen.len() < survivors.len()
        || holders_seen.values().any(|seen| seen == &holder)
    {
        assert!(killed_at.elapsed() < NODE_LEASE_TTL * 4, "no survivor took over {node_id}: {holders_seen:?}");
        for replica in survivors.iter().map(|id| cluster.replica(id).expect("replica")) {
            let nodes = replica.server.list_nodes().await.expect("list nodes on a survivor");
            let Some(node) = nodes.iter().find(|node| node.node_id == node_id) else {
                panic!(
                    "{} showed {node_id} gone {:?} after the kill\n{}",
                    replica.id,
                    killed_at.elapsed(),
                    cluster.logs(30)
                )
            };
            holders_seen.insert(replica.id.clone(), node.replica_id.clone());
            let state = replica.server.workspace_state(&workspace_id).await.expect("get workspace");
            assert_eq!(state, v1::WorkspaceState::Ready, "{} after {:?}", replica.id, killed_at.elapsed());
        }
        polls += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(polls >= 20, "only {polls} polls");
    let after = cluster.node_record(registry.as_ref(), &node_id).await.expect("read").expect("node record");
    assert!(survivors.contains(&after.replica_id.as_str()), "{after:?}");
    assert!(holders_seen.values().all(|seen| seen == &after.replica_id), "{holders_seen:?} vs {after:?}");
    assert_eq!(
        (after.lease_id, after.node_generation),
        (before.lease_id, before.node_generation),
        "the node must continue its lease, not register anew"
    );
    let survivor = cluster.replica(survivors[0]).expect("replica");
    let ran = survivor.server.exec(&workspace_id, &["sh", "-c", "echo still"]).await.expect("exec after failover");
    assert_eq!(ran.stdout, b"still\n");
    let unchanged = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    assert_eq!(unchanged.generation, record.generation, "the workspace never moved");
}

/// Self-fencing: a node agent SIGSTOPped past its lease TTL loses its lease; its workspace
/// moves to the other node on the next access. After SIGCONT the node fences itself (serves
/// nothing on the lapsed lease), registers again with a higher node generation, and removes
/// its now superseded copy before it serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_node_fences_itself_registers_anew_and_drops_moved_copies() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(3, 2)).await.expect("cluster");
    let registry = cluster.registry().await;
    let session = cluster.replicas[0].server.create_session("frank", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    let record = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    let paused_id = record.node_id.clone().expect("placed");
    let paused = cluster.node(&paused_id).expect("node");
    let other_id = cluster.nodes.iter().find(|node| node.id != paused_id).expect("other node").id.clone();
    let before = cluster.node_record(registry.as_ref(), &paused_id).await.expect("read").expect("node record");

    paused.server.process.signal(Signal::SIGSTOP);
    let lost = wait_until(NODE_LEASE_TTL + Duration::from_secs(2), || {
        all_replicas_see(&cluster, &paused_id, std::slice::from_ref(&workspace_id), v1::WorkspaceState::Lost)
    })
    .await;
    if !lost {
        paused.server.process.signal(Signal::SIGCONT);
        panic!("the paused node's lease did not lapse\n{}", cluster.logs(30));
    }
    let ran = cluster.replicas[1].server.exec(&workspace_id, &["sh", "-c", "echo moved"]).await;
    let ran = ran.unwrap_or_else(|status| panic!("exec while the node is paused: {status:?}\n{}", cluster.logs(30)));
    assert_eq!(ran.stdout, b"moved\n");
    let moved = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    assert_eq!(moved.node_id.as_deref(), Some(other_id.as_str()));
    assert!(moved.generation > record.generation);

    let resumed_at = paused.server.log().len();
    paused.server.process.signal(Signal::SIGCONT);
    let registered_anew = wait_until(Duration::from_secs(10), || async {
        let mut all = true;
        for replica in &cluster.replicas {
            let listed = replica.server.list_nodes().await.unwrap_or_default();
            all &= listed.iter().any(|node| node.node_id == paused_id && node.node_generation > before.node_generation);
        }
        all
    })
    .await;
    assert!(registered_anew, "the node did not register with a new generation\n{}", cluster.logs(30));
    let after = cluster.node_record(registry.as_ref(), &paused_id).await.expect("read").expect("node record");
    assert_ne!(after.lease_id, before.lease_id, "a lapsed lease cannot be continued");

    // The directory goes first, then the node logs the removal: wait for both.
    let expected = vec![(other_id.clone(), workspace_id.clone())];
    let dropped = wait_until(Duration::from_secs(10), || async {
        cluster.workspace_dirs() == expected && paused.server.log()[resumed_at..].contains("moved a copy superseded")
    })
    .await;
    assert!(dropped, "workspace dirs {:?}, expected {expected:?}\n{}", cluster.workspace_dirs(), cluster.logs(30));

    // In the paused node's log after SIGCONT: fenced first, then the superseded copy
    // removed, then serving again (the replica names it before the registration answer).
    let log = paused.server.log();
    let resumed = &log[resumed_at..];
    let position = |needle: &str| resumed.find(needle);
    let fenced = position("fenced").unwrap_or_else(|| panic!("no fence after SIGCONT:\n{resumed}"));
    let serving = position("registered again; serving").unwrap_or_else(|| panic!("no re-registration:\n{resumed}"));
    let removed = position("moved a copy superseded").unwrap_or_else(|| panic!("no removal:\n{resumed}"));
    assert!(fenced < removed && removed < serving, "out of order after SIGCONT:\n{resumed}");

    // The node no longer holds the workspace: asked directly at the old generation, it
    // refuses as not provisioned here.
    let mut node_client = WorkspaceServiceClient::new(paused.server.channel());
    let mut request = tonic::Request::new(v1::StatRequest { workspace_id: workspace_id.clone(), path: String::new() });
    request.metadata_mut().insert(berth_proto::meta::GENERATION, record.generation.to_string().parse().expect("ascii"));
    let status = node_client.stat(request).await.expect_err("the superseded copy is gone");
    assert_eq!(
        berth_proto::meta::ErrorKind::of(&status),
        Some(berth_proto::meta::ErrorKind::WrongGeneration),
        "{status:?}"
    );
    let ran = cluster.replicas[2].server.exec(&workspace_id, &["sh", "-c", "echo here"]).await.expect("exec");
    assert_eq!(ran.stdout, b"here\n");
}
