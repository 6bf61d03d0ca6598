//! A node agent that restarts adopts its Docker containers instead of creating new ones:
//! `berth up --backend docker` is SIGKILLed and started again on the same data dir; the
//! workspace keeps its files and its single container (counted by label).

use std::process::Command;
use std::time::Duration;

use berth_proto::v1;
use berth_tests::berth::start_up;

/// Containers labelled with `label=value`, running or not.
fn containers_with(label: &str, value: &str) -> Vec<String> {
    let output = Command::new("docker")
        .args(["ps", "-aq", "--filter", &format!("label={label}={value}")])
        .output()
        .expect("docker ps runs");
    assert!(output.status.success(), "docker ps failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect()
}

/// Builds the base image once (idempotent; a no-op when it exists).
fn ensure_base_image() {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/images/build-base.sh");
    let status = Command::new(script).status().expect("run build-base.sh");
    assert!(status.success(), "deploy/images/build-base.sh failed");
}

struct RemoveContainers(String);

impl Drop for RemoveContainers {
    fn drop(&mut self) {
        let ids = containers_with("berth.workspace.id", &self.0);
        if !ids.is_empty() {
            let _ = Command::new("docker").arg("rm").arg("-f").args(&ids).output();
        }
    }
}

async fn exec(
    client: &mut v1::workspace_service_client::WorkspaceServiceClient<tonic::transport::Channel>,
    workspace: &str,
    script: &str,
) -> v1::ExecResult {
    client
        .exec(v1::ExecRequest {
            workspace_id: workspace.to_owned(),
            argv: vec!["sh".into(), "-c".into(), script.into()],
            timeout_ms: 20_000,
            ..Default::default()
        })
        .await
        .expect("exec")
        .into_inner()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_agent_adopts_its_container() {
    ensure_base_image();
    let data_dir = tempfile::tempdir().unwrap();
    let first = start_up(data_dir.path(), &["--backend", "docker"]).await.unwrap();
    let mut client = first.workspace_client();
    let user = format!("adopt-{:08x}", rand::random::<u32>());
    let session = client
        .create_session(v1::CreateSessionRequest { user_id: user.clone(), agent_id: "a".into(), ..Default::default() })
        .await
        .unwrap_or_else(|status| panic!("create session: {status:?}\nlog:\n{}", first.log()))
        .into_inner();
    let workspace = session.workspace_id.clone();
    let _cleanup = RemoveContainers(workspace.clone());
    let wrote = exec(&mut client, &workspace, "echo kept > note.txt").await;
    assert_eq!(wrote.exit_code, 0, "{wrote:?}");
    assert_eq!(containers_with("berth.workspace.id", &workspace).len(), 1);

    first.kill();
    assert_eq!(containers_with("berth.workspace.id", &workspace).len(), 1, "the container outlives its node agent");

    let second = start_up(data_dir.path(), &["--backend", "docker"]).await.unwrap();
    let mut client = second.workspace_client();
    // The restarted registry (journal) still knows the session and the workspace.
    let fetched = client.get_session(v1::GetSessionRequest { session_id: session.session_id.clone() }).await.unwrap();
    assert_eq!(fetched.into_inner().workspace_id, workspace);
    let read = tokio::time::timeout(Duration::from_secs(60), exec(&mut client, &workspace, "cat note.txt"))
        .await
        .expect("exec after restart finishes");
    assert_eq!(read.exit_code, 0, "{read:?}\nlog:\n{}", second.log());
    assert_eq!(String::from_utf8_lossy(&read.stdout), "kept\n");
    let containers = containers_with("berth.workspace.id", &workspace);
    assert_eq!(containers.len(), 1, "adopted, not duplicated: {containers:?}\nlog:\n{}", second.log());
    second.kill();
}

/// This data dir's warm-pool containers (claimed or not): their workspace directory, the
/// root label, lies under it.
fn pool_containers(data_dir: &std::path::Path) -> Vec<String> {
    let output = Command::new("docker")
        .args(["ps", "-a", "--no-trunc", "--filter", "label=berth.pool"])
        .args(["--format", "{{.ID}} {{.Label \"berth.workspace.root\"}}"])
        .output()
        .expect("docker ps runs");
    let prefix = data_dir.display().to_string();
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(_, root)| root.starts_with(&prefix))
        .map(|(id, _)| id.to_owned())
        .collect()
}

struct RemovePool(std::path::PathBuf);

impl Drop for RemovePool {
    fn drop(&mut self) {
        let ids = pool_containers(&self.0);
        if !ids.is_empty() {
            let _ = Command::new("docker").arg("rm").arg("-f").args(&ids).output();
        }
    }
}

async fn wait_for_pool(data_dir: &std::path::Path, count: usize, log: impl Fn() -> String) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let found = pool_containers(data_dir);
        if found.len() == count {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{} pool containers, not {count}\nlog:\n{}",
            found.len(),
            log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_warm_pool_serves_first_sessions_refills_and_is_emptied_when_the_agent_stops() {
    ensure_base_image();
    let data_dir = tempfile::tempdir().unwrap();
    let _cleanup = RemovePool(data_dir.path().to_path_buf());
    let up = start_up(data_dir.path(), &["--backend", "docker", "--warm-pool", "docker=2"]).await.unwrap();
    wait_for_pool(data_dir.path(), 2, || up.log()).await;
    let pool = pool_containers(data_dir.path());
    let mut client = up.workspace_client();
    let user = format!("pool-{:08x}", rand::random::<u32>());
    let started = std::time::Instant::now();
    let session = client
        .create_session(v1::CreateSessionRequest { user_id: user, agent_id: "a".into(), ..Default::default() })
        .await
        .unwrap_or_else(|status| panic!("create session: {status:?}\nlog:\n{}", up.log()))
        .into_inner();
    println!("first session from the pool: {:?}", started.elapsed());
    let workspace = session.workspace_id.clone();
    let hostname = exec(&mut client, &workspace, "hostname").await;
    let hostname = String::from_utf8_lossy(&hostname.stdout).trim().to_owned();
    assert!(pool.iter().any(|id| id.starts_with(&hostname)), "{hostname} is not one of the pool's {pool:?}");
    // The workspace's layout is there and its files are the workspace's.
    let listed = exec(&mut client, &workspace, "echo kept > note.txt && ls -A").await;
    assert_eq!(listed.exit_code, 0, "{listed:?}");
    // Refilled: two ready again, beside the claimed one.
    wait_for_pool(data_dir.path(), 3, || up.log()).await;
    // A stop empties the pool; the claimed workspace's container stays (it is the
    // workspace's), and is found again by the next agent.
    up.process.signal(nix::sys::signal::Signal::SIGTERM);
    assert!(up.process.wait_exit(Duration::from_secs(60)), "berth up did not stop\nlog:\n{}", up.log());
    let left = pool_containers(data_dir.path());
    assert_eq!(left.len(), 1, "pool containers left after the stop: {left:?}\nlog:\n{}", up.log());
    assert!(left[0].starts_with(&hostname));
    let again = start_up(data_dir.path(), &["--backend", "docker"]).await.unwrap();
    let mut client = again.workspace_client();
    let read = tokio::time::timeout(Duration::from_secs(60), exec(&mut client, &workspace, "hostname; cat note.txt"))
        .await
        .expect("exec after restart finishes");
    assert_eq!(String::from_utf8_lossy(&read.stdout), format!("{hostname}\nkept\n"), "{read:?}\nlog:\n{}", again.log());
    client.close_workspace(v1::CloseWorkspaceRequest { workspace_id: workspace.clone(), destroy: true }).await.unwrap();
    wait_for_pool(data_dir.path(), 0, || again.log()).await;
    again.kill();
}
