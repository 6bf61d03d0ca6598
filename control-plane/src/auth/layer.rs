//! The tower layer in front of every gRPC service of a replica.
//!
//! By path:
//! - `grpc.health.v1.Health/*` — open (load balancers and readiness probes carry no token).
//! - `berth.v1.NodeService/*` — node heartbeats: a node credential ([`NodeAuth`]), never a
//!   user token. The node id it proves goes into the request extensions as an
//!   [`AuthenticatedNode`]; the heartbeat handler refuses a registration under another id.
//! - everything else — authenticated by the configured [`Authenticator`]; the resulting
//!   [`Caller`] goes into the request extensions for the handlers' [`crate::authz`] checks.
//!   A service added to the router later is covered without doing anything.
//!
//! Audit: one `berth::audit` line at info per mutating call (every RPC whose method name
//! does not start with Get / List / Read / Stat / Watch / Check / Describe) and per refused
//! authentication, with the principal, the workspace the handler noted, the RPC and the
//! outcome. The outcome is the status the call answered with; for a server-streaming call
//! (ExecStream) "ok" means the stream started.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use futures::future::BoxFuture;
use http::{Request, Response};
use tonic::body::Body;
use tower::{Layer, Service};

use super::authenticator::Authenticator;
use super::caller::Caller;
use super::node::{AuthenticatedNode, NodeAuth};
use crate::error::ControlPlaneError;

/// Audit target; route it to its own sink with `RUST_LOG=berth::audit=info`.
pub const AUDIT_TARGET: &str = "berth::audit";

#[derive(Clone)]
pub struct AuthLayer {
    state: Arc<State>,
}

struct State {
    authenticator: Authenticator,
    node_auth: NodeAuth,
}

impl AuthLayer {
    pub fn new(authenticator: Authenticator, node_auth: NodeAuth) -> Self {
        Self { state: Arc::new(State { authenticator, node_auth }) }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService { inner, state: Arc::clone(&self.state) }
    }
}

#[derive(Clone)]
pub struct AuthService<S> {
    inner: S,
    state: Arc<State>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Open,
    Node,
    Public,
}

fn classify(path: &str) -> Class {
    if path.starts_with("/grpc.health.v1.Health/") {
        Class::Open
    } else if path.starts_with("/berth.v1.NodeService/") {
        Class::Node
    } else {
        Class::Public
    }
}

/// Read-only RPCs by naming convention; everything else is audited.
fn is_mutating(path: &str) -> bool {
    let method = path.rsplit('/').next().unwrap_or_default();
    let reads = ["Get", "List", "Read", "Stat", "Watch", "Check", "Describe", "ServerReflectionInfo"];
    !reads.iter().any(|prefix| method.starts_with(prefix))
}

/// The status code a response carries in its headers (a trailers-only error), or "ok".
fn outcome(response: &Response<Body>) -> String {
    match response.headers().get("grpc-status").and_then(|value| value.to_str().ok()) {
        Some(code) => {
            let code = tonic::Code::from_bytes(code.as_bytes());
            if code == tonic::Code::Ok { "ok".into() } else { format!("{code:?}") }
        }
        None => "ok".into(),
    }
}

impl<S> Service<Request<Body>> for AuthService<S>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone + Send + 'static,
    S::Future: Send + 'static,
{
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<Body>) -> Self::Future {
        // The clone that was polled ready serves this call (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let path = request.uri().path().to_owned();
        match classify(&path) {
            Class::Open => Box::pin(inner.call(request)),
            Class::Node => {
                let presented = request
                    .headers()
                    .get(berth_proto::auth::AUTHORIZATION)
                    .and_then(|value| value.to_str().ok())
                    .and_then(berth_proto::auth::bearer_of);
                match self.state.node_auth.authenticate(presented) {
                    Some(node) => {
                        request.extensions_mut().insert::<AuthenticatedNode>(node);
                        Box::pin(inner.call(request))
                    }
                    None => {
                        tracing::warn!(target: AUDIT_TARGET, rpc = %path, outcome = "Unauthenticated", "node call without a valid node credential refused");
                        let status = tonic::Status::from(ControlPlaneError::NodeCredentials);
                        Box::pin(async move { Ok(status.into_http()) })
                    }
                }
            }
            Class::Public => match self.state.authenticator.authenticate(request.headers()) {
                Ok(principal) => {
                    let caller = Caller::new(principal);
                    request.extensions_mut().insert(caller.clone());
                    Box::pin(async move {
                        let response = inner.call(request).await?;
                        if is_mutating(&path) {
                            tracing::info!(
                                target: AUDIT_TARGET,
                                principal = %caller.principal().label(),
                                workspace = %caller.workspace().unwrap_or_default(),
                                rpc = %path,
                                outcome = %outcome(&response),
                                "audit"
                            );
                        }
                        Ok(response)
                    })
                }
                Err(error) => {
                    let status = tonic::Status::from(ControlPlaneError::from(error));
                    tracing::info!(
                        target: AUDIT_TARGET,
                        principal = "",
                        workspace = "",
                        rpc = %path,
                        outcome = ?status.code(),
                        reason = %status.message(),
                        "audit"
                    );
                    Box::pin(async move { Ok(status.into_http()) })
                }
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_classified() {
        assert!(classify("/grpc.health.v1.Health/Check") == Class::Open);
        assert!(classify("/berth.v1.NodeService/Heartbeat") == Class::Node);
        assert!(classify("/berth.v1.WorkspaceService/Exec") == Class::Public);
        assert!(classify("/berth.v1.ContractService/AddSkill") == Class::Public);
        assert!(classify("/grpc.reflection.v1.ServerReflection/ServerReflectionInfo") == Class::Public);
        assert!(is_mutating("/berth.v1.WorkspaceService/Exec"));
        assert!(is_mutating("/berth.v1.WorkspaceService/ShareWorkspace"));
        assert!(!is_mutating("/berth.v1.WorkspaceService/GetSession"));
        assert!(!is_mutating("/berth.v1.WorkspaceService/ReadFile"));
    }
}
