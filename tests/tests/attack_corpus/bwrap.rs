//! Bubblewrap host side, through the public API of a real `berth up --backend bubblewrap`:
//!
//! - **exec env → host:** `LD_PRELOAD=<host path of an uploaded .so>` in an exec's env;
//! - **spec env → host:** the same in the workspace spec's env;
//! - **`.mcp` env → host:** the same in the env of a stdio MCP server, one with plain values
//!   only (started as the agent) and one that also holds a secret (started as a secret
//!   holder);
//! - **tenant A → tenant B by host path:** A's sandbox, and A's host uid outside it, try
//!   to list, read and write B's workspace by its host path;
//! - **memory bomb:** one runaway process, and the same memory spread over processes that
//!   each stay far below the limit, in a workspace with a 64 MiB limit.
//!
//! Markers: the planted library's constructor creates a file in the host's `/tmp` (only
//! code running on the host can); B's secret must not show in any output, and a file A
//! tries to create in B's root must not appear; the memory bomb's peak, read from the
//! workspace cgroup on the host, must stay within the limit, and the node keeps serving.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use berth_proto::v1;
use berth_tests::berth::{BerthProcess, start_up};

fn token(prefix: &str) -> String {
    format!("{prefix}{}", rand::random::<u64>())
}

/// `berth up` offering bubblewrap only, with its data in a fresh directory.
async fn bubblewrap_node() -> (tempfile::TempDir, BerthProcess) {
    // Rust's tempdir is 0755 under the default umask: sandbox uids can reach roots below.
    let data_dir = tempfile::Builder::new().prefix("berth-attack-bwrap-").tempdir().unwrap();
    let up = start_up(data_dir.path(), &["--backend", "bubblewrap"]).await.expect("berth up with bubblewrap");
    // Serving comes before the in-process node's first heartbeat.
    berth_testkit::assert_eventually("the node to register (see the berth up log)", Duration::from_secs(30), || {
        let listed = up.list_nodes();
        async move { listed.await.is_ok_and(|nodes| !nodes.is_empty()) }
    })
    .await;
    (data_dir, up)
}

async fn workspace_of(up: &BerthProcess, user: &str, spec: Option<v1::WorkspaceSpec>) -> String {
    let request = v1::CreateSessionRequest {
        user_id: user.into(),
        agent_id: "agent".into(),
        backend: "bubblewrap".into(),
        spec,
        ..Default::default()
    };
    up.workspace_client().create_session(request).await.expect("create a bubblewrap session").into_inner().workspace_id
}

fn host_root(data_dir: &Path, workspace: &str) -> PathBuf {
    data_dir.join("node").join("workspaces").join(workspace)
}

/// Compiles a library whose constructor creates `marker`, and shows that it does when a
/// host process preloads it (else the test would prove nothing).
fn planted_library(dir: &Path, marker: &Path) -> Vec<u8> {
    let source = dir.join("planted.c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n__attribute__((constructor)) static void planted(void) {{\n\
             FILE *file = fopen(\"{}\", \"w\"); if (file) {{ fputs(\"host code ran\", file); fclose(file); }} }}\n",
            marker.display()
        ),
    )
    .unwrap();
    let library = dir.join("planted.so");
    let built = Command::new("gcc").args(["-shared", "-fPIC", "-o"]).arg(&library).arg(&source).output().unwrap();
    assert!(built.status.success(), "gcc: {}", String::from_utf8_lossy(&built.stderr));
    assert!(Command::new("true").env("LD_PRELOAD", &library).status().unwrap().success());
    assert!(marker.exists(), "the planted library does not run on the host");
    std::fs::remove_file(marker).unwrap();
    std::fs::read(&library).unwrap()
}

async fn exec(up: &BerthProcess, workspace: &str, argv: &[&str], env: &[(&str, &str)]) -> v1::ExecResult {
    let request = v1::ExecRequest {
        workspace_id: workspace.into(),
        argv: argv.iter().map(|arg| (*arg).to_owned()).collect(),
        env: env.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect(),
        timeout_ms: 30_000,
        ..Default::default()
    };
    up.workspace_client().exec(request).await.expect("exec").into_inner()
}

