//! Workspace snapshots end to end (issue 15), with real replicas, node agents, etcd and a
//! snapshot store (a `dir` on disk, a real `redis-server`, `moto_server` as S3): a SIGKILLed
//! node's workspace comes back restored on another node with exactly its files; a drain
//! without `--force` moves every workspace with its data; a corrupted blob makes the restore
//! fall back to the previous snapshot, loudly; a node killed mid-restore removes the partial
//! tree when it starts again; a snapshot from a node holding an older
//! placement never becomes the latest; interval snapshots keep `--snapshot-keep`; Release
//! snapshots; destroy deletes every snapshot of the workspace.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_proto::v1;
use berth_proto::v1::node_service_client::NodeServiceClient;
use berth_testkit::store_servers;
use berth_testkit::{wait_for, wait_for_every, wait_until, wait_until_every};
use berth_tests::berth::{cli, retry_transient};
use berth_tests::cluster::{Cluster, ClusterConfig};
use tempfile::TempDir;

/// A cluster whose replicas and nodes share one `dir` snapshot store (returned: it must
/// outlive the cluster).
async fn snapshot_cluster(replicas: usize, nodes: usize) -> (Cluster, TempDir) {
    let store = tempfile::Builder::new().prefix("berth-snapshots-").tempdir().expect("store dir");
    let url = format!("file://{}", store.path().display());
    let mut config = ClusterConfig::on_shared_etcd(replicas, nodes);
    config.node_flags = vec!["--snapshot-store".into(), url.clone()];
    config.replica_flags = vec!["--snapshot-store".into(), url];
    let cluster = Cluster::start(config).await.expect("cluster");
    (cluster, store)
}

/// Every regular file under `root` (relative path -> content), for exact comparison.
fn tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(metadata) = std::fs::symlink_metadata(&path) else { continue };
            if metadata.is_dir() {
                pending.push(path);
            } else if metadata.is_file() {
                let relative = path.strip_prefix(root).expect("under root").display().to_string();
                files.insert(relative, std::fs::read(&path).expect("read"));
            }
        }
    }
    files
}

fn workspace_root(cluster: &Cluster, node_id: &str, workspace_id: &str) -> PathBuf {
    cluster.node(node_id).expect("node").data_dir.join("workspaces").join(workspace_id)
}

