//! A stand-in for OpenSandbox's in-sandbox daemon `execd` (the real one is a Go program that
//! cannot be built here). It serves the subset of the published API (`specs/execd-api.yaml`
//! of OpenSandbox) that Berth's `opensandbox` backend and the official Python SDK use:
//! health, foreground and background commands with their event stream, interrupt and
//! status, and the file endpoints. See README.md beside this crate for what it leaves out.
//!
//! Test support only: it runs inside a sandbox container started by the real
//! `opensandbox-server`, built as a static binary so it needs nothing from the image.
//!
//! Usage: `berth-opensandbox-execd-standin [--listen ADDR]` (default `0.0.0.0:44772`). When
//! `EXECD_ACCESS_TOKEN` is set, every call but `/ping` must carry it in
//! `X-EXECD-ACCESS-TOKEN`. Faults for tests: `POST /x-standin/faults` (see `faults.rs`).

mod answer;
mod command;
mod faults;
mod files;
mod multipart;
mod query;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRef, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{delete, get, post};
use http::StatusCode;

use answer::{empty_ok, error};

/// What every handler shares; each handler module extracts only its own part.
#[derive(Clone)]
struct Shared {
    commands: Arc<command::Commands>,
    faults: Arc<faults::Faults>,
    access_token: Option<Arc<str>>,
}

impl FromRef<Shared> for Arc<command::Commands> {
    fn from_ref(shared: &Shared) -> Self {
        Arc::clone(&shared.commands)
    }
}

impl FromRef<Shared> for Arc<faults::Faults> {
    fn from_ref(shared: &Shared) -> Self {
        Arc::clone(&shared.faults)
    }
}

async fn guard(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let full = request.uri().path();
    let path = full.strip_prefix("/proxy/44772").filter(|rest| rest.starts_with('/')).unwrap_or(full).to_owned();
    if let Some(token) = &shared.access_token
        && path != "/ping"
        && !path.starts_with("/x-standin/")
    {
        let given = request.headers().get("x-execd-access-token").and_then(|value| value.to_str().ok());
        if given != Some(&**token) {
            return error(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "missing or wrong X-EXECD-ACCESS-TOKEN");
        }
    }
    if let Some(status) = shared.faults.take(&path) {
        return error(status, "INJECTED_FAULT", format!("fault injected by the stand-in for {path}"));
    }
    next.run(request).await
}

/// The API, also under `/proxy/44772/` (the path the server's bridge-mode endpoints name:
/// the real daemon proxies `/proxy/{port}/…` to that local port, here only to itself).
fn router(shared: Shared) -> Router {
    let api = routes();
    Router::new()
        .merge(api.clone())
        .nest("/proxy/44772", api)
        .layer(middleware::from_fn_with_state(shared.clone(), guard))
        .with_state(shared)
}

fn routes() -> Router<Shared> {
    Router::new()
        .route("/ping", get(|| async { empty_ok() }))
        .route("/command", post(command::run).delete(command::interrupt))
        .route("/command/status/{id}", get(command::status))
        .route("/command/{id}/logs", get(command::logs))
        .route("/files/info", get(files::info))
        .route("/files", delete(files::remove_files))
        .route("/files/mv", post(files::rename))
        .route("/files/upload", post(files::upload))
        .route("/files/download", get(files::download))
        .route("/files/permissions", post(files::chmod))
        .route("/directories/list", get(files::list))
        .route("/directories", post(files::make_dirs).delete(files::remove_dirs))
        .route("/x-standin/faults", post(faults::set))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let mut listen: SocketAddr = "0.0.0.0:44772".parse().expect("default address");
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--listen" => {
                let value = args.next().unwrap_or_default();
                listen = value.parse().unwrap_or_else(|error| {
                    eprintln!("execd stand-in: bad --listen {value:?}: {error}");
                    std::process::exit(2)
                });
            }
            other => {
                eprintln!("execd stand-in: unknown argument {other:?}");
                std::process::exit(2)
            }
        }
    }
    let access_token = std::env::var("EXECD_ACCESS_TOKEN").ok().filter(|token| !token.is_empty()).map(Arc::from);
    let shared = Shared { commands: Arc::default(), faults: Arc::default(), access_token };
    let listener = tokio::net::TcpListener::bind(listen).await.unwrap_or_else(|error| {
        eprintln!("execd stand-in: cannot listen on {listen}: {error}");
        std::process::exit(1)
    });
    eprintln!("execd stand-in listening on {listen}");
    if let Err(error) = axum::serve(listener, router(shared)).await {
        eprintln!("execd stand-in: server failed: {error}");
        std::process::exit(1);
    }
}
