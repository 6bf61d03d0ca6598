//! The warm pool against the real engine: what a claimed workspace shows, which provisions
//! the pool serves, restarts and crashes in the middle of a claim.

use super::*;

impl Node {
    /// Ids of this node's pool containers (claimed or not).
    fn pool_containers(&self) -> Vec<String> {
        let node = format!("label={NODE_LABEL}={}", self.node_id());
        let listed =
            docker_cli(&["ps", "-aq", "--no-trunc", "--filter", &node, "--filter", &format!("label={POOL_LABEL}")]);
        String::from_utf8_lossy(&listed.stdout).split_whitespace().map(str::to_owned).collect()
    }
}

/// What a workspace can see of its container's history: env, files, processes.
async fn traces(backend: &BackendRef) -> Vec<String> {
    // As the node leaves every workspace: with its layout (a pool slot has it seeded).
    berth_workspace::layout::ensure(&**backend).await.unwrap();
    let mut seen = Vec::new();
    for command in [
        "env | grep -v -e '^HOSTNAME=' -e '^BERTH_EXEC_ID=' | sort",
        "ls -A /workspace /tmp /home/berth",
        "stat -c '%n %U:%G %a %F' /workspace /workspace/.mcp /workspace/skills /workspace/data /workspace/sessions",
        "cat /workspace/.mcp",
        "ps -o user,args",
    ] {
        let text = stdout_text(&sh_ok(&**backend, command, &[]).await);
        // The supervisor and this command's shim run the supervisor binary (no pids are
        // shown); the shim of an earlier command may not have been reaped yet (shown as
        // `[supervisor]`, in either container), so those are left out.
        seen.extend(text.lines().filter(|line| !line.ends_with("[supervisor]")).map(str::to_owned));
    }
    seen
}

#[tokio::test]
async fn a_claimed_pool_workspace_carries_no_trace_of_its_anonymous_past() {
    let node = Node::with_pool(|_| {}).await;
    assert_eq!(node.driver.fill_pool(2).await.unwrap(), PoolLevel { ready: 2, claimed: 0 });
    let pool = node.pool_containers();
    assert_eq!(pool.len(), 2);
    // A workspace made the usual way (its spec rules the pool out), to compare with.
    let made = node.provision("ws-made", &WorkspaceSpec { pids: 512, ..Default::default() }).await;
    assert_eq!(node.driver.fill_pool(2).await.unwrap().claimed, 0);
    let started = Instant::now();
    let claimed = node.provision("ws-claimed", &WorkspaceSpec::default()).await;
    let claim_took = started.elapsed();
    assert_eq!(node.driver.fill_pool(2).await.unwrap(), PoolLevel { ready: 2, claimed: 1 });
    let hostname = stdout_text(&sh_ok(&*claimed, "hostname", &[]).await).trim().to_owned();
    assert!(pool.iter().any(|id| id.starts_with(&hostname)), "{hostname} is not one of the pool's {pool:?}");
    println!("claim took {claim_took:?}");
    // Nothing tells it from a workspace made for it: env, files, processes.
    assert_eq!(traces(&claimed).await, traces(&made).await);
    // Its directory is the workspace's root, both ways.
    let root = node.data.path().join("ws-claimed");
    sh_ok(&*claimed, "echo from-inside > inside", &[]).await;
    assert_eq!(std::fs::read_to_string(root.join("inside")).unwrap(), "from-inside\n");
    std::fs::write(root.join("outside"), "from-host").unwrap();
    assert_eq!(stdout_text(&sh_ok(&*claimed, "cat outside", &[]).await), "from-host");
    // Found again (same container, same supervisor), listed for adoption.
    let again = node.provision("ws-claimed", &WorkspaceSpec::default()).await;
    assert_eq!(supervisor_pid(&again).await, supervisor_pid(&claimed).await);
    assert!(node.driver.adopt().await.unwrap().contains(&id("ws-claimed")));
    assert!(node.driver.is_running(&id("ws-claimed")).await);
    // Released (stopped) and provisioned again: Docker starts it with its files.
    node.driver.release(&id("ws-claimed")).await.unwrap();
    assert!(!node.driver.is_running(&id("ws-claimed")).await);
    let restarted = node.provision("ws-claimed", &WorkspaceSpec::default()).await;
    assert_eq!(stdout_text(&sh_ok(&*restarted, "cat inside", &[]).await), "from-inside\n");
    assert_eq!(stdout_text(&sh_ok(&*restarted, "hostname", &[]).await).trim(), hostname);
    // Destroyed: its container goes, the rest of the pool stays; emptied, nothing is left.
    node.driver.destroy(&id("ws-claimed")).await.unwrap();
    assert!(!node.pool_containers().iter().any(|id| id.starts_with(&hostname)));
    assert!(!node.driver.adopt().await.unwrap().contains(&id("ws-claimed")));
    assert_eq!(node.driver.fill_pool(0).await.unwrap().ready, 0);
    assert_eq!(node.pool_containers(), Vec::<String>::new());
    let slots = node.data.path().join("pool").join("slots");
    assert_eq!(std::fs::read_dir(&slots).unwrap().count(), 0, "slots left in {}", slots.display());
}

