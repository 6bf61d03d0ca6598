//! No silent data loss (issue findings 1, 3 and 4), with real replicas, node agents and
//! etcd: a workspace keeps its files when its node is full, restarting or briefly gone; a
//! workspace deleted while its node was away never serves its files again; a replica that
//! lost its lock cannot release or destroy a newer copy on a node.

use std::time::Duration;

use berth_proto::meta::ErrorKind;
use berth_proto::v1;
use berth_proto::v1::node_agent_service_client::NodeAgentServiceClient;
use berth_testkit::{wait_for, wait_until};
use berth_tests::berth::{cli, retry_transient};
use berth_tests::cluster::{Cluster, ClusterConfig};
use nix::sys::signal::Signal;
use tonic::Code;

/// Waits until no replica lists `node_id` (its lease ran out).
async fn wait_node_gone(cluster: &Cluster, node_id: &str) {
    let gone = wait_until(Duration::from_secs(15), || async {
        cluster
            .listed_nodes()
            .await
            .iter()
            .all(|listed| listed.as_ref().is_some_and(|ids| !ids.iter().any(|id| id == node_id)))
    })
    .await;
    assert!(gone, "{node_id} is still listed\n{}", cluster.logs(30));
}

/// Finding 1: an IDLE workspace on a node at capacity wakes on that node, with its files.
/// Before: the full node was refused, the workspace was re-created empty on the other node,
/// and the full node then deleted the real copy as superseded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_workspace_on_a_full_node_wakes_there_with_its_files() {
    let mut config = ClusterConfig::on_shared_etcd(1, 2);
    config.node_flags = vec!["--capacity".into(), "1".into()];
    let cluster = Cluster::start(config).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let session = replica.create_session("fay", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    replica.write_file(&workspace_id, "notes.txt", b"mine").await.expect("write");
    let placed = replica.get_workspace(&workspace_id).await.expect("get");
    let mut workspaces = replica.workspace_client();
    let close = v1::CloseWorkspaceRequest { workspace_id: workspace_id.clone(), destroy: false };
    workspaces.close_workspace(close).await.expect("close (idle)");
    // The full node's count (1, its idle copy) reaches the replica with the next heartbeats.
    let full = wait_until(Duration::from_secs(10), || async {
        replica
            .list_nodes()
            .await
            .is_ok_and(|nodes| nodes.iter().any(|node| node.node_id == placed.node_id && node.workspaces == 1))
    })
    .await;
    assert!(full, "{} never reported its idle copy", placed.node_id);

    let read = replica.read_file(&workspace_id, "notes.txt").await;
    assert_eq!(read.as_deref().ok(), Some(&b"mine"[..]), "the woken workspace lost its file: {read:?}");
    let woken = replica.get_workspace(&workspace_id).await.expect("get");
    assert_eq!(woken.node_id, placed.node_id, "woken away from its files");
    // Woken with its files: still the files the fresh placement made.
    assert!(woken.generation > placed.generation, "not placed again: {woken:?}");
    assert_eq!(woken.origin(), v1::WorkspaceOrigin::Fresh, "{woken:?}");
    assert_eq!(woken.origin_generation, placed.origin_generation, "{woken:?}");
}

/// Finding 1 (node briefly gone): while the node holding a workspace is not live, the
/// workspace answers a retryable UNAVAILABLE naming the node, for the lost-node grace; the
/// node comes back and the workspace is served there with its files. Before: the first
/// access re-created it empty on the other node and the returning node deleted the files.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_waits_for_its_stopped_node_and_comes_back_with_its_files() {
    let mut config = ClusterConfig::on_shared_etcd(1, 2);
    config.lost_node_grace = "60s";
    let cluster = Cluster::start(config).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let session = replica.create_session("gus", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    replica.write_file(&workspace_id, "notes.txt", b"kept").await.expect("write");
    let placed = replica.get_workspace(&workspace_id).await.expect("get");
    let node = cluster.node(&placed.node_id).expect("node");

    node.server.process.signal(Signal::SIGSTOP);
    wait_node_gone(&cluster, &node.id).await;
    for _ in 0..3 {
        let status = replica.read_file(&workspace_id, "notes.txt").await.expect_err("served without its node");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert!(berth_proto::meta::is_retryable(&status), "not marked retryable: {status:?}");
        assert!(status.message().contains(&node.id), "the reason names the node: {}", status.message());
    }
    node.server.process.signal(Signal::SIGCONT);
    let (read, attempts) =
        retry_transient(Duration::from_secs(30), || replica.read_file(&workspace_id, "notes.txt")).await;
    assert_eq!(read.as_deref().ok(), Some(&b"kept"[..]), "after the node came back: {read:?}\n{}", cluster.logs(30));
    let back = replica.get_workspace(&workspace_id).await.expect("get");
    assert_eq!(back.node_id, node.id, "moved away from its files");
    // Never re-placed: the same copy, still the one made fresh for it.
    assert_eq!(back.generation, placed.generation, "{back:?}");
    assert_eq!(back.origin(), v1::WorkspaceOrigin::Fresh, "{back:?}");
    println!("measured: served again after {attempts} attempt(s) once the node continued");
}