/// Writes a small tree: text, a nested file and 200 KiB of pseudo-random bytes.
async fn write_files(cluster: &Cluster, workspace_id: &str, tag: &str) {
    let replica = &cluster.replicas[0].server;
    let noise: Vec<u8> = (0..200 * 1024u32).map(|index| (index.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    replica.write_file(workspace_id, "notes.txt", format!("notes of {tag}").as_bytes()).await.expect("write notes");
    replica.write_file(workspace_id, "src/deep/main.rs", b"fn main() {}\n").await.expect("write nested");
    replica.write_file(workspace_id, "data.bin", &noise).await.expect("write binary");
}

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

/// SIGKILLs the node holding `placed`; through the second replica `file` reads back as
/// `expected` from another node, and the workspace says `restored`. Returns it as it is now.
async fn kill_and_read_back(cluster: &Cluster, placed: &v1::Workspace, file: &str, expected: &[u8]) -> v1::Workspace {
    let node = cluster.node(&placed.node_id).expect("node");
    node.server.kill();
    wait_node_gone(cluster, &node.id).await;
    let second = &cluster.replicas[1].server;
    let workspace_id = &placed.workspace_id;
    let (read, _) = retry_transient(Duration::from_secs(20), || second.read_file(workspace_id, file)).await;
    assert_eq!(read.as_deref().ok(), Some(expected), "{read:?}\n{}", cluster.logs(40));
    let back = second.get_workspace(workspace_id).await.expect("get");
    assert_ne!(back.node_id, placed.node_id, "{back:?}");
    assert_eq!(back.origin(), v1::WorkspaceOrigin::Restored, "{back:?}");
    back
}

fn snapshot_by_cli(endpoint: &str, workspace_id: &str) -> serde_json::Value {
    let output = cli(endpoint, &["-o", "json", "ws", "snapshot", workspace_id]);
    assert!(
        output.status.success(),
        "berth ws snapshot failed: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("snapshot json")
}

/// (1) SIGKILL the node holding a snapshotted workspace: through another replica it comes
/// back on the other node with exactly the files of the snapshot, and says restored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_node_s_workspace_comes_back_restored_on_another_node() {
    let (cluster, _store) = snapshot_cluster(2, 2).await;
    let first = &cluster.replicas[0].server;
    let session = first.create_session("ana", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    write_files(&cluster, &workspace_id, "ana").await;
    let placed = first.get_workspace(&workspace_id).await.expect("get");
    let before = tree(&workspace_root(&cluster, &placed.node_id, &workspace_id));
    assert!(before.contains_key("data.bin"), "{:?}", before.keys().collect::<Vec<_>>());

    let snapshot = snapshot_by_cli(&first.endpoint, &workspace_id);
    let snapshot_id = snapshot["snapshot_id"].as_str().expect("snapshot id").to_owned();
    assert_eq!(snapshot["generation"].as_u64(), Some(placed.generation), "{snapshot}");
    let listed = cli(&first.endpoint, &["-o", "json", "ws", "snapshots", &workspace_id]);
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("snapshots json");
    assert_eq!(listed[0]["snapshot_id"].as_str(), Some(snapshot_id.as_str()), "{listed}");
    assert_eq!(listed[0]["latest"].as_bool(), Some(true), "{listed}");

    let back = kill_and_read_back(&cluster, &placed, "notes.txt", b"notes of ana").await;
    assert_eq!(back.origin_snapshot_id, snapshot_id, "{back:?}");
    assert!(back.origin_snapshot_time.is_some(), "{back:?}");
    assert_eq!(back.origin_generation, back.generation, "{back:?}");
    let after = tree(&workspace_root(&cluster, &back.node_id, &workspace_id));
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>(),
        "the restored tree has other files"
    );
    assert!(after == before, "a restored file differs from the snapshotted one");
}

/// (2) `berth nodes drain NODE` without `--force` snapshots and moves every workspace of
/// the node, printing one progress line each; nothing written before the drain is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_without_force_moves_every_workspace_with_its_files() {
    let (cluster, _store) = snapshot_cluster(1, 2).await;
    let replica = &cluster.replicas[0].server;
    let mut workspaces = Vec::new();
    for agent in ["a1", "a2", "a3", "a4"] {
        let session = replica.create_session("bo", agent).await.expect("create");
        write_files(&cluster, &session.workspace_id, agent).await;
        let placed = replica.get_workspace(&session.workspace_id).await.expect("get");
        workspaces.push(placed);
    }
    let drained = workspaces[0].node_id.clone();
    let on_drained: Vec<&v1::Workspace> = workspaces.iter().filter(|workspace| workspace.node_id == drained).collect();
    let before: Vec<_> =
        on_drained.iter().map(|workspace| tree(&workspace_root(&cluster, &drained, &workspace.workspace_id))).collect();

    let output = cli(&replica.endpoint, &["nodes", "drain", &drained]);
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "drain failed: {stdout}{}\n{}",
        String::from_utf8_lossy(&output.stderr),
        cluster.logs(40)
    );
    let total = on_drained.len();
    for index in 1..=total {
        assert!(stdout.contains(&format!("[{index}/{total}]")), "no progress line {index}/{total}: {stdout}");
    }
    assert!(stdout.contains(&format!("moved {total} of {total}")), "{stdout}");

    for (workspace, before) in on_drained.iter().zip(before) {
        let moved = replica.get_workspace(&workspace.workspace_id).await.expect("get");
        assert_ne!(moved.node_id, drained, "{moved:?}");
        assert_eq!(moved.origin(), v1::WorkspaceOrigin::Restored, "{moved:?}");
        let after = tree(&workspace_root(&cluster, &moved.node_id, &workspace.workspace_id));
        assert!(after == before, "{} lost or changed files in the move", workspace.workspace_id);
        let read = replica.read_file(&workspace.workspace_id, "src/deep/main.rs").await;
        assert_eq!(read.as_deref().ok(), Some(&b"fn main() {}\n"[..]), "{read:?}");
    }
}

