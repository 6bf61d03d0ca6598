//! The compose cluster of `deploy/compose/` driven from tests: 3 etcd members, 3 replicas and
//! 3 node agents (node4 and node5 on demand), each its own container on a private Docker
//! network, under one compose project per [`ComposeCluster`], with the credentials
//! `deploy/compose/make-secrets.sh` makes: TLS on every listener, etcd with TLS and user
//! authentication, a credential per node. The test talks gRPC over TLS to the ports compose
//! publishes on 127.0.0.1, scrapes metrics over HTTPS at the containers' addresses on the
//! Docker network (the host reaches them), and breaks the cluster with the docker CLI
//! (`kill`, `network disconnect`, `restart`). Dropping the handle tears the project down
//! (containers, network, volumes), also when the test panics.
//!
//! Needs the images `deploy/compose/build-images.sh` builds (`berth/berth:dev`,
//! `berth/etcd:dev`); a missing image fails the test with that instruction.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use berth_proto::auth::{BearerInterceptor, Secret};
use berth_proto::v1;
use berth_proto::v1::admin_service_client::AdminServiceClient;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use tempfile::TempDir;
use tonic::Status;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use berth_proto::credentials::NodeCredentialKey;
use berth_proto::tls::{ClientTls, TlsFiles};
use berth_testkit::wait_until;
use tonic::transport::{ClientTlsConfig, Endpoint};

/// Images the compose file runs (its defaults).
pub const BERTH_IMAGE: &str = "berth/berth:dev";
pub const ETCD_IMAGE: &str = "berth/etcd:dev";
/// The replica services, in order.
pub const REPLICA_SERVICES: [&str; 3] = ["replica1", "replica2", "replica3"];
/// The etcd member services.
pub const ETCD_SERVICES: [&str; 3] = ["etcd1", "etcd2", "etcd3"];
/// The node services `up` starts; [`EXTRA_NODE_SERVICES`] start on demand (profile `scale`).
pub const NODE_SERVICES: [&str; 3] = ["node1", "node2", "node3"];
pub const EXTRA_NODE_SERVICES: [&str; 2] = ["node4", "node5"];
/// Ports inside the containers.
const REPLICA_PORT: u16 = 7070;
/// Longest a single docker / compose command may take.
const DOCKER_TIMEOUT: Duration = Duration::from_secs(120);

/// Lease and heartbeat settings of the test cluster: short, so failures show quickly.
#[derive(Clone, Debug)]
pub struct ComposeConfig {
    pub node_lease_ttl: Duration,
    pub replica_lease_ttl: Duration,
    pub heartbeat_interval: Duration,
    /// How long a workspace waits for its gone node before it is re-created elsewhere.
    pub lost_node_grace: Duration,
}

impl Default for ComposeConfig {
    fn default() -> Self {
        Self {
            node_lease_ttl: Duration::from_secs(3),
            replica_lease_ttl: Duration::from_secs(3),
            heartbeat_interval: Duration::from_millis(500),
            lost_node_grace: Duration::from_secs(3),
        }
    }
}

pub type AuthedChannel = InterceptedService<Channel, BearerInterceptor>;

/// One replica as the test reaches it.
#[derive(Clone)]
pub struct ComposeReplica {
    pub service: &'static str,
    /// `https://127.0.0.1:<published port>`.
    pub endpoint: String,
    channel: Channel,
    tls: ClientTlsConfig,
    token: Secret,
}

impl ComposeReplica {
    fn interceptor(&self) -> BearerInterceptor {
        BearerInterceptor::new(Some(&self.token))
    }

    pub fn workspace_client(&self) -> WorkspaceServiceClient<AuthedChannel> {
        WorkspaceServiceClient::with_interceptor(self.channel.clone(), self.interceptor())
    }

    pub fn admin_client(&self) -> AdminServiceClient<AuthedChannel> {
        AdminServiceClient::with_interceptor(self.channel.clone(), self.interceptor())
    }

