//! In-process cluster for security tests: an embedded registry, a replica with
//! `--auth token`, a second replica with `--auth jwt` on the same registry, and one node
//! agent (local backend) that only accepts the replicas' node secret. The node offers only
//! `local` (with `allow_unsandboxed`), so the test users' tokens and JWTs carry the grant
//! for it (`backends = ["local"]`, `berth/backends`): without it a plain user is refused.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use berth_control_plane::auth::AuthConfig;
use berth_control_plane::auth::jwt::{ClaimCheck, JwtConfig, JwtKey};
use berth_control_plane::registry::embedded::EmbeddedRegistry;
use berth_control_plane::{ControlPlaneConfig, RegistryRef};
use berth_proto::auth::Secret;
use berth_proto::v1;
use berth_proto::v1::admin_service_client::AdminServiceClient;
use berth_proto::v1::contract_service_client::ContractServiceClient;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use tokio_util::sync::CancellationToken;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

pub const ALICE: &str = "alice-token-0123456789";
pub const EVE: &str = "eve-token-0123456789";
pub const CAROL: &str = "carol-token-0123456789";
pub const PLATFORM: &str = "platform-token-0123456789";
pub const OPS: &str = "ops-token-0123456789";
pub const JWT_SECRET: &str = "jwt-secret-0123456789abcdef";
pub const JWT_ISSUER: &str = "berth-tests";
pub const JWT_AUDIENCE: &str = "berth";

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
secret = "carol-token-0123456789"
user = "carol"
backends = ["local"]
[[token]]
secret = "platform-token-0123456789"
service = "platform"
act_for_users = true
[[token]]
secret = "ops-token-0123456789"
admin = true
name = "ops"
"#;

/// Limits a test may tighten.
#[derive(Clone, Copy)]
pub struct Limits {
    pub max_message_bytes: usize,
    pub max_execs_per_workspace: u32,
    pub max_file_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_message_bytes: 32 * 1024 * 1024, max_execs_per_workspace: 32, max_file_bytes: 1 << 32 }
    }
}

pub struct Harness {
    pub token_endpoint: String,
    pub jwt_endpoint: String,
    pub node_endpoint: String,
    pub node_secret: Secret,
    pub registry: RegistryRef,
    pub dir: tempfile::TempDir,
    pub cancel: CancellationToken,
}

impl Drop for Harness {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

async fn listener() -> (tokio::net::TcpListener, String) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("address"));
    (listener, endpoint)
}

pub async fn start(limits: Limits) -> Harness {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, TOKENS).expect("tokens file");
    let jwt_secret = dir.path().join("jwt.secret");
    std::fs::write(&jwt_secret, JWT_SECRET).expect("jwt secret");
    let node_secret = Secret::random();
    let registry: RegistryRef = EmbeddedRegistry::new();
    let cancel = CancellationToken::new();

    let replica = |id: &str, auth: AuthConfig| {
        let mut config = ControlPlaneConfig::new(id);
        config.auth = auth;
        config.node_secret = Some(node_secret.clone());
        config.max_message_bytes = limits.max_message_bytes;
        config.bind_timeout = Duration::from_secs(20);
        config.provision_timeout = Duration::from_secs(15);
        config
    };
    let (token_listener, token_endpoint) = listener().await;
    tokio::spawn(berth_control_plane::serve(
        token_listener,
        replica("replica-token", AuthConfig::Tokens { file: tokens }),
        Arc::clone(&registry),
        cancel.clone(),
    ));
    let (jwt_listener, jwt_endpoint) = listener().await;
    let mut jwt = JwtConfig::new(JwtKey::Secret(jwt_secret));
    jwt.leeway = Duration::from_secs(5);
    jwt.issuer = ClaimCheck::Required(JWT_ISSUER.into());
    jwt.audience = ClaimCheck::Required(JWT_AUDIENCE.into());
    tokio::spawn(berth_control_plane::serve(
        jwt_listener,
        replica("replica-jwt", AuthConfig::Jwt(jwt)),
        Arc::clone(&registry),
        cancel.clone(),
    ));

    let (node_listener, node_endpoint) = listener().await;
    let mut node = berth_node_agent::NodeAgentConfig::new("node-sec", dir.path().join("node"));
    node.control_planes = vec![token_endpoint.clone()];
    node.node_secret = Some(node_secret.clone());
    node.max_execs_per_workspace = limits.max_execs_per_workspace;
    node.max_file_bytes = limits.max_file_bytes;
    node.allow_unsandboxed = true;
    // The MCP HTTP fixture listens on loopback, which the SSRF guard refuses unless allowed.
    node.contract.mcp.allowed_cidrs = vec!["127.0.0.1/32".parse().unwrap()];
    tokio::spawn(berth_node_agent::serve(node_listener, node, cancel.clone()));
    let harness = Harness { token_endpoint, jwt_endpoint, node_endpoint, node_secret, registry, dir, cancel };
    harness.wait_ready().await;
    harness
}