/// Blob files of a `dir` store.
fn blobs(store: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![store.join("blobs")];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// (3) A blob of the latest snapshot is corrupted on disk: the re-placement's restore fails
/// on it, says so in the node's log, and restores the previous snapshot instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_blob_makes_the_restore_fall_back_to_the_previous_snapshot() {
    let (cluster, store) = snapshot_cluster(1, 2).await;
    let replica = &cluster.replicas[0].server;
    let session = replica.create_session("cy", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    replica.write_file(&workspace_id, "kept.txt", b"in both snapshots").await.expect("write");
    let older = snapshot_by_cli(&replica.endpoint, &workspace_id);
    let blobs_of_older = blobs(store.path());
    let noise: Vec<u8> = (0..300 * 1024u32).map(|index| (index.wrapping_mul(40_503) >> 7) as u8).collect();
    replica.write_file(&workspace_id, "newer.bin", &noise).await.expect("write");
    let newer = snapshot_by_cli(&replica.endpoint, &workspace_id);
    let new_blobs: Vec<PathBuf> =
        blobs(store.path()).into_iter().filter(|blob| !blobs_of_older.contains(blob)).collect();
    assert!(!new_blobs.is_empty(), "the newer snapshot uploaded no blob");
    for blob in &new_blobs {
        let mut bytes = std::fs::read(blob).expect("read blob");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        std::fs::write(blob, bytes).expect("corrupt blob");
    }

    let placed = replica.get_workspace(&workspace_id).await.expect("get");
    let node = cluster.node(&placed.node_id).expect("node");
    node.server.kill();
    wait_node_gone(&cluster, &node.id).await;
    let (read, _) = retry_transient(Duration::from_secs(20), || replica.read_file(&workspace_id, "kept.txt")).await;
    assert_eq!(read.as_deref().ok(), Some(&b"in both snapshots"[..]), "{read:?}\n{}", cluster.logs(40));
    let back = replica.get_workspace(&workspace_id).await.expect("get");
    assert_eq!(back.origin(), v1::WorkspaceOrigin::Restored, "{back:?}");
    assert_eq!(back.origin_snapshot_id, older["snapshot_id"].as_str().unwrap(), "fell back to the older one: {back:?}");
    let missing = replica.read_file(&workspace_id, "newer.bin").await;
    assert!(missing.is_err(), "a file of the corrupt snapshot came back: {:?}", missing.map(|bytes| bytes.len()));
    let new_node = cluster.node(&back.node_id).expect("new node");
    let newer_id = newer["snapshot_id"].as_str().unwrap();
    let loud: Vec<String> = new_node
        .server
        .log()
        .lines()
        .filter(|line| line.contains(newer_id) && line.contains("ERROR"))
        .map(str::to_owned)
        .collect();
    assert!(
        !loud.is_empty(),
        "the failed restore of {newer_id} is not in the node's log as an error:\n{}",
        new_node.server.log()
    );
    let replica_says = cluster.replica_log_lines(&cluster.replicas[0].id, "restored from an older snapshot");
    assert!(!replica_says.is_empty(), "the replica did not warn about the fallback");
}

/// The restore trees (`.ID.restore-…`) under a node's workspaces directory.
fn unfinished_restores(cluster: &Cluster, node_id: &str) -> Vec<String> {
    let workspaces = cluster.node(node_id).expect("node").data_dir.join("workspaces");
    let Ok(entries) = std::fs::read_dir(workspaces) else { return Vec::new() };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| berth_snapshot::staging_target(name).is_some())
        .collect()
}

