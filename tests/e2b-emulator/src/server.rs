//! The two listeners — platform API and envd — over one set of sandboxes, started and
//! stopped with [`Emulator`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State as AxumState};
use axum::response::Response;
use http::{Method, StatusCode};
use serde_json::json;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::connect::{ConnectError, json_response, stream_error};
use super::faults::{Fault, FaultTarget};
use super::state::{Phase, State, StateConfig};
use super::{filesystem, platform, process};

/// Largest unary envd request body.
const MAX_UNARY_BODY: usize = 64 * 1024 * 1024;

/// How to run an emulator.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    /// Where sandboxes keep their files (a temp directory, removed on drop, when `None`).
    pub root: Option<PathBuf>,
    /// The only API key the platform API accepts.
    pub api_key: String,
    /// Running sandboxes allowed at once; one more create is refused with 429 (the
    /// concurrency quota).
    pub max_running: Option<usize>,
    /// When root: each sandbox gets a host uid from here up (mapped to 1000 inside; 50 per
    /// emulator before they repeat).
    /// `None` when not root.
    pub host_uid_base: Option<u32>,
    /// Sandbox timeout when a create or connect names none.
    pub default_timeout: Duration,
}

impl EmulatorConfig {
    pub fn for_test(api_key: &str) -> Self {
        let root = nix::unistd::geteuid().is_root();
        Self {
            root: None,
            api_key: api_key.to_owned(),
            max_running: None,
            // A range per emulator, so sandboxes of emulators in parallel tests never share a uid.
            host_uid_base: root.then(|| 420_000 + (rand::random::<u32>() % 1000) * 50),
            default_timeout: Duration::from_secs(300),
        }
    }
}

/// A running emulator; dropping it stops the listeners and kills every sandbox.
pub struct Emulator {
    pub api_url: String,
    pub sandbox_url: String,
    state: Arc<State>,
    shutdown: CancellationToken,
    _temp: Option<TempRoot>,
}

/// A temp root removed on drop (sandbox files may belong to other uids: root removes them).
struct TempRoot(PathBuf);

impl Drop for TempRoot {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Emulator {
    /// Starts both listeners on `127.0.0.1:0`.
    pub async fn start(config: EmulatorConfig) -> Result<Self> {
        let (root, temp) = match &config.root {
            Some(root) => (root.clone(), None),
            None => {
                let root = std::env::temp_dir().join(format!(
                    "berth-e2b-emulator-{}-{}",
                    std::process::id(),
                    rand::random::<u64>()
                ));
                (root.clone(), Some(TempRoot(root)))
            }
        };
        std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711))?;
        let state = Arc::new(State::new(StateConfig {
            root,
            api_key: config.api_key.clone(),
            max_running: config.max_running,
            host_uid_base: config.host_uid_base,
            default_timeout: config.default_timeout,
        }));
        let shutdown = CancellationToken::new();
        let api = TcpListener::bind("127.0.0.1:0").await?;
        let envd = TcpListener::bind("127.0.0.1:0").await?;
        let api_url = url(api.local_addr()?);
        let sandbox_url = url(envd.local_addr()?);
        serve(api, Router::new().fallback(platform_handler).with_state(state.clone()), shutdown.clone());
        serve(envd, Router::new().fallback(envd_handler).with_state(state.clone()), shutdown.clone());
        let reaper_state = state.clone();
        let reaper_shutdown = shutdown.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = reaper_shutdown.cancelled() => return,
                    () = tokio::time::sleep(Duration::from_secs(1)) => reaper_state.reap().await,
                }
            }
        });
        Ok(Self { api_url, sandbox_url, state, shutdown, _temp: temp })
    }

    /// Injects a fault (see [`Fault`]).
    pub fn inject(&self, fault: Fault) {
        self.state.faults.inject(fault);
    }

    /// How many requests a fault answered so far.
    pub fn faults_fired(&self) -> u64 {
        self.state.faults.fired()
    }

    /// Ids of the sandboxes that exist (running or paused).
    pub fn sandbox_ids(&self) -> Vec<String> {
        self.state.all().iter().map(|sandbox| sandbox.id.clone()).collect()
    }

    /// Whether a sandbox is paused (`None`: no such sandbox).
    pub async fn is_paused(&self, id: &str) -> Option<bool> {
        let sandbox = self.state.get(id)?;
        let life = sandbox.life.lock().await;
        Some(life.phase == Phase::Paused)
    }

    /// The metadata a sandbox was created with.
    pub fn metadata(&self, id: &str) -> Option<std::collections::BTreeMap<String, String>> {
        self.state.get(id).map(|sandbox| sandbox.metadata.clone())
    }

    /// What sandbox `id`'s create asked for as `allow_internet_access` (outer `None`: no
    /// such sandbox).
    pub fn internet_access(&self, id: &str) -> Option<Option<bool>> {
        self.state.get(id).map(|sandbox| sandbox.allow_internet_access)
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.state.kill_all_now();
    }
}

