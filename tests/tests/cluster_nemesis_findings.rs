//! Interleavings the randomized fault test (`fault_nemesis`) and its review found, each
//! forced here with real processes: a destroy whose record delete could not commit, a node
//! generation handed out twice, and a node stopped past its lease that runs again.

use std::time::Duration;

use berth_proto::meta::ErrorKind;
use berth_proto::v1;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use berth_testkit::wait_until;
use berth_tests::berth::retry_transient;
use berth_tests::cluster::{Cluster, ClusterConfig};
use berth_tests::proxy::ProxyMode;
use nix::sys::signal::Signal;
use tonic::Code;

/// CloseWorkspace(destroy) removed the files on the node, then the record's delete failed
/// (the replica had lost etcd): the record stayed READY at the same lineage and the next call
/// made the workspace again on the same node, empty, still saying FRESH. Now the record's
/// delete commits first (with a tombstone) and the node's destroy follows; a workspace is
/// either deleted for good or keeps its files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroy_that_cannot_commit_never_leaves_an_empty_workspace_that_says_fresh() {
    let mut config = ClusterConfig::on_shared_etcd(1, 1);
    config.proxy_replica_etcd = true;
    config.node_flags = vec!["--debug-destroy-delay".into(), "4s".into()];
    let cluster = Cluster::start(config).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let workspace_id = replica.create_session("ida", "agent").await.expect("create").workspace_id;
    replica.write_file(&workspace_id, "notes.txt", b"kept").await.expect("write");
    let placed = replica.get_workspace(&workspace_id).await.expect("get");

    let mut client = replica.workspace_client();
    let close = v1::CloseWorkspaceRequest { workspace_id: workspace_id.clone(), destroy: true };
    let destroy = tokio::spawn(async move { client.close_workspace(close).await });
    // The node has removed the files and holds its answer: cut the replica off etcd now.
    let root = cluster.nodes[0].data_dir.join("workspaces").join(&workspace_id);
    let removed = wait_until(Duration::from_secs(10), || {
        let root = root.clone();
        async move { !root.exists() }
    })
    .await;
    assert!(removed, "the node never removed the files\n{}", cluster.logs(20));
    cluster.set_replica_etcd(0, ProxyMode::BlackHole);
    let answer = destroy.await.expect("task");
    cluster.set_replica_etcd(0, ProxyMode::Pass);
    println!("destroy answered {:?}", answer.as_ref().map(|_| ()).map_err(|status| status.code()));

    let registry = cluster.registry().await;
    let record = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read etcd");
    match record {
        None => {
            // Deleted for good: the same id is a new, empty workspace that says so.
            let (again, _) = retry_transient(Duration::from_secs(20), || replica.create_session("ida", "agent")).await;
            assert_eq!(again.expect("create again").workspace_id, workspace_id);
            let fresh = replica.get_workspace(&workspace_id).await.expect("get");
            assert_eq!(fresh.origin(), v1::WorkspaceOrigin::Fresh, "{fresh:?}");
            assert!(fresh.origin_generation > placed.origin_generation, "{fresh:?} vs {placed:?}");
            let read = replica.read_file(&workspace_id, "notes.txt").await;
            assert_eq!(read.map_err(|status| status.code()), Err(Code::NotFound));
        }
        Some(record) => {
            // Not deleted: then it still has its files, or says it lost them.
            let (read, _) =
                retry_transient(Duration::from_secs(20), || replica.read_file(&workspace_id, "notes.txt")).await;
            let now = replica.get_workspace(&workspace_id).await.expect("get");
            let said_so =
                now.origin() == v1::WorkspaceOrigin::RecreatedEmpty && now.origin_generation > placed.origin_generation;
            assert!(
                read.as_deref().ok() == Some(&b"kept"[..]) || said_so,
                "the record survived the destroy (generation {}) but its files did not, and it says {:?} \
                 (origin generation {} as before: {}): {read:?}\n{}",
                record.generation,
                now.origin(),
                now.origin_generation,
                now.origin_generation == placed.origin_generation,
                cluster.logs(30)
            );
        }
    }
}

