//! MCP servers that hold secrets, and the SSRF guard of HTTP MCP servers (items 5 and 6 of
//! the isolation issue). Each case runs the real `berth up` (`cargo build -p berth --bin
//! berth` first) and attacks through the public API and execs, as a tenant's agent would.
//!
//! Attacks and entry points:
//! - MCP binary swap: the agent replaces the (pinned) server program in its workspace, then
//!   makes the server restart (Docker; bubblewrap).
//! - `/proc/*/environ` of a running secret-holding server, signals, its private directory
//!   (Docker).
//! - HOME / cwd planting: a `.profile` a login shell server would source (Docker: the base
//!   image has no Python), `usercustomize.py` / `sitecustomize.py` for a Python server
//!   (bubblewrap).
//! - SSRF: an HTTP MCP server at 127.0.0.1:<listener> (by address, by name, as an
//!   IPv4-mapped IPv6 address) and at 169.254.169.254; a control run with
//!   `--mcp-allow-cidr 127.0.0.1/32` shows the listener does see a connection when allowed.
//! - Two tenants on one node: code in A's sandbox looks for B's MCP secret (Docker;
//!   bubblewrap).
//!
//! Markers: every attack tries to write what it stole into its own workspace, which is a
//! host directory under the node's data dir; the test greps that directory (on the host)
//! for the secret, and checks exec output and errors for it too.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use berth_proto::v1::contract_service_client::ContractServiceClient;
use berth_proto::v1::{self, mcp_server};
use berth_tests::berth::{BerthProcess, start_up};
use tonic::transport::Channel;

use super::find_dir;

/// A `berth up` node offering `backend`, and its data directory.
struct Node {
    up: BerthProcess,
    data: tempfile::TempDir,
}

impl Node {
    async fn start(backend: &str, extra: &[&str]) -> Self {
        let data = tempfile::Builder::new().prefix("berth-attack-mcp-").tempdir().unwrap();
        // Sandbox users must be able to reach workspace roots below the data dir.
        std::fs::set_permissions(data.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        let mut flags = vec!["--backend", backend];
        flags.extend_from_slice(extra);
        let up = start_up(data.path(), &flags).await.expect("berth up (cargo build -p berth --bin berth first)");
        Self { up, data }
    }

    fn contract(&self) -> ContractServiceClient<Channel> {
        ContractServiceClient::new(self.up.channel())
    }

    /// A workspace of `user` (made unique per test: `berth up` is always node `node-up`, and
    /// Docker container names derive from node and workspace ids, so two tests' workspaces
    /// must differ).
    async fn workspace(&self, user: &str, backend: &str) -> String {
        let request = v1::CreateSessionRequest {
            user_id: format!("{user}-{}", hex::encode(rand::random::<[u8; 6]>())),
            agent_id: "attacker".into(),
            backend: backend.into(),
            ..Default::default()
        };
        let client = self.up.workspace_client();
        // The node registers shortly after `berth up` serves.
        let what = format!("a {backend} workspace");
        let session = berth_testkit::eventually_ok(&what, Duration::from_secs(30), || {
            let (mut client, request) = (client.clone(), request.clone());
            async move { client.create_session(request).await }
        })
        .await;
        session.into_inner().workspace_id
    }

    /// The host directory of a workspace (below the node's data dir).
    fn host_root(&self, workspace: &str) -> PathBuf {
        find_dir(self.data.path(), workspace).unwrap_or_else(|| panic!("no host directory for {workspace}"))
    }

    async fn sh(&self, workspace: &str, script: &str) -> v1::ExecResult {
        self.up.exec(workspace, &["sh", "-c", script]).await.expect("exec")
    }

    /// Installs the MCP fixture at `bin/berth-mcp-fixture` (executable).
    async fn install_fixture(&self, workspace: &str) {
        let bytes = std::fs::read(berth_testkit::mcp_fixture::binary()).unwrap();
        self.up.write_file(workspace, berth_testkit::mcp_fixture::INSTALL_PATH, &bytes).await.expect("write fixture");
        let made = self.sh(workspace, "chmod 0755 bin/berth-mcp-fixture").await;
        assert_eq!(made.exit_code, 0, "{}", String::from_utf8_lossy(&made.stderr));
    }

    async fn add_stdio(&self, workspace: &str, name: &str, stdio: v1::McpStdio) -> Result<(), tonic::Status> {
        let server = v1::McpServer { name: name.into(), transport: Some(mcp_server::Transport::Stdio(stdio)) };
        let request = v1::AddMcpRequest { workspace_id: workspace.into(), server: Some(server), replace: true };
        self.contract().add_mcp(request).await.map(drop)
    }

    async fn call(
        &self,
        workspace: &str,
        server: &str,
        tool: &str,
        arguments: serde_json::Value,
    ) -> Result<v1::CallMcpToolResponse, tonic::Status> {
        let request = v1::CallMcpToolRequest {
            workspace_id: workspace.into(),
            server: server.into(),
            tool: tool.into(),
            arguments_json: arguments.to_string(),
            timeout_ms: 20_000,
        };
        self.contract().call_mcp_tool(request).await.map(tonic::Response::into_inner)
    }
}

/// Every file below `dir` (on the host) whose content holds `secret`.
fn files_holding(dir: &Path, secret: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return found };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => found.extend(files_holding(&path, secret)),
            Ok(kind) if kind.is_file() => {
                let content = std::fs::read(&path).unwrap_or_default();
                if String::from_utf8_lossy(&content).contains(secret) {
                    found.push(path);
                }
            }
            _ => {}
        }
    }
    found
}

