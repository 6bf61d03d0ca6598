//! The HTTP listener: bearer-token authentication (a wrong token is 401; no token is the
//! anonymous user), discovery (`/version`, `/api`, `/apis`,
//! `/api/v1`), namespaced Pods and PVCs (list with label and field selectors, create, get,
//! replace, merge patch, delete, delete collection; `Table` answers for kubectl), and
//! `pods/exec`. Started and stopped with [`Emulator`].

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::body::{Body, to_bytes};
use axum::extract::{Request, State as AxumState};
use axum::response::Response;
use http::{Method, StatusCode, header};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::exec::{self, ExecRequest, form_pairs};
use crate::selector::Selector;
use crate::state::{ApiError, ApiResult, PODS, PVCS, State};

const MAX_BODY: usize = 4 * 1024 * 1024;

/// How to run an emulator.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    /// Where volumes and the kubeconfig live (a temp directory, removed on drop, when `None`).
    pub root: Option<PathBuf>,
    /// The only bearer token the server accepts.
    pub token: String,
    /// The namespace the written kubeconfig's context names.
    pub namespace: String,
}

impl EmulatorConfig {
    pub fn for_test() -> Self {
        Self {
            root: None,
            token: format!("berth-emulator-{:016x}", rand::random::<u64>()),
            namespace: "default".to_owned(),
        }
    }
}

struct Shared {
    state: Arc<State>,
    token: String,
}

/// A running emulator; dropping it stops the listener and kills every container.
pub struct Emulator {
    /// `http://127.0.0.1:PORT`
    pub url: String,
    pub token: String,
    /// A kubeconfig naming this server, its token and the namespace (for kubectl, the
    /// Python client and a gateway's `--kube-config-file`).
    pub kubeconfig: PathBuf,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    temp: Option<PathBuf>,
}

impl Emulator {
    pub async fn start(config: EmulatorConfig) -> Result<Self> {
        let (root, temp) = match &config.root {
            Some(root) => (root.clone(), None),
            None => {
                let root = std::env::temp_dir().join(format!(
                    "berth-kube-emulator-{}-{:x}",
                    std::process::id(),
                    rand::random::<u64>()
                ));
                (root.clone(), Some(root))
            }
        };
        std::fs::create_dir_all(&root).with_context(|| format!("create {}", root.display()))?;
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let kubeconfig = root.join("kubeconfig");
        std::fs::write(&kubeconfig, kubeconfig_text(&url, &config.token, &config.namespace))?;
        let shared = Arc::new(Shared { state: Arc::new(State::new(root.join("data"))), token: config.token.clone() });
        let shutdown = CancellationToken::new();
        let router = Router::new().fallback(handle).with_state(shared.clone());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, router).with_graceful_shutdown(stop.cancelled_owned()).await;
        });
        Ok(Self { url, token: config.token, kubeconfig, shared, shutdown, temp })
    }

    /// How many objects of a kind (`pods`, `persistentvolumeclaims`) exist, all namespaces.
    pub fn count(&self, resource: &str) -> usize {
        self.shared.state.count(resource)
    }

    /// The objects of a kind in a namespace matching a label selector (tests look behind
    /// the backend's back with this).
    pub fn list(&self, resource: &str, namespace: &str, selector: &str) -> Vec<Value> {
        let selector = Selector::parse(selector).unwrap_or_default();
        self.shared.state.list(resource, Some(namespace), &selector, None)["items"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    /// Stops the listener and every container now (drop does the same, without waiting).
    pub async fn stop(&self) {
        self.shutdown.cancel();
        self.shared.state.shutdown().await;
    }
}

impl Drop for Emulator {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(temp) = &self.temp {
            let _ = std::fs::remove_dir_all(temp);
        }
    }
}

fn kubeconfig_text(url: &str, token: &str, namespace: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: berth-emulator\n  cluster:\n    server: {url}\n\
         users:\n- name: berth\n  user:\n    token: {token}\ncontexts:\n- name: berth-emulator\n  context:\n    \
         cluster: berth-emulator\n    user: berth\n    namespace: {namespace}\ncurrent-context: berth-emulator\n"
    )
}

