//! The idle sweeper with real processes: one elected replica releases a workspace idle past
//! its TTL; the data stays; the next access brings it back transparently.

use std::time::Duration;

use berth_control_plane::records::StoredState;
use berth_proto::v1;
use berth_testkit::{wait_for, wait_until};
use berth_tests::cluster::{Cluster, ClusterConfig};

/// The log line of a sweep (control-plane/src/sweeper.rs).
const SWEEP_LINE: &str = "workspace idle; runtime released";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_workspace_is_released_by_one_replica_and_wakes_with_its_files() {
    let mut config = ClusterConfig::on_shared_etcd(3, 2);
    config.idle_ttl = "2s";
    let cluster = Cluster::start(config).await.expect("cluster");
    let registry = cluster.registry().await;
    let session = cluster.replicas[0].server.create_session("gina", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    let payload = b"kept across idle\n".to_vec();
    cluster.replicas[1].server.write_file(&workspace_id, "notes/keep.txt", &payload).await.expect("write");
    let ready = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");

    // Idle TTL 2 s, a sweep every 500 ms, access times refreshed every 500 ms: IDLE well
    // within 10 s. Read the IDLE record from etcd itself, so its `changed_by` is the sweep's.
    let idle = wait_for(Duration::from_secs(10), || async {
        let record = cluster.workspace_record(registry.as_ref(), &workspace_id).await.ok().flatten()?;
        (record.state == StoredState::Idle).then_some(record)
    })
    .await
    .unwrap_or_else(|| panic!("{workspace_id} never became IDLE\n{}", cluster.logs(30)));
    assert_eq!(idle.generation, ready.generation, "releasing is not a re-placement");
    assert_eq!(idle.node_id, ready.node_id, "an IDLE workspace keeps its node (its data is there)");
    let sweeper = idle.changed_by.clone();
    assert!(cluster.replica(&sweeper).is_some(), "changed_by {sweeper:?} names no replica");
    for replica in &cluster.replicas {
        let idle_here = wait_until(Duration::from_secs(5), || async {
            replica.server.workspace_state(&workspace_id).await.ok() == Some(v1::WorkspaceState::Idle)
        })
        .await;
        assert!(idle_here, "{} does not report {workspace_id} IDLE", replica.id);
    }
    // The files stay on the node's disk while no runtime holds them.
    let node = cluster.node(idle.node_id.as_deref().expect("node")).expect("node");
    let on_disk = node.data_dir.join("workspaces").join(&workspace_id).join("notes/keep.txt");
    assert_eq!(std::fs::read(&on_disk).expect("file on disk while IDLE"), payload);

    // The next access, through a replica other than the sweeper, brings it back READY.
    let reader = cluster.replicas.iter().find(|replica| replica.id != sweeper).expect("another replica");
    let back = reader.server.read_file(&workspace_id, "notes/keep.txt").await;
    let back = back.unwrap_or_else(|status| panic!("read after IDLE: {status:?}\n{}", cluster.logs(30)));
    assert_eq!(back, payload);
    let woken = reader.server.get_workspace(&workspace_id).await.expect("get workspace");
    assert_eq!(woken.state(), v1::WorkspaceState::Ready, "{woken:?}");
    assert_eq!(Some(woken.node_id.as_str()), idle.node_id.as_deref(), "it wakes where its data is");
    assert!(woken.generation > idle.generation, "{woken:?}");

    // Exactly one replica swept it: the one the record names, and its log says so with its
    // replica id; no other replica's log mentions a sweep of this workspace.
    let swept_by_sweeper: Vec<String> = cluster
        .replica_log_lines(&sweeper, &workspace_id)
        .into_iter()
        .filter(|line| line.contains(SWEEP_LINE) && line.contains(&format!("replica_id={sweeper}")))
        .collect();
    assert!(!swept_by_sweeper.is_empty(), "{sweeper}'s log has no sweep of {workspace_id}\n{}", cluster.logs(30));
    for replica in cluster.replicas.iter().filter(|replica| replica.id != sweeper) {
        let swept: Vec<String> = cluster
            .replica_log_lines(&replica.id, &workspace_id)
            .into_iter()
            .filter(|line| line.contains(SWEEP_LINE))
            .collect();
        assert!(swept.is_empty(), "{} also swept {workspace_id}: {swept:?}", replica.id);
    }
}
