//! ContractService end to end, in process: a replica and a node agent on loopback ports,
//! calls through the public API, forwarded by the router to the node agent's own
//! ContractService. Once per backend (`contract_over_grpc!(docker, "docker")` adds one).

use std::time::Duration;

use berth_control_plane::registry::embedded::EmbeddedRegistry;
use berth_control_plane::{ControlPlaneConfig, RegistryRef};
use berth_proto::v1::contract_service_client::ContractServiceClient;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use berth_proto::v1::{self, add_skill_request, mcp_server, upload_tree_request};
use berth_testkit::tar_corpus::{archive, file, gzip, symlink};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

struct Cluster {
    contract: ContractServiceClient<Channel>,
    workspace: WorkspaceServiceClient<Channel>,
    workspace_id: String,
    data: tempfile::TempDir,
    cancel: CancellationToken,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// A replica and a node agent offering `backend`, and one READY workspace on it.
async fn cluster(backend: &str) -> Cluster {
    cluster_with(backend, |_| {}).await
}

async fn cluster_with(backend: &str, tweak: impl FnOnce(&mut berth_node_agent::NodeAgentConfig)) -> Cluster {
    let registry: RegistryRef = EmbeddedRegistry::new();
    let cancel = CancellationToken::new();
    let replica_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let replica_url = format!("http://{}", replica_listener.local_addr().unwrap());
    tokio::spawn(berth_control_plane::serve(
        replica_listener,
        ControlPlaneConfig::new("replica-contract"),
        registry,
        cancel.clone(),
    ));
    let data = tempfile::Builder::new().prefix("berth-contract-").tempdir().unwrap();
    // The sandbox user must be able to reach workspace roots below the data dir.
    std::fs::set_permissions(data.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let node_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut node = berth_node_agent::NodeAgentConfig::new("node-contract", data.path().join("node"));
    node.control_planes = vec![replica_url.clone()];
    node.backends = vec![backend.to_owned()];
    node.allow_unsandboxed = true;
    tweak(&mut node);
    tokio::spawn(berth_node_agent::serve(node_listener, node, cancel.clone()));
    let channel = tonic::transport::Endpoint::from_shared(replica_url).unwrap().connect_lazy();
    let workspace = WorkspaceServiceClient::new(channel.clone());
    let ready = format!("a ready workspace on {backend}");
    let session = berth_testkit::eventually_ok(&ready, Duration::from_secs(30), || {
        let mut workspace = workspace.clone();
        let request = v1::CreateSessionRequest {
            user_id: "alice".into(),
            agent_id: format!("agent-{backend}"),
            backend: backend.into(),
            ..Default::default()
        };
        async move {
            let result = workspace.create_session(request).await;
            // Only "not registered or not serving yet" is worth waiting out.
            if let Err(status) = &result {
                assert!(
                    matches!(
                        status.code(),
                        tonic::Code::Unavailable | tonic::Code::FailedPrecondition | tonic::Code::Internal
                    ),
                    "unexpected: {status}"
                );
            }
            result
        }
    })
    .await
    .into_inner();
    let contract = ContractServiceClient::new(channel).max_decoding_message_size(64 << 20);
    Cluster { contract, workspace, workspace_id: session.workspace_id, data, cancel }
}

fn header_value(value: &str, secret: bool) -> v1::McpValue {
    v1::McpValue { value: value.into(), secret }
}

async fn mcp_over_http(backend: &str) {
    // The fixture listens on loopback, which the SSRF guard refuses unless allowed.
    let mut cluster = cluster_with(backend, |node| {
        node.contract.mcp.allowed_cidrs = vec!["127.0.0.1/32".parse().unwrap()];
    })
    .await;
    let ws = cluster.workspace_id.clone();
    let server_stop = CancellationToken::new();
    let url = berth_mcp_fixture::spawn_http(server_stop.clone()).await.unwrap();
    let secret = format!("Bearer t-{}", rand::random::<u64>());
    let server = v1::McpServer {
        name: "remote".into(),
        transport: Some(mcp_server::Transport::Http(v1::McpHttp {
            url,
            headers: [("Authorization".to_owned(), header_value(&secret, true))].into_iter().collect(),
        })),
    };
    let added = cluster
        .contract
        .add_mcp(v1::AddMcpRequest { workspace_id: ws.clone(), server: Some(server), replace: false })
        .await
        .unwrap()
        .into_inner();
    let stored = added.server.unwrap();
    let Some(mcp_server::Transport::Http(http)) = stored.transport else { panic!("not http") };
    assert_eq!(http.headers["authorization"], header_value("", true), "the secret came back");
    // Not in the workspace: `cat .mcp` inside the sandbox shows only the reference.
    let shown = cluster
        .workspace
        .exec(v1::ExecRequest {
            workspace_id: ws.clone(),
            argv: vec!["sh".into(), "-c".into(), "cat .mcp".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(!shown.contains(&secret), "{shown}");
    assert!(shown.contains("mcp/remote/header/authorization"), "{shown}");
    // The server receives it.
    let call = |tool: &str, arguments: &str| v1::CallMcpToolRequest {
        workspace_id: ws.clone(),
        server: "remote".into(),
        tool: tool.into(),
        arguments_json: arguments.into(),
        timeout_ms: 0,
    };
    let answer =
        cluster.contract.call_mcp_tool(call("header", r#"{"name":"authorization"}"#)).await.unwrap().into_inner();
    assert_eq!(answer.text, secret);
    assert!(answer.started);
    let echo = cluster.contract.call_mcp_tool(call("echo", r#"{"text":"over http"}"#)).await.unwrap().into_inner();
    assert_eq!(echo.text, "over http");
    assert!(!echo.started);
    // A slow tool: typed DEADLINE_EXCEEDED from the node.
    let mut slow = call("sleep", r#"{"ms":20000}"#);
    slow.timeout_ms = 300;
    let status = cluster.contract.call_mcp_tool(slow).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status}");
    let tools = cluster
        .contract
        .list_mcp_tools(v1::ListMcpToolsRequest { workspace_id: ws.clone(), server: "remote".into(), timeout_ms: 0 })
        .await
        .unwrap()
        .into_inner();
    assert!(tools.tools.iter().any(|tool| tool.name == "echo"));
    let listed =
        cluster.contract.list_mcps(v1::ListMcpsRequest { workspace_id: ws.clone() }).await.unwrap().into_inner();
    assert_eq!(listed.servers.len(), 1);
    assert!(listed.servers[0].live);
    // Validation happens at the replica too (the node is never asked).
    for (bad_server, bad_args) in [("../x", "{}"), ("remote", "[1]"), ("remote", "not json")] {
        let status = cluster.contract.call_mcp_tool(v1::CallMcpToolRequest {
            server: bad_server.into(),
            arguments_json: bad_args.into(),
            ..call("echo", "")
        });
        assert_eq!(status.await.unwrap_err().code(), tonic::Code::InvalidArgument);
    }
    let missing = cluster.contract.call_mcp_tool(v1::CallMcpToolRequest { server: "nope".into(), ..call("echo", "") });
    assert_eq!(missing.await.unwrap_err().code(), tonic::Code::NotFound);
    // Destroying the workspace removes its secrets from the node's private store.
    let secrets = cluster.data.path().join("node/secrets").join(format!("{ws}.json"));
    assert!(secrets.exists(), "no secret file at {}", secrets.display());
    use std::os::unix::fs::PermissionsExt as _;
    assert_eq!(std::fs::metadata(&secrets).unwrap().permissions().mode() & 0o777, 0o600);
    cluster
        .workspace
        .close_workspace(v1::CloseWorkspaceRequest { workspace_id: ws.clone(), destroy: true })
        .await
        .unwrap();
    assert!(!secrets.exists(), "secrets survived the workspace");
    server_stop.cancel();
}

async fn skills_offload_and_trees(backend: &str) {
    let mut cluster = cluster(backend).await;
    let ws = cluster.workspace_id.clone();
    // AddSkill: header, then a gzipped tar in small chunks.
    let skill = gzip(&archive(&[file("s/SKILL.md", b"---\nname: s\ndescription: A skill\n---\nBody\n")]));
    let mut messages = vec![v1::AddSkillRequest {
        msg: Some(add_skill_request::Msg::Header(v1::AddSkillHeader {
            workspace_id: ws.clone(),
            name: "greeter".into(),
            replace: false,
        })),
    }];
    messages.extend(
        skill.chunks(100).map(|chunk| v1::AddSkillRequest { msg: Some(add_skill_request::Msg::Chunk(chunk.to_vec())) }),
    );
    let added = cluster.contract.add_skill(futures::stream::iter(messages)).await.unwrap().into_inner();
    assert_eq!(added.skill.unwrap().name, "greeter");
    let listed =
        cluster.contract.list_skills(v1::ListSkillsRequest { workspace_id: ws.clone() }).await.unwrap().into_inner();
    assert_eq!(listed.skills.len(), 1);
    assert_eq!(listed.skills[0].description, "A skill");
    let got = cluster
        .contract
        .get_skill(v1::GetSkillRequest { workspace_id: ws.clone(), name: "greeter".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.body, "Body\n");
    // A hostile skill archive is refused with a typed status and leaves nothing.
    let hostile = archive(&[symlink("esc", "/etc"), file("esc/x", b"x")]);
    let messages = vec![
        v1::AddSkillRequest {
            msg: Some(add_skill_request::Msg::Header(v1::AddSkillHeader {
                workspace_id: ws.clone(),
                name: "evil".into(),
                replace: false,
            })),
        },
        v1::AddSkillRequest { msg: Some(add_skill_request::Msg::Chunk(hostile)) },
    ];
    let status = cluster.contract.add_skill(futures::stream::iter(messages)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status}");
    let skills_dir = cluster
        .workspace
        .list_dir(v1::ListDirRequest { workspace_id: ws.clone(), path: "skills".into() })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<String> = skills_dir.entries.iter().map(|entry| entry.name.clone()).collect();
    assert_eq!(names, ["greeter"]);
    let removed = cluster
        .contract
        .remove_skill(v1::RemoveSkillRequest { workspace_id: ws.clone(), name: "greeter".into() })
        .await
        .unwrap()
        .into_inner();
    assert!(removed.existed);

    // Offload.
    let context = cluster
        .contract
        .offload_context(v1::OffloadContextRequest {
            workspace_id: ws.clone(),
            session_id: "sess-a".into(),
            messages_json: vec![
                r#"{"role":"user","content":"hi"}"#.into(),
                r#"{"role":"assistant","content":"yo"}"#.into(),
            ],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((context.path.as_str(), context.messages), ("sessions/sess-a/context.jsonl", 2));
    let bad = cluster.contract.offload_context(v1::OffloadContextRequest {
        workspace_id: ws.clone(),
        session_id: "sess-a".into(),
        messages_json: vec!["{not json".into()],
    });
    assert_eq!(bad.await.unwrap_err().code(), tonic::Code::InvalidArgument);
    let result = cluster
        .contract
        .offload_tool_result(v1::OffloadToolResultRequest {
            workspace_id: ws.clone(),
            session_id: "sess-a".into(),
            tool_call_id: "call-1".into(),
            content: vec![b'x'; 50_000],
            threshold_bytes: 1000,
            preview_bytes: 10,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(result.offloaded);
    assert_eq!(result.path, "sessions/sess-a/tool_result-call-1.txt");

    // Trees: upload a tar, download it again.
    let tree = archive(&[file("src/a.txt", b"alpha"), file("src/deep/b.txt", b"beta")]);
    let mut messages = vec![v1::UploadTreeRequest {
        msg: Some(upload_tree_request::Msg::Header(v1::UploadTreeHeader {
            workspace_id: ws.clone(),
            path: "project".into(),
            overwrite: false,
        })),
    }];
    messages.extend(
        tree.chunks(500)
            .map(|chunk| v1::UploadTreeRequest { msg: Some(upload_tree_request::Msg::Chunk(chunk.to_vec())) }),
    );
    let uploaded = cluster.contract.upload_tree(futures::stream::iter(messages)).await.unwrap().into_inner();
    assert_eq!(uploaded.files, 2);
    let mut stream = cluster
        .contract
        .download_tree(v1::DownloadTreeRequest { workspace_id: ws.clone(), path: "project".into() })
        .await
        .unwrap()
        .into_inner();
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        bytes.extend_from_slice(&chunk.data);
    }
    let mut names = Vec::new();
    for entry in tar::Archive::new(&bytes[..]).entries().unwrap() {
        names.push(entry.unwrap().path().unwrap().display().to_string());
    }
    assert_eq!(names, ["src/", "src/a.txt", "src/deep/", "src/deep/b.txt"]);
    let escape =
        cluster.contract.download_tree(v1::DownloadTreeRequest { workspace_id: ws.clone(), path: "../x".into() });
    assert_eq!(escape.await.unwrap_err().code(), tonic::Code::InvalidArgument);
}

async fn seeded_skills_are_not_resurrected(backend: &str) {
    let seed = tempfile::tempdir().unwrap();
    std::fs::set_permissions(seed.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for name in ["alpha", "beta"] {
        std::fs::create_dir(seed.path().join(name)).unwrap();
        std::fs::write(seed.path().join(name).join("SKILL.md"), format!("---\nname: {name}\ndescription: d\n---\n"))
            .unwrap();
    }
    let seed_dir = seed.path().to_path_buf();
    let mut cluster = cluster_with(backend, |node| node.contract.skills_seed = Some(seed_dir)).await;
    let ws = cluster.workspace_id.clone();
    let names = |listed: v1::ListSkillsResponse| listed.skills.into_iter().map(|skill| skill.name).collect::<Vec<_>>();
    let listed = cluster.contract.list_skills(v1::ListSkillsRequest { workspace_id: ws.clone() }).await.unwrap();
    assert_eq!(names(listed.into_inner()), ["alpha", "beta"]);
    cluster
        .contract
        .remove_skill(v1::RemoveSkillRequest { workspace_id: ws.clone(), name: "alpha".into() })
        .await
        .unwrap();
    // Release the runtime; the next call provisions it again (seeding hook included).
    cluster
        .workspace
        .close_workspace(v1::CloseWorkspaceRequest { workspace_id: ws.clone(), destroy: false })
        .await
        .unwrap();
    let listed = cluster.contract.list_skills(v1::ListSkillsRequest { workspace_id: ws.clone() }).await.unwrap();
    assert_eq!(names(listed.into_inner()), ["beta"], "a removed seed skill came back");
}

macro_rules! contract_over_grpc {
    ($name:ident, $backend:literal) => {
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn mcp_over_http() {
                super::mcp_over_http($backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn skills_offload_and_trees() {
                super::skills_offload_and_trees($backend).await;
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn seeded_skills_are_not_resurrected() {
                super::seeded_skills_are_not_resurrected($backend).await;
            }
        }
    };
}

contract_over_grpc!(local, "local");
contract_over_grpc!(bubblewrap, "bubblewrap");
