//! One listener serving the API and, under `/toolbox/{sandboxId}/…`, every sandbox's
//! toolbox (the `toolboxProxyUrl` of each sandbox is `<api>/toolbox`), started and stopped
//! with [`Emulator`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::body::to_bytes;
use axum::extract::{Request, State as AxumState};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use berth_e2b_emulator::{Fault, FaultTarget};

use super::api;
use super::reply::error;
use super::state::{Phase, State, StateConfig};
use super::toolbox;

/// How to run an emulator.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    /// Where sandboxes keep their files (a temp directory, removed on drop, when `None`).
    pub root: Option<PathBuf>,
    /// The only API key accepted (`Authorization: Bearer …`).
    pub api_key: String,
    /// The organization every sandbox belongs to; a request naming another one in
    /// `X-Daytona-Organization-ID` is refused (403).
    pub organization_id: String,
    /// Started sandboxes allowed at once; one more create or start is refused with 403 and
    /// Daytona's quota message.
    pub max_started: Option<usize>,
    /// When root: each sandbox gets a host uid from here up (mapped to 1000 inside).
    pub host_uid_base: Option<u32>,
}

impl EmulatorConfig {
    pub fn for_test(api_key: &str) -> Self {
        let root = nix::unistd::geteuid().is_root();
        Self {
            root: None,
            api_key: api_key.to_owned(),
            organization_id: "emulator-organization".to_owned(),
            max_started: None,
            // A range per emulator, so sandboxes of emulators in parallel tests never share a uid.
            host_uid_base: root.then(|| 470_000 + (rand::random::<u32>() % 1000) * 50),
        }
    }
}

/// A running emulator; dropping it stops the listener and kills every sandbox.
pub struct Emulator {
    pub api_url: String,
    state: Arc<State>,
    shutdown: CancellationToken,
    _temp: Option<TempRoot>,
}

/// A temp root removed on drop.
struct TempRoot(PathBuf);

impl Drop for TempRoot {
    /// The emulator's drop has just SIGKILLed the sandboxes' inits: their processes may
    /// still be writing (an exec's status file) while they die, and a removal that meets a
    /// file made after it listed a directory fails. Tried again until it is gone, for 5 s
    /// at most.
    fn drop(&mut self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            match std::fs::remove_dir_all(&self.0) {
                Ok(()) => return,
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => return,
                Err(_) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(error) => {
                    eprintln!("daytona emulator: cannot remove {}: {error}", self.0.display());
                    return;
                }
            }
        }
    }
}

impl Emulator {
    /// Starts the listener on `127.0.0.1:0`.
    pub async fn start(config: EmulatorConfig) -> Result<Self> {
        let (root, temp) = match &config.root {
            Some(root) => (root.clone(), None),
            None => {
                let root = std::env::temp_dir().join(format!(
                    "berth-daytona-emulator-{}-{}",
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
            organization_id: config.organization_id.clone(),
            max_started: config.max_started,
            host_uid_base: config.host_uid_base,
        }));
        let shutdown = CancellationToken::new();
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let api_url = url(listener.local_addr()?);
        *state.toolbox_url.lock().unwrap_or_else(|poison| poison.into_inner()) = format!("{api_url}/toolbox");
        let router = Router::new().fallback(handler).with_state(state.clone());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(async move { stop.cancelled().await }).await;
        });
        Ok(Self { api_url, state, shutdown, _temp: temp })
    }

    /// Injects a fault: `FaultTarget::Api` for the API, `FaultTarget::Envd` for toolboxes.
    pub fn inject(&self, fault: Fault) {
        self.state.faults.inject(fault);
    }

    pub fn faults_fired(&self) -> u64 {
        self.state.faults.fired()
    }

    /// Ids of the sandboxes that exist (started or stopped).
    pub fn sandbox_ids(&self) -> Vec<String> {
        self.state.all().iter().map(|sandbox| sandbox.id.clone()).collect()
    }

    /// Whether a sandbox is stopped (`None`: no such sandbox).
    pub async fn is_stopped(&self, id: &str) -> Option<bool> {
        let sandbox = self.state.get(id)?;
        let life = sandbox.life.lock().await;
        Some(life.phase == Phase::Stopped)
    }

    /// A sandbox's labels now.
    pub fn labels(&self, id: &str) -> Option<std::collections::BTreeMap<String, String>> {
        self.state.get(id).map(|sandbox| sandbox.labels())
    }

    /// Whether sandbox `id` was created with `networkBlockAll`.
    pub fn network_blocked(&self, id: &str) -> Option<bool> {
        self.state.get(id).map(|sandbox| sandbox.network_block_all)
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

/// Largest JSON request body.
const MAX_JSON_BODY: usize = 16 * 1024 * 1024;

async fn handler(AxumState(state): AxumState<Arc<State>>, request: Request) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let headers = request.headers().clone();
    // The SDK's event channel: Daytona serves Socket.IO here; a 404 makes the SDK poll.
    if path.starts_with("/socket.io") {
        return error(404, "Cannot GET /socket.io/");
    }
    if path == "/_emulator/faults" {
        return api::faults(&state, &method, request.into_body()).await;
    }
    let header = |name: &str| headers.get(name).and_then(|value| value.to_str().ok()).unwrap_or("").to_owned();
    if header("authorization") != format!("Bearer {}", state.config.api_key) {
        return error(401, "Unauthorized");
    }
    let organization = header("x-daytona-organization-id");
    if !organization.is_empty() && organization != state.config.organization_id {
        return error(403, &format!("Organization {organization} not found or not a member"));
    }
    if let Some(rest) = path.strip_prefix("/toolbox/") {
        if let Some((status, message)) = state.faults.take(FaultTarget::Envd, method.as_str(), &path) {
            return error(status, if message.is_empty() { "injected fault" } else { &message });
        }
        let (id, toolbox_path) = rest.split_once('/').map_or((rest, ""), |(id, tail)| (id, tail));
        let Some(sandbox) = state.get(id) else {
            return error(404, &format!("Sandbox with ID {id} not found"));
        };
        let init_pid = {
            let life = sandbox.life.lock().await;
            if life.deleted || life.phase != Phase::Started {
                return error(400, &format!("Sandbox {id} is not started"));
            }
            life.init.as_ref().map(|init| init.init_pid)
        };
        let Some(init_pid) = init_pid else { return error(400, &format!("Sandbox {id} is not started")) };
        let toolbox_path = format!("/{toolbox_path}");
        return toolbox::handle(sandbox, init_pid, &method, &toolbox_path, &query, &headers, request.into_body()).await;
    }
    if let Some((status, message)) = state.faults.take(FaultTarget::Api, method.as_str(), &path) {
        return error(status, if message.is_empty() { "injected fault" } else { &message });
    }
    let body = match to_bytes(request.into_body(), MAX_JSON_BODY).await {
        Ok(body) => body,
        Err(failure) => return error(400, &format!("body: {failure}")),
    };
    match api::handle(&state, &method, &path, &query, &body).await {
        Ok(response) => response,
        Err(refusal) => error(refusal.status, &refusal.message),
    }
}