#[tokio::test]
async fn the_pool_serves_only_fresh_workspaces_with_the_default_spec() {
    let node = Node::with_pool(|_| {}).await;
    node.driver.fill_pool(1).await.unwrap();
    for (workspace, spec) in [
        ("ws-limits", WorkspaceSpec { memory_bytes: 64 << 20, ..Default::default() }),
        ("ws-readonly", WorkspaceSpec { read_only_root: true, ..Default::default() }),
        ("ws-labelled", WorkspaceSpec { labels: [("team".into(), "a".into())].into(), ..Default::default() }),
    ] {
        node.provision(workspace, &spec).await;
        assert_eq!(node.containers(Some(workspace)).len(), 1, "{workspace} did not get a container of its own");
    }
    // A root with files is a workspace's data: never replaced by a slot's directory.
    std::fs::write(node.root("ws-data").join("kept"), "data").unwrap();
    let kept = node.provision("ws-data", &WorkspaceSpec::default()).await;
    assert_eq!(stdout_text(&sh_ok(&*kept, "cat kept", &[]).await), "data");
    assert_eq!(node.containers(Some("ws-data")).len(), 1);
    assert_eq!(node.driver.fill_pool(1).await.unwrap(), PoolLevel { ready: 1, claimed: 0 });
    // Env is per exec and a network is attached after start: such a workspace is served.
    let spec = WorkspaceSpec { env: [("A".into(), "1".into())].into(), ..Default::default() };
    let served = node.provision("ws-env", &spec).await;
    assert_eq!(stdout_text(&sh_ok(&*served, "echo $A", &[]).await), "1\n");
    assert_eq!(node.containers(Some("ws-env")).len(), 0, "ws-env got a container of its own");
    assert_eq!(node.driver.fill_pool(0).await.unwrap(), PoolLevel { ready: 0, claimed: 1 });
}

#[tokio::test]
async fn a_restarted_driver_keeps_claimed_workspaces_and_sweeps_unclaimed_slots() {
    let node = Node::with_pool(|_| {}).await;
    node.driver.fill_pool(2).await.unwrap();
    let claimed = node.provision("ws-kept", &WorkspaceSpec::default()).await;
    sh_ok(&*claimed, "echo kept > f", &[]).await;
    let hostname = stdout_text(&sh_ok(&*claimed, "hostname", &[]).await).trim().to_owned();
    assert_eq!(node.pool_containers().len(), 2);
    // Another driver on the same node (an agent restarted after a crash).
    let restarted = DockerDriver::connect(node.driver.config().clone()).await.unwrap();
    assert!(restarted.adopt().await.unwrap().contains(&id("ws-kept")));
    let root = node.data.path().join("ws-kept");
    let found = restarted
        .provision(ProvisionContext::unplaced(&id("ws-kept"), &root, &WorkspaceSpec::default()))
        .await
        .unwrap();
    assert_eq!(stdout_text(&sh_ok(&*found, "hostname; cat f", &[]).await), format!("{hostname}\nkept\n"));
    // Its first fill removes the slot the crashed agent had ready, and makes its own.
    let stale: Vec<String> = node.pool_containers().into_iter().filter(|id| !id.starts_with(&hostname)).collect();
    assert_eq!(restarted.fill_pool(1).await.unwrap(), PoolLevel { ready: 1, claimed: 0 });
    let now = node.pool_containers();
    assert_eq!(now.len(), 2);
    assert!(!now.contains(&stale[0]), "the stale slot {} is still there", stale[0]);
    restarted.destroy(&id("ws-kept")).await.unwrap();
    restarted.fill_pool(0).await.unwrap();
    assert_eq!(node.pool_containers(), Vec::<String>::new());
}