    /// CreateSession for `user`/`agent` (policy per-agent), with an explicit session id when
    /// given. Carries a 20 s gRPC deadline.
    pub async fn create_session(&self, user: &str, agent: &str, session_id: &str) -> Result<v1::Session, Status> {
        let mut request = tonic::Request::new(v1::CreateSessionRequest {
            user_id: user.into(),
            agent_id: agent.into(),
            session_id: session_id.into(),
            ..Default::default()
        });
        request.set_timeout(Duration::from_secs(20));
        Ok(self.workspace_client().create_session(request).await?.into_inner())
    }

    /// Exec with a 10 s command timeout and a 15 s gRPC deadline.
    pub async fn exec(&self, workspace_id: &str, argv: &[&str]) -> Result<v1::ExecResult, Status> {
        let mut request = tonic::Request::new(v1::ExecRequest {
            workspace_id: workspace_id.into(),
            argv: argv.iter().map(|arg| (*arg).to_owned()).collect(),
            timeout_ms: 10_000,
            ..Default::default()
        });
        request.set_timeout(Duration::from_secs(15));
        Ok(self.workspace_client().exec(request).await?.into_inner())
    }

    pub async fn get_workspace(&self, workspace_id: &str) -> Result<v1::Workspace, Status> {
        let mut request = tonic::Request::new(v1::GetWorkspaceRequest { workspace_id: workspace_id.into() });
        request.set_timeout(Duration::from_secs(5));
        Ok(self.workspace_client().get_workspace(request).await?.into_inner())
    }

    /// The nodes this replica lists (AdminService ListNodes, what `berth nodes list` shows).
    pub async fn list_nodes(&self) -> Result<Vec<v1::NodeInfo>, Status> {
        let mut request = tonic::Request::new(v1::ListNodesRequest {});
        request.set_timeout(Duration::from_secs(5));
        Ok(self.admin_client().list_nodes(request).await?.into_inner().nodes)
    }

    pub async fn node_ids(&self) -> Option<Vec<String>> {
        let nodes = self.list_nodes().await.ok()?;
        let mut ids: Vec<String> = nodes.into_iter().map(|node| node.node_id).collect();
        ids.sort();
        Some(ids)
    }

    pub async fn is_serving(&self) -> bool {
        let channel = tls_channel(&self.endpoint, self.tls.clone());
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let request = tonic_health::pb::HealthCheckRequest { service: String::new() };
        let Ok(Ok(response)) = tokio::time::timeout(Duration::from_secs(2), health.check(request)).await else {
            return false;
        };
        response.into_inner().status == tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    }
}

/// A running compose project; dropped, it is torn down.
pub struct ComposeCluster {
    pub project: String,
    pub config: ComposeConfig,
    pub replicas: Vec<ComposeReplica>,
    compose_file: PathBuf,
    secrets: TempDir,
    admin_token: Secret,
    /// Host ports the replicas are published on: fixed for the project's life, so a
    /// restarted replica comes back at the same address.
    replica_ports: [u16; 3],
    /// How long `up` took until every replica listed every node.
    pub bring_up: Duration,
}