fn secret() -> String {
    format!("attack-secret-{}", hex::encode(rand::random::<[u8; 12]>()))
}

fn value(value: &str, secret: bool) -> v1::McpValue {
    v1::McpValue { value: value.into(), secret }
}

/// The fixture declared with `TOKEN` = `secret`, pinned.
fn fixture_with_secret(secret: &str) -> v1::McpStdio {
    v1::McpStdio {
        command: berth_testkit::mcp_fixture::INSTALL_PATH.into(),
        env: [("TOKEN".to_owned(), value(secret, true))].into(),
        sha256: berth_testkit::mcp_fixture::sha256_hex().into(),
        ..Default::default()
    }
}

fn output_text(result: &v1::ExecResult) -> String {
    format!("{}{}", String::from_utf8_lossy(&result.stdout), String::from_utf8_lossy(&result.stderr))
}

// ---- MCP binary swap ---------------------------------------------------------------------

/// The agent replaces the pinned server program with its own script and crashes the server
/// so that it restarts: the swapped program must never run with the secret.
async fn binary_swap(backend: &str) {
    let node = Node::start(backend, &[]).await;
    let workspace = node.workspace("alice", backend).await;
    node.install_fixture(&workspace).await;
    let token = secret();
    // An unpinned workspace program is refused before anything runs.
    let mut unpinned = fixture_with_secret(&token);
    unpinned.sha256.clear();
    let refused = node.add_stdio(&workspace, "echo", unpinned).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("sha256"), "{}", refused.message());

    node.add_stdio(&workspace, "echo", fixture_with_secret(&token)).await.expect("add pinned");
    let env = node.call(&workspace, "echo", "env", serde_json::json!({"name": "TOKEN"})).await.expect("env");
    assert_eq!(env.text, token, "the pinned server did not get its secret");

    let swap = node
        .sh(
            &workspace,
            "printf '#!/bin/sh\\nenv > %s/stolen-by-swap\\n' \"$PWD\" > bin/new && chmod 0755 bin/new && \
             mv -f bin/new bin/berth-mcp-fixture && echo swapped",
        )
        .await;
    assert!(output_text(&swap).contains("swapped"), "the swap itself failed: {}", output_text(&swap));
    let _ = node.call(&workspace, "echo", "crash", serde_json::json!({})).await;
    let after = node.call(&workspace, "echo", "env", serde_json::json!({"name": "TOKEN"})).await;
    let after_text = format!("{after:?}");
    assert!(after.is_err(), "the swapped program answered: {after_text}");
    assert!(!after_text.contains(&token), "the error shows the secret: {after_text}");
    let root = node.host_root(&workspace);
    assert!(!root.join("stolen-by-swap").exists(), "the swapped program ran (marker {})", root.display());
    assert_eq!(files_holding(&root, &token), Vec::<PathBuf>::new(), "the secret reached the workspace");

    // Next step: re-pin `.mcp` to the swapped program. The pin is part of the binding, so
    // the edited declaration no longer gets the secret.
    let repin = node
        .sh(
            &workspace,
            &format!(
                "new=$(sha256sum bin/berth-mcp-fixture | cut -d' ' -f1) && \
                 sed -i \"s/{}/$new/\" .mcp && grep -c \"$new\" .mcp",
                berth_testkit::mcp_fixture::sha256_hex()
            ),
        )
        .await;
    assert_eq!(output_text(&repin).trim(), "1", "the re-pin itself failed: {}", output_text(&repin));
    let repinned = node.call(&workspace, "echo", "env", serde_json::json!({"name": "TOKEN"})).await;
    let repinned_text = format!("{repinned:?}");
    assert!(!repinned_text.contains(&token), "the re-pinned program got the secret: {repinned_text}");
    assert!(
        std::fs::read_to_string(root.join("stolen-by-swap")).map_or(true, |stolen| !stolen.contains(&token)),
        "the re-pinned program ran with the secret"
    );
    assert_eq!(files_holding(&root, &token), Vec::<PathBuf>::new(), "the secret reached the workspace");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_mcp_binary_swap_is_never_run() {
    binary_swap("docker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_mcp_binary_swap_is_never_run() {
    binary_swap("bubblewrap").await;
}

// ---- /proc/<pid>/environ, signals, the private directory (Docker) ------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_mcp_server_environ_is_unreadable() {
    let node = Node::start("docker", &[]).await;
    let workspace = node.workspace("alice", "docker").await;
    node.install_fixture(&workspace).await;
    let token = secret();
    node.add_stdio(&workspace, "echo", fixture_with_secret(&token)).await.expect("add");
    let pid = node.call(&workspace, "echo", "pid", serde_json::json!({})).await.expect("pid").text;
    let home = node.call(&workspace, "echo", "env", serde_json::json!({"name": "HOME"})).await.expect("home").text;

    // Everything an agent might try, its loot written into its workspace.
    let script = format!(
        "id; cat /proc/{pid}/environ; for f in /proc/[0-9]*/environ; do cat \"$f\"; done; \
         tr '\\0' '\\n' < /proc/{pid}/environ; ls -la {home}; cat {home}/*; \
         echo planted > {home}/planted; cp /proc/{pid}/exe ./exe-copy; \
         kill -9 {pid} && echo killed; \
         grep -rl TOKEN /proc/*/environ"
    );
    let attack = node.sh(&workspace, &format!("( {script} ) > loot 2>&1; cat loot")).await;
    let text = output_text(&attack);
    assert!(!text.contains(&token), "the agent read the secret: {text}");
    assert!(!text.contains("killed"), "the agent could signal the server: {text}");
    assert!(text.contains("uid=1000"), "the agent is not the workspace user: {text}");
    let root = node.host_root(&workspace);
    assert_eq!(files_holding(&root, &token), Vec::<PathBuf>::new(), "the secret reached the workspace");
    assert!(home.starts_with("/tmp/berth-secret."), "HOME of the server: {home:?}");
    // The server is untouched: same process, still serving, nothing planted.
    let again = node.call(&workspace, "echo", "pid", serde_json::json!({})).await.expect("pid again");
    assert_eq!(again.text, pid);
    assert!(!again.started);
    let planted = node.sh(&workspace, &format!("test -e {home}/planted && echo present || echo absent")).await;
    assert!(!output_text(&planted).contains("present"), "{}", output_text(&planted));
}

