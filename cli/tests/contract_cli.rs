//! `berth fs push | pull`, `berth skills ...` and `berth mcp ...` against an in-process
//! replica and node agent (local backend): the commands, their output and their errors.

use std::path::Path;
use std::time::Duration;

use berth::{Cli, Io};
use berth_control_plane::registry::embedded::EmbeddedRegistry;
use berth_control_plane::{ControlPlaneConfig, RegistryRef};
use berth_proto::v1;
use clap::Parser;
use tokio_util::sync::CancellationToken;

struct Outcome {
    result: anyhow::Result<i32>,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn ok(&self) -> &str {
        match &self.result {
            Ok(0) => &self.stdout,
            other => panic!("command failed: {other:?}; stdout {:?} stderr {:?}", self.stdout, self.stderr),
        }
    }
}

async fn berth(endpoint: &str, args: &[&str]) -> Outcome {
    let argv = ["berth", "--endpoint", endpoint].into_iter().chain(args.iter().copied());
    let cli = Cli::try_parse_from(argv).expect("arguments parse");
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let io = Io { stdin: &mut tokio::io::empty(), stdout: &mut stdout, stderr: &mut stderr };
    let result = berth::run_with_io(cli, io).await;
    Outcome {
        result,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    }
}

/// A replica and a local node agent; returns the endpoint and a READY workspace id.
async fn cluster(cancel: &CancellationToken, data: &Path) -> (String, String) {
    let registry: RegistryRef = EmbeddedRegistry::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(berth_control_plane::serve(
        listener,
        ControlPlaneConfig::new("replica-cli"),
        registry,
        cancel.clone(),
    ));
    let node_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut node = berth_node_agent::NodeAgentConfig::new("node-cli", data.join("node"));
    node.control_planes = vec![endpoint.clone()];
    node.allow_unsandboxed = true;
    // The MCP fixture listens on loopback, which the SSRF guard refuses unless allowed.
    node.contract.mcp.allowed_cidrs = vec!["127.0.0.1/32".parse().unwrap()];
    tokio::spawn(berth_node_agent::serve(node_listener, node, cancel.clone()));
    let client = v1::workspace_service_client::WorkspaceServiceClient::new(
        tonic::transport::Endpoint::from_shared(endpoint.clone()).unwrap().connect_lazy(),
    );
    let session = berth_testkit::eventually_ok("a workspace", Duration::from_secs(30), || {
        let mut client = client.clone();
        let request = v1::CreateSessionRequest { user_id: "u".into(), agent_id: "a".into(), ..Default::default() };
        async move { client.create_session(request).await }
    })
    .await;
    (endpoint, session.into_inner().workspace_id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn trees_skills_and_mcp_from_the_cli() {
    let cancel = CancellationToken::new();
    let data = tempfile::tempdir().unwrap();
    let (endpoint, ws) = cluster(&cancel, data.path()).await;
    let endpoint = endpoint.as_str();

    // fs push / pull.
    let local = tempfile::tempdir().unwrap();
    let project = local.path().join("proj");
    std::fs::create_dir_all(project.join("src/nested")).unwrap();
    std::fs::write(project.join("README"), b"readme").unwrap();
    std::fs::write(project.join("src/nested/lib.rs"), b"pub fn f() {}").unwrap();
    let pushed = berth(endpoint, &["fs", "push", &ws, project.to_str().unwrap()]).await;
    assert!(pushed.ok().starts_with("pushed 2 files"), "{}", pushed.stdout);
    let out = local.path().join("pulled");
    let pulled = berth(endpoint, &["fs", "pull", &ws, "proj", out.to_str().unwrap()]).await;
    assert!(pulled.ok().contains("pulled"), "{}", pulled.stdout);
    assert_eq!(std::fs::read(out.join("src/nested/lib.rs")).unwrap(), b"pub fn f() {}");
    assert_eq!(std::fs::read(out.join("README")).unwrap(), b"readme");
    let again = berth(endpoint, &["fs", "push", &ws, project.to_str().unwrap()]).await;
    let error = format!("{:#}", again.result.unwrap_err());
    assert!(error.contains("already exists"), "{error}");

    // skills add (a directory) / ls / show / rm.
    let skill = local.path().join("greeter");
    std::fs::create_dir(&skill).unwrap();
    std::fs::write(skill.join("SKILL.md"), b"---\nname: greeter\ndescription: Says hello\n---\nSay hello.\n").unwrap();
    berth(endpoint, &["skills", "add", &ws, skill.to_str().unwrap()]).await.ok();
    let listed = berth(endpoint, &["skills", "ls", &ws]).await;
    assert!(listed.ok().contains("greeter") && listed.stdout.contains("Says hello"), "{}", listed.stdout);
    let shown = berth(endpoint, &["skills", "show", &ws, "greeter"]).await;
    assert_eq!(shown.ok(), "Say hello.\n");
    let json = berth(endpoint, &["-o", "json", "skills", "ls", &ws]).await;
    let parsed: serde_json::Value = serde_json::from_str(json.ok()).unwrap();
    assert_eq!(parsed[0]["name"], "greeter");
    berth(endpoint, &["skills", "rm", &ws, "greeter"]).await.ok();

    // mcp add (HTTP, secret header) / ls / tools / call / rm.
    let server_stop = CancellationToken::new();
    let url = berth_mcp_fixture::spawn_http(server_stop.clone()).await.unwrap();
    berth(endpoint, &["mcp", "add", &ws, "remote", "--url", &url, "--secret-header", "Authorization=Bearer cli"])
        .await
        .ok();
    let listed = berth(endpoint, &["mcp", "ls", &ws]).await;
    assert!(
        listed.ok().contains("authorization=<secret>") && !listed.stdout.contains("Bearer cli"),
        "{}",
        listed.stdout
    );
    let tools = berth(endpoint, &["mcp", "tools", &ws, "remote"]).await;
    assert!(tools.ok().contains("echo"), "{}", tools.stdout);
    let called = berth(endpoint, &["mcp", "call", &ws, "remote", "header", r#"{"name":"authorization"}"#]).await;
    assert_eq!(called.ok(), "Bearer cli\n");
    let slow = berth(endpoint, &["mcp", "call", &ws, "remote", "sleep", r#"{"ms":10000}"#, "--timeout", "200ms"]).await;
    let error = format!("{:#}", slow.result.unwrap_err());
    assert!(error.contains("deadline exceeded"), "{error}");
    berth(endpoint, &["mcp", "rm", &ws, "remote"]).await.ok();
    server_stop.cancel();
    cancel.cancel();
}