/// `docker compose` when the plugin exists, else the standalone `docker-compose`.
fn compose_program() -> Vec<String> {
    static PROGRAM: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    PROGRAM
        .get_or_init(|| {
            let plugin = std::process::Command::new("docker")
                .args(["compose", "version"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|status| status.success());
            if plugin { vec!["docker".into(), "compose".into()] } else { vec!["docker-compose".into()] }
        })
        .clone()
}

/// Runs `program args` with `env` added, failing on a non-zero exit or after
/// [`DOCKER_TIMEOUT`]; returns stdout.
async fn run(program: &[String], args: &[&str], env: &[(String, String)]) -> anyhow::Result<String> {
    let mut command = tokio::process::Command::new(&program[0]);
    command.args(&program[1..]).args(args).envs(env.iter().cloned()).kill_on_drop(true);
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let shown = format!("{} {}", program.join(" "), args.join(" "));
    let output = tokio::time::timeout(DOCKER_TIMEOUT, command.output())
        .await
        .with_context(|| format!("`{shown}` took longer than {DOCKER_TIMEOUT:?}"))?
        .with_context(|| format!("`{shown}` did not start"))?;
    if !output.status.success() {
        bail!("`{shown}` failed ({}): {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `docker <args>`.
pub async fn docker(args: &[&str]) -> anyhow::Result<String> {
    run(&["docker".to_owned()], args, &[]).await
}

impl ComposeCluster {
    /// Brings a fresh project up from nothing (images must exist) and waits until every
    /// replica serves and lists every node, and every node serves workspaces.
    pub async fn start(config: ComposeConfig) -> anyhow::Result<Self> {
        for image in [BERTH_IMAGE, ETCD_IMAGE] {
            if docker(&["image", "inspect", "--format", "{{.Id}}", image]).await.is_err() {
                bail!("image {image} is missing: run deploy/compose/build-images.sh first");
            }
        }
        remove_stale_projects().await;
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let compose_file = root.join("deploy/compose/docker-compose.yml");
        let secrets = tempfile::Builder::new().prefix("berth-compose-secrets-").tempdir()?;
        let admin_token = Secret::new(format!("admin-{:032x}", rand::random::<u128>()));
        std::fs::write(
            secrets.path().join("tokens.toml"),
            format!("[[token]]\nsecret = \"{}\"\nadmin = true\nname = \"test\"\n", admin_token.expose()),
        )?;
        // The deployment's own script makes the rest (it keeps this tokens.toml).
        let script = root.join("deploy/compose/make-secrets.sh");
        let made = tokio::process::Command::new("bash").arg(&script).arg(secrets.path()).output().await?;
        if !made.status.success() {
            bail!("make-secrets.sh failed: {}", String::from_utf8_lossy(&made.stderr));
        }
        let project = format!("berthtest{:08x}", rand::random::<u32>());
        let cluster = Self {
            project,
            config: config.clone(),
            replicas: Vec::new(),
            compose_file,
            secrets,
            admin_token,
            replica_ports: [crate::process::free_port()?, crate::process::free_port()?, crate::process::free_port()?],
            bring_up: Duration::ZERO,
        };
        // On an error `bring_up` drops the cluster, which tears the project down.
        cluster.bring_up().await
    }

    async fn bring_up(mut self) -> anyhow::Result<Self> {
        let started = Instant::now();
        self.compose(&["up", "--detach", "--no-color"]).await.context("compose up")?;
        for service in REPLICA_SERVICES {
            let published = self.published_port(service, REPLICA_PORT).await?;
            let endpoint = format!("https://{published}");
            let tls = self.client_tls(None)?;
            self.replicas.push(ComposeReplica {
                service,
                channel: tls_channel(&endpoint, tls.clone()),
                endpoint,
                tls,
                token: self.admin_token.clone(),
            });
        }
        let expected = self.node_ids().await?;
        if !self.wait_nodes_listed(&expected, Duration::from_secs(60)).await {
            bail!("the replicas do not list nodes {expected:?}\n{}", self.logs(30).await);
        }
        if !self.wait_nodes_serving(Duration::from_secs(30)).await {
            bail!("the nodes do not serve\n{}", self.logs(30).await);
        }
        self.bring_up = started.elapsed();
        Ok(self)
    }

    fn env(&self) -> Vec<(String, String)> {
        let duration = |value: Duration| format!("{}ms", value.as_millis());
        vec![
            ("BERTH_SECRETS_DIR".into(), self.secrets.path().display().to_string()),
            ("BERTH_PUBLISH_R1".into(), format!("127.0.0.1:{}", self.replica_ports[0])),
            ("BERTH_PUBLISH_R2".into(), format!("127.0.0.1:{}", self.replica_ports[1])),
            ("BERTH_PUBLISH_R3".into(), format!("127.0.0.1:{}", self.replica_ports[2])),
            ("BERTH_NODE_PUBLISH".into(), "127.0.0.1:".into()),
            ("BERTH_NODE_LEASE_TTL".into(), duration(self.config.node_lease_ttl)),
            ("BERTH_REPLICA_LEASE_TTL".into(), duration(self.config.replica_lease_ttl)),
            ("BERTH_HEARTBEAT_INTERVAL".into(), duration(self.config.heartbeat_interval)),
            ("BERTH_LOST_NODE_GRACE".into(), duration(self.config.lost_node_grace)),
            ("RUST_LOG".into(), "info,berth=debug".into()),
        ]
    }

    /// `docker compose -p <project> -f <file> <args>`.
    pub async fn compose(&self, args: &[&str]) -> anyhow::Result<String> {
        let file = self.compose_file.display().to_string();
        let mut all = vec!["--project-name", self.project.as_str(), "--file", file.as_str()];
        all.extend_from_slice(args);
        run(&compose_program(), &all, &self.env()).await
    }

    /// `host:port` on 127.0.0.1 where `service`'s `port` is published.
    async fn published_port(&self, service: &str, port: u16) -> anyhow::Result<String> {
        let out = self.compose(&["port", service, &port.to_string()]).await?;
        let published = out.trim().to_owned();
        if published.is_empty() {
            bail!("{service}:{port} is not published");
        }
        Ok(published)
    }

    /// A file of the credentials make-secrets.sh wrote (`pki/ca.pem`, `pki/replica1.key`, …).
    pub fn secret_path(&self, name: &str) -> PathBuf {
        self.secrets.path().join(name)
    }

    /// TLS towards the cluster's listeners: trusting its CA, presenting `identity`'s
    /// certificate (`pki/<identity>.pem`) when given.
    pub fn client_tls(&self, identity: Option<&str>) -> anyhow::Result<ClientTlsConfig> {
        ClientTls {
            ca: self.secret_path("pki/ca.pem"),
            identity: identity.map(|name| TlsFiles {
                cert: self.secret_path(&format!("pki/{name}.pem")),
                key: self.secret_path(&format!("pki/{name}.key")),
            }),
            // The published ports are on 127.0.0.1; every certificate names localhost too.
            domain: Some("localhost".into()),
        }
        .config()
        .map_err(anyhow::Error::msg)
    }

    /// The address of `service`'s container on the project network (reachable from the host).
    pub async fn address(&self, service: &str) -> anyhow::Result<String> {
        let container = self.container(service).await?;
        let out =
            docker(&["inspect", "--format", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", &container])
                .await?;
        Ok(out.trim().to_owned())
    }

    /// `GET path` over HTTPS from `service`'s `port`, verifying its certificate (SAN =
    /// service name) against the cluster CA and presenting `identity`'s certificate when
    /// given (etcd wants one). Returns the body of a 200 answer.
    pub async fn https_get(
        &self,
        service: &str,
        port: u16,
        path: &str,
        identity: Option<&str>,
    ) -> anyhow::Result<String> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from_pem_file(self.secret_path("pki/ca.pem"))?)?;
        let builder =
            rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()?
                .with_root_certificates(roots);
        let config = match identity {
            Some(name) => builder.with_client_auth_cert(
                CertificateDer::pem_file_iter(self.secret_path(&format!("pki/{name}.pem")))?
                    .collect::<Result<Vec<_>, _>>()?,
                PrivateKeyDer::from_pem_file(self.secret_path(&format!("pki/{name}.key")))?,
            )?,
            None => builder.with_no_client_auth(),
        };
        let address = format!("{}:{port}", self.address(service).await?);
        let exchange = async {
            let tcp = tokio::net::TcpStream::connect(&address).await?;
            let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
            let mut tls = connector.connect(ServerName::try_from(service.to_owned())?, tcp).await?;
            let request = format!("GET {path} HTTP/1.1\r\nHost: {service}\r\nConnection: close\r\n\r\n");
            tls.write_all(request.as_bytes()).await?;
            let mut response = Vec::new();
            // A peer that closes without TLS close_notify still sent the whole answer.
            if let Err(error) = tls.read_to_end(&mut response).await
                && error.kind() != std::io::ErrorKind::UnexpectedEof
            {
                return Err(error.into());
            }
            anyhow::Ok(String::from_utf8_lossy(&response).into_owned())
        };
        let response = tokio::time::timeout(Duration::from_secs(10), exchange)
            .await
            .with_context(|| format!("https://{service}:{port}{path} took over 10 s"))??;
        let (head, body) = response.split_once("\r\n\r\n").unwrap_or((response.as_str(), ""));
        if !head.starts_with("HTTP/1.1 200") {
            bail!("https://{service}:{port}{path}: {}", head.lines().next().unwrap_or(""));
        }
        Ok(body.to_owned())
    }

    /// The Prometheus text of `service`'s metrics port over HTTPS (replicas and nodes 9100;
    /// etcd members 2379, with a replica's client certificate).
    pub async fn scrape(&self, service: &str) -> anyhow::Result<String> {
        if service.starts_with("etcd") {
            self.https_get(service, 2379, "/metrics", Some("replica1")).await
        } else {
            self.https_get(service, 9100, "/metrics", None).await
        }
    }

    /// What a plaintext client gets from `service`'s `port` for `GET /metrics` (the bytes
    /// of the answer, empty when the connection was closed).
    pub async fn plaintext_get(&self, service: &str, port: u16) -> anyhow::Result<String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let address = format!("{}:{port}", self.address(service).await?);
        let exchange = async {
            let mut tcp = tokio::net::TcpStream::connect(&address).await?;
            tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await?;
            let mut answer = Vec::new();
            let _ = tcp.read_to_end(&mut answer).await;
            anyhow::Ok(String::from_utf8_lossy(&answer).into_owned())
        };
        tokio::time::timeout(Duration::from_secs(10), exchange).await.context("plaintext probe took over 10 s")?
    }

    /// Full container ids of `service`.
    pub async fn containers(&self, service: &str) -> anyhow::Result<Vec<String>> {
        let out = self.compose(&["ps", "-q", service]).await?;
        Ok(out.lines().map(str::trim).filter(|line| !line.is_empty()).map(str::to_owned).collect())
    }

    /// The container of `service` (one-instance services).
    pub async fn container(&self, service: &str) -> anyhow::Result<String> {
        self.containers(service).await?.into_iter().next().with_context(|| format!("no container for {service}"))
    }

    /// Ids of the nodes that have a container (a node's id is its service's name), sorted.
    pub async fn node_ids(&self) -> anyhow::Result<Vec<String>> {
        let mut ids = Vec::new();
        for service in NODE_SERVICES.iter().chain(&EXTRA_NODE_SERVICES) {
            if !self.containers(service).await?.is_empty() {
                ids.push((*service).to_owned());
            }
        }
        Ok(ids)
    }

    /// The container of node `node_id`.
    pub async fn node_container(&self, node_id: &str) -> anyhow::Result<String> {
        self.container(node_id).await
    }

    /// A client of node `node_id`'s data plane (`WorkspaceService`) through its published
    /// port, as a replica reaches it: replica1's client certificate and the replica
    /// credential for that node.
    pub async fn node_client(&self, node_id: &str) -> anyhow::Result<WorkspaceServiceClient<AuthedChannel>> {
        let container = self.node_container(node_id).await?;
        let out = docker(&["port", &container, "7071/tcp"]).await?;
        let published = out.lines().find(|line| line.starts_with("127.0.0.1:")).context("node port not published")?;
        let endpoint = format!("https://{}", published.trim());
        let key =
            NodeCredentialKey::from_file(&self.secret_path("pki/node-credential.key")).map_err(anyhow::Error::msg)?;
        Ok(WorkspaceServiceClient::with_interceptor(
            tls_channel(&endpoint, self.client_tls(Some("replica1"))?),
            BearerInterceptor::new(Some(&key.replica_credential(node_id))),
        ))
    }

    /// The project's network (`<project>_berth`).
    pub fn network(&self) -> String {
        format!("{}_berth", self.project)
    }

    /// Waits until every replica lists exactly `expected` (sorted) node ids.
    pub async fn wait_nodes_listed(&self, expected: &[String], timeout: Duration) -> bool {
        wait_until(timeout, || async {
            for replica in &self.replicas {
                if replica.node_ids().await.as_deref() != Some(expected) {
                    return false;
                }
            }
            true
        })
        .await
    }

    /// Waits until a workspace can be created and run through every replica: the nodes
    /// lift their startup fence a moment after their records appear.
    pub async fn wait_nodes_serving(&self, timeout: Duration) -> bool {
        let probe = format!("serving-probe-{:08x}", rand::random::<u32>());
        wait_until(timeout, || async {
            let Ok(session) = self.replicas[0].create_session(&probe, "probe", "").await else {
                return false;
            };
            self.replicas[0].exec(&session.workspace_id, &["true"]).await.is_ok()
        })
        .await
    }

    /// Names of workspace directories on node `node_id`'s disk.
    pub async fn workspace_dirs(&self, node_id: &str) -> anyhow::Result<Vec<String>> {
        let container = self.node_container(node_id).await?;
        let out = docker(&["exec", &container, "ls", "-1", "/var/lib/berth/workspaces"]).await?;
        let mut dirs: Vec<String> = out.lines().map(str::to_owned).filter(|name| !name.is_empty()).collect();
        dirs.sort();
        Ok(dirs)
    }

    /// `docker logs` of one container (stdout and stderr together).
    pub async fn container_log(&self, container: &str) -> String {
        let mut command = tokio::process::Command::new("docker");
        command.args(["logs", container]).kill_on_drop(true).stdin(Stdio::null());
        match tokio::time::timeout(DOCKER_TIMEOUT, command.output()).await {
            Ok(Ok(output)) => {
                format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr))
            }
            _ => format!("(no log of {container})"),
        }
    }

    /// The last `lines` log lines of every service, for failure messages.
    pub async fn logs(&self, lines: usize) -> String {
        let tail = lines.to_string();
        match self.compose(&["logs", "--no-color", "--tail", &tail]).await {
            Ok(logs) => logs,
            Err(error) => format!("(compose logs failed: {error:#})"),
        }
    }

    /// Docker's verdict on what compose started: `service state` lines.
    pub async fn ps(&self) -> String {
        self.compose(&["ps"]).await.unwrap_or_else(|error| format!("(compose ps failed: {error:#})"))
    }
}

impl Drop for ComposeCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The log is the only trace of what the containers did; keep a copy.
            let path = std::env::temp_dir().join(format!("{}.log", self.project));
            let program = compose_program();
            let file = self.compose_file.display().to_string();
            if let Ok(output) = std::process::Command::new(&program[0])
                .args(&program[1..])
                .args(["--project-name", &self.project, "--file", &file, "logs", "--no-color"])
                .envs(self.env())
                .stdin(Stdio::null())
                .output()
            {
                let _ = std::fs::write(&path, &output.stdout);
                eprintln!("compose project {} logs kept at {}", self.project, path.display());
            }
        }
        let program = compose_program();
        let file = self.compose_file.display().to_string();
        let torn_down = std::process::Command::new(&program[0])
            .args(&program[1..])
            .args([
                "--project-name",
                &self.project,
                "--file",
                &file,
                "down",
                "--volumes",
                "--remove-orphans",
                "--timeout",
                "1",
            ])
            .envs(self.env())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .output();
        match torn_down {
            Ok(output) if output.status.success() => {}
            Ok(output) => {
                eprintln!("compose down of {} failed: {}", self.project, String::from_utf8_lossy(&output.stderr).trim())
            }
            Err(error) => eprintln!("compose down of {} did not run: {error}", self.project),
        }
    }
}