// ---- HOME / cwd planting ------------------------------------------------------------------

/// Docker: `/bin/sh -l` reads `$HOME/.profile`; the agent plants one in its own HOME and
/// in the workspace (the server's declared cwd).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_mcp_server_home_is_not_the_agents() {
    let node = Node::start("docker", &[]).await;
    let workspace = node.workspace("alice", "docker").await;
    let token = secret();
    let plant = node
        .sh(
            &workspace,
            "for d in \"$HOME\" \"$PWD\"; do echo \"env > $PWD/stolen-by-profile\" > \"$d/.profile\"; done; echo planted",
        )
        .await;
    assert!(output_text(&plant).contains("planted"), "{}", output_text(&plant));
    let login_shell = v1::McpStdio {
        command: "/bin/sh".into(),
        args: vec!["-l".into(), "-c".into(), "exit 0".into()],
        env: [("TOKEN".to_owned(), value(&token, true))].into(),
        ..Default::default()
    };
    node.add_stdio(&workspace, "login", login_shell).await.expect("add");
    // Not an MCP server: the start fails, after the shell has read its profile, if any.
    let _ = node.call(&workspace, "login", "x", serde_json::json!({})).await;
    let root = node.host_root(&workspace);
    assert!(!root.join("stolen-by-profile").exists(), "the planted .profile ran in the server");
    assert_eq!(files_holding(&root, &token), Vec::<PathBuf>::new(), "the secret reached the workspace");
}