impl Harness {
    /// Waits until a session can be created (replicas serving, node registered and
    /// serving).
    async fn wait_ready(&self) {
        let client = self.workspace(Creds::token(ALICE));
        berth_testkit::eventually_ok("the cluster to become ready", Duration::from_secs(30), || {
            let mut client = client.clone();
            async move {
                client.create_session(v1::CreateSessionRequest { agent_id: "probe".into(), ..Default::default() }).await
            }
        })
        .await;
    }

    pub fn workspace(&self, creds: Creds) -> Client {
        let endpoint = if creds.jwt { &self.jwt_endpoint } else { &self.token_endpoint };
        WorkspaceServiceClient::with_interceptor(channel(endpoint), creds).max_decoding_message_size(64 << 20)
    }

    pub fn admin(&self, creds: Creds) -> AdminServiceClient<InterceptedService<Channel, Creds>> {
        let endpoint = if creds.jwt { &self.jwt_endpoint } else { &self.token_endpoint };
        AdminServiceClient::with_interceptor(channel(endpoint), creds)
    }
}

impl Harness {
    pub fn contract(&self, creds: Creds) -> ContractClient {
        let endpoint = if creds.jwt { &self.jwt_endpoint } else { &self.token_endpoint };
        ContractServiceClient::with_interceptor(channel(endpoint), creds).max_decoding_message_size(64 << 20)
    }
}

pub type ContractClient = ContractServiceClient<InterceptedService<Channel, Creds>>;

pub type Client = WorkspaceServiceClient<InterceptedService<Channel, Creds>>;

pub fn channel(endpoint: &str) -> Channel {
    Endpoint::from_shared(endpoint.to_owned()).expect("endpoint").connect_lazy()
}

/// Credentials of one test caller; `jwt` picks the JWT replica.
#[derive(Clone, Default)]
pub struct Creds {
    authorization: Option<MetadataValue<Ascii>>,
    act_as: Option<MetadataValue<Ascii>>,
    pub jwt: bool,
}

impl Creds {
    pub fn none() -> Self {
        Self::default()
    }

    pub fn token(token: &str) -> Self {
        Self { authorization: Some(format!("Bearer {token}").parse().expect("header")), ..Self::default() }
    }

    pub fn jwt(token: &str) -> Self {
        Self { jwt: true, ..Self::token(token) }
    }

    pub fn acting_as(mut self, user: &str) -> Self {
        self.act_as = Some(user.parse().expect("header"));
        self
    }
}

impl tonic::service::Interceptor for Creds {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.authorization {
            request.metadata_mut().insert("authorization", value.clone());
        }
        if let Some(value) = &self.act_as {
            request.metadata_mut().insert("x-berth-act-as", value.clone());
        }
        Ok(request)
    }
}

/// An HS256 JWT for `sub`, expiring `expires_in_secs` from now (negative: in the past).
pub fn jwt(sub: &str, expires_in_secs: i64, extra: serde_json::Value) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs() as i64;
    // The harness node offers only `local`: every test JWT is granted it.
    let mut claims = serde_json::json!({
        "sub": sub,
        "exp": now + expires_in_secs,
        "iss": JWT_ISSUER,
        "aud": JWT_AUDIENCE,
        "berth/backends": ["local"],
    });
    if let (Some(claims), Some(extra)) = (claims.as_object_mut(), extra.as_object()) {
        claims.extend(extra.clone());
        // `null` in `extra` removes the claim.
        claims.retain(|_, value| !value.is_null());
    }
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(JWT_SECRET.as_bytes()),
    )
    .expect("sign jwt")
}

/// A WriteFile call's messages: header, the data in 64 KiB chunks, commit.
pub fn write_messages(workspace_id: &str, path: &str, data: &[u8]) -> Vec<v1::WriteFileRequest> {
    let header = v1::WriteFileHeader { workspace_id: workspace_id.into(), path: path.into(), mode: 0 };
    berth_proto::convert::write_file_messages(header, data, 64 * 1024)
}

/// Reads a whole file through ReadFile.
pub async fn read_all(client: &mut Client, workspace_id: &str, path: &str) -> Result<Vec<u8>, tonic::Status> {
    use futures::StreamExt;
    let mut stream = client
        .read_file(v1::ReadFileRequest { workspace_id: workspace_id.into(), path: path.into(), chunk_size: 0 })
        .await?
        .into_inner();
    let mut data = Vec::new();
    while let Some(chunk) = stream.next().await {
        data.extend(chunk?.data);
    }
    Ok(data)
}

/// Runs `sh -c script` in the workspace and returns stdout (panics on failure).
pub async fn sh(client: &mut Client, workspace_id: &str, script: &str) -> String {
    let result = client
        .exec(v1::ExecRequest {
            workspace_id: workspace_id.into(),
            argv: vec!["sh".into(), "-c".into(), script.into()],
            ..Default::default()
        })
        .await
        .unwrap_or_else(|status| panic!("exec {script:?}: {status:?}"))
        .into_inner();
    assert_eq!(result.exit_code, 0, "{script:?}: {}", String::from_utf8_lossy(&result.stderr));
    String::from_utf8_lossy(&result.stdout).into_owned()
}