fn url(address: SocketAddr) -> String {
    format!("http://{address}")
}

fn serve(listener: TcpListener, router: Router, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).with_graceful_shutdown(async move { shutdown.cancelled().await }).await;
    });
}

async fn platform_handler(AxumState(state): AxumState<Arc<State>>, request: Request) -> Response {
    platform::handle(state, request).await
}

/// What the sandbox proxy answers for a sandbox that is not running.
fn not_running(id: &str) -> Response {
    json_response(
        StatusCode::BAD_GATEWAY,
        &json!({"code": 502, "message": format!("The sandbox {id} was not found"), "sandboxId": id}),
    )
}

async fn envd_handler(AxumState(state): AxumState<Arc<State>>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let headers = request.headers().clone();
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or("").to_owned();
    if let Some((status, message)) = state.faults.take(FaultTarget::Envd, method.as_str(), &path) {
        let message = if message.is_empty() { format!("injected fault {status}") } else { message };
        return platform::error(status, &message);
    }
    let id = header("e2b-sandbox-id");
    let Some(sandbox) = state.get(&id) else { return not_running(&id) };
    let init_pid = {
        let life = sandbox.life.lock().await;
        if life.killed || life.phase != Phase::Running {
            return not_running(&id);
        }
        life.init.as_ref().map(|init| init.init_pid)
    };
    if header("x-access-token") != sandbox.envd_token {
        return platform::error(401, "unauthorized access, please provide a valid access token");
    }
    let body = request.into_body();
    match (&method, path.as_str()) {
        (&Method::GET, "/health") => {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
        (&Method::GET, "/files") => filesystem::download(sandbox, &query).await,
        (&Method::POST, "/files") => filesystem::upload(sandbox, &headers, &query, body).await,
        (&Method::POST, "/process.Process/StreamInput") => process::stream_input(&sandbox, body).await,
        (&Method::POST, rpc) => {
            let body = match to_bytes(body, MAX_UNARY_BODY).await {
                Ok(body) => body,
                Err(error) => return ConnectError::invalid(format!("body: {error}")).into_unary(),
            };
            match rpc {
                "/process.Process/Start" => process::start(sandbox, init_pid, &headers, &body).await,
                "/process.Process/SendInput" => process::send_input(&sandbox, &body).await,
                "/process.Process/CloseStdin" => process::close_stdin(&sandbox, &body).await,
                "/process.Process/SendSignal" => process::send_signal(&sandbox, &body).await,
                "/process.Process/List" => process::list(&sandbox),
                "/process.Process/Connect" | "/filesystem.Filesystem/WatchDir" => {
                    stream_error(ConnectError::new("unimplemented", format!("{rpc} is not emulated")))
                }
                other => match other.strip_prefix("/filesystem.Filesystem/") {
                    Some(call) => filesystem::call(sandbox, call, &body).await,
                    None => ConnectError::new("unimplemented", format!("{other} is not emulated")).into_unary(),
                },
            }
        }
        _ => platform::error(404, &format!("no route {method} {path}")),
    }
}