/// Finding 3: a workspace destroyed while its node was stopped; the node comes back; the
/// same user's session creates the workspace of the same id again. Before: the node kept the
/// orphan copy ("bind in flight"), the new workspace started at the same generation and the
/// node adopted the old directory, serving the deleted file. Now: the delete leaves a
/// tombstone, the new workspace is provisioned `fresh` at a newer generation, the old copy is
/// quarantined (listed, restorable) and never served as the workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_deleted_while_its_node_was_away_never_serves_its_files_again() {
    let config = ClusterConfig::on_shared_etcd(1, 1);
    let cluster = Cluster::start(config).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let session = replica.create_session("hal", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    replica.write_file(&workspace_id, "secret.txt", b"deleted data").await.expect("write");
    let node = &cluster.nodes[0];

    node.server.process.signal(Signal::SIGSTOP);
    wait_node_gone(&cluster, &node.id).await;
    let mut workspaces = replica.workspace_client();
    let close = v1::CloseWorkspaceRequest { workspace_id: workspace_id.clone(), destroy: true };
    workspaces.close_workspace(close).await.expect("destroy while the node is away");
    node.server.process.signal(Signal::SIGCONT);
    cluster.wait_nodes_listed(1, Duration::from_secs(20)).await.expect("node back");
    cluster.wait_nodes_serving(Duration::from_secs(20)).await.expect("node serving");

    let (again, _) = retry_transient(Duration::from_secs(20), || replica.create_session("hal", "agent")).await;
    let again = again.expect("create again");
    assert_eq!(again.workspace_id, workspace_id, "the policy gives the same id");
    let read = replica.read_file(&workspace_id, "secret.txt").await;
    assert_eq!(read.as_ref().map_err(|status| status.code()), Err(Code::NotFound), "deleted file served: {read:?}");
    let fresh = replica.get_workspace(&workspace_id).await.expect("get");
    assert_eq!(fresh.origin(), v1::WorkspaceOrigin::Fresh, "{fresh:?}");

    // The old copy is in the quarantine, listed by `berth nodes quarantine` and restorable
    // into the new workspace (an operator's undo), never adopted as it.
    let endpoint = replica.endpoint.clone();
    let listed = wait_for(Duration::from_secs(10), || {
        let (endpoint, node_id, workspace_id) = (endpoint.clone(), node.id.clone(), workspace_id.clone());
        async move {
            let output = cli(&endpoint, &["-o", "json", "nodes", "quarantine", &node_id]);
            let entries: Vec<serde_json::Value> = serde_json::from_slice(&output.stdout).ok()?;
            entries.into_iter().find(|entry| entry["workspace_id"] == workspace_id.as_str())
        }
    })
    .await
    .unwrap_or_else(|| panic!("the old copy is not in the quarantine\n{}", cluster.logs(30)));
    assert!(listed["bytes"].as_u64() >= Some(b"deleted data".len() as u64), "{listed}");
    assert!(listed["generation"].as_u64() < Some(fresh.generation), "{listed} vs {fresh:?}");
    let entry = listed["entry"].as_str().expect("entry name");
    let output = cli(&endpoint, &["-o", "json", "nodes", "quarantine", &node.id, "--restore", entry]);
    assert!(output.status.success(), "restore: {}", String::from_utf8_lossy(&output.stderr));
    let restored: serde_json::Value = serde_json::from_slice(&output.stdout).expect("json");
    let path = restored["path"].as_str().expect("path");
    let back = replica.read_file(&workspace_id, &format!("{path}/secret.txt")).await.expect("restored file");
    assert_eq!(back, b"deleted data");
    // An entry name is never a path.
    let output = cli(&endpoint, &["nodes", "quarantine", &node.id, "--restore", "../state"]);
    assert!(!output.status.success(), "a path as entry was accepted");
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("not found"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A node call as a replica sends it: the generation it expects in `x-berth-generation`.
fn at<T>(message: T, generation: u64) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert(berth_proto::meta::GENERATION, generation.to_string().parse().expect("ascii"));
    request
}

/// Finding 4: the node fences Release, Destroy and Provision by generation. Asked as a
/// replica that lost its lock would ask (an older generation than the node holds), the node
/// refuses with `stale-generation` / `wrong-generation` and the copy stays. Before: Release
/// and Destroy ignored the generation, so the stale replica destroyed the newer copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_refuses_release_destroy_and_provision_from_an_older_generation() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(1, 1)).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let session = replica.create_session("ida", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    replica.write_file(&workspace_id, "keep.txt", b"newer copy").await.expect("write");
    let placed = replica.get_workspace(&workspace_id).await.expect("get");
    let node = &cluster.nodes[0];
    let mut client = NodeAgentServiceClient::new(node.server.channel());
    let stale = placed.generation - 1;

    let destroyed = client.destroy(at(v1::DestroyRequest { workspace_id: workspace_id.clone() }, stale)).await;
    let status = destroyed.expect_err("a stale destroy was obeyed");
    assert_eq!(ErrorKind::of(&status), Some(ErrorKind::StaleGeneration), "{status:?}");
    let released = client.release(at(v1::ReleaseRequest { workspace_id: workspace_id.clone() }, stale)).await;
    let status = released.expect_err("a stale release was obeyed");
    assert_eq!(ErrorKind::of(&status), Some(ErrorKind::WrongGeneration), "{status:?}");
    let provision = v1::ProvisionRequest {
        workspace_id: workspace_id.clone(),
        generation: stale,
        backend: String::new(),
        spec: None,
        fresh: true,
        owner: String::new(),
        ..Default::default()
    };
    let status = client.provision(at(provision, stale)).await.expect_err("a stale provision was obeyed");
    assert_eq!(ErrorKind::of(&status), Some(ErrorKind::StaleGeneration), "{status:?}");

    let read = replica.read_file(&workspace_id, "keep.txt").await;
    assert_eq!(read.as_deref().ok(), Some(&b"newer copy"[..]), "{read:?}");
    let exec = replica.exec(&workspace_id, &["true"]).await.expect("still running");
    assert_eq!(exec.exit_code, 0);
}

