//! Cross-process: `berth control-plane --auth token` on a real etcd, `berth node-agent`s
//! with their own credentials (`berth node-credential`), and the `berth` CLI with
//! `--token` / `--act-as`.

use std::process::{Command, Output};
use std::time::Duration;

use berth_testkit::wait_until;
use berth_tests::berth::{BerthProcess, DEFAULT_LOG_FILTER, berth_binary};
use berth_tests::etcd::EtcdProcess;
use nix::sys::signal::Signal;

const TOKENS: &str = r#"
[[token]]
secret = "alice-token-0123456789"
user = "alice"
backends = ["local"]
[[token]]
secret = "eve-token-0123456789"
user = "eve"
backends = ["local"]
[[token]]
secret = "platform-token-0123456789"
service = "platform"
act_for_users = true
"#;

fn cli(endpoint: &str, token: Option<&str>, args: &[&str]) -> Output {
    let mut command = Command::new(berth_binary());
    command.arg("--endpoint").arg(endpoint).args(args).env_remove("BERTH_TOKEN").env_remove("BERTH_ACT_AS");
    if let Some(token) = token {
        command.env("BERTH_TOKEN", token);
    }
    command.output().expect("run the berth cli")
}

/// Writes a node credential key into `dir` and, with `berth node-credential`, the
/// credential of each node id; returns the key's path and the credentials' paths.
fn node_credentials(dir: &std::path::Path, node_ids: &[&str]) -> (String, Vec<String>) {
    let key = dir.join("node-credential.key");
    std::fs::write(&key, format!("{:032x}{:032x}\n", rand::random::<u128>(), rand::random::<u128>())).unwrap();
    let key = key.display().to_string();
    let credentials = node_ids
        .iter()
        .map(|node_id| {
            let out = dir.join(format!("{node_id}.credential")).display().to_string();
            let made = Command::new(berth_binary())
                .args(["node-credential", "--key-file", &key, "--node-id", node_id, "--out", &out])
                .output()
                .expect("run berth node-credential");
            assert!(made.status.success(), "berth node-credential: {}", text(&made.stderr));
            out
        })
        .collect();
    (key, credentials)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `berth control-plane --auth token` ([`TOKENS`]) on a fresh etcd and one node agent with
/// its own credential, both logging at `log_filter`: `replica-<name>` and `node-<name>`.
struct TokenCluster {
    _etcd: EtcdProcess,
    dir: tempfile::TempDir,
    tokens: std::path::PathBuf,
    /// The node credential key's path and the node's credential's path.
    key: String,
    credential: String,
    replica: BerthProcess,
    node: BerthProcess,
}

async fn token_cluster(name: &str, log_filter: &str) -> TokenCluster {
    let etcd = EtcdProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let node_id = format!("node-{name}");
    let (key, mut credentials) = node_credentials(dir.path(), &[node_id.as_str()]);
    let prefix = format!("/berth-{name}-{:016x}", rand::random::<u64>());
    let replica_id = format!("replica-{name}");
    let replica_args = [
        "control-plane",
        "--etcd",
        &etcd.endpoint(),
        "--key-prefix",
        &prefix,
        "--replica-id",
        &replica_id,
        "--auth",
        "token",
        "--tokens-file",
        &tokens.display().to_string(),
        "--node-credential-key-file",
        &key,
    ]
    .map(str::to_owned)
    .to_vec();
    let replica = BerthProcess::start_with_log(&replica_id, replica_args, log_filter).await.unwrap();
    let credential = credentials.remove(0);
    let data = dir.path().join("node").display().to_string();
    let node_args = [
        "node-agent",
        "--control-plane",
        &replica.endpoint,
        "--data-dir",
        &data,
        "--node-id",
        &node_id,
        "--allow-unsandboxed",
        "--node-credential-file",
        &credential,
    ]
    .map(str::to_owned)
    .to_vec();
    let node = BerthProcess::start_with_log(&node_id, node_args, log_filter).await.unwrap();
    TokenCluster { _etcd: etcd, dir, tokens, key, credential, replica, node }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_with_tokens_and_the_cli() {
    let cluster = token_cluster("auth", DEFAULT_LOG_FILTER).await;
    let TokenCluster { dir, tokens, key, credential, replica, node, .. } = &cluster;
    let endpoint = replica.endpoint.clone();
    let alice = Some("alice-token-0123456789");

    // alice's session, once the node registered.
    let mut created = None;
    let ready = wait_until(Duration::from_secs(30), || {
        let output = cli(&endpoint, alice, &["session", "create", "--agent", "coder", "-o", "json"]);
        let ok = output.status.success();
        if ok {
            created = Some(output);
        }
        async move { ok }
    })
    .await;
    assert!(ready, "no session for alice; replica log:\n{}", replica.log());
    let session: serde_json::Value = serde_json::from_slice(&created.unwrap().stdout).expect("json session");
    assert_eq!(session["user_id"], "alice", "{session}");
    let workspace = session["workspace_id"].as_str().expect("workspace id").to_owned();

    let ran = cli(&endpoint, alice, &["exec", &workspace, "--", "echo", "hi"]);
    assert!(ran.status.success(), "alice exec: {}", text(&ran.stderr));
    assert_eq!(text(&ran.stdout), "hi\n");

    // No token: one clear line, exit 1.
    let anonymous = cli(&endpoint, None, &["ws", "list"]);
    assert_eq!(anonymous.status.code(), Some(1));
    assert!(text(&anonymous.stderr).contains("unauthenticated"), "{}", text(&anonymous.stderr));
    // Another user: the workspace does not exist for them.
    let eve = cli(&endpoint, Some("eve-token-0123456789"), &["exec", &workspace, "--", "true"]);
    assert_eq!(eve.status.code(), Some(1));
    assert!(text(&eve.stderr).contains("not found"), "{}", text(&eve.stderr));
    // alice shares the workspace with eve through the CLI; then eve may use it.
    let shared = cli(&endpoint, alice, &["ws", "share", &workspace, "eve", "-o", "json"]);
    assert!(shared.status.success(), "share: {}", text(&shared.stderr));
    assert!(text(&shared.stdout).contains("\"eve\""), "{}", text(&shared.stdout));
    let eve_again = cli(&endpoint, Some("eve-token-0123456789"), &["exec", &workspace, "--", "true"]);
    assert!(eve_again.status.success(), "eve after the share: {}", text(&eve_again.stderr));
    let reshare = cli(&endpoint, Some("eve-token-0123456789"), &["ws", "share", &workspace, "mallory"]);
    assert!(text(&reshare.stderr).contains("permission denied"), "{}", text(&reshare.stderr));
    // A user may not speak for another.
    let spoof = cli(&endpoint, alice, &["session", "create", "--user", "eve", "--agent", "coder"]);
    assert!(text(&spoof.stderr).contains("permission denied"), "{}", text(&spoof.stderr));
    // The service acts for alice with --act-as.
    let acting =
        cli(&endpoint, Some("platform-token-0123456789"), &["--act-as", "alice", "exec", &workspace, "--", "true"]);
    assert!(acting.status.success(), "service for alice: {}", text(&acting.stderr));
    // An admin call needs an admin.
    let nodes = cli(&endpoint, alice, &["nodes", "list"]);
    assert!(text(&nodes.stderr).contains("permission denied"), "{}", text(&nodes.stderr));

    // SIGHUP re-reads the tokens file: a new token works without a restart.
    std::fs::write(tokens, format!("{TOKENS}\n[[token]]\nsecret = \"ops-token-0123456789\"\nadmin = true\n")).unwrap();
    replica.process.signal(Signal::SIGHUP);
    let reloaded = wait_until(Duration::from_secs(10), || {
        let ok = cli(&endpoint, Some("ops-token-0123456789"), &["nodes", "list"]).status.success();
        async move { ok }
    })
    .await;
    assert!(reloaded, "the admin token added to the file was never accepted; log:\n{}", replica.log());
    assert!(replica.log().contains("berth::audit"), "no audit lines in the replica log");

    // The token from a file: nothing secret on the CLI's command line, and no warning.
    let token_file = dir.path().join("alice.token");
    std::fs::write(&token_file, "alice-token-0123456789\n").unwrap();
    let from_file = cli(&endpoint, None, &["--token-file", &token_file.display().to_string(), "ws", "list"]);
    assert!(from_file.status.success(), "--token-file: {}", text(&from_file.stderr));
    assert!(!text(&from_file.stderr).contains("warning"), "{}", text(&from_file.stderr));
    // A token on the command line still works, with a warning naming the safe ways.
    let on_argv = cli(&endpoint, None, &["--token", "alice-token-0123456789", "ws", "list"]);
    assert!(on_argv.status.success(), "--token: {}", text(&on_argv.stderr));
    assert!(
        text(&on_argv.stderr).contains("warning: --token puts a secret on the command line"),
        "{}",
        text(&on_argv.stderr)
    );
    // What `ps` shows of the running servers holds no secret: every one came from a file.
    let key_text = std::fs::read_to_string(key).unwrap();
    let credential_text = std::fs::read_to_string(credential).unwrap();
    for (name, pid) in [("replica", replica.pid()), ("node", node.pid())] {
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("cmdline");
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        for secret in [key_text.trim(), credential_text.trim(), "alice-token-0123456789", "ops-token-0123456789"] {
            assert!(!cmdline.contains(secret), "{name}'s command line shows a secret: {cmdline}");
        }
    }
    // Nor do their logs, although every one of those secrets crossed them.
    for (name, log) in [("replica", replica.log()), ("node", node.log())] {
        for secret in [key_text.trim(), credential_text.trim(), "alice-token-0123456789", "ops-token-0123456789"] {
            assert!(!log.contains(secret), "{name}'s log shows a secret");
        }
        // The replica credential the node received on every call is derived; none of it shows.
        assert!(!log.contains("berth-replica.node-auth."), "{name}'s log shows a replica credential");
    }
}

/// Issue 14: two real node-agent processes with the same id and credential (a copied
/// credential, or a node started twice). The second cannot take the id over while the first
/// lives: the record keeps the first's address, and the second's log says why. Once the
/// first is killed, its lease runs out and the second registers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_node_agent_cannot_take_over_a_live_node_id() {
    let etcd = EtcdProcess::start();
    let dir = tempfile::tempdir().unwrap();
    let (key, credentials) = node_credentials(dir.path(), &["node-twin"]);
    let prefix = format!("/berth-twin-{:016x}", rand::random::<u64>());
    let replica = BerthProcess::start(
        "replica-twin",
        ["control-plane", "--etcd", &etcd.endpoint(), "--key-prefix", &prefix, "--replica-id", "replica-twin"]
            .into_iter()
            .chain(["--node-credential-key-file", &key, "--node-lease-ttl", "4s", "--heartbeat-interval", "1s"])
            .map(str::to_owned)
            .collect(),
    )
    .await
    .unwrap();
    let node_args = |data: &str| -> Vec<String> {
        [
            "node-agent",
            "--control-plane",
            &replica.endpoint,
            "--data-dir",
            data,
            "--node-id",
            "node-twin",
            "--allow-unsandboxed",
            "--node-credential-file",
            &credentials[0],
        ]
        .map(str::to_owned)
        .to_vec()
    };
    let first_data = dir.path().join("first").display().to_string();
    let first = BerthProcess::start("node-twin-1", node_args(&first_data)).await.unwrap();
    let address_of_node = || async {
        let output = cli(&replica.endpoint, None, &["nodes", "list", "-o", "json"]);
        let listed = text(&output.stdout);
        listed.contains("node-twin").then_some(listed)
    };
    let listed = berth_testkit::wait_for(Duration::from_secs(30), address_of_node).await.expect("first node listed");
    assert!(listed.contains(&first.endpoint), "{listed}");

    let second_data = dir.path().join("second").display().to_string();
    let second = BerthProcess::start("node-twin-2", node_args(&second_data)).await.unwrap();
    let refused =
        wait_until(Duration::from_secs(20), || async { second.log().contains("node id node-twin is held") }).await;
    assert!(refused, "the second process was not refused; its log:\n{}", second.log());
    let listed = address_of_node().await.expect("listed");
    assert!(listed.contains(&first.endpoint) && !listed.contains(&second.endpoint), "taken over: {listed}");
    assert!(replica.log().contains("registration refused: the node id is held on another lease"), "{}", replica.log());

    // The holder dies: its lease runs out and the id is free for the second process.
    first.kill();
    let moved = wait_until(Duration::from_secs(30), || async {
        address_of_node().await.is_some_and(|listed| listed.contains(&second.endpoint))
    })
    .await;
    assert!(moved, "the second process never registered after the first died:\n{}", second.log());
}

/// Secret-bearing fields never reach a log: with every process at `debug`, a workspace's
/// spec env value and the caller's bearer token appear in no line of the replica's or the
/// node agent's log, though the value did reach the workspace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spec_env_values_and_tokens_stay_out_of_debug_logs() {
    use berth_proto::auth::{BearerInterceptor, Secret};
    use berth_proto::v1;
    use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
    let TokenCluster { replica, node, .. } = &token_cluster("logs", "debug").await;
    let token = "alice-token-0123456789";
    let secret = format!("sk-logged-{:032x}", rand::random::<u128>());
    let mut client =
        WorkspaceServiceClient::with_interceptor(replica.channel(), BearerInterceptor::new(Some(&Secret::new(token))));
    let spec =
        v1::WorkspaceSpec { env: [("API_KEY".to_owned(), secret.clone())].into_iter().collect(), ..Default::default() };
    let request = || v1::CreateSessionRequest {
        user_id: "alice".into(),
        agent_id: "logs".into(),
        backend: "local".into(),
        spec: Some(spec.clone()),
        ..Default::default()
    };
    let workspace =
        berth_testkit::eventually_ok("alice's session once the node registered", Duration::from_secs(30), || {
            let (mut client, request) = (client.clone(), request());
            async move { client.create_session(request).await.map(|session| session.into_inner().workspace_id) }
        })
        .await;
    let ran = client
        .exec(v1::ExecRequest {
            workspace_id: workspace.clone(),
            argv: vec!["sh".into(), "-c".into(), "printf %s \"$API_KEY\"".into()],
            timeout_ms: 10_000,
            ..Default::default()
        })
        .await
        .expect("exec")
        .into_inner();
    assert_eq!(String::from_utf8_lossy(&ran.stdout), secret, "the value reached the workspace");
    let got = client.get_workspace(v1::GetWorkspaceRequest { workspace_id: workspace.clone() }).await.expect("get");
    assert!(format!("{:?}", got.into_inner()).contains(&secret), "the owner reads its own spec env");

    for (name, log) in [("replica", replica.log()), ("node agent", node.log())] {
        assert!(log.contains(&workspace), "the {name} logged nothing about the workspace at debug:\n{log}");
        for line in log.lines() {
            assert!(!line.contains(&secret), "the {name} logged a spec env value: {line}");
            assert!(!line.contains(token), "the {name} logged a bearer token: {line}");
        }
    }
}