/// Test projects live well under a minute; one older than this was left by a test run that
/// was killed before its drop guard ran.
const STALE_PROJECT_AGE: Duration = Duration::from_secs(15 * 60);

/// Removes the containers and networks of test projects (`berthtest*`) older than
/// [`STALE_PROJECT_AGE`], so a killed run does not leave nine containers behind for good.
/// Best effort: a failure here is logged and the test goes on.
async fn remove_stale_projects() {
    let Ok(listing) = docker(&[
        "ps",
        "--all",
        "--filter",
        "label=com.docker.compose.project",
        "--format",
        "{{.ID}} {{.Label \"com.docker.compose.project\"}} {{.CreatedAt}}",
    ])
    .await
    else {
        return;
    };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let mut stale_projects = std::collections::BTreeSet::new();
    for line in listing.lines() {
        // "<id> <project> 2026-11-30 10:51:03 +0000 UTC"
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [id, project, date, time, "+0000", ..] = fields.as_slice() else { continue };
        let Some(created) = unix_seconds(date, time) else { continue };
        if project.starts_with("berthtest") && now.as_secs().saturating_sub(created) > STALE_PROJECT_AGE.as_secs() {
            stale_projects.insert((*project).to_owned());
            if let Err(error) = docker(&["rm", "--force", "--volumes", id]).await {
                eprintln!("removing stale container {id}: {error:#}");
            }
        }
    }
    for project in stale_projects {
        eprintln!("removed stale compose project {project}");
        let _ = docker(&["network", "rm", &format!("{project}_berth")]).await;
    }
}