/// Writes a claim record the way a provision does before it renames the slot (what an
/// agent that crashed right after it left).
fn plant_claim(node: &Node, workspace: &str, slot: &str, container: &str) {
    use sha2::Digest as _;
    let digest = hex::encode(sha2::Sha256::digest(workspace.as_bytes()));
    let claims = node.data.path().join("pool").join("claims");
    std::fs::create_dir_all(&claims).unwrap();
    std::fs::write(claims.join(&digest[..32]), format!("{workspace}\n{slot}\n{container}\n")).unwrap();
}

/// The slot and container id of each of this node's pool containers.
fn pool_slots(node: &Node) -> Vec<(String, String)> {
    let node_filter = format!("label={NODE_LABEL}={}", node.node_id());
    let listed = docker_cli(&[
        "ps",
        "-a",
        "--no-trunc",
        "--filter",
        &node_filter,
        "--filter",
        &format!("label={POOL_LABEL}"),
        "--format",
        &format!("{{{{.Label \"{POOL_LABEL}\"}}}} {{{{.ID}}}}"),
    ]);
    String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
        .map(|(slot, id)| (slot.to_owned(), id.to_owned()))
        .collect()
}

#[tokio::test]
async fn a_claim_cut_short_by_a_crash_is_finished_or_undone_by_the_next_provision() {
    let node = Node::with_pool(|_| {}).await;
    node.driver.fill_pool(2).await.unwrap();
    let slots = pool_slots(&node);
    assert_eq!(slots.len(), 2);
    // Crashed after the record, before the rename; the root is still empty: finished.
    plant_claim(&node, "ws-finish", &slots[0].0, &slots[0].1);
    // The same, but the root got files since (a restore): undone, and the workspace gets
    // a container of its own with its files.
    plant_claim(&node, "ws-undo", &slots[1].0, &slots[1].1);
    std::fs::write(node.root("ws-undo").join("restored"), "data").unwrap();
    let restarted = DockerDriver::connect(node.driver.config().clone()).await.unwrap();
    let provision = |workspace: &'static str| {
        let root = node.root(workspace);
        let restarted = &restarted;
        async move {
            restarted
                .provision(ProvisionContext::unplaced(&id(workspace), &root, &WorkspaceSpec::default()))
                .await
                .unwrap()
        }
    };
    let finished = provision("ws-finish").await;
    let hostname = stdout_text(&sh_ok(&*finished, "hostname", &[]).await).trim().to_owned();
    assert!(slots[0].1.starts_with(&hostname), "ws-finish runs in {hostname}, not its claimed {}", slots[0].1);
    sh_ok(&*finished, "echo here > f", &[]).await;
    assert_eq!(std::fs::read_to_string(node.data.path().join("ws-finish").join("f")).unwrap(), "here\n");
    let undone = provision("ws-undo").await;
    assert_eq!(stdout_text(&sh_ok(&*undone, "cat restored", &[]).await), "data");
    assert_eq!(node.containers(Some("ws-undo")).len(), 1, "ws-undo has no container of its own");
    let left: Vec<String> = pool_slots(&node).into_iter().map(|(_, id)| id).collect();
    assert_eq!(left, vec![slots[0].1.clone()], "the undone claim's container is still there");
    restarted.destroy(&id("ws-finish")).await.unwrap();
    restarted.destroy(&id("ws-undo")).await.unwrap();
    assert_eq!(node.pool_containers(), Vec::<String>::new());
}