fn json_response(code: StatusCode, body: &Value) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap_or_default()
}

fn error_response(error: &ApiError) -> Response {
    json_response(StatusCode::from_u16(error.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR), &error.to_status())
}

async fn handle(AxumState(shared): AxumState<Arc<Shared>>, request: Request) -> Response {
    // A wrong credential is refused; none at all is `system:anonymous` (kubectl sends no
    // bearer token over plain HTTP, and TLS is not emulated).
    let authorized = match request.headers().get(header::AUTHORIZATION) {
        None => true,
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|value| value.strip_prefix("Bearer "))
            .is_some_and(|token| token == shared.token),
    };
    if !authorized {
        return error_response(&ApiError::new(401, "Unauthorized", "Unauthorized"));
    }
    match route(&shared, request).await {
        Ok(response) => response,
        Err(error) => error_response(&error),
    }
}

fn discovery(path: &str, host: &str) -> Option<Value> {
    let verbs = json!(["create", "delete", "deletecollection", "get", "list", "patch", "update"]);
    Some(match path {
        "/version" => json!({
            "major": "1", "minor": "37", "gitVersion": "v1.37.0-berth-emulator", "gitCommit": "",
            "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "go1.25",
            "compiler": "gc", "platform": "linux/amd64",
        }),
        "/api" => json!({
            "kind": "APIVersions", "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
        }),
        "/apis" => json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []}),
        "/api/v1" => json!({
            "kind": "APIResourceList", "groupVersion": "v1",
            "resources": [
                {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
                 "verbs": verbs, "shortNames": ["po"], "categories": ["all"]},
                {"name": "pods/exec", "singularName": "", "namespaced": true, "kind": "PodExecOptions",
                 "verbs": ["create", "get"]},
                {"name": "persistentvolumeclaims", "singularName": "persistentvolumeclaim", "namespaced": true,
                 "kind": "PersistentVolumeClaim", "verbs": verbs, "shortNames": ["pvc"]},
            ],
        }),
        _ => return None,
    })
}

/// A kubectl `get` answer: a `meta.k8s.io/v1` Table of the list.
fn table(resource: &str, list: &Value) -> Value {
    let rows: Vec<Value> = list["items"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|object| {
            let status = object["status"]["phase"].as_str().unwrap_or("");
            let status = if object["metadata"]["deletionTimestamp"].is_string() { "Terminating" } else { status };
            json!({
                "cells": [object["metadata"]["name"], status, object["metadata"]["creationTimestamp"]],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": object["metadata"]},
            })
        })
        .collect();
    let status_column = if resource == PODS { "Status" } else { "Phase" };
    json!({
        "kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": list["metadata"],
        "columnDefinitions": [
            {"name": "Name", "type": "string", "format": "name", "description": "name", "priority": 0},
            {"name": status_column, "type": "string", "format": "", "description": "phase", "priority": 0},
            {"name": "Created", "type": "string", "format": "", "description": "creation time", "priority": 0},
        ],
        "rows": rows,
    })
}

async fn body_json(request: Request) -> ApiResult<Value> {
    let bytes = to_bytes(request.into_body(), MAX_BODY)
        .await
        .map_err(|error| ApiError::bad_request(format!("read the body: {error}")))?;
    if bytes.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(&bytes).map_err(|error| ApiError::bad_request(format!("decode the body: {error}")))
}