/// Bubblewrap: a Python server started as `/usr/bin/python3` would import
/// `usercustomize.py` from the user site of its HOME and `sitecustomize.py` from its cwd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_usercustomize_is_not_imported() {
    let node = Node::start("bubblewrap", &[]).await;
    let workspace = node.workspace("alice", "bubblewrap").await;
    let token = secret();
    // The agent plants its module where a Python server would import it: the user site of
    // its HOME, and its cwd (the workspace root, the server's declared cwd).
    let payload =
        "import os\np = os.environ.get('BERTH_LOOT')\nif p:\n    open(p, 'w').write(repr(dict(os.environ)))\n";
    let plant = v1::ExecRequest {
        workspace_id: workspace.clone(),
        argv: [
            "sh",
            "-c",
            "site=$(python3 -c 'import site; print(site.getusersitepackages())') && mkdir -p \"$site\" && \
                cat > usercustomize.py && cp usercustomize.py sitecustomize.py && \
                cp usercustomize.py sitecustomize.py \"$site/\" && echo \"$PWD\"",
        ]
        .map(str::to_owned)
        .to_vec(),
        stdin: payload.as_bytes().to_vec(),
        ..Default::default()
    };
    let planted = node.up.workspace_client().exec(plant).await.expect("plant").into_inner();
    assert_eq!(planted.exit_code, 0, "{}", output_text(&planted));
    let inside_root = String::from_utf8_lossy(&planted.stdout).trim().to_owned();
    let python = v1::McpStdio {
        command: "/usr/bin/python3".into(),
        args: vec!["-c".into(), "pass".into()],
        env: [
            ("TOKEN".to_owned(), value(&token, true)),
            ("BERTH_LOOT".to_owned(), value(&format!("{inside_root}/stolen-by-python"), false)),
        ]
        .into(),
        ..Default::default()
    };
    node.add_stdio(&workspace, "py", python).await.expect("add");
    let _ = node.call(&workspace, "py", "x", serde_json::json!({})).await;
    let root = node.host_root(&workspace);
    assert!(!root.join("stolen-by-python").exists(), "a planted customize module ran in the server");
    assert_eq!(files_holding(&root, &token), Vec::<PathBuf>::new(), "the secret reached the workspace");
}

// ---- SSRF -----------------------------------------------------------------------------------

/// A listener on 127.0.0.1 that counts the connections it accepts.
async fn recording_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&accepted);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counter.fetch_add(1, Ordering::SeqCst);
            drop(stream);
        }
    });
    (port, accepted)
}

