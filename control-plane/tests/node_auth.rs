//! Replica <-> node agent trust: the node agent answers only the control plane (shared
//! secret and/or mutual TLS), and a replica accepts heartbeats only with the node secret.

mod support;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use berth_control_plane::ControlPlaneConfig;
use berth_control_plane::auth::AuthConfig;
use berth_control_plane::registry::embedded::EmbeddedRegistry;
use berth_proto::auth::{BearerInterceptor, Secret};
use berth_proto::tls::{ClientTls, TlsFiles};
use berth_proto::v1;
use berth_proto::v1::node_agent_service_client::NodeAgentServiceClient;
use berth_proto::v1::node_service_client::NodeServiceClient;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use prost::Message;
use support::{ALICE, Creds, Limits};
use tokio_util::sync::CancellationToken;
use tonic::Code;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

fn node_client(
    endpoint: &str,
    secret: Option<&Secret>,
) -> NodeAgentServiceClient<tonic::service::interceptor::InterceptedService<tonic::transport::Channel, BearerInterceptor>>
{
    NodeAgentServiceClient::with_interceptor(support::channel(endpoint), BearerInterceptor::new(secret))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn node_agent_refuses_calls_without_the_control_planes_credentials() {
    let harness = support::start(Limits::default()).await;
    let wrong = Secret::new("not-the-node-secret-0123456789");
    for (name, secret) in [("no credential", None), ("wrong secret", Some(&wrong))] {
        let mut node = node_client(&harness.node_endpoint, secret);
        // The node's data plane (the public WorkspaceService) is behind the same check.
        let mut data_plane = WorkspaceServiceClient::with_interceptor(
            support::channel(&harness.node_endpoint),
            BearerInterceptor::new(secret),
        );
        let exec = data_plane
            .exec(v1::ExecRequest { workspace_id: "ws-x".into(), argv: vec!["id".into()], ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(exec.code(), Code::Unauthenticated, "{name}: exec: {exec:?}");
        // `ReadFile`, which the node writes as frames by hand, stands behind it too.
        let read = data_plane
            .read_file(v1::ReadFileRequest { workspace_id: "ws-x".into(), path: "a".into(), chunk_size: 0 })
            .await
            .unwrap_err();
        assert_eq!(read.code(), Code::Unauthenticated, "{name}: read_file: {read:?}");
        let provision = node
            .provision(v1::ProvisionRequest { workspace_id: "ws-x".into(), generation: 1, ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(provision.code(), Code::Unauthenticated, "{name}: provision: {provision:?}");
        let listed = node.list_local(v1::ListLocalRequest {}).await.unwrap_err();
        assert_eq!(listed.code(), Code::Unauthenticated, "{name}: list_local: {listed:?}");
    }
    // The right secret gets through to the service (and its own checks).
    let mut node = node_client(&harness.node_endpoint, Some(&harness.node_secret));
    node.list_local(v1::ListLocalRequest {}).await.expect("the control plane's secret is accepted");
    // Health stays open for probes.
    let mut health = tonic_health::pb::health_client::HealthClient::new(support::channel(&harness.node_endpoint));
    health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap();
}

/// `ReadFile` on a node is written as frames by hand (node-agent `read_frames.rs`): a
/// generated client reads it whole, in the chunks it asked for, and the call passes the
/// same gate as every other (generation, workspace held) and refuses malformed requests.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_read_from_the_node_arrives_whole_and_passes_the_same_gate() {
    let harness = support::start(Limits::default()).await;
    let mut alice = harness.workspace(Creds::token(ALICE));
    let workspace_id = alice
        .create_session(v1::CreateSessionRequest { agent_id: "reader".into(), ..Default::default() })
        .await
        .expect("alice creates her session")
        .into_inner()
        .workspace_id;
    let data = berth_testkit::noise(7, 2 * 1024 * 1024 + 17);
    let messages = support::write_messages(&workspace_id, "blob.bin", &data);
    alice.write_file(futures::stream::iter(messages)).await.expect("write");

    let mut node = WorkspaceServiceClient::with_interceptor(
        support::channel(&harness.node_endpoint),
        BearerInterceptor::new(Some(&harness.node_secret)),
    );
    for chunk_size in [4096u32, 100_000, 1024 * 1024] {
        let request = v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "blob.bin".into(), chunk_size };
        let mut stream = node.read_file(request).await.expect("the node serves the read").into_inner();
        let mut chunks = Vec::new();
        while let Some(chunk) = stream.message().await.expect("a chunk") {
            chunks.push(chunk.data);
        }
        assert!(chunks.iter().all(|chunk| chunk.len() <= chunk_size as usize), "a chunk over {chunk_size}");
        assert_eq!(chunks.concat(), data, "chunk size {chunk_size}");
    }

    // The gate: a generation the node does not hold, a workspace it does not hold, a path
    // out of the workspace; each refused before a byte is read.
    let mut request = tonic::Request::new(v1::ReadFileRequest {
        workspace_id: workspace_id.clone(),
        path: "blob.bin".into(),
        chunk_size: 0,
    });
    request.metadata_mut().insert(berth_proto::meta::GENERATION, "999".parse().expect("value"));
    let stale = node.read_file(request).await.expect_err("a generation the node does not hold");
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
    assert!(stale.message().contains("not 999"), "{stale:?}");
    let unknown = v1::ReadFileRequest { workspace_id: "ws-none".into(), path: "blob.bin".into(), chunk_size: 0 };
    let unknown = node.read_file(unknown).await.expect_err("a workspace the node does not hold");
    assert_eq!(unknown.code(), Code::FailedPrecondition, "{unknown:?}");
    assert!(unknown.message().contains("not provisioned"), "{unknown:?}");
    let escape = v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "../x".into(), chunk_size: 0 };
    let escape = node.read_file(escape).await.expect_err("a path out of the workspace");
    assert_eq!(escape.code(), Code::InvalidArgument, "{escape:?}");

    // A body that is not one uncompressed message, with the right credential.
    let message = v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "blob.bin".into(), chunk_size: 0 }
        .encode_to_vec();
    let mut compressed = vec![1u8];
    compressed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    compressed.extend_from_slice(&message);
    let mut cut = vec![0u8];
    cut.extend_from_slice(&(message.len() as u32 + 1).to_be_bytes());
    cut.extend_from_slice(&message);
    for (case, body, expected) in [
        ("no message", Vec::new(), Code::InvalidArgument),
        ("a compressed message", compressed, Code::Unimplemented),
        ("a length past the body", cut, Code::InvalidArgument),
        ("a body over 64 KiB", vec![0u8; 100 * 1024], Code::ResourceExhausted),
    ] {
        let status = raw_read_file(&harness.node_endpoint, &harness.node_secret, body).await;
        assert_eq!(status.code(), expected, "{case}: {status:?}");
    }
}

/// Sends `body` as a ReadFile request body to a node, as it is; the status it answers.
async fn raw_read_file(endpoint: &str, secret: &Secret, body: Vec<u8>) -> tonic::Status {
    use http_body_util::BodyExt;
    use tower::ServiceExt;
    let mut request = http::Request::new(tonic::body::Body::new(http_body_util::Full::new(bytes::Bytes::from(body))));
    *request.method_mut() = http::Method::POST;
    *request.uri_mut() = http::Uri::from_static("/berth.v1.WorkspaceService/ReadFile");
    request.headers_mut().insert(http::header::TE, http::HeaderValue::from_static("trailers"));
    request.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/grpc"));
    let authorization = format!("Bearer {}", secret.expose()).parse().expect("header");
    request.headers_mut().insert(http::header::AUTHORIZATION, authorization);
    let response = support::channel(endpoint).oneshot(request).await.expect("the node answers over HTTP/2");
    if let Some(status) = tonic::Status::from_header_map(response.headers()) {
        return status;
    }
    let trailers = response.into_body().collect().await.expect("body").trailers().cloned().expect("trailers");
    tonic::Status::from_header_map(&trailers).expect("a grpc-status")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replica_refuses_heartbeats_without_the_node_secret() {
    let harness = support::start(Limits::default()).await;
    let register = v1::NodeMessage {
        msg: Some(v1::node_message::Msg::Register(v1::Register {
            node_id: "rogue".into(),
            address: "http://127.0.0.1:1".into(),
            backends: vec!["local".into()],
            ..Default::default()
        })),
    };
    let wrong = Secret::new("not-the-node-secret-0123456789");
    for (name, secret) in [("no credential", None), ("wrong secret", Some(&wrong))] {
        let mut client = NodeServiceClient::with_interceptor(
            support::channel(&harness.token_endpoint),
            BearerInterceptor::new(secret),
        );
        let outcome = client.heartbeat(futures::stream::iter(vec![register.clone()])).await;
        let status = match outcome {
            Err(status) => status,
            Ok(response) => response.into_inner().message().await.expect_err("no registration answer"),
        };
        assert_eq!(status.code(), Code::Unauthenticated, "{name}: {status:?}");
    }
    // A user token is no node credential either.
    let mut client = NodeServiceClient::with_interceptor(
        support::channel(&harness.token_endpoint),
        BearerInterceptor::new(Some(&Secret::new(ALICE))),
    );
    let status = client.heartbeat(futures::stream::iter(vec![register])).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
}

fn make_certs(dir: &Path, node: &str) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/certs/make-dev-certs.sh");
    let output =
        std::process::Command::new("bash").arg(script).arg(dir).arg(node).output().expect("run make-dev-certs.sh");
    assert!(output.status.success(), "make-dev-certs.sh: {}", String::from_utf8_lossy(&output.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mutual_tls_between_replica_and_node() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    make_certs(&certs, "node-tls");
    let other_ca = dir.path().join("other");
    make_certs(&other_ca, "node-tls");
    let secret = Secret::random();
    let registry: berth_control_plane::RegistryRef = EmbeddedRegistry::new();
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();

    let replica_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let replica_endpoint = format!("http://{}", replica_listener.local_addr().unwrap());
    let mut replica = ControlPlaneConfig::new("replica-mtls");
    replica.auth = AuthConfig::None;
    replica.node_secret = Some(secret.clone());
    replica.node_tls = Some(ClientTls {
        ca: certs.join("ca.pem"),
        identity: Some(TlsFiles { cert: certs.join("replica.pem"), key: certs.join("replica.key") }),
        domain: None,
    });
    tokio::spawn(berth_control_plane::serve(replica_listener, replica, Arc::clone(&registry), cancel.clone()));

    let node_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let node_address = node_listener.local_addr().unwrap();
    let mut node = berth_node_agent::NodeAgentConfig::new("node-tls", dir.path().join("node"));
    node.control_planes = vec![replica_endpoint.clone()];
    node.node_secret = Some(secret.clone());
    node.tls = Some(TlsFiles { cert: certs.join("node-tls.pem"), key: certs.join("node-tls.key") });
    node.allow_unsandboxed = true;
    node.client_ca = Some(certs.join("ca.pem"));
    tokio::spawn(berth_node_agent::serve(node_listener, node, cancel.clone()));

    // Through the replica: the node is reached over mutual TLS.
    let mut client = berth_proto::v1::workspace_service_client::WorkspaceServiceClient::with_interceptor(
        support::channel(&replica_endpoint),
        Creds::none(),
    );
    let session = berth_testkit::eventually_ok("a session over mTLS", Duration::from_secs(30), || {
        let mut client = client.clone();
        let request =
            v1::CreateSessionRequest { user_id: "alice".into(), agent_id: "tls".into(), ..Default::default() };
        async move { client.create_session(request).await }
    })
    .await
    .into_inner();
    let listed = client.list_workspaces(v1::ListWorkspacesRequest::default()).await.unwrap().into_inner();
    assert!(listed.workspaces.iter().any(|workspace| workspace.workspace_id == session.workspace_id));
    let ran = client
        .exec(v1::ExecRequest {
            workspace_id: session.workspace_id.clone(),
            argv: vec!["echo".into(), "over-mtls".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ran.stdout, b"over-mtls\n");

    // Directly: without a client certificate, or with one from another CA, no call gets in.
    let url = format!("https://{node_address}");
    let ca = Certificate::from_pem(std::fs::read(certs.join("ca.pem")).unwrap());
    let identity = |dir: &Path| {
        Identity::from_pem(
            std::fs::read(dir.join("replica.pem")).unwrap(),
            std::fs::read(dir.join("replica.key")).unwrap(),
        )
    };
    // A node's own certificate is for serving only (no clientAuth): it is no client
    // certificate for another node (issue 14).
    let node_identity = Identity::from_pem(
        std::fs::read(certs.join("node-tls.pem")).unwrap(),
        std::fs::read(certs.join("node-tls.key")).unwrap(),
    );
    let attempts = [
        ("no client certificate", ClientTlsConfig::new().ca_certificate(ca.clone())),
        ("certificate of another CA", ClientTlsConfig::new().ca_certificate(ca.clone()).identity(identity(&other_ca))),
        ("a node's certificate", ClientTlsConfig::new().ca_certificate(ca.clone()).identity(node_identity)),
    ];
    for (name, tls) in attempts {
        let channel = Endpoint::from_shared(url.clone()).unwrap().tls_config(tls).unwrap().connect_lazy();
        let mut node = NodeAgentServiceClient::with_interceptor(channel, BearerInterceptor::new(Some(&secret)));
        let refused = node.list_local(v1::ListLocalRequest {}).await.unwrap_err();
        assert_ne!(refused.code(), Code::Ok, "{name}");
        assert_ne!(
            refused.code(),
            Code::Unauthenticated,
            "{name}: refused by TLS, not by the bearer check: {refused:?}"
        );
    }
    // The right certificate without the secret still fails: both are required when set.
    let tls = ClientTlsConfig::new().ca_certificate(ca).identity(identity(&certs));
    let channel = Endpoint::from_shared(url).unwrap().tls_config(tls).unwrap().connect_lazy();
    let mut node = NodeAgentServiceClient::with_interceptor(channel.clone(), BearerInterceptor::new(None));
    assert_eq!(node.list_local(v1::ListLocalRequest {}).await.unwrap_err().code(), Code::Unauthenticated);
    let mut node = NodeAgentServiceClient::with_interceptor(channel, BearerInterceptor::new(Some(&secret)));
    node.list_local(v1::ListLocalRequest {}).await.expect("certificate and secret are accepted");
}

#[tokio::test]
async fn unauthenticated_listeners_beyond_loopback_are_refused() {
    // 0.0.0.0 is not loopback: --auth none must not start there.
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let config = ControlPlaneConfig::new("replica-open");
    let error = berth_control_plane::serve(listener, config, EmbeddedRegistry::new(), CancellationToken::new())
        .await
        .unwrap_err()
        .to_string();
    assert!(error.contains("--auth none is allowed only when every listener is on loopback"), "{error}");
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let mut node = berth_node_agent::NodeAgentConfig::new("node-open", tempfile::tempdir().unwrap().path());
    node.control_planes = vec!["http://127.0.0.1:1".into()];
    node.allow_unsandboxed = true;
    let error = berth_node_agent::serve(listener, node, CancellationToken::new()).await.unwrap_err().to_string();
    assert!(error.contains("without credentials"), "{error}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_listener_serves_tls() {
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), "public");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let mut config = ControlPlaneConfig::new("replica-tls");
    config.tls = Some(TlsFiles { cert: dir.path().join("public.pem"), key: dir.path().join("public.key") });
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    tokio::spawn(berth_control_plane::serve(listener, config, EmbeddedRegistry::new(), cancel.clone()));

    let ca = Certificate::from_pem(std::fs::read(dir.path().join("ca.pem")).unwrap());
    let tls = ClientTlsConfig::new().ca_certificate(ca);
    let channel = Endpoint::from_shared(format!("https://{address}")).unwrap().tls_config(tls).unwrap().connect_lazy();
    let client = berth_proto::v1::workspace_service_client::WorkspaceServiceClient::new(channel);
    berth_testkit::eventually_ok("an answer over TLS", Duration::from_secs(20), || {
        let mut client = client.clone();
        async move { client.list_workspaces(v1::ListWorkspacesRequest::default()).await }
    })
    .await;
    // Plain text gets nowhere on a TLS listener.
    let mut plain = berth_proto::v1::workspace_service_client::WorkspaceServiceClient::new(support::channel(&format!(
        "http://{address}"
    )));
    assert!(plain.list_workspaces(v1::ListWorkspacesRequest::default()).await.is_err());
}

fn register_message(node_id: &str) -> v1::NodeMessage {
    v1::NodeMessage {
        msg: Some(v1::node_message::Msg::Register(v1::Register {
            node_id: node_id.into(),
            address: "http://127.0.0.1:1".into(),
            backends: vec!["local".into()],
            ..Default::default()
        })),
    }
}

/// What a registration with `credential` as `node_id` gets: the first answer or the error.
async fn try_register(endpoint: &str, credential: &Secret, node_id: &str) -> Result<v1::ControlMessage, tonic::Status> {
    let mut client =
        NodeServiceClient::with_interceptor(support::channel(endpoint), BearerInterceptor::new(Some(credential)));
    // The stream stays open (a pending second message) so a successful registration is
    // answered rather than ended.
    use futures::StreamExt;
    let messages = futures::stream::iter(vec![register_message(node_id)]).chain(futures::stream::pending());
    let mut answers = client.heartbeat(messages).await?.into_inner();
    match answers.message().await? {
        Some(answer) => Ok(answer),
        None => Err(tonic::Status::aborted("stream ended without an answer")),
    }
}

/// Per-node credentials (issue 14): a node proves its own id and no other; a live node's id
/// cannot be taken over; each node accepts only the replica credential made for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn nodes_hold_their_own_credentials_and_only_those() {
    use berth_proto::credentials::NodeCredentialKey;

    let dir = tempfile::tempdir().unwrap();
    let key = NodeCredentialKey::random();
    let registry: berth_control_plane::RegistryRef = EmbeddedRegistry::new();
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    let replica_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let replica_endpoint = format!("http://{}", replica_listener.local_addr().unwrap());
    let mut replica = ControlPlaneConfig::new("replica-keyed");
    replica.node_credential_key = Some(key.clone());
    tokio::spawn(berth_control_plane::serve(replica_listener, replica, Arc::clone(&registry), cancel.clone()));

    let mut endpoints = Vec::new();
    for id in ["node-a", "node-b"] {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        endpoints.push(format!("http://{}", listener.local_addr().unwrap()));
        let mut node = berth_node_agent::NodeAgentConfig::new(id, dir.path().join(id));
        node.control_planes = vec![replica_endpoint.clone()];
        node.node_credential = Some(key.node_credential(id));
        node.allow_unsandboxed = true;
        tokio::spawn(berth_node_agent::serve(listener, node, cancel.clone()));
    }
    let admin = berth_proto::v1::admin_service_client::AdminServiceClient::with_interceptor(
        support::channel(&replica_endpoint),
        Creds::none(),
    );
    berth_testkit::assert_eventually("both nodes registered", Duration::from_secs(30), || {
        let mut admin = admin.clone();
        async move {
            admin
                .list_nodes(v1::ListNodesRequest::default())
                .await
                .is_ok_and(|nodes| nodes.into_inner().nodes.len() == 2)
        }
    })
    .await;
    // Through the replica, a session runs on one of them: replica credentials work.
    let mut client = WorkspaceServiceClient::with_interceptor(support::channel(&replica_endpoint), Creds::none());
    let session = client
        .create_session(v1::CreateSessionRequest {
            user_id: "alice".into(),
            agent_id: "keyed".into(),
            ..Default::default()
        })
        .await
        .expect("a session through per-node credentials")
        .into_inner();
    let ran = client
        .exec(v1::ExecRequest {
            workspace_id: session.workspace_id,
            argv: vec!["echo".into(), "ok".into()],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(ran.stdout, b"ok\n");

    let a = key.node_credential("node-a");
    // Node A's credential registering as node B: refused, typed.
    let refused = try_register(&replica_endpoint, a.secret(), "node-b").await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(refused.message().contains("node node-a's") && refused.message().contains("node-b"), "{refused:?}");
    // …or as a fresh id it has no credential for.
    let refused = try_register(&replica_endpoint, a.secret(), "node-c").await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // A second process with node A's own credential cannot take over the live node A.
    let taken = try_register(&replica_endpoint, a.secret(), "node-a").await.unwrap_err();
    assert_eq!(taken.code(), Code::AlreadyExists, "{taken:?}");
    assert!(taken.message().contains("node id node-a is held"), "{taken:?}");
    // A replica credential is no node credential.
    let replica_credential = key.replica_credential("node-a");
    let refused = try_register(&replica_endpoint, &replica_credential, "node-a").await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    // A credential from another key proves nothing.
    let foreign = NodeCredentialKey::random().node_credential("node-c");
    let refused = try_register(&replica_endpoint, foreign.secret(), "node-c").await.unwrap_err();
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");

    // Node agents: B accepts only the replica credential made for B — not A's node
    // credential, not the replica credential A receives, not B's own node credential.
    let node_b = &endpoints[1];
    let b = key.node_credential("node-b");
    for (name, credential) in [
        ("node A's credential", a.secret().clone()),
        ("the replica credential for node A", key.replica_credential("node-a")),
        ("node B's own node credential", b.secret().clone()),
    ] {
        let mut node = node_client(node_b, Some(&credential));
        let refused = node.list_local(v1::ListLocalRequest {}).await.unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{name}: {refused:?}");
        let mut data_plane = WorkspaceServiceClient::with_interceptor(
            support::channel(node_b),
            BearerInterceptor::new(Some(&credential)),
        );
        let refused = data_plane
            .exec(v1::ExecRequest { workspace_id: "ws-x".into(), argv: vec!["id".into()], ..Default::default() })
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{name}: exec: {refused:?}");
    }
    let mut node = node_client(node_b, Some(&key.replica_credential("node-b")));
    node.list_local(v1::ListLocalRequest {}).await.expect("the replica credential for node B");
}

#[test]
fn dev_certificate_script_makes_the_credentials_replicas_derive() {
    use berth_proto::credentials::{NodeCredential, NodeCredentialKey};
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path(), "node-7");
    let key = NodeCredentialKey::from_file(&dir.path().join("node-credential.key")).unwrap();
    let made = NodeCredential::from_file(&dir.path().join("node-7.credential"), "node-7").unwrap();
    assert_eq!(made.secret(), key.node_credential("node-7").secret());
    assert_eq!(key.verify_node(made.secret().expose()).as_deref(), Some("node-7"));
}

#[tokio::test]
async fn beyond_loopback_nodes_need_their_own_credential_and_tls() {
    use berth_proto::credentials::NodeCredentialKey;
    let dir = tempfile::tempdir().unwrap();
    let key = NodeCredentialKey::random();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, "[[token]]\nsecret = \"ops-token-0123456789\"\nadmin = true\nname = \"ops\"\n").unwrap();
    let serve_replica = |config: ControlPlaneConfig| async move {
        let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
        berth_control_plane::serve(listener, config, EmbeddedRegistry::new(), CancellationToken::new())
            .await
            .unwrap_err()
            .to_string()
    };
    let mut replica = ControlPlaneConfig::new("replica-wide");
    replica.auth = AuthConfig::Tokens { file: tokens.clone() };
    replica.node_secret = Some(Secret::random());
    let error = serve_replica(replica.clone()).await;
    assert!(error.contains("--shared-node-secret-file) is for loopback development only"), "{error}");
    replica.node_secret = None;
    replica.node_credential_key = Some(key.clone());
    let error = serve_replica(replica.clone()).await;
    assert!(error.contains("without TLS") && error.contains("--insecure-plaintext"), "{error}");

    let serve_node = |config: berth_node_agent::NodeAgentConfig| async move {
        let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
        berth_node_agent::serve(listener, config, CancellationToken::new()).await.unwrap_err().to_string()
    };
    let mut node = berth_node_agent::NodeAgentConfig::new("node-wide", dir.path().join("node"));
    node.control_planes = vec!["http://127.0.0.1:1".into()];
    node.allow_unsandboxed = true;
    node.node_secret = Some(Secret::random());
    let error = serve_node(node.clone()).await;
    assert!(error.contains("loopback development only"), "{error}");
    node.node_secret = None;
    node.node_credential = Some(key.node_credential("node-other"));
    let error = serve_node(node.clone()).await;
    assert!(error.contains("node \"node-other\"'s"), "{error}");
    node.node_credential = Some(key.node_credential("node-wide"));
    let error = serve_node(node.clone()).await;
    assert!(error.contains("without TLS") && error.contains("--insecure-plaintext"), "{error}");
}