/// A node SIGSTOPped past its lease serves none of the calls that waited for it when it runs
/// again (the workspace may be placed elsewhere by then). The fence used to rest on the
/// watchdog task running before those calls' tasks (it did, in every run of this test); now
/// every call checks the lease deadline itself, so no task order matters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_stopped_past_its_lease_serves_nothing_when_it_runs_again() {
    let config = ClusterConfig::on_shared_etcd(1, 2);
    let cluster = Cluster::start(config).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let workspace_id = replica.create_session("jo", "agent").await.expect("create").workspace_id;
    replica.write_file(&workspace_id, "old.txt", b"old copy").await.expect("write");
    let placed = replica.get_workspace(&workspace_id).await.expect("get");
    let node = cluster.node(&placed.node_id).expect("node");

    node.server.process.signal(Signal::SIGSTOP);
    let gone = wait_until(Duration::from_secs(15), || async {
        replica.list_nodes().await.is_ok_and(|nodes| nodes.iter().all(|listed| listed.node_id != node.id))
    })
    .await;
    assert!(gone, "{} still listed", node.id);
    // Calls as a replica with a stale route would send them, queued while the node sleeps.
    let mut probes = Vec::new();
    for _ in 0..8 {
        let mut client = WorkspaceServiceClient::new(node.server.channel());
        let mut request = tonic::Request::new(v1::ReadFileRequest {
            workspace_id: workspace_id.clone(),
            path: "old.txt".into(),
            chunk_size: 0,
        });
        request
            .metadata_mut()
            .insert(berth_proto::meta::GENERATION, placed.generation.to_string().parse().expect("ascii"));
        probes.push(tokio::spawn(async move {
            let mut stream = client.read_file(request).await?.into_inner();
            let mut data = Vec::new();
            while let Some(chunk) = futures::StreamExt::next(&mut stream).await {
                data.extend(chunk?.data);
            }
            Ok::<_, tonic::Status>(data)
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    node.server.process.signal(Signal::SIGCONT);
    for probe in probes {
        match probe.await.expect("probe task") {
            Ok(data) => {
                panic!("a node past its lease served {:?}\n{}", String::from_utf8_lossy(&data), cluster.logs(20))
            }
            Err(status) => {
                assert_eq!(ErrorKind::of(&status), Some(ErrorKind::NodeFenced), "{status:?}");
                // Nothing ran, so a client may repeat the call (a restarted node answers this
                // until its registration is acknowledged, which a replica can route to first).
                assert!(
                    berth_proto::meta::is_retryable(&status),
                    "a fenced refusal is not marked retryable: {status:?}"
                );
            }
        }
    }
}

/// A node killed and started again after its lease ran out got node generation 1 again:
/// the replica took the previous generation from its view, which had dropped the node with
/// its lease. Node generations must grow with every new lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_comes_back_after_its_lease_ran_out_gets_a_newer_generation() {
    let config = ClusterConfig::on_shared_etcd(1, 1);
    let mut cluster = Cluster::start(config).await.expect("cluster");
    let registry = cluster.registry().await;
    let node_id = cluster.nodes[0].id.clone();
    let first = cluster.node_record(registry.as_ref(), &node_id).await.expect("etcd").expect("node record");

    cluster.nodes[0].server.kill();
    let lapsed = wait_until(Duration::from_secs(15), || async {
        cluster.node_record(registry.as_ref(), &node_id).await.is_ok_and(|record| record.is_none())
    })
    .await;
    assert!(lapsed, "the node's lease never ran out");
    cluster.restart_node(0).await.expect("restart");
    let again = berth_testkit::wait_for(Duration::from_secs(15), || async {
        cluster.node_record(registry.as_ref(), &node_id).await.ok().flatten()
    })
    .await
    .expect("the node registered again");
    assert!(
        again.node_generation > first.node_generation,
        "node generation {} reused after a lease lapse (was {})",
        again.node_generation,
        first.node_generation
    );
}
