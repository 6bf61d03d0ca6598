//! The opensandbox driver against the real `opensandbox-server`: labels, adoption by another
//! gateway, generation fencing, `fresh`, pause / resume, destroy, cluster separation, the
//! janitor's view, and how provider failures map to errors.

mod support;

use std::time::Duration;

use bytes::Bytes;

use berth_backend_opensandbox::{OpenSandboxBackend, OpenSandboxDriver, label_keys};
use berth_testkit::{rel, sh_ok};
use berth_workspace::{
    Backend, BackendDriver, LabelledSandbox, Placement, ProvisionContext, WorkspaceError, WorkspaceId, WorkspaceSpec,
};
use support::Cluster;

fn id(text: &str) -> WorkspaceId {
    WorkspaceId::new(text).unwrap()
}

async fn provision(
    driver: &OpenSandboxDriver,
    workspace: &WorkspaceId,
    generation: u64,
    fresh: bool,
) -> berth_workspace::Result<OpenSandboxBackend> {
    let root = std::env::temp_dir();
    let spec = WorkspaceSpec::default();
    let context = ProvisionContext {
        workspace_id: workspace,
        root: &root,
        spec: &spec,
        placement: Placement { generation, owner: "alice@example.com", fresh },
    };
    driver.provision_sandbox(context).await
}

async fn labelled(driver: &OpenSandboxDriver) -> Vec<LabelledSandbox> {
    let mut listed = driver.list_labelled().await.expect("list this cluster's sandboxes");
    listed.sort_by(|left, right| left.provider_id.cmp(&right.provider_id));
    listed
}

async fn read(backend: &dyn Backend, path: &str) -> Vec<u8> {
    backend.read_to_bytes(&rel(path), 1 << 20).await.unwrap_or_else(|error| panic!("read {path}: {error}")).to_vec()
}

