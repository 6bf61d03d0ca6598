//! The cross-tenant matrix: every public RPC × every kind of caller, one assertion per cell
//! naming the cell. In-process: two replicas (token auth and JWT auth) on one embedded
//! registry and a node agent that only accepts the replicas' node secret.
//!
//! Setup: alice owns workspace W (agent `coder`) and session S on it, shared W with carol,
//! declared the HTTP MCP server `remote` (a real one, the test fixture) and added the skill
//! `base`. eve is another user, `platform` a service allowed to act for users, `ops` an
//! admin. ListWorkspaces answers OK to everyone; its cell says whether W is listed (OK) or
//! not (NOT_FOUND).

mod support;

use berth_proto::v1;
use futures::StreamExt;
use support::{ALICE, CAROL, Client, Creds, EVE, Harness, Limits, OPS, PLATFORM, jwt, write_messages};
use tonic::Code;

#[derive(Clone, Copy, Debug)]
enum Who {
    Owner,
    Other,
    ServiceForOwner,
    ServiceForOther,
    Shared,
    Admin,
    NoToken,
    BadToken,
    ExpiredJwt,
    JwtOwner,
}

const COLUMNS: [Who; 10] = [
    Who::Owner,
    Who::Other,
    Who::ServiceForOwner,
    Who::ServiceForOther,
    Who::Shared,
    Who::Admin,
    Who::NoToken,
    Who::BadToken,
    Who::ExpiredJwt,
    Who::JwtOwner,
];

fn creds(who: Who) -> Creds {
    match who {
        Who::Owner => Creds::token(ALICE),
        Who::Other => Creds::token(EVE),
        Who::ServiceForOwner => Creds::token(PLATFORM).acting_as("alice"),
        Who::ServiceForOther => Creds::token(PLATFORM).acting_as("eve"),
        Who::Shared => Creds::token(CAROL),
        Who::Admin => Creds::token(OPS),
        Who::NoToken => Creds::none(),
        Who::BadToken => Creds::token("not-a-valid-token-0123456789"),
        Who::ExpiredJwt => Creds::jwt(&jwt("alice", -300, serde_json::json!({}))),
        Who::JwtOwner => Creds::jwt(&jwt("alice", 300, serde_json::json!({}))),
    }
}

#[derive(Clone, Copy, Debug)]
enum Rpc {
    CreateSessionExplicit,
    CreateSessionNamingAlice,
    GetSession,
    CloseSession,
    GetWorkspace,
    ListWorkspaces,
    CloseWorkspace,
    Exec,
    ExecStream,
    ReadFile,
    WriteFile,
    Stat,
    ListDir,
    RemovePath,
    MakeDir,
    ShareWorkspace,
    UnshareWorkspace,
    ListNodes,
    AddMcp,
    RemoveMcp,
    ListMcps,
    ListMcpTools,
    CallMcpTool,
    AddSkill,
    RemoveSkill,
    ListSkills,
    GetSkill,
    OffloadContext,
    OffloadToolResult,
    UploadTree,
    DownloadTree,
    GetClusterStatus,
    /// Of a node that does not exist: an admin learns NOT_FOUND, everyone else is refused
    /// before the lookup (a real drain would change placement for the other cells).
    DrainNode,
    UndrainNode,
}

const O: Code = Code::Ok;
const N: Code = Code::NotFound;
const P: Code = Code::PermissionDenied;
const I: Code = Code::InvalidArgument;
const U: Code = Code::Unauthenticated;