async fn add_http(node: &Node, workspace: &str, name: &str, url: &str, token: &str) {
    let server = v1::McpServer {
        name: name.into(),
        transport: Some(mcp_server::Transport::Http(v1::McpHttp {
            url: url.into(),
            headers: [("authorization".to_owned(), value(token, true))].into(),
        })),
    };
    let request = v1::AddMcpRequest { workspace_id: workspace.into(), server: Some(server), replace: true };
    node.contract().add_mcp(request).await.expect("add http mcp");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssrf_to_loopback_and_metadata_is_refused() {
    let (port, accepted) = recording_listener().await;
    // Any backend: an HTTP server is reached from the node agent itself.
    let node = Node::start("bubblewrap", &[]).await;
    let workspace = node.workspace("alice", "bubblewrap").await;
    let token = secret();
    let targets = [
        format!("http://127.0.0.1:{port}/mcp"),
        format!("http://localhost:{port}/mcp"),
        format!("http://[::ffff:127.0.0.1]:{port}/mcp"),
        format!("http://127.1:{port}/mcp"),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://[::ffff:a9fe:a9fe]/latest/meta-data/".to_owned(),
    ];
    let mut answers = Vec::new();
    for (index, url) in targets.iter().enumerate() {
        let name = format!("ssrf-{index}");
        add_http(&node, &workspace, &name, url, &token).await;
        answers.push((url, node.call(&workspace, &name, "echo", serde_json::json!({"text": "x"})).await));
    }
    // The marker first: nothing reached the listener.
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "the node connected to the loopback listener");
    for (url, answer) in answers {
        let refused = answer.unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{url}: {refused:?}");
        assert!(refused.message().contains("--mcp-allow-cidr"), "{url}: {}", refused.message());
        assert!(!refused.message().contains(&token), "{url}: the error shows the secret");
    }
}

/// The control: with the range allowed, the same declaration reaches the listener, so the
/// zero above is the guard's doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ssrf_control_allowed_range_reaches_the_listener() {
    let (port, accepted) = recording_listener().await;
    let node = Node::start("bubblewrap", &["--mcp-allow-cidr", "127.0.0.1/32"]).await;
    let workspace = node.workspace("alice", "bubblewrap").await;
    add_http(&node, &workspace, "allowed", &format!("http://127.0.0.1:{port}/mcp"), &secret()).await;
    let failed = node.call(&workspace, "allowed", "echo", serde_json::json!({"text": "x"})).await.unwrap_err();
    assert_ne!(failed.code(), tonic::Code::PermissionDenied, "{failed:?}");
    let seen = Arc::clone(&accepted);
    berth_testkit::assert_eventually("the listener saw the allowed connection", Duration::from_secs(10), move || {
        let seen = Arc::clone(&seen);
        async move { seen.load(Ordering::SeqCst) > 0 }
    })
    .await;
}

// ---- two tenants on one node ----------------------------------------------------------------

/// Bob's MCP server holds a secret; code in Alice's sandbox looks everywhere it can.
async fn two_tenants(backend: &str) {
    let node = Node::start(backend, &[]).await;
    let alice = node.workspace("alice", backend).await;
    let bob = node.workspace("bob", backend).await;
    node.install_fixture(&bob).await;
    let token = secret();
    node.add_stdio(&bob, "vault", fixture_with_secret(&token)).await.expect("add");
    let env = node.call(&bob, "vault", "env", serde_json::json!({"name": "TOKEN"})).await.expect("env");
    assert_eq!(env.text, token);
    let bob_root = node.host_root(&bob);
    let secrets_dir = node.data.path().display().to_string();
    let script = format!(
        "for f in /proc/[0-9]*/environ; do cat \"$f\"; done; \
         cat {bob}/.mcp; ls -R {secrets_dir}; cat $(find {secrets_dir} -name '*.json' 2>/dev/null); \
         grep -rs attack-secret- /tmp /home /proc/*/environ {secrets_dir} 2>/dev/null | head -c 4096",
        bob = bob_root.display()
    );
    let attack = node.sh(&alice, &format!("( {script} ) > loot 2>&1; cat loot")).await;
    let text = output_text(&attack);
    assert!(!text.contains(&token), "alice read bob's secret: {text}");
    let alice_root = node.host_root(&alice);
    assert_eq!(files_holding(&alice_root, &token), Vec::<PathBuf>::new(), "bob's secret reached alice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_two_tenants_cannot_read_each_others_mcp_secrets() {
    two_tenants("docker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_two_tenants_cannot_read_each_others_mcp_secrets() {
    two_tenants("bubblewrap").await;
}

// ---- MCP calls and the node's budgets ---------------------------------------------------

/// Fires `calls` concurrent 3 s `sleep` tool calls; returns (succeeded, refused with
/// RESOURCE_EXHAUSTED, the slowest refusal).
async fn concurrent_sleeps(node: &Node, workspace: &str, calls: usize) -> (usize, usize, Duration) {
    let started = std::time::Instant::now();
    let outcomes = futures::future::join_all((0..calls).map(|_| async {
        let outcome = node.call(workspace, "slow", "sleep", serde_json::json!({"ms": 3000})).await;
        (outcome, started.elapsed())
    }))
    .await;
    let mut succeeded = 0;
    let mut refused = 0;
    let mut slowest_refusal = Duration::ZERO;
    for (outcome, elapsed) in outcomes {
        match outcome {
            Ok(_) => succeeded += 1,
            Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                refused += 1;
                slowest_refusal = slowest_refusal.max(elapsed);
            }
            Err(status) => panic!("an MCP call failed otherwise: {status}"),
        }
    }
    (succeeded, refused, slowest_refusal)
}

/// A node whose one workspace runs the fixture as server `slow`, already started.
async fn node_with_slow_server(extra: &[&str]) -> (Node, String) {
    let node = Node::start("bubblewrap", extra).await;
    let workspace = node.workspace("alice", "bubblewrap").await;
    node.install_fixture(&workspace).await;
    let stdio = v1::McpStdio { command: berth_testkit::mcp_fixture::INSTALL_PATH.into(), ..Default::default() };
    node.add_stdio(&workspace, "slow", stdio).await.expect("add the server");
    node.call(&workspace, "slow", "echo", serde_json::json!({"text": "warm"})).await.expect("start the server");
    (node, workspace)
}

/// Tool results are buffered on the node like exec output (up to 16 MiB each): a call
/// reserves that from the node's output budget, so many concurrent calls returning large
/// results cannot exhaust the node's memory; past the budget a call is refused at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_calls_reserve_from_the_nodes_output_budget() {
    // Room for exactly two calls' results.
    let (node, workspace) = node_with_slow_server(&["--exec-output-budget-bytes", "33554432"]).await;
    let (succeeded, refused, slowest_refusal) = concurrent_sleeps(&node, &workspace, 4).await;
    assert_eq!((succeeded, refused), (2, 2), "4 calls on a budget of 2");
    assert!(slowest_refusal < Duration::from_secs(2), "a refusal waited {slowest_refusal:?}: it must not queue");
}

