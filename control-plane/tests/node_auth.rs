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
    let attempts = [
        ("no client certificate", ClientTlsConfig::new().ca_certificate(ca.clone())),
        ("certificate of another CA", ClientTlsConfig::new().ca_certificate(ca.clone()).identity(identity(&other_ca))),
    ];
    for (name, tls) in attempts {
        let channel = Endpoint::from_shared(url.clone()).unwrap().tls_config(tls).unwrap().connect_lazy();
        let mut node = NodeAgentServiceClient::with_interceptor(channel, BearerInterceptor::new(Some(&secret)));
        let refused = node.list_local(v1::ListLocalRequest {}).await.unwrap_err();
        assert_ne!(refused.code(), Code::Ok, "{name}");
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