/// Seconds since the epoch of a UTC `YYYY-MM-DD` `HH:MM:SS` (days from the civil date, as in
/// Howard Hinnant's `days_from_civil`).
fn unix_seconds(date: &str, time: &str) -> Option<u64> {
    let numbers = |text: &str, separator: char| -> Option<Vec<i64>> {
        text.split(separator).map(|part| part.parse::<i64>().ok()).collect()
    };
    let (date, time) = (numbers(date, '-')?, numbers(time, ':')?);
    let ([year, month, day], [hour, minute, second]) = (date.as_slice(), time.as_slice()) else { return None };
    let year = if *month <= 2 { year - 1 } else { *year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    let days = era * 146_097 + day_of_era - 719_468;
    u64::try_from(days * 86_400 + hour * 3600 + minute * 60 + second).ok()
}

/// A lazily connecting channel to `endpoint` over `tls`.
fn tls_channel(endpoint: &str, tls: ClientTlsConfig) -> Channel {
    Endpoint::from_shared(endpoint.to_owned())
        .expect("valid endpoint")
        .tls_config(tls)
        .expect("tls config")
        .connect_timeout(Duration::from_secs(2))
        .tcp_nodelay(true)
        .connect_lazy()
}

#[cfg(test)]
mod tests {
    #[test]
    fn unix_seconds_of_docker_timestamps() {
        assert_eq!(super::unix_seconds("1970-01-01", "00:00:00"), Some(0));
        assert_eq!(super::unix_seconds("2026-11-30", "10:51:03"), Some(1_796_035_863));
        assert_eq!(super::unix_seconds("2000-02-29", "12:00:00"), Some(951_825_600));
        assert_eq!(super::unix_seconds("2026-11", "10:51:03"), None);
    }
}