/// (3b) A node SIGKILLed in the middle of restoring a workspace leaves the restore's partial
/// tree beside its workspaces; started again on the same data directory, it removes that
/// tree before it serves, and the workspace still comes back whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_restore_removes_the_partial_tree_when_it_starts_again() {
    let (mut cluster, _store) = snapshot_cluster(1, 2).await;
    let replica = &cluster.replicas[0].server;
    let session = replica.create_session("dee", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    // 64 MiB that does not compress, so the restore takes long enough to be caught in it.
    for part in 0..8u64 {
        let noise = berth_testkit::noise(part, 8 << 20);
        replica.write_file(&workspace_id, &format!("big/{part}.bin"), &noise).await.expect("write");
    }
    replica.write_file(&workspace_id, "notes.txt", b"notes of dee").await.expect("write");
    snapshot_by_cli(&replica.endpoint, &workspace_id);
    let placed = replica.get_workspace(&workspace_id).await.expect("get");
    cluster.node(&placed.node_id).expect("node").server.kill();
    wait_node_gone(&cluster, &placed.node_id).await;
    let other = cluster.nodes.iter().position(|node| node.id != placed.node_id).expect("another node");
    let other_id = cluster.nodes[other].id.clone();

    // A read re-places the workspace on the other node, which restores it; that node is
    // killed as soon as the restore's tree shows up.
    let (_, caught) = tokio::join!(replica.read_file(&workspace_id, "notes.txt"), async {
        let caught = wait_until_every(Duration::from_secs(30), Duration::from_millis(1), || async {
            !unfinished_restores(&cluster, &other_id).is_empty()
        })
        .await;
        if caught {
            cluster.nodes[other].server.kill();
        }
        caught
    });
    assert!(caught, "no restore tree appeared on {other_id}\n{}", cluster.logs(40));
    let left = unfinished_restores(&cluster, &other_id);
    assert_eq!(left.len(), 1, "the kill did not catch the restore in progress: {left:?}");

    cluster.restart_node(other).await.expect("restart");
    let replica = &cluster.replicas[0].server;
    let left = unfinished_restores(&cluster, &other_id);
    assert!(left.is_empty(), "{other_id} serves with an unfinished restore beside its workspaces: {left:?}");
    let log = cluster.nodes[other].server.log();
    assert!(log.contains("removed the tree of a restore that never finished"), "{log}");
    let (read, _) = retry_transient(Duration::from_secs(30), || replica.read_file(&workspace_id, "notes.txt")).await;
    assert_eq!(read.as_deref().ok(), Some(&b"notes of dee"[..]), "{read:?}\n{}", cluster.logs(40));
    let (read, _) = retry_transient(Duration::from_secs(30), || replica.read_file(&workspace_id, "big/7.bin")).await;
    assert_eq!(read.map(|bytes| bytes.len()).ok(), Some(8 << 20));
}