/// The create-time labels Docker keeps on the sandbox's container.
fn container_labels(container: &str) -> serde_json::Value {
    let text = support::docker(&["inspect", "--format", "{{json .Config.Labels}}", container]);
    serde_json::from_str(text.trim()).expect("container labels as JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labels_then_another_gateway_adopts_with_the_files() {
    let cluster = Cluster::new();
    let workspace = id("ws-adopt@team:one");
    let first = provision(&cluster.driver, &workspace, 5, false).await.unwrap();
    first.write_bytes(&rel("notes/keep.txt"), Bytes::from_static(b"kept\n"), 0o644).await.unwrap();

    let containers = cluster.containers();
    assert_eq!(containers.len(), 1, "{containers:?}");
    let labels = container_labels(&containers[0]);
    assert_eq!(labels[label_keys::CLUSTER], label_keys::cluster_value(&cluster.prefix));
    assert_eq!(labels[label_keys::GENERATION], "5");
    assert_eq!(labels[label_keys::OWNER], hex::encode("alice@example.com"));
    assert_eq!(labels[format!("{}0", label_keys::WORKSPACE_ID_CHUNK)], hex::encode(workspace.as_str()));

    // Another gateway: nothing shared in memory, found by label, generation recorded.
    let gateway = cluster.another_gateway();
    let second = provision(&gateway, &workspace, 6, false).await.unwrap();
    assert_eq!(second.sandbox_id(), first.sandbox_id());
    assert_eq!(read(&second, "notes/keep.txt").await, b"kept\n");
    let listed = labelled(&gateway).await;
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].generation, listed[0].workspace_id.clone()), (6, Some(workspace.clone())));

    // The older gateway's placement is fenced; the same generation again is idempotent.
    match provision(&cluster.driver, &workspace, 5, false).await {
        Err(WorkspaceError::SandboxFenced { held: 6, asked: 5, .. }) => {}
        other => panic!("expected SandboxFenced, got {other:?}"),
    }
    let again = provision(&gateway, &workspace, 6, false).await.unwrap();
    assert_eq!(again.sandbox_id(), first.sandbox_id());
    assert_eq!(cluster.containers().len(), 1);
    gateway.destroy(&workspace).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_never_adopts() {
    let cluster = Cluster::new();
    let workspace = id("ws-fresh");
    let old = provision(&cluster.driver, &workspace, 1, false).await.unwrap();
    old.write_bytes(&rel("old.txt"), Bytes::from_static(b"old"), 0o644).await.unwrap();
    let new = provision(&cluster.driver, &workspace, 2, true).await.unwrap();
    assert_ne!(new.sandbox_id(), old.sandbox_id());
    assert!(!new.exists(&rel("old.txt")).await.unwrap(), "a fresh workspace adopted the orphan's files");
    let listed = labelled(&cluster.driver).await;
    assert_eq!(listed.iter().map(|sandbox| sandbox.provider_id.as_str()).collect::<Vec<_>>(), [new.sandbox_id()]);
    assert_eq!(cluster.containers().len(), 1);
    cluster.driver.destroy(&workspace).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_pauses_and_provision_resumes_with_the_files() {
    let cluster = Cluster::new();
    let workspace = id("ws-idle");
    let backend = provision(&cluster.driver, &workspace, 3, false).await.unwrap();
    backend.write_bytes(&rel("state.txt"), Bytes::from_static(b"before idle"), 0o644).await.unwrap();
    cluster.driver.release(&workspace).await.unwrap();
    assert!(!cluster.driver.is_running(&workspace).await);
    let containers = cluster.containers();
    let paused = support::docker(&["inspect", "--format", "{{.State.Paused}}", &containers[0]]);
    assert_eq!(paused.trim(), "true", "the sandbox's container is not paused");
    // Release twice is fine.
    cluster.driver.release(&workspace).await.unwrap();

    let woken = provision(&cluster.driver, &workspace, 4, false).await.unwrap();
    assert_eq!(woken.sandbox_id(), backend.sandbox_id());
    assert!(cluster.driver.is_running(&workspace).await);
    assert_eq!(read(&woken, "state.txt").await, b"before idle");
    let output = sh_ok(&woken, "echo awake", &[]).await;
    assert_eq!(&output.stdout[..], b"awake\n");
    cluster.driver.destroy(&workspace).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_leaves_nothing_labelled() {
    let cluster = Cluster::new();
    let (doomed, kept) = (id("ws-doomed"), id("ws-kept"));
    provision(&cluster.driver, &doomed, 1, false).await.unwrap();
    let survivor = provision(&cluster.driver, &kept, 1, false).await.unwrap();
    cluster.driver.destroy(&doomed).await.unwrap();
    let listed = labelled(&cluster.driver).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].workspace_id, Some(kept.clone()));
    assert_eq!(listed[0].provider_id, survivor.sandbox_id());
    assert_eq!(cluster.containers().len(), 1, "the destroyed workspace's container is still there");
    // Destroy is safe on an unknown or already destroyed id.
    cluster.driver.destroy(&doomed).await.unwrap();
    cluster.driver.destroy(&kept).await.unwrap();
    assert!(labelled(&cluster.driver).await.is_empty());
    assert!(cluster.containers().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clusters_never_see_each_other() {
    let (one, two) = (Cluster::new(), Cluster::new());
    let workspace = id("ws-shared-name");
    let in_one = provision(&one.driver, &workspace, 1, false).await.unwrap();
    in_one.write_bytes(&rel("owner.txt"), Bytes::from_static(b"one"), 0o644).await.unwrap();
    let in_two = provision(&two.driver, &workspace, 1, false).await.unwrap();
    assert_ne!(in_one.sandbox_id(), in_two.sandbox_id());
    assert!(!in_two.exists(&rel("owner.txt")).await.unwrap());
    let (seen_one, seen_two) = (labelled(&one.driver).await, labelled(&two.driver).await);
    assert_eq!(seen_one.iter().map(|sandbox| sandbox.provider_id.as_str()).collect::<Vec<_>>(), [in_one.sandbox_id()]);
    assert_eq!(seen_two.iter().map(|sandbox| sandbox.provider_id.as_str()).collect::<Vec<_>>(), [in_two.sandbox_id()]);
    // Neither deletes the other's sandbox, even when handed its id.
    assert!(matches!(two.driver.remove_labelled(&seen_one[0]).await, Err(WorkspaceError::InvalidArgument(_))));
    two.driver.destroy(&workspace).await.unwrap();
    assert_eq!(read(&in_one, "owner.txt").await, b"one");
    assert_eq!(one.containers().len(), 1);
    one.driver.destroy(&workspace).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn janitor_view_lists_and_removes_labelled_sandboxes() {
    let cluster = Cluster::new();
    let workspace = id("ws-orphan");
    let before = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    let orphan = provision(&cluster.driver, &workspace, 9, false).await.unwrap();
    let listed = labelled(&cluster.driver).await;
    assert_eq!(listed.len(), 1);
    let sandbox = &listed[0];
    assert_eq!(sandbox.provider_id, orphan.sandbox_id());
    assert_eq!((sandbox.workspace_id.clone(), sandbox.generation), (Some(workspace.clone()), 9));
    assert!(sandbox.created_at_ms >= before - 60_000, "created_at {} vs {before}", sandbox.created_at_ms);
    cluster.driver.remove_labelled(sandbox).await.unwrap();
    assert!(labelled(&cluster.driver).await.is_empty());
    assert!(cluster.containers().is_empty());
    // Safe on a sandbox that is already gone.
    cluster.driver.remove_labelled(sandbox).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_api_key_is_provider_auth_naming_the_file() {
    let key_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(key_file.path(), "not-the-key\n").unwrap();
    let cluster = Cluster::with_config(|config| config.api_key_file = Some(key_file.path().to_owned()));
    match provision(&cluster.driver, &id("ws-auth"), 1, false).await {
        Err(WorkspaceError::ProviderAuth { credential, .. }) => {
            assert!(credential.contains(&key_file.path().display().to_string()), "{credential}")
        }
        other => panic!("expected ProviderAuth, got {other:?}"),
    }
    // A missing key file is refused before any call, naming it.
    let missing = std::env::temp_dir().join(format!("berth-no-such-key-{}", rand::random::<u64>()));
    let mut config = support::config("/berth-test/missing-key");
    config.api_key_file = Some(missing.clone());
    match OpenSandboxDriver::new(config) {
        Err(WorkspaceError::BackendUnavailable { reason, .. }) => {
            assert!(reason.contains(&missing.display().to_string()), "{reason}")
        }
        other => panic!("expected BackendUnavailable, got {:?}", other.map(|_| ())),
    }
}

/// Arms a fault in a sandbox's execd stand-in (what the real daemon cannot be made to do).
async fn arm_fault(sandbox_id: &str, path_prefix: &str, status: u16, count: u32) {
    fault_request(sandbox_id, serde_json::json!({ "path_prefix": path_prefix, "status": status, "count": count }))
        .await;
}

async fn clear_faults(sandbox_id: &str) {
    fault_request(sandbox_id, serde_json::json!({ "clear": true })).await;
}

async fn fault_request(sandbox_id: &str, body: serde_json::Value) {
    let server = support::server();
    let client = reqwest::Client::new();
    let endpoint: serde_json::Value = client
        .get(format!("{}/v1/sandboxes/{sandbox_id}/endpoints/44772", server.url))
        .header("OPEN-SANDBOX-API-KEY", &server.api_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let endpoint = endpoint["endpoint"].as_str().unwrap().to_owned();
    let armed = client.post(format!("http://{endpoint}/x-standin/faults")).body(body.to_string()).send().await.unwrap();
    assert!(armed.status().is_success(), "arming the fault failed: {}", armed.status());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_failures_are_retried_then_mapped() {
    let cluster = Cluster::with_config(|config| config.retry_deadline = Duration::from_secs(3));
    let workspace = id("ws-faults");
    let backend = provision(&cluster.driver, &workspace, 1, false).await.unwrap();
    backend.write_bytes(&rel("f"), Bytes::from_static(b"x"), 0o644).await.unwrap();
    // Two 503s on an idempotent call: retried, the call succeeds.
    arm_fault(backend.sandbox_id(), "/files/info", 503, 2).await;
    assert_eq!(backend.stat(&rel("f")).await.unwrap().size, 1);
    // 429 past the deadline: the quota error.
    arm_fault(backend.sandbox_id(), "/files/info", 429, 1_000).await;
    let started = std::time::Instant::now();
    match backend.stat(&rel("f")).await {
        Err(WorkspaceError::ProviderQuota { .. }) => {}
        other => panic!("expected ProviderQuota, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(10), "retries outlived the deadline: {:?}", started.elapsed());
    clear_faults(backend.sandbox_id()).await;
    // A 5xx on a call that acts (run a command) is not sent twice: it fails at once.
    arm_fault(backend.sandbox_id(), "/command", 500, 1).await;
    match backend.exec(&berth_workspace::ExecSpec::new(vec!["true".into()])).await {
        Err(WorkspaceError::Backend { message, .. }) => assert!(message.contains("500"), "{message}"),
        other => panic!("expected Backend, got {other:?}"),
    }
    let output = sh_ok(&backend, "echo fine", &[]).await;
    assert_eq!(&output.stdout[..], b"fine\n");
    cluster.driver.destroy(&workspace).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn execs_leave_no_processes_behind() {
    let cluster = Cluster::new();
    let workspace = id("ws-reaped");
    let backend = provision(&cluster.driver, &workspace, 1, false).await.unwrap();
    let mut with_stdin = berth_workspace::ExecSpec::new(vec!["cat".into()]);
    with_stdin.stdin = Bytes::from_static(b"in");
    for _ in 0..3 {
        sh_ok(&backend, "echo out; echo err >&2", &[]).await;
        assert_eq!(&backend.exec(&with_stdin).await.unwrap().stdout[..], b"in");
    }
    // A spawned process with streamed stdin, ended by closing its input.
    let mut spawned = backend.spawn(&berth_workspace::SpawnSpec::new(vec!["cat".into()])).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut spawned.stdin, b"streamed").await.unwrap();
    tokio::io::AsyncWriteExt::shutdown(&mut spawned.stdin).await.unwrap();
    drop(spawned.stdin);
    let mut out = Vec::new();
    tokio::io::AsyncReadExt::read_to_end(&mut spawned.stdout, &mut out).await.unwrap();
    assert_eq!(out, b"streamed");
    assert_eq!(spawned.control.wait().await.unwrap().code, Some(0));
    // No zombie and no helper (stdin holders, drain timers) outlives its exec.
    berth_testkit::assert_eventually("helper processes to be gone", Duration::from_secs(10), || async {
        let listing = sh_ok(&backend, "ps -o stat,args", &[]).await;
        let text = String::from_utf8_lossy(&listing.stdout).into_owned();
        !text.lines().skip(1).any(|line| line.trim_start().starts_with('Z') || line.contains("sleep"))
    })
    .await;
    cluster.driver.destroy(&workspace).await.unwrap();
}

/// The node agent learns from `provision_reporting` whether a portable workspace's files came
/// along: adopted (`Some(true)`), or made again after the provider lost the sandbox
/// (`Some(false)`: the workspace then says RECREATED_EMPTY).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provision_reports_whether_the_sandbox_was_made_or_adopted() {
    let cluster = Cluster::new();
    let workspace = id("ws-reporting");
    let root = std::env::temp_dir();
    let spec = WorkspaceSpec::default();
    let context = |generation, fresh| ProvisionContext {
        workspace_id: &workspace,
        root: &root,
        spec: &spec,
        placement: Placement { generation, owner: "alice@example.com", fresh },
    };
    let (_, adopted) = cluster.driver.provision_reporting(context(1, true)).await.expect("create");
    assert_eq!(adopted, Some(false), "a new sandbox was made");
    let other = cluster.another_gateway();
    let (_, adopted) = other.provision_reporting(context(2, false)).await.expect("adopt");
    assert_eq!(adopted, Some(true), "adopted with its files");
    // Behind Berth's back, the sandbox goes.
    let containers = cluster.containers();
    assert_eq!(containers.len(), 1, "{containers:?}");
    support::docker(&["rm", "-f", "-v", &containers[0]]);
    let third = cluster.another_gateway();
    let (_, adopted) = third.provision_reporting(context(3, false)).await.expect("made again");
    assert_eq!(adopted, Some(false), "the provider no longer had it: made again, empty");
}
