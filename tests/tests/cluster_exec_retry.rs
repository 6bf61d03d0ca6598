//! Exec retry with real processes (issue 13, finding 8): a replica retries an exec after a
//! broken node connection only when the request provably never left; an exec whose
//! connection broke after it reached the node is not run twice.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use berth_testkit::wait_until;
use berth_tests::berth::DEFAULT_LOG_FILTER;
use berth_tests::cluster::{Cluster, ClusterConfig, Node, socket_address, start_node_agent};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// Lines of `file`, 0 when it does not exist.
fn line_count(file: &Path) -> usize {
    std::fs::read_to_string(file).map(|text| text.lines().count()).unwrap_or(0)
}

/// An exec reached the node and ran; then the replica's connection to the
/// node stalled (packets held, so the replica's HTTP/2 keep-alive gives up with
/// UNAVAILABLE). The replica must not run the exec again: the client gets UNKNOWN ("may have
/// run"), and the exec's side effect happened once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_that_may_have_run_is_not_retried() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(1, 0)).await.expect("cluster");
    let stall = StallProxy::start().await.expect("stall proxy");
    let data_dir = tempfile::tempdir().expect("tempdir");
    let endpoints = cluster.replica_endpoints().join(",");
    let node = start_node("node-exec", &endpoints, data_dir.path(), &stall).await.expect("node");
    cluster.wait_nodes_listed(1, Duration::from_secs(20)).await.expect("listed");
    assert!(wait_until(Duration::from_secs(20), || node.is_serving()).await, "node never served");
    let replica = &cluster.replicas[0].server;
    let session = replica.create_session("hb-c", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    let marker = data_dir.path().join("workspaces").join(&workspace_id).join("ran.txt");

    let client = replica.workspace_client();
    let request = berth_proto::v1::ExecRequest {
        workspace_id: workspace_id.clone(),
        argv: ["sh", "-c", "echo ran >> ran.txt; sleep 1"].map(str::to_owned).to_vec(),
        timeout_ms: 10_000,
        ..Default::default()
    };
    let exec = tokio::spawn(async move {
        let mut client = client;
        client.exec(request).await
    });
    let ran = wait_until(Duration::from_secs(10), || async { line_count(&marker) >= 1 }).await;
    assert!(ran, "the exec never ran\n{}", cluster.logs(30));
    // The request is on the node: hold every byte of the connections that exist now.
    stall.stall_current();
    let answer = exec.await.expect("exec task");
    let lines = line_count(&marker);
    println!("exec answer after the stall: {answer:?}; ran {lines} time(s)");
    assert_eq!(lines, 1, "the exec ran {lines} times; answer {answer:?}\n{}", cluster.logs(30));
    let status = answer.expect_err("the replica cannot know the outcome: it must answer an error");
    // UNKNOWN, not UNAVAILABLE: a client must not take it for "never ran" and retry.
    assert_eq!(status.code(), tonic::Code::Unknown, "{status:?}");
    assert!(status.message().contains("may have run"), "{status:?}");
}

/// `127.0.0.1:port` of `http://127.0.0.1:port`.
/// Starts a node agent advertising `stall`'s address, so every replica call to it passes
/// that proxy.
async fn start_node(id: &str, control_planes: &str, data_dir: &Path, stall: &StallProxy) -> anyhow::Result<Node> {
    let advertise = vec!["--advertise".to_owned(), format!("http://{}", stall.address)];
    let node = start_node_agent(id, control_planes, data_dir, &advertise, DEFAULT_LOG_FILTER).await?;
    stall.set_upstream(socket_address(&node.server.endpoint)?);
    Ok(node)
}

/// A TCP proxy that can stall the connections it carries now (hold their bytes, keep them
/// open) while passing new ones: the replica's open call hangs, its retry would get through.
struct StallProxy {
    address: SocketAddr,
    upstream: Arc<OnceLock<SocketAddr>>,
    epoch: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl StallProxy {
    async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let upstream: Arc<OnceLock<SocketAddr>> = Arc::new(OnceLock::new());
        let (epoch, _) = watch::channel(0u64);
        let accept_upstream = Arc::clone(&upstream);
        let accept_epoch = epoch.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Some(upstream) = accept_upstream.get().copied() else { continue };
                let mut stalled = accept_epoch.subscribe();
                tokio::spawn(async move {
                    let Ok(server) = TcpStream::connect(upstream).await else { return };
                    let (mut client, mut server) = (client, server);
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                        _ = stalled.changed() => {
                            // Keep both sockets open and silent until the test ends.
                            std::future::pending::<()>().await;
                        }
                    }
                });
            }
        });
        Ok(Self { address, upstream, epoch, task })
    }

    fn set_upstream(&self, upstream: SocketAddr) {
        let _ = self.upstream.set(upstream);
    }

    fn stall_current(&self) {
        self.epoch.send_modify(|epoch| *epoch += 1);
    }
}

impl Drop for StallProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// While a node's process is gone but its lease has not run out, an exec cannot reach it:
/// nothing ran, so the answer is UNAVAILABLE marked retryable (it was unmarked, and a client
/// could not tell it from an exec that may have run). Found by the Python client's tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exec_that_cannot_reach_its_node_is_marked_retryable() {
    let mut config = ClusterConfig::on_shared_etcd(1, 1);
    config.lost_node_grace = "60s";
    config.node_lease_ttl = "4s";
    let cluster = Cluster::start(config).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let workspace_id = replica.create_session("unreached", "agent").await.expect("create").workspace_id;
    replica.exec(&workspace_id, &["true"]).await.expect("exec before the kill");
    cluster.nodes[0].server.kill();
    let mut unreached = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(2);
    while tokio::time::Instant::now() < deadline {
        let status = replica.exec(&workspace_id, &["true"]).await.expect_err("the node is dead");
        assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
        assert!(berth_proto::meta::is_retryable(&status), "not marked retryable: {status:?}");
        unreached += 1;
    }
    assert!(unreached > 0);
}