async fn route(shared: &Shared, request: Request) -> ApiResult<Response> {
    let path = request.uri().path().trim_end_matches('/').to_owned();
    let query = request.uri().query().unwrap_or("").to_owned();
    let method = request.method().clone();
    let host = request.headers().get(header::HOST).and_then(|value| value.to_str().ok()).unwrap_or("").to_owned();
    if method == Method::GET
        && let Some(body) = discovery(&path, &host)
    {
        return Ok(json_response(StatusCode::OK, &body));
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let state = &shared.state;
    let pairs = form_pairs(&query);
    let param = |name: &str| pairs.iter().find(|(key, _)| key == name).map(|(_, value)| value.clone());
    let (namespace, resource, name, subresource) = match segments.as_slice() {
        ["api", "v1", resource] => (None, *resource, None, None),
        ["api", "v1", "namespaces", namespace, resource] => (Some(*namespace), *resource, None, None),
        ["api", "v1", "namespaces", namespace, resource, name] => (Some(*namespace), *resource, Some(*name), None),
        ["api", "v1", "namespaces", namespace, resource, name, sub] => {
            (Some(*namespace), *resource, Some(*name), Some(*sub))
        }
        _ => return Err(ApiError::not_found("path", &path)),
    };
    if resource != PODS && resource != PVCS {
        return Err(ApiError::not_found("resource", resource));
    }
    if param("watch").is_some_and(|value| value == "true" || value == "1") {
        return Err(ApiError::new(405, "MethodNotAllowed", "watch is not emulated"));
    }
    match (method.clone(), namespace, name, subresource) {
        (Method::GET | Method::POST, Some(namespace), Some(pod), Some("exec")) if resource == PODS => {
            let exec_request = ExecRequest::parse(&query);
            let container = state.container(namespace, pod, exec_request.container.as_deref()).await?;
            exec::upgrade(request, container, exec_request)
        }
        (_, _, _, Some(sub)) => Err(ApiError::not_found("subresource", sub)),
        (Method::GET, namespace, None, None) => {
            let labels = Selector::parse(&param("labelSelector").unwrap_or_default()).map_err(ApiError::bad_request)?;
            let field = param("fieldSelector").unwrap_or_default();
            let by_name = field.strip_prefix("metadata.name=").map(str::to_owned);
            if !field.is_empty() && by_name.is_none() {
                return Err(ApiError::bad_request(format!("field selector {field:?} is not emulated")));
            }
            let list = state.list(resource, namespace, &labels, by_name.as_deref());
            let accept = request.headers().get(header::ACCEPT).and_then(|value| value.to_str().ok()).unwrap_or("");
            if accept.contains("as=Table") {
                return Ok(json_response(StatusCode::OK, &table(resource, &list)));
            }
            Ok(json_response(StatusCode::OK, &list))
        }
        (Method::POST, Some(namespace), None, None) => {
            let object = body_json(request).await?;
            let created = state.create(resource, namespace, object)?;
            if resource == PODS {
                let name = created["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                let namespace = namespace.to_owned();
                // Started in the background: a Pod is Pending first, as on a cluster.
                let starting = shared.state.clone();
                tokio::spawn(async move { starting.start_pod(&namespace, &name).await });
            }
            Ok(json_response(StatusCode::CREATED, &created))
        }
        (Method::DELETE, Some(namespace), None, None) => {
            let labels = Selector::parse(&param("labelSelector").unwrap_or_default()).map_err(ApiError::bad_request)?;
            let list = state.list(resource, Some(namespace), &labels, None);
            let mut deleted = Vec::new();
            for object in list["items"].as_array().cloned().unwrap_or_default() {
                let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
                if let Ok(gone) = state.delete(resource, namespace, &name).await {
                    deleted.push(gone);
                }
            }
            let mut answer = list;
            answer["items"] = json!(deleted);
            Ok(json_response(StatusCode::OK, &answer))
        }
        (Method::GET, Some(namespace), Some(name), None) => {
            Ok(json_response(StatusCode::OK, &state.get(resource, namespace, name)?))
        }
        (Method::PUT, Some(namespace), Some(name), None) => {
            let object = body_json(request).await?;
            Ok(json_response(StatusCode::OK, &state.replace(resource, namespace, name, object)?))
        }
        (Method::PATCH, Some(namespace), Some(name), None) => {
            let content_type =
                request.headers().get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or("");
            if content_type.starts_with("application/json-patch+json") {
                return Err(ApiError::new(415, "UnsupportedMediaType", "JSON patch is not emulated"));
            }
            let patch = body_json(request).await?;
            Ok(json_response(StatusCode::OK, &state.patch(resource, namespace, name, &patch)?))
        }
        (Method::DELETE, Some(namespace), Some(name), None) => {
            Ok(json_response(StatusCode::OK, &state.delete(resource, namespace, name).await?))
        }
        _ => Err(ApiError::new(405, "MethodNotAllowed", format!("{method} {path} is not emulated"))),
    }
}
