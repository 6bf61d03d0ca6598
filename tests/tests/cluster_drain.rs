//! Graceful drain with real processes (2 replicas, 2 node agents, real etcd), driven through
//! the `berth` CLI: a drain of a node holding workspaces is refused without `--force` and
//! names them; with it, new sessions land on the other node, an existing workspace's next
//! Exec runs on the other node at a higher generation, the drained node drops its superseded
//! copy, the drain survives a replica restart, `berth status` shows it, and an undrain makes
//! the node eligible again.

use std::time::Duration;

use berth_proto::v1::NodeState;
use berth_testkit::wait_until;
use berth_tests::berth::cli;
use berth_tests::cluster::{Cluster, ClusterConfig};

const DEADLINE: Duration = Duration::from_secs(20);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// True when every live replica lists `node_id` in `state`.
async fn every_replica_lists(cluster: &Cluster, node_id: &str, state: NodeState) -> bool {
    for replica in cluster.live_replicas() {
        let Ok(nodes) = replica.server.list_nodes().await else { return false };
        if !nodes.iter().any(|node| node.node_id == node_id && node.state() == state) {
            return false;
        }
    }
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_node_gets_no_placements_and_its_workspaces_move_on_next_exec() {
    let mut cluster = Cluster::start(ClusterConfig::on_shared_etcd(2, 2)).await.expect("cluster");
    let registry = cluster.registry().await;
    let first = cluster.replicas[0].server.endpoint.clone();

    let session = cluster.replicas[0].server.create_session("alice", "drained").await.expect("create");
    let workspace_id = session.workspace_id.clone();
    let before = cluster.workspace_record(registry.as_ref(), &workspace_id).await.unwrap().expect("record");
    let drained = before.node_id.clone().expect("placed");
    let other = cluster.nodes.iter().map(|node| node.id.clone()).find(|id| *id != drained).expect("second node");

    // Without --force: refused, names the workspace, changes nothing.
    let refused = cli(&cluster.replicas[1].server.endpoint, &["nodes", "drain", &drained]);
    assert!(!refused.status.success(), "drain without --force succeeded: {}", text(&refused.stdout));
    let stderr = text(&refused.stderr);
    assert!(stderr.contains(&workspace_id) && stderr.contains("force"), "refusal does not say what is lost: {stderr}");
    assert!(every_replica_lists(&cluster, &drained, NodeState::Live).await, "a refused drain changed the node");

    // With --force: the workspace is reported released, every replica sees the drain.
    let forced = cli(&cluster.replicas[1].server.endpoint, &["-o", "json", "nodes", "drain", &drained, "--force"]);
    assert!(forced.status.success(), "forced drain failed: {}", text(&forced.stderr));
    let answer: serde_json::Value = serde_json::from_slice(&forced.stdout).expect("json");
    assert_eq!(answer["released"], serde_json::json!([workspace_id]), "{answer}");
    let seen = wait_until(DEADLINE, || every_replica_lists(&cluster, &drained, NodeState::Draining)).await;
    assert!(seen, "replicas do not all list {drained} as draining\n{}", cluster.logs(20));

    // New sessions land on the other node only.
    for index in 0..4 {
        let replica = &cluster.replicas[index % 2].server;
        let session = replica.create_session("bob", &format!("agent-{index}")).await.expect("create after drain");
        let record = cluster.workspace_record(registry.as_ref(), &session.workspace_id).await.unwrap().unwrap();
        assert_eq!(record.node_id.as_deref(), Some(other.as_str()), "session {index} placed on the drained node");
    }

    // The existing workspace's next Exec runs on the other node, at a new generation.
    let result = cluster.replicas[0].server.exec(&workspace_id, &["true"]).await.expect("exec after drain");
    assert_eq!(result.exit_code, 0);
    let after = cluster.workspace_record(registry.as_ref(), &workspace_id).await.unwrap().unwrap();
    assert_eq!(after.node_id.as_deref(), Some(other.as_str()));
    assert!(after.generation > before.generation, "{} -> {}", before.generation, after.generation);
    // The drained node removes its superseded copy (that is the data the drain warned about).
    let removed = wait_until(DEADLINE, || async {
        !cluster.workspace_dirs().iter().any(|(node, name)| *node == drained && *name == workspace_id)
    })
    .await;
    assert!(removed, "the drained node kept its superseded copy: {:?}", cluster.workspace_dirs());

    // The drain lives in etcd, not in a replica: a restarted replica still honours it.
    cluster.restart_replica(1).await.expect("restart replica 1");
    let restarted = cluster.replicas[1].server.endpoint.clone();
    assert!(every_replica_lists(&cluster, &drained, NodeState::Draining).await, "drain lost across a restart");
    let session = cluster.replicas[1].server.create_session("carol", "after-restart").await.expect("create");
    let record = cluster.workspace_record(registry.as_ref(), &session.workspace_id).await.unwrap().unwrap();
    assert_eq!(record.node_id.as_deref(), Some(other.as_str()));

    // `berth status`: replicas, nodes with the drain, workspaces by state, etcd health.
    let status = cli(&restarted, &["-o", "json", "status"]);
    assert!(status.status.success(), "status failed: {}", text(&status.stderr));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status json");
    assert_eq!(status["registry"]["registry"], "etcd");
    assert_eq!(status["registry"]["healthy"], true);
    let replicas: Vec<&str> =
        status["replicas"].as_array().unwrap().iter().filter_map(|r| r["replica_id"].as_str()).collect();
    assert_eq!(replicas, ["replica-0", "replica-1"], "{status}");
    assert_eq!(status["drained_nodes"], serde_json::json!([drained]));
    let drained_state = status["nodes"].as_array().unwrap().iter().find(|node| node["node_id"] == drained.as_str());
    assert_eq!(drained_state.map(|node| node["state"].clone()), Some(serde_json::json!("draining")), "{status}");
    let ready: u64 = status["workspaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|count| count["state"] == "ready")
        .filter_map(|count| count["count"].as_u64())
        .sum();
    assert_eq!(ready, 6, "{status}");
    let screen = cli(&restarted, &["status"]);
    let screen = text(&screen.stdout);
    assert!(screen.contains("etcd healthy") && screen.contains("draining"), "status screen:\n{screen}");

    // Undrain: the node is live again and, being the least loaded, gets the next workspace.
    let undrained = cli(&first, &["nodes", "undrain", &drained]);
    assert!(undrained.status.success(), "undrain failed: {}", text(&undrained.stderr));
    assert!(text(&undrained.stdout).contains("receives workspaces again"));
    let live = wait_until(DEADLINE, || every_replica_lists(&cluster, &drained, NodeState::Live)).await;
    assert!(live, "replicas still list {drained} as draining");
    let mut landed = false;
    for index in 0..4 {
        let session = cluster.replicas[0].server.create_session("dave", &format!("agent-{index}")).await.unwrap();
        let record = cluster.workspace_record(registry.as_ref(), &session.workspace_id).await.unwrap().unwrap();
        landed |= record.node_id.as_deref() == Some(drained.as_str());
    }
    assert!(landed, "no new workspace landed on the undrained node\n{}", cluster.logs(20));
}