/// A provision reads a host root's layout on the host and calls into the sandbox only for
/// what is missing: the parts a tenant removed come back when the workspace is provisioned
/// again, and its own files stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_provision_puts_back_the_layout_a_tenant_removed() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(1, 1)).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let session = replica.create_session("lee", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    replica.write_file(&workspace_id, "keep.txt", b"mine").await.expect("write");
    let removed = replica.exec(&workspace_id, &["sh", "-c", "rm -rf sessions data .mcp"]).await.expect("exec");
    assert_eq!(removed.exit_code, 0, "{removed:?}");
    let placed = replica.get_workspace(&workspace_id).await.expect("get");
    let mut client = NodeAgentServiceClient::new(cluster.nodes[0].server.channel());
    let generation = placed.generation;
    client.release(at(v1::ReleaseRequest { workspace_id: workspace_id.clone() }, generation)).await.expect("release");
    let provision = v1::ProvisionRequest {
        workspace_id: workspace_id.clone(),
        generation,
        backend: String::new(),
        spec: None,
        fresh: false,
        owner: String::new(),
        ..Default::default()
    };
    client.provision(at(provision, generation)).await.expect("provision again");

    let listed = replica
        .exec(
            &workspace_id,
            &["sh", "-c", "cat .mcp; for d in skills data sessions; do test -d $d -a ! -L $d && echo $d; done"],
        )
        .await
        .expect("exec");
    assert_eq!(String::from_utf8_lossy(&listed.stdout), "[]skills\ndata\nsessions\n", "{listed:?}");
    let kept = replica.read_file(&workspace_id, "keep.txt").await.expect("read");
    assert_eq!(kept, b"mine");
}