/// (4) A snapshot reported by a node holding an older placement (here: the node's id
/// registering again after its workspace was re-placed elsewhere) is refused with a typed
/// answer and never becomes the workspace's latest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_from_a_fenced_node_is_refused() {
    let (cluster, _store) = snapshot_cluster(1, 2).await;
    let replica = &cluster.replicas[0].server;
    let session = replica.create_session("dee", "agent").await.expect("create");
    let workspace_id = session.workspace_id;
    replica.write_file(&workspace_id, "notes.txt", b"before").await.expect("write");
    let taken = snapshot_by_cli(&replica.endpoint, &workspace_id);
    let placed = replica.get_workspace(&workspace_id).await.expect("get");
    let node = cluster.node(&placed.node_id).expect("node");
    node.server.kill();
    wait_node_gone(&cluster, &node.id).await;
    let (read, _) = retry_transient(Duration::from_secs(20), || replica.read_file(&workspace_id, "notes.txt")).await;
    assert_eq!(read.as_deref().ok(), Some(&b"before"[..]), "{read:?}\n{}", cluster.logs(40));
    let moved = replica.get_workspace(&workspace_id).await.expect("get");
    assert!(moved.generation > placed.generation);

    // The old node's id comes back and reports a late snapshot of its old placement.
    let mut client = NodeServiceClient::new(replica.channel());
    let (outbound, receiver) = tokio::sync::mpsc::channel(4);
    let register = v1::Register {
        node_id: node.id.clone(),
        address: "http://127.0.0.1:9".into(),
        backends: vec!["local".into()],
        default_backend: "local".into(),
        key_prefix: cluster.prefix.clone(),
        ..Default::default()
    };
    outbound.send(v1::NodeMessage { msg: Some(v1::node_message::Msg::Register(register)) }).await.unwrap();
    let mut inbound =
        client.heartbeat(tokio_stream::wrappers::ReceiverStream::new(receiver)).await.expect("heartbeat").into_inner();
    let late = v1::SnapshotTaken {
        workspace_id: workspace_id.clone(),
        snapshot_id: format!("{:013}-{:020}-{:016x}", 9_999_999_999_999u64, placed.generation, 7u64),
        generation: placed.generation,
        created_unix_ms: 9_999_999_999_999,
        ..Default::default()
    };
    let report = v1::HeartbeatReport { seq: 1, snapshots: vec![late.clone()], ..Default::default() };
    let refused = tokio::time::timeout(Duration::from_secs(15), async {
        let mut reported = false;
        while let Ok(Some(message)) = inbound.message().await {
            match message.msg {
                Some(v1::control_message::Msg::Registered(_)) if !reported => {
                    reported = true;
                    outbound
                        .send(v1::NodeMessage { msg: Some(v1::node_message::Msg::Report(report.clone())) })
                        .await
                        .ok();
                }
                Some(v1::control_message::Msg::SnapshotRefused(refused)) => return Some(refused),
                _ => {}
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .expect("no SnapshotRefused answer");
    assert_eq!(refused.snapshot_id, late.snapshot_id);
    assert_eq!(refused.generation, placed.generation);
    assert_eq!(refused.record_generation, moved.generation, "{refused:?}");
    assert!(refused.reason.contains("refused as its latest"), "{}", refused.reason);

    // The record's pointer is not the late snapshot.
    let registry = cluster.registry().await;
    let record = wait_for(Duration::from_secs(5), || async {
        cluster.workspace_record(registry.as_ref(), &workspace_id).await.ok().flatten()
    })
    .await
    .expect("record");
    let pointer = record.snapshot.expect("a snapshot pointer");
    assert_ne!(pointer.id, late.snapshot_id, "the fenced snapshot became the latest");
    assert_eq!(pointer.id, taken["snapshot_id"].as_str().unwrap());
}

/// The snapshots `berth ws snapshots -o json` lists, newest first.
fn snapshots_by_cli(endpoint: &str, workspace_id: &str) -> Vec<serde_json::Value> {
    let output = cli(endpoint, &["-o", "json", "ws", "snapshots", workspace_id]);
    assert!(output.status.success(), "berth ws snapshots failed: {}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_slice::<serde_json::Value>(&output.stdout)
        .expect("snapshots json")
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn latest_id(listed: &[serde_json::Value]) -> Option<String> {
    listed
        .iter()
        .find(|snapshot| snapshot["latest"].as_bool() == Some(true))
        .and_then(|snapshot| snapshot["snapshot_id"].as_str())
        .map(str::to_owned)
}

/// `file` as snapshot `snapshot_id` of the workspace holds it, restored straight from the
/// store into a directory of the test's own (what any node would restore).
async fn file_in_snapshot(url: &str, workspace_id: &str, snapshot_id: &str, file: &str) -> Option<Vec<u8>> {
    let store = berth_snapshot::open(url).expect("open the store");
    let dir = tempfile::Builder::new().prefix("berth-restore-check-").tempdir().expect("temp dir");
    let into = dir.path().join("workspace");
    berth_snapshot::restore(&*store, workspace_id, snapshot_id, &into).await.expect("restore from the store");
    std::fs::read(into.join(file)).ok()
}

/// (5) Interval snapshots to a Redis store: a workspace written since its last snapshot gets
/// a new one every `--snapshot-interval`, recorded as its latest through the heartbeat; the
/// store keeps `--snapshot-keep` of them; a SIGKILLed node's workspace comes back on the
/// other node from the newest, with the last write before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interval_snapshots_to_redis_keep_the_newest_and_restore_after_a_kill() {
    let redis = tokio::task::spawn_blocking(store_servers::redis).await.expect("redis-server");
    let url = redis.redis_url(&format!("berth-test-{:016x}", rand::random::<u64>()));
    let mut config = ClusterConfig::on_shared_etcd(2, 2);
    let keep = ["--snapshot-store", &url, "--snapshot-keep", "2"].map(str::to_owned);
    config.node_flags = [&keep[..], &["--snapshot-interval".to_owned(), "1s".to_owned()]].concat();
    config.replica_flags = keep.to_vec();
    let cluster = Cluster::start(config).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let workspace_id = replica.create_session("cy", "agent").await.expect("create").workspace_id;

    let mut latest = Vec::new();
    for version in 1..=3 {
        let content = format!("version {version}");
        replica.write_file(&workspace_id, "notes.txt", content.as_bytes()).await.expect("write");
        // No on-demand call: only the interval can make the snapshot that holds this write.
        let holding = wait_for_every(Duration::from_secs(30), Duration::from_millis(300), || async {
            let id = latest_id(&snapshots_by_cli(&replica.endpoint, &workspace_id))?;
            let held = file_in_snapshot(&url, &workspace_id, &id, "notes.txt").await?;
            (held == content.as_bytes()).then_some(id)
        })
        .await;
        let id = holding.unwrap_or_else(|| {
            panic!("no interval snapshot recorded holding {content:?} within 30 s\n{}", cluster.logs(40))
        });
        latest.push(id);
    }
    assert!(latest.windows(2).all(|pair| pair[0] < pair[1]), "latest snapshots do not grow: {latest:?}");

    // At least three snapshots were taken (three distinct latest ones): exactly the newest
    // two stay, and the oldest is gone from the store.
    let kept = wait_until_every(Duration::from_secs(15), Duration::from_millis(300), || async {
        snapshots_by_cli(&replica.endpoint, &workspace_id).len() == 2
    })
    .await;
    let listed = snapshots_by_cli(&replica.endpoint, &workspace_id);
    assert!(kept, "not exactly --snapshot-keep 2 snapshots stay: {listed:?}");
    let listed_ids: Vec<&str> = listed.iter().filter_map(|snapshot| snapshot["snapshot_id"].as_str()).collect();
    assert!(listed_ids.contains(&latest[2].as_str()), "the newest is not kept: {listed_ids:?}");
    assert!(!listed_ids.contains(&latest[0].as_str()), "the oldest was not pruned: {listed_ids:?}");

    let placed = replica.get_workspace(&workspace_id).await.expect("get");
    kill_and_read_back(&cluster, &placed, "notes.txt", b"version 3").await;
    drop(cluster);
    drop(redis);
}

/// (6) With an S3 store (`moto_server`): closing a workspace (Release, data kept) snapshots
/// it with no other call and records that snapshot as its latest; destroying it deletes
/// every snapshot of the workspace from the store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_snapshots_to_s3_and_destroy_deletes_them() {
    let moto = tokio::task::spawn_blocking(|| store_servers::moto("berth-cluster")).await.expect("moto_server");
    let url = moto.s3_url("berth-cluster", &format!("ci/{:016x}", rand::random::<u64>()));
    let mut config = ClusterConfig::on_shared_etcd(1, 1);
    config.node_flags = vec!["--snapshot-store".into(), url.clone()];
    config.replica_flags = vec!["--snapshot-store".into(), url.clone()];
    let cluster = Cluster::start(config).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let workspace_id = replica.create_session("di", "agent").await.expect("create").workspace_id;
    replica.write_file(&workspace_id, "released.txt", b"kept over the release").await.expect("write");
    assert!(snapshots_by_cli(&replica.endpoint, &workspace_id).is_empty(), "a snapshot before any trigger");

    let output = cli(&replica.endpoint, &["ws", "close", &workspace_id]);
    assert!(output.status.success(), "ws close: {}", String::from_utf8_lossy(&output.stderr));
    let listed = snapshots_by_cli(&replica.endpoint, &workspace_id);
    let id = latest_id(&listed).unwrap_or_else(|| panic!("no latest snapshot after the release: {listed:?}"));
    assert_eq!(listed.len(), 1, "{listed:?}");
    let held = file_in_snapshot(&url, &workspace_id, &id, "released.txt").await;
    assert_eq!(held.as_deref(), Some(&b"kept over the release"[..]));

    let output = cli(&replica.endpoint, &["ws", "close", "--destroy", &workspace_id]);
    assert!(output.status.success(), "ws close --destroy: {}", String::from_utf8_lossy(&output.stderr));
    let store = berth_snapshot::open(&url).expect("open the store");
    let gone = wait_until_every(Duration::from_secs(15), Duration::from_millis(300), || async {
        berth_snapshot::list(&*store, &workspace_id).await.is_ok_and(|left| left.is_empty())
    })
    .await;
    assert!(gone, "snapshots of a destroyed workspace stay: {:?}", berth_snapshot::list(&*store, &workspace_id).await);
    drop(cluster);
    drop(moto);
}
