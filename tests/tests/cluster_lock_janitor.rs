//! A bind lock nobody remembers (issue 13, finding 5): a create whose answer was lost lands
//! after the replica gave up on it, and the lock hangs on the replica's lease. The replica's
//! lock janitor deletes it, so a bind of that workspace goes through within seconds instead
//! of waiting out its whole timeout until the replica restarts.

use std::time::{Duration, Instant};

use berth_control_plane::policy::{IsolationPolicy, assign_workspace_id};
use berth_control_plane::registry::Registry;
use berth_tests::cluster::{Cluster, ClusterConfig};
use berth_workspace::WorkspaceId;
use bytes::Bytes;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_orphaned_lock_of_the_replica_is_reaped_and_the_bind_goes_through() {
    let mut config = ClusterConfig::on_shared_etcd(1, 1);
    config.bind_timeout = "20s";
    let cluster = Cluster::start(config).await.expect("cluster");
    cluster.wait_nodes_listed(1, Duration::from_secs(10)).await.expect("node listed");
    let registry = cluster.registry().await;
    let keys = cluster.keys();
    let replica = &cluster.replicas[0];

    // The replica's lease, from its own record (`/replicas/<id>` hangs on it).
    let replica_record = registry.get(&keys.replica(&replica.id)).await.expect("read").expect("replica record");
    assert_ne!(replica_record.lease, 0, "the replica record is on the replica's lease");

    // What an ambiguous create leaves: the replica's id, a nonce no bind of it remembers,
    // on its lease.
    let workspace_id =
        WorkspaceId::new(assign_workspace_id(IsolationPolicy::PerAgent, "jan", "agent", "")).expect("workspace id");
    let lock_key = keys.lock(&workspace_id);
    let orphan = Bytes::from(format!("{}/00000000deadbeef", replica.id));
    let planted =
        registry.create_if_absent(&lock_key, orphan, replica_record.lease).await.expect("plant").expect("lock free");

    let started = Instant::now();
    let session = replica.server.create_session("jan", "agent").await;
    let elapsed = started.elapsed();
    let session = session.unwrap_or_else(|status| panic!("bind after {elapsed:?}: {status:?}\n{}", cluster.logs(30)));
    assert_eq!(session.workspace_id, workspace_id.as_str());
    assert!(elapsed < Duration::from_secs(10), "the bind waited {elapsed:?} (timeout 20s)\n{}", cluster.logs(30));
    let reaped = cluster.replica_log_lines(&replica.id, &lock_key);
    assert!(
        reaped.iter().any(|line| line.contains("deleted an orphaned bind lock") && line.contains(&planted.to_string())),
        "no janitor line for {lock_key} at create revision {planted}: {reaped:?}"
    );
    println!("bind behind an orphaned lock took {elapsed:?}");
}
