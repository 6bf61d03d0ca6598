//! Two tenants on one Docker node, through the public API of a real `berth up --backend
//! docker`: code in A's container tries to list, read and write B's workspace — by the
//! host path of B's files, through its own mount table, through `/proc` (B's processes),
//! and by guessing B's in-container path — while a process of B runs and holds the secret
//! in its environment.
//!
//! Markers: B's secret must not show in anything A's exec prints or leaves in A's own
//! workspace (a host directory, grepped on the host), and a file A tries to create in B's
//! workspace must not appear there. Bubblewrap's two-tenant case is in `bwrap.rs`
//! (`tenant_a_cannot_list_read_or_write_tenant_b_by_host_path`), MCP secrets in `mcp.rs`.

use std::time::Duration;

use berth_proto::v1;
use berth_tests::berth::{BerthProcess, start_up};

use super::find_dir;

fn unique(prefix: &str) -> String {
    format!("{prefix}{}", hex::encode(rand::random::<[u8; 6]>()))
}

async fn workspace_of(up: &BerthProcess, user: &str) -> String {
    // Unique users: every `berth up` is node `node-up`, and container names derive from the
    // node and workspace ids.
    let request = v1::CreateSessionRequest {
        user_id: unique(user),
        agent_id: "agent".into(),
        backend: "docker".into(),
        ..Default::default()
    };
    let client = up.workspace_client();
    let session = berth_testkit::eventually_ok("a docker workspace", Duration::from_secs(60), || {
        let (mut client, request) = (client.clone(), request.clone());
        async move { client.create_session(request).await }
    })
    .await;
    session.into_inner().workspace_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_tenant_a_cannot_list_read_or_write_tenant_b() {
    let data = tempfile::Builder::new().prefix("berth-attack-tenants-").tempdir().unwrap();
    let up = start_up(data.path(), &["--backend", "docker"]).await.expect("berth up with docker");
    let alice = workspace_of(&up, "alice-").await;
    let bob = workspace_of(&up, "bob-").await;
    assert_ne!(alice, bob);
    let secret = unique("bob-secret-");
    up.write_file(&bob, "secret.txt", secret.as_bytes()).await.expect("B writes its secret");
    let bob_root = find_dir(data.path(), &bob).expect("B's workspace on the host");
    let alice_root = find_dir(data.path(), &alice).expect("A's workspace on the host");
    assert!(bob_root.join("secret.txt").is_file(), "the secret is not where the test looks");

    // B runs a process holding the secret in its env while A attacks.
    let mut holder = up.workspace_client();
    let holding = v1::ExecRequest {
        workspace_id: bob.clone(),
        argv: vec!["sh".into(), "-c".into(), "sleep 20".into()],
        env: [("BOB_SECRET".to_owned(), secret.clone())].into_iter().collect(),
        timeout_ms: 30_000,
        ..Default::default()
    };
    let bob_running = tokio::spawn(async move { holder.exec(holding).await });

    let marker = bob_root.join(unique("from-alice-"));
    let script = "cat \"$1/secret.txt\"; ls -la \"$1\"; echo x > \"$2\"; \
                  for path in $(awk '{print $4, $5}' /proc/self/mountinfo); do cat \"$path/secret.txt\" \"$path/../$3/secret.txt\"; done; \
                  for pid in /proc/[0-9]*; do cat \"$pid/environ\" \"$pid/root/workspace/secret.txt\"; done; \
                  cat /workspace/../*/secret.txt /*/$3/secret.txt; \
                  echo done";
    let attack = v1::ExecRequest {
        workspace_id: alice.clone(),
        argv: vec![
            "sh".into(),
            "-c".into(),
            format!("( {script} ) > loot 2>&1; cat loot"),
            "sh".into(),
            bob_root.display().to_string(),
            marker.display().to_string(),
            bob.clone(),
        ],
        timeout_ms: 30_000,
        ..Default::default()
    };
    let result = up.workspace_client().exec(attack).await.expect("A's exec").into_inner();
    let shown = format!("{}{}", String::from_utf8_lossy(&result.stdout), String::from_utf8_lossy(&result.stderr));
    assert!(shown.contains("done"), "the attack script did not run: {shown}");
    assert!(!shown.contains(&secret), "A's container read B's secret: {shown}");
    let loot = std::fs::read_to_string(alice_root.join("loot")).expect("A's loot file on the host");
    assert!(!loot.contains(&secret), "B's secret reached A's workspace");
    assert!(!marker.exists(), "A's container wrote into B's workspace");
    bob_running.abort();

    // Outside the containers: another host uid (any local user, an escaped sandbox of
    // another backend) cannot list or read B's workspace.
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(&bob_root).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode & 0o007, 0, "B's root is open to every host user: {mode:o}");
    let secret_path = bob_root.join("secret.txt").display().to_string();
    let outsider = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--", "cat", &secret_path])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&outsider.stdout).contains(&secret), "another host uid read B's file");
}