/// Expected codes, columns in the order of [`COLUMNS`]:
/// owner, other, svc→owner, svc→other, shared, admin, no token, bad token, expired JWT, JWT owner.
#[rustfmt::skip]
const MATRIX: [(Rpc, [Code; 10]); 34] = [
    // An admin must name the user a session is for (user_id or x-berth-act-as).
    (Rpc::CreateSessionExplicit,    [O, N, O, N, O, I, U, U, U, O]),
    // user_id = "alice" in the body: only alice herself, a service acting for her and admins.
    (Rpc::CreateSessionNamingAlice, [O, P, O, I, P, O, U, U, U, O]),
    (Rpc::GetSession,               [O, N, O, N, N, O, U, U, U, O]),
    (Rpc::CloseSession,             [O, N, O, N, N, O, U, U, U, O]),
    (Rpc::GetWorkspace,             [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::ListWorkspaces,           [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::CloseWorkspace,           [O, N, O, N, P, O, U, U, U, O]),
    (Rpc::Exec,                     [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::ExecStream,               [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::ReadFile,                 [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::WriteFile,                [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::Stat,                     [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::ListDir,                  [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::RemovePath,               [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::MakeDir,                  [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::ShareWorkspace,           [O, N, O, N, P, O, U, U, U, O]),
    (Rpc::UnshareWorkspace,         [O, N, O, N, P, O, U, U, U, O]),
    (Rpc::ListNodes,                [P, P, P, P, P, O, U, U, U, P]),
    // ContractService: workspace content, so the same row as Exec.
    (Rpc::AddMcp,                   [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::RemoveMcp,                [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::ListMcps,                 [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::ListMcpTools,             [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::CallMcpTool,              [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::AddSkill,                 [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::RemoveSkill,              [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::ListSkills,               [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::GetSkill,                 [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::OffloadContext,           [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::OffloadToolResult,        [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::UploadTree,               [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::DownloadTree,             [O, N, O, N, O, O, U, U, U, O]),
    (Rpc::GetClusterStatus,         [P, P, P, P, P, O, U, U, U, P]),
    (Rpc::DrainNode,                [P, P, P, P, P, N, U, U, U, P]),
    (Rpc::UndrainNode,              [P, P, P, P, P, O, U, U, U, P]),
];

struct Fixture {
    workspace: String,
    session: String,
    /// Stops the HTTP MCP server when the test ends.
    _mcp: tokio_util::sync::DropGuard,
}

async fn setup(harness: &Harness) -> Fixture {
    let mut alice = harness.workspace(Creds::token(ALICE));
    let session = alice
        .create_session(v1::CreateSessionRequest { agent_id: "coder".into(), ..Default::default() })
        .await
        .expect("alice creates her session")
        .into_inner();
    let workspace = session.workspace_id.clone();
    let shared = alice
        .share_workspace(v1::ShareWorkspaceRequest { workspace_id: workspace.clone(), user_id: "carol".into() })
        .await
        .expect("alice shares W with carol")
        .into_inner();
    assert_eq!(shared.shared_with, vec!["carol".to_owned()]);
    support::sh(&mut alice, &workspace, "echo hello > hello.txt").await;
    let mut contract = harness.contract(Creds::token(ALICE));
    let mcp_stop = tokio_util::sync::CancellationToken::new();
    let url = berth_mcp_fixture::spawn_http(mcp_stop.clone()).await.expect("mcp http fixture");
    contract.add_mcp(mcp_request(&workspace, "remote", &url)).await.expect("alice declares an mcp server");
    contract.add_skill(futures::stream::iter(skill_messages(&workspace, "base"))).await.expect("alice adds a skill");
    Fixture { workspace, session: session.session_id, _mcp: mcp_stop.drop_guard() }
}

fn mcp_request(workspace: &str, name: &str, url: &str) -> v1::AddMcpRequest {
    let transport = v1::mcp_server::Transport::Http(v1::McpHttp { url: url.into(), headers: Default::default() });
    let server = v1::McpServer { name: name.into(), transport: Some(transport) };
    v1::AddMcpRequest { workspace_id: workspace.into(), server: Some(server), replace: false }
}

fn skill_messages(workspace: &str, name: &str) -> Vec<v1::AddSkillRequest> {
    let front = format!("---\nname: {name}\ndescription: a test skill\n---\nBody\n");
    let archive = tar_of(&[("SKILL.md", front.as_bytes())]);
    let header = v1::AddSkillHeader { workspace_id: workspace.into(), name: name.into(), replace: false };
    vec![
        v1::AddSkillRequest { msg: Some(v1::add_skill_request::Msg::Header(header)) },
        v1::AddSkillRequest { msg: Some(v1::add_skill_request::Msg::Chunk(archive)) },
    ]
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, path, *data).expect("tar entry");
    }
    builder.into_inner().expect("tar")
}

/// One cell: the RPC as `who`, reduced to its status code.
async fn call(harness: &Harness, fixture: &Fixture, rpc: Rpc, who: Who, cell: usize) -> Result<(), tonic::Status> {
    let mut client: Client = harness.workspace(creds(who));
    let workspace = fixture.workspace.clone();
    match rpc {
        Rpc::CreateSessionExplicit => {
            let request =
                v1::CreateSessionRequest { agent_id: "coder".into(), workspace_id: workspace, ..Default::default() };
            client.create_session(request).await.map(drop)
        }
        Rpc::CreateSessionNamingAlice => {
            let request =
                v1::CreateSessionRequest { user_id: "alice".into(), agent_id: "coder".into(), ..Default::default() };
            client.create_session(request).await.map(drop)
        }
        Rpc::GetSession => {
            client.get_session(v1::GetSessionRequest { session_id: fixture.session.clone() }).await.map(drop)
        }
        Rpc::CloseSession => {
            // A fresh session of alice's for every cell: a successful close removes it.
            let mut alice = harness.workspace(Creds::token(ALICE));
            let fresh = alice
                .create_session(v1::CreateSessionRequest { agent_id: "coder".into(), ..Default::default() })
                .await?
                .into_inner();
            client.close_session(v1::CloseSessionRequest { session_id: fresh.session_id }).await.map(drop)
        }
        Rpc::GetWorkspace => client.get_workspace(v1::GetWorkspaceRequest { workspace_id: workspace }).await.map(drop),
        Rpc::ListWorkspaces => {
            let listed = client.list_workspaces(v1::ListWorkspacesRequest::default()).await?.into_inner();
            if listed.workspaces.iter().any(|listed| listed.workspace_id == workspace) {
                Ok(())
            } else {
                Err(tonic::Status::not_found("W is not listed"))
            }
        }
        Rpc::CloseWorkspace => client
            .close_workspace(v1::CloseWorkspaceRequest { workspace_id: workspace, destroy: false })
            .await
            .map(drop),
        Rpc::Exec => client.exec(exec_request(&workspace)).await.map(drop),
        Rpc::ExecStream => {
            let mut stream = client.exec_stream(exec_request(&workspace)).await?.into_inner();
            while let Some(chunk) = stream.next().await {
                chunk?;
            }
            Ok(())
        }
        Rpc::ReadFile => support::read_all(&mut client, &workspace, "hello.txt").await.map(drop),
        Rpc::WriteFile => {
            let messages = write_messages(&workspace, &format!("written-{cell}.txt"), b"data");
            client.write_file(futures::stream::iter(messages)).await.map(drop)
        }
        Rpc::Stat => client.stat(v1::StatRequest { workspace_id: workspace, path: "hello.txt".into() }).await.map(drop),
        Rpc::ListDir => {
            client.list_dir(v1::ListDirRequest { workspace_id: workspace, path: String::new() }).await.map(drop)
        }
        Rpc::RemovePath => client
            .remove_path(v1::RemovePathRequest {
                workspace_id: workspace,
                path: format!("written-{cell}.txt"),
                recursive: false,
            })
            .await
            .map(drop),
        Rpc::MakeDir => client
            .make_dir(v1::MakeDirRequest { workspace_id: workspace, path: format!("dir-{cell}"), parents: true })
            .await
            .map(drop),
        Rpc::ShareWorkspace => client
            .share_workspace(v1::ShareWorkspaceRequest { workspace_id: workspace, user_id: "dave".into() })
            .await
            .map(drop),
        Rpc::UnshareWorkspace => client
            .unshare_workspace(v1::UnshareWorkspaceRequest { workspace_id: workspace, user_id: "dave".into() })
            .await
            .map(drop),
        Rpc::ListNodes => harness.admin(creds(who)).list_nodes(v1::ListNodesRequest {}).await.map(drop),
        Rpc::GetClusterStatus => {
            harness.admin(creds(who)).get_cluster_status(v1::GetClusterStatusRequest {}).await.map(drop)
        }
        Rpc::DrainNode => harness
            .admin(creds(who))
            .drain_node(v1::DrainNodeRequest { node_id: "node-absent".into(), force: true })
            .await
            .map(drop),
        Rpc::UndrainNode => harness
            .admin(creds(who))
            .undrain_node(v1::UndrainNodeRequest { node_id: "node-absent".into() })
            .await
            .map(drop),
        _ => contract_call(harness, fixture, rpc, who, cell).await,
    }
}

/// The ContractService cells. Every call that changes something names a fresh object
/// (`…-<cell>`), so an allowed call never collides with an earlier cell's.
async fn contract_call(
    harness: &Harness,
    fixture: &Fixture,
    rpc: Rpc,
    who: Who,
    cell: usize,
) -> Result<(), tonic::Status> {
    let mut client = harness.contract(creds(who));
    let workspace = fixture.workspace.clone();
    match rpc {
        Rpc::AddMcp => {
            client.add_mcp(mcp_request(&workspace, &format!("m-{cell}"), "http://127.0.0.1:9/mcp")).await.map(drop)
        }
        Rpc::RemoveMcp => client
            .remove_mcp(v1::RemoveMcpRequest { workspace_id: workspace, name: format!("m-{cell}") })
            .await
            .map(drop),
        Rpc::ListMcps => client.list_mcps(v1::ListMcpsRequest { workspace_id: workspace }).await.map(drop),
        Rpc::ListMcpTools => {
            let request = v1::ListMcpToolsRequest { workspace_id: workspace, server: "remote".into(), timeout_ms: 0 };
            let tools = client.list_mcp_tools(request).await?.into_inner();
            assert!(tools.tools.iter().any(|tool| tool.name == "echo"), "cell {cell}: no echo tool");
            Ok(())
        }
        Rpc::CallMcpTool => {
            let request = v1::CallMcpToolRequest {
                workspace_id: workspace,
                server: "remote".into(),
                tool: "echo".into(),
                arguments_json: format!(r#"{{"text":"cell {cell}"}}"#),
                timeout_ms: 0,
            };
            let answer = client.call_mcp_tool(request).await?.into_inner();
            assert_eq!(answer.text, format!("cell {cell}"));
            Ok(())
        }
        Rpc::AddSkill => {
            client.add_skill(futures::stream::iter(skill_messages(&workspace, &format!("s-{cell}")))).await.map(drop)
        }
        Rpc::RemoveSkill => client
            .remove_skill(v1::RemoveSkillRequest { workspace_id: workspace, name: format!("s-{cell}") })
            .await
            .map(drop),
        Rpc::ListSkills => client.list_skills(v1::ListSkillsRequest { workspace_id: workspace }).await.map(drop),
        Rpc::GetSkill => {
            let skill = client.get_skill(v1::GetSkillRequest { workspace_id: workspace, name: "base".into() }).await?;
            assert_eq!(skill.into_inner().body, "Body\n");
            Ok(())
        }
        Rpc::OffloadContext => client
            .offload_context(v1::OffloadContextRequest {
                workspace_id: workspace,
                session_id: fixture.session.clone(),
                messages_json: vec![format!(r#"{{"role":"user","content":"cell {cell}"}}"#)],
            })
            .await
            .map(drop),
        Rpc::OffloadToolResult => client
            .offload_tool_result(v1::OffloadToolResultRequest {
                workspace_id: workspace,
                session_id: fixture.session.clone(),
                tool_call_id: format!("call-{cell}"),
                content: vec![b'x'; 64 * 1024],
                ..Default::default()
            })
            .await
            .map(drop),
        Rpc::UploadTree => {
            let header =
                v1::UploadTreeHeader { workspace_id: workspace, path: format!("tree-{cell}"), overwrite: false };
            let messages = vec![
                v1::UploadTreeRequest { msg: Some(v1::upload_tree_request::Msg::Header(header)) },
                v1::UploadTreeRequest { msg: Some(v1::upload_tree_request::Msg::Chunk(tar_of(&[("f", b"data")]))) },
            ];
            client.upload_tree(futures::stream::iter(messages)).await.map(drop)
        }
        Rpc::DownloadTree => {
            let request = v1::DownloadTreeRequest { workspace_id: workspace, path: String::new() };
            let mut stream = client.download_tree(request).await?.into_inner();
            let mut bytes = 0;
            while let Some(chunk) = stream.next().await {
                bytes += chunk?.data.len();
            }
            assert!(bytes > 0, "cell {cell}: an empty tree");
            Ok(())
        }
        _ => unreachable!("{rpc:?} is a WorkspaceService or AdminService cell"),
    }
}

fn exec_request(workspace: &str) -> v1::ExecRequest {
    v1::ExecRequest { workspace_id: workspace.into(), argv: vec!["true".into()], ..Default::default() }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_public_rpc_for_every_kind_of_caller() {
    let harness = support::start(Limits::default()).await;
    let fixture = setup(&harness).await;
    let mut failures = Vec::new();
    let mut cell = 0;
    for (rpc, expected_row) in MATRIX {
        for (who, expected) in COLUMNS.into_iter().zip(expected_row) {
            cell += 1;
            let got = match call(&harness, &fixture, rpc, who, cell).await {
                Ok(()) => Code::Ok,
                Err(status) => status.code(),
            };
            if got != expected {
                failures.push(format!("cell {rpc:?} × {who:?}: expected {expected:?}, got {got:?}"));
            }
        }
    }
    assert_eq!(cell, MATRIX.len() * COLUMNS.len());
    assert!(failures.is_empty(), "{} of {cell} cells wrong:\n{}", failures.len(), failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hidden_workspaces_look_exactly_like_missing_ones() {
    let harness = support::start(Limits::default()).await;
    let fixture = setup(&harness).await;
    let mut eve = harness.workspace(Creds::token(EVE));
    let hidden = eve.get_workspace(v1::GetWorkspaceRequest { workspace_id: fixture.workspace.clone() }).await;
    let missing = eve.get_workspace(v1::GetWorkspaceRequest { workspace_id: "ws-missing".into() }).await;
    let (hidden, missing) = (hidden.unwrap_err(), missing.unwrap_err());
    assert_eq!(hidden.code(), missing.code());
    assert_eq!(hidden.message().replace(&fixture.workspace, "X"), missing.message().replace("ws-missing", "X"));
    // Exec on a hidden workspace: the same answer as on a missing one.
    let hidden = eve.exec(exec_request(&fixture.workspace)).await.unwrap_err();
    let missing = eve.exec(exec_request("ws-missing")).await.unwrap_err();
    assert_eq!(
        (hidden.code(), hidden.message().replace(&fixture.workspace, "X")),
        (missing.code(), missing.message().replace("ws-missing", "X"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn explicit_ids_sharing_and_squatting() {
    let harness = support::start(Limits::default()).await;
    let mut alice = harness.workspace(Creds::token(ALICE));
    let mut eve = harness.workspace(Creds::token(EVE));
    // eve cannot squat alice's future policy workspace: policy ids are not creatable.
    let policy_id =
        berth_control_plane::assign_workspace_id(berth_control_plane::IsolationPolicy::PerAgent, "alice", "writer", "");
    let squat = eve
        .create_session(v1::CreateSessionRequest {
            agent_id: "writer".into(),
            workspace_id: policy_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(squat.code(), Code::NotFound, "{squat:?}");
    let mine = alice
        .create_session(v1::CreateSessionRequest { agent_id: "writer".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(mine.workspace_id, policy_id);

    // An explicit new id makes the caller its owner; others get NOT_FOUND until shared.
    let team = eve
        .create_session(v1::CreateSessionRequest {
            agent_id: "lead".into(),
            workspace_id: "team-eve".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(team.workspace_id, "team-eve");
    let join =
        v1::CreateSessionRequest { agent_id: "member".into(), workspace_id: "team-eve".into(), ..Default::default() };
    assert_eq!(alice.create_session(join.clone()).await.unwrap_err().code(), Code::NotFound);
    eve.share_workspace(v1::ShareWorkspaceRequest { workspace_id: "team-eve".into(), user_id: "alice".into() })
        .await
        .unwrap();
    let joined = alice.create_session(join.clone()).await.unwrap().into_inner();
    assert_eq!(joined.workspace_id, "team-eve");
    // A shared user may not re-share or close.
    let reshare = alice
        .share_workspace(v1::ShareWorkspaceRequest { workspace_id: "team-eve".into(), user_id: "carol".into() })
        .await
        .unwrap_err();
    assert_eq!(reshare.code(), Code::PermissionDenied);
    // Revocation holds at once on this replica.
    eve.unshare_workspace(v1::UnshareWorkspaceRequest { workspace_id: "team-eve".into(), user_id: "alice".into() })
        .await
        .unwrap();
    assert_eq!(alice.exec(exec_request("team-eve")).await.unwrap_err().code(), Code::NotFound);
    // A user may not act as another; a service without act-as is nobody's user.
    let mut spoof = harness.workspace(Creds::token(ALICE).acting_as("eve"));
    let spoofed = spoof.list_workspaces(v1::ListWorkspacesRequest::default()).await.unwrap_err();
    assert_eq!(spoofed.code(), Code::PermissionDenied, "{spoofed:?}");
    let mut platform = harness.workspace(Creds::token(PLATFORM));
    assert_eq!(platform.exec(exec_request(&policy_id)).await.unwrap_err().code(), Code::NotFound);
    let listed = platform.list_workspaces(v1::ListWorkspacesRequest::default()).await.unwrap().into_inner();
    assert!(listed.workspaces.is_empty(), "a service sees nothing as itself: {listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn jwt_claims_make_admins_and_services() {
    let harness = support::start(Limits::default()).await;
    let fixture = setup(&harness).await;
    let admin = Creds::jwt(&jwt("root", 300, serde_json::json!({ "berth/admin": true })));
    harness.admin(admin.clone()).list_nodes(v1::ListNodesRequest {}).await.unwrap();
    let service =
        Creds::jwt(&jwt("platform", 300, serde_json::json!({ "berth/act_for_users": true }))).acting_as("alice");
    harness.workspace(service).exec(exec_request(&fixture.workspace)).await.unwrap();
    // Wrong issuer, wrong audience, none of either, too long a life, a bare legacy claim:
    // each refused by the replica before any handler runs.
    for (name, extra) in [
        ("wrong issuer", serde_json::json!({ "iss": "someone-else" })),
        ("wrong audience", serde_json::json!({ "aud": "another-service" })),
        ("no issuer", serde_json::json!({ "iss": null })),
        ("no audience", serde_json::json!({ "aud": null })),
        ("legacy admin claim", serde_json::json!({ "admin": true })),
    ] {
        let refused =
            harness.admin(Creds::jwt(&jwt("root", 300, extra))).list_nodes(v1::ListNodesRequest {}).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{name}: {refused:?}");
    }
    let refused = harness
        .workspace(Creds::jwt(&jwt("alice", 3 * 24 * 3600, serde_json::json!({}))))
        .list_workspaces(v1::ListWorkspacesRequest::default())
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    assert!(refused.message().contains("--jwt-max-lifetime"), "{refused:?}");
    let user_acting = Creds::jwt(&jwt("eve", 300, serde_json::json!({}))).acting_as("alice");
    let refused = harness.workspace(user_acting).exec(exec_request(&fixture.workspace)).await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied);
    // Health stays open for probes.
    let mut health = tonic_health::pb::health_client::HealthClient::new(support::channel(&harness.token_endpoint));
    health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap();
}

/// Issue 14: a workspace's spec env (credentials the owner hands its agent) is readable by
/// its owner and admins only; a user it is shared with sees the names, not the values.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn spec_env_values_are_shown_to_the_owner_and_admins_only() {
    let harness = support::start(Limits::default()).await;
    let mut alice = harness.workspace(Creds::token(ALICE));
    let spec = v1::WorkspaceSpec {
        env: [("API_KEY".to_owned(), "alice-secret-value-0123".to_owned())].into_iter().collect(),
        ..Default::default()
    };
    let session = alice
        .create_session(v1::CreateSessionRequest { agent_id: "env".into(), spec: Some(spec), ..Default::default() })
        .await
        .expect("alice's session")
        .into_inner();
    let workspace_id = session.workspace_id;
    let shared = alice
        .share_workspace(v1::ShareWorkspaceRequest { workspace_id: workspace_id.clone(), user_id: "carol".into() })
        .await
        .expect("share")
        .into_inner();
    assert_eq!(shared.spec.expect("spec").env["API_KEY"], "alice-secret-value-0123", "the owner's own answer");
    let env_seen_by = |creds: Creds| {
        let mut client = harness.workspace(creds);
        let workspace_id = workspace_id.clone();
        async move {
            let got = client.get_workspace(v1::GetWorkspaceRequest { workspace_id: workspace_id.clone() }).await;
            let got = got.expect("get").into_inner().spec.expect("spec").env;
            let listed = client.list_workspaces(v1::ListWorkspacesRequest::default()).await.expect("list").into_inner();
            let listed = listed.workspaces.into_iter().find(|workspace| workspace.workspace_id == workspace_id);
            (got, listed.expect("listed").spec.expect("spec").env)
        }
    };
    for (who, creds) in [("owner", Creds::token(ALICE)), ("admin", Creds::token(OPS))] {
        let (got, listed) = env_seen_by(creds).await;
        assert_eq!(got["API_KEY"], "alice-secret-value-0123", "{who}: get");
        assert_eq!(listed["API_KEY"], "alice-secret-value-0123", "{who}: list");
    }
    let (got, listed) = env_seen_by(Creds::token(CAROL)).await;
    assert_eq!(got["API_KEY"], "<redacted>", "shared user: get");
    assert_eq!(listed["API_KEY"], "<redacted>", "shared user: list");
}