fn output_of(result: &v1::ExecResult) -> String {
    format!("{}{}", String::from_utf8_lossy(&result.stdout), String::from_utf8_lossy(&result.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ld_preload_in_the_exec_env_stays_in_the_sandbox() {
    let (data_dir, up) = bubblewrap_node().await;
    let build_dir = tempfile::tempdir().unwrap();
    let marker = std::env::temp_dir().join(token("berth-attack-exec-env-"));
    let library = planted_library(build_dir.path(), &marker);
    let workspace = workspace_of(&up, "mallory", None).await;
    up.write_file(&workspace, "x.so", &library).await.expect("upload the library");
    let host_path = host_root(data_dir.path(), &workspace).join("x.so");
    assert!(host_path.is_file(), "the upload is not at {}", host_path.display());
    let host_path = host_path.display().to_string();
    let result = exec(&up, &workspace, &["true"], &[("LD_PRELOAD", &host_path)]).await;
    assert_eq!(result.exit_code, 0, "{}", output_of(&result));
    assert!(!marker.exists(), "LD_PRELOAD from the exec env ran code on the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ld_preload_in_the_spec_env_stays_in_the_sandbox() {
    let (_data_dir, up) = bubblewrap_node().await;
    let build_dir = tempfile::Builder::new().prefix("berth-attack-lib-").tempdir().unwrap();
    let marker = std::env::temp_dir().join(token("berth-attack-spec-env-"));
    planted_library(build_dir.path(), &marker);
    let library = build_dir.path().join("planted.so").display().to_string();
    let spec =
        v1::WorkspaceSpec { env: [("LD_PRELOAD".to_owned(), library)].into_iter().collect(), ..Default::default() };
    let workspace = workspace_of(&up, "mallory", Some(spec)).await;
    let result = exec(&up, &workspace, &["true"], &[]).await;
    assert_eq!(result.exit_code, 0, "{}", output_of(&result));
    assert!(!marker.exists(), "LD_PRELOAD from the workspace env ran code on the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_a_cannot_list_read_or_write_tenant_b_by_host_path() {
    use std::os::unix::fs::MetadataExt as _;
    let (data_dir, up) = bubblewrap_node().await;
    let workspace_a = workspace_of(&up, "alice", None).await;
    let workspace_b = workspace_of(&up, "bob", None).await;
    assert_ne!(workspace_a, workspace_b);
    let secret = token("bob-secret-");
    up.write_file(&workspace_b, "secret.txt", secret.as_bytes()).await.expect("B writes its secret");
    let root_b = host_root(data_dir.path(), &workspace_b);
    let secret_path = root_b.join("secret.txt").display().to_string();
    let marker = root_b.join(token("from-alice-"));
    let marker_text = marker.display().to_string();
    let root_b_text = root_b.display().to_string();

    // From A's sandbox, by host path and through its own mount table.
    let script = "cat \"$1\"; ls -la \"$2\"; echo x > \"$3\"; \
                  for path in $(awk '{print $4}' /proc/self/mountinfo); do cat \"$path/../$4/secret.txt\"; done; \
                  echo done";
    let result = exec(
        &up,
        &workspace_a,
        &["sh", "-c", script, "sh", &secret_path, &root_b_text, &marker_text, &workspace_b],
        &[],
    )
    .await;
    let shown = output_of(&result);
    assert!(shown.contains("done"), "{shown}");
    assert!(!shown.contains(&secret), "A's sandbox read B's secret: {shown}");
    assert!(!marker.exists(), "A's sandbox wrote into B's workspace");

    // As A's host uid, outside any namespace (what an escaped process of A could do).
    let uid_a = std::fs::metadata(host_root(data_dir.path(), &workspace_a)).unwrap().uid();
    let uid_b = std::fs::metadata(&root_b).unwrap().uid();
    assert_ne!(uid_a, 0);
    assert_ne!(uid_a, uid_b, "both workspaces run as one host uid");
    for attempt in [vec!["cat", &secret_path], vec!["ls", &root_b_text], vec!["touch", &marker_text]] {
        let output = Command::new("setpriv")
            .args([format!("--reuid={uid_a}"), format!("--regid={uid_a}"), "--clear-groups".into(), "--".into()])
            .args(&attempt)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap();
        let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
        assert!(!output.status.success() && !text.contains(&secret), "A's uid ran {attempt:?}: {text}");
    }
    assert!(!marker.exists(), "A's uid wrote into B's workspace");
}

/// The peak memory of `workspace`'s cgroup under the `berth up` process `pid`'s own
/// cgroup, as the host's cgroup files report it (v1 or v2).
fn cgroup_memory_peak(pid: u32, workspace: &str) -> Option<u64> {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let v2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let (mount, path, file) = if v2 {
        let path = own.lines().find_map(|line| line.strip_prefix("0::"))?;
        ("/sys/fs/cgroup".to_owned(), path.to_owned(), "memory.peak")
    } else {
        let line = own
            .lines()
            .find(|line| line.split(':').nth(1).is_some_and(|names| names.split(',').any(|name| name == "memory")))?;
        ("/sys/fs/cgroup/memory".to_owned(), line.splitn(3, ':').nth(2)?.to_owned(), "memory.max_usage_in_bytes")
    };
    let parent = Path::new(&mount).join(path.trim_start_matches('/')).join("berth");
    let dir = std::fs::read_dir(parent)
        .ok()?
        .flatten()
        .find(|entry| entry.file_name().to_string_lossy().starts_with(&format!("{workspace}.")))?;
    std::fs::read_to_string(dir.path().join(file)).ok()?.trim().parse().ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_is_contained_and_the_node_keeps_serving() {
    const LIMIT: u64 = 64 * 1024 * 1024;
    let (_data_dir, up) = bubblewrap_node().await;
    let spec = v1::WorkspaceSpec { memory_bytes: LIMIT, ..Default::default() };
    let workspace = workspace_of(&up, "mallory", Some(spec)).await;
    let bystander = workspace_of(&up, "alice", None).await;

    // Six processes of 16 MB each: under any per-process limit, over the workspace's.
    let spread = "for i in 1 2 3 4 5 6; do (x=$(head -c 16000000 /dev/zero | tr '\\0' a); sleep 2; \
                  echo survived$i) & done; wait";
    let result = exec(&up, &workspace, &["sh", "-c", spread], &[]).await;
    let survivors = String::from_utf8_lossy(&result.stdout).matches("survived").count();
    assert!(survivors < 6, "the spread bomb held 96 MB in a 64 MiB workspace: {}", output_of(&result));
    let peak = cgroup_memory_peak(up.pid(), &workspace).expect("the workspace cgroup on the host");
    assert!(peak <= LIMIT, "the workspace peaked at {peak} bytes, over its {LIMIT}");
    let bomb = exec(&up, &workspace, &["tail", "/dev/zero"], &[]).await;
    assert_eq!(bomb.signal, 9, "the runaway process was not killed: {}", output_of(&bomb));

    // The node is fine: the same workspace and another one still run commands.
    for target in [&workspace, &bystander] {
        let after = exec(&up, target, &["echo", "fine"], &[]).await;
        assert_eq!(String::from_utf8_lossy(&after.stdout), "fine\n", "{}", output_of(&after));
    }
    assert!(up.is_running(), "berth up died");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ld_preload_in_an_mcp_server_env_stays_in_the_sandbox() {
    use berth_proto::v1::contract_service_client::ContractServiceClient;
    use berth_proto::v1::mcp_server::Transport;

    let (data_dir, up) = bubblewrap_node().await;
    let build_dir = tempfile::tempdir().unwrap();
    let marker = std::env::temp_dir().join(token("berth-attack-mcp-env-"));
    let library = planted_library(build_dir.path(), &marker);
    let workspace = workspace_of(&up, "mallory", None).await;
    up.write_file(&workspace, "x.so", &library).await.expect("upload the library");
    let host_path = host_root(data_dir.path(), &workspace).join("x.so").display().to_string();
    let plain = |value: &str| v1::McpValue { value: value.into(), secret: false };
    let mut contract = ContractServiceClient::new(up.channel());
    for (name, secret) in [("plain", None), ("holder", Some("s3cret-value"))] {
        let mut env: std::collections::HashMap<String, v1::McpValue> =
            [("LD_PRELOAD".to_owned(), plain(&host_path))].into_iter().collect();
        if let Some(secret) = secret {
            env.insert("TOKEN".into(), v1::McpValue { value: secret.into(), secret: true });
        }
        // A system program (no pin needed) that is no MCP server: the start fails, but the
        // spawn — where a host-side preload would run — happens.
        let stdio = v1::McpStdio { command: "/bin/true".into(), env, ..Default::default() };
        let server = v1::McpServer { name: name.into(), transport: Some(Transport::Stdio(stdio)) };
        let added = contract
            .add_mcp(v1::AddMcpRequest { workspace_id: workspace.clone(), server: Some(server), replace: true })
            .await;
        added.unwrap_or_else(|status| panic!("add the {name} server: {status}"));
        let listed = contract
            .list_mcp_tools(v1::ListMcpToolsRequest {
                workspace_id: workspace.clone(),
                server: name.into(),
                timeout_ms: 10_000,
            })
            .await;
        let refused = listed.expect_err("/bin/true answered as an MCP server");
        // The sandboxed loader saw the variable and found no such file: the env reached the
        // server, inside the sandbox only.
        assert!(
            refused.message().contains("from LD_PRELOAD cannot be preloaded"),
            "the {name} server did not start with the env: {refused:?}"
        );
        assert!(!marker.exists(), "LD_PRELOAD from the {name} MCP server's env ran code on the host");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_a_cannot_read_b_spec_env_from_the_nodes_files() {
    use std::os::unix::fs::MetadataExt as _;
    let (data_dir, up) = bubblewrap_node().await;
    let workspace_a = workspace_of(&up, "alice", None).await;
    let secret = token("sk-bob-");
    let spec =
        v1::WorkspaceSpec { env: [("API_KEY".to_owned(), secret.clone())].into_iter().collect(), ..Default::default() };
    let workspace_b = workspace_of(&up, "bob", Some(spec)).await;
    assert_ne!(workspace_a, workspace_b);
    // The node keeps B's spec (env included) in its state file and `berth up`'s registry
    // journal; A's host uid (what an escaped process of A runs as) must read neither.
    let uid_a = std::fs::metadata(host_root(data_dir.path(), &workspace_a)).unwrap().uid();
    let data = data_dir.path().display().to_string();
    let output = Command::new("setpriv")
        .args([format!("--reuid={uid_a}"), format!("--regid={uid_a}"), "--clear-groups".into(), "--".into()])
        .args(["grep", "-rs", &secret, &data])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .output()
        .unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!text.contains(&secret), "A's uid read B's spec env from the node's files: {text}");
    // Control: the secret is there (as root).
    let as_root = Command::new("grep").args(["-rls", &secret, &data]).output().unwrap();
    assert!(!as_root.stdout.is_empty(), "the control found no copy of the secret under {data}");
}