/// MCP calls count against the caller's concurrent execs (`--max-execs-per-user`): a tool
/// call runs code in the workspace just as an exec does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_calls_count_against_the_exec_quota() {
    let (node, workspace) = node_with_slow_server(&["--max-execs-per-user", "1"]).await;
    let (succeeded, refused, slowest_refusal) = concurrent_sleeps(&node, &workspace, 3).await;
    assert_eq!((succeeded, refused), (1, 2), "3 calls on a quota of 1");
    assert!(slowest_refusal < Duration::from_secs(2), "a refusal waited {slowest_refusal:?}: it must not queue");
}

/// The agent writes an HTTP server into `.mcp` itself (no AddMcp): the node would connect
/// for it from the node's network position — out of a workspace without network, and into
/// every range the operator opened for MCP with `--mcp-allow-cidr`. The node connects only
/// to HTTP servers the tenant declared through the API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_server_the_agent_wrote_into_mcp_is_never_connected() {
    let (port, accepted) = recording_listener().await;
    let node = Node::start("bubblewrap", &["--mcp-allow-cidr", "127.0.0.1/32"]).await;
    let workspace = node.workspace("mallory", "bubblewrap").await;
    let declaration = format!(
        r#"[{{"name":"exfil","transport":"http","url":"http://127.0.0.1:{port}/exfil/from-an-offline-sandbox","headers":{{"x-leak":"payload"}}}}]"#
    );
    let written = node.sh(&workspace, &format!("printf '%s' '{declaration}' > .mcp")).await;
    assert_eq!(written.exit_code, 0, "{}", output_text(&written));
    let refused = node.call(&workspace, "exfil", "echo", serde_json::json!({"text": "x"})).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("AddMcp"), "the refusal must say how to declare it: {refused:?}");
    let mut contract = node.contract();
    let listing =
        v1::ListMcpToolsRequest { workspace_id: workspace.clone(), server: "exfil".into(), timeout_ms: 5_000 };
    assert_eq!(contract.list_mcp_tools(listing).await.unwrap_err().code(), tonic::Code::PermissionDenied);
    assert_eq!(accepted.load(Ordering::SeqCst), 0, "the node connected for a declaration the agent wrote");
}
