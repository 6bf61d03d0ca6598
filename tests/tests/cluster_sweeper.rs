//! The idle sweeper never idles a workspace in use (issue 13, finding 7): an exec running
//! longer than the idle TTL keeps its workspace READY, and a workspace its node has not
//! reported yet starts counting when the sweeper first sees it, not at the epoch.

use std::time::{Duration, Instant};

use berth_control_plane::records::{self, Origin, RECORD_VERSION, StoredState, WorkspaceRecord};
use berth_control_plane::registry::Registry;
use berth_proto::v1::contract_service_client::ContractServiceClient;
use berth_proto::v1::{self, mcp_server};
use berth_testkit::wait_for;
use berth_tests::cluster::{Cluster, ClusterConfig};
use berth_workspace::WorkspaceId;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_longer_than_the_idle_ttl_completes_and_the_workspace_stays_ready() {
    let mut config = ClusterConfig::on_shared_etcd(2, 1);
    config.idle_ttl = "1s";
    let cluster = Cluster::start(config).await.expect("cluster");
    let registry = cluster.registry().await;
    let session = cluster.replicas[0].server.create_session("ivan", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    let ready = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    assert_eq!(ready.state, StoredState::Ready);

    // Four times the TTL; a sweep runs every 500 ms meanwhile.
    let started = Instant::now();
    let result = cluster.replicas[1].server.exec(&workspace_id, &["sleep", "4"]).await;
    let result = result.unwrap_or_else(|status| panic!("exec: {status:?}\n{}", cluster.logs(40)));
    assert_eq!(result.exit_code, 0, "{result:?}\n{}", cluster.logs(40));
    assert!(started.elapsed() >= Duration::from_secs(4), "the exec ran its course");

    // Still READY at the same generation: never released (a release and wake would have
    // bumped the generation).
    let after = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    assert_eq!(after.state, StoredState::Ready, "idled while an exec ran: {after:?}\n{}", cluster.logs(40));
    assert_eq!(after.generation, ready.generation, "{after:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_its_node_has_not_reported_is_idled_only_a_ttl_after_first_seen() {
    let mut config = ClusterConfig::on_shared_etcd(1, 1);
    config.idle_ttl = "3s";
    let cluster = Cluster::start(config).await.expect("cluster");
    cluster.wait_nodes_listed(1, Duration::from_secs(10)).await.expect("node listed");
    let registry = cluster.registry().await;

    // A READY record on a live node that does not have the workspace: its node never
    // reports it, and the record carries no usable time (written long ago).
    let workspace_id = WorkspaceId::new("ws-unreported-0001").expect("id");
    let record = WorkspaceRecord {
        version: RECORD_VERSION,
        id: workspace_id.clone(),
        owner: "ivan".into(),
        agent: "agent".into(),
        policy: Default::default(),
        backend: "local".into(),
        spec: Default::default(),
        state: StoredState::Ready,
        node_id: Some(cluster.nodes[0].id.clone()),
        generation: 1,
        created_at_ms: 0,
        updated_at_ms: 0,
        failure: None,
        changed_by: "test".into(),
        shared_with: Vec::new(),
        origin: Origin::Fresh,
        origin_generation: 1,
        snapshot: None,
    };
    let planted_at = Instant::now();
    registry.put(&cluster.keys().workspace(&workspace_id), records::encode(&record)).await.expect("plant");

    let idled_after = wait_for(Duration::from_secs(15), || async {
        let record = cluster.workspace_record(registry.as_ref(), workspace_id.as_str()).await.ok().flatten()?;
        (record.state == StoredState::Idle).then(|| planted_at.elapsed())
    })
    .await
    .unwrap_or_else(|| panic!("{workspace_id} never became IDLE\n{}", cluster.logs(30)));
    assert!(
        idled_after >= Duration::from_secs(3),
        "idled {idled_after:?} after it appeared, before one idle TTL (3s)\n{}",
        cluster.logs(30)
    );
    println!("unreported workspace idled {idled_after:?} after it appeared (ttl 3s)");
}

/// A workspace whose MCP server has a live client is in use: the sweeper leaves it READY
/// however long ago the last call was (the pool closes idle clients on its own timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workspace_with_a_live_mcp_client_is_not_idled() {
    let mut config = ClusterConfig::on_shared_etcd(1, 1);
    config.idle_ttl = "1s";
    let cluster = Cluster::start(config).await.expect("cluster");
    let registry = cluster.registry().await;
    let replica = &cluster.replicas[0].server;
    let session = replica.create_session("mona", "agent").await.expect("create");
    let workspace_id = session.workspace_id;

    let fixture = std::fs::read(berth_testkit::mcp_fixture::binary()).expect("fixture binary");
    replica.write_file(&workspace_id, berth_testkit::mcp_fixture::INSTALL_PATH, &fixture).await.expect("write");
    let made = replica.exec(&workspace_id, &["chmod", "0755", berth_testkit::mcp_fixture::INSTALL_PATH]).await;
    assert_eq!(made.expect("chmod").exit_code, 0);
    let mut contract = ContractServiceClient::new(replica.channel());
    let stdio = v1::McpStdio { command: berth_testkit::mcp_fixture::INSTALL_PATH.into(), ..Default::default() };
    let server = v1::McpServer { name: "echo".into(), transport: Some(mcp_server::Transport::Stdio(stdio)) };
    let request = v1::AddMcpRequest { workspace_id: workspace_id.clone(), server: Some(server), replace: true };
    contract.add_mcp(request).await.expect("add mcp");
    let call = v1::CallMcpToolRequest {
        workspace_id: workspace_id.clone(),
        server: "echo".into(),
        tool: "echo".into(),
        arguments_json: r#"{"text":"hi"}"#.into(),
        timeout_ms: 20_000,
    };
    contract.call_mcp_tool(call).await.expect("call: the client is live now");
    let ready = cluster.workspace_record(registry.as_ref(), &workspace_id).await.expect("read").expect("record");
    let node_id = ready.node_id.clone().expect("placed");

    // Wait until the node's own reports show the workspace unused for three TTLs: a sweep
    // runs every 500 ms, so the sweeper judged it several times meanwhile.
    let outcome = wait_for(Duration::from_secs(20), || async {
        let record = cluster.workspace_record(registry.as_ref(), &workspace_id).await.ok().flatten()?;
        if record.state != StoredState::Ready || record.generation != ready.generation {
            return Some(Err(Box::new(record)));
        }
        let node = cluster.node_record(registry.as_ref(), &node_id).await.ok().flatten()?;
        let reported = node.workspace_use.get(&workspace_id)?;
        let unused_ms = reported.idle_at_report_ms(node.last_heartbeat_ms);
        (unused_ms >= 3_000).then_some(Ok(unused_ms))
    })
    .await
    .unwrap_or_else(|| panic!("the node never reported {workspace_id} unused for 3s\n{}", cluster.logs(30)));
    let unused_ms =
        outcome.unwrap_or_else(|record| panic!("idled with a live MCP client: {record:?}\n{}", cluster.logs(30)));
    println!("READY with a live MCP client after {unused_ms} ms unused (ttl 1s)");
}
