//! Only the control plane may call a node agent (docs/design.md §5).
//!
//! Two mechanisms, usable together: a bearer credential on every call but the health
//! service (checked here, in constant time) — the replica credential made for this node
//! (`berth_proto::credentials`; no other node's credential and no credential a node holds
//! passes), or on loopback the older shared secret — and mutual TLS (the TLS acceptor
//! refuses a client without a certificate signed by the cluster CA for client use before
//! any request is read; see `server.rs`).

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use berth_proto::auth::{AUTHORIZATION, Secret, bearer_of};
use futures::future::BoxFuture;
use http::{Request, Response};
use tonic::body::Body;
use tower::{Layer, Service};

/// Requires the replica credential on every call except `grpc.health.v1.Health/*`.
#[derive(Clone)]
pub struct NodeAuthLayer {
    secret: Option<Arc<Secret>>,
}

impl NodeAuthLayer {
    /// `None` accepts every caller (loopback-only deployments; checked at start). The value
    /// is what callers must present: the replica credential for this node, or the shared
    /// secret.
    pub fn new(secret: Option<Secret>) -> Self {
        Self { secret: secret.map(Arc::new) }
    }
}

impl<S> Layer<S> for NodeAuthLayer {
    type Service = NodeAuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        NodeAuthService { inner, secret: self.secret.clone() }
    }
}

#[derive(Clone)]
pub struct NodeAuthService<S> {
    inner: S,
    secret: Option<Arc<Secret>>,
}

impl<S> Service<Request<Body>> for NodeAuthService<S>
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

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let open = request.uri().path().starts_with("/grpc.health.v1.Health/");
        let allowed = open
            || match &self.secret {
                None => true,
                Some(secret) => request
                    .headers()
                    .get(AUTHORIZATION)
                    .and_then(|value| value.to_str().ok())
                    .and_then(bearer_of)
                    .is_some_and(|presented| secret.matches(presented)),
            };
        if allowed {
            Box::pin(inner.call(request))
        } else {
            tracing::warn!(target: "berth::audit", rpc = %request.uri().path(), outcome = "Unauthenticated", "node call without the control plane's credentials refused");
            let status = tonic::Status::from(crate::error::NodeError::Unauthenticated);
            Box::pin(async move { Ok(status.into_http()) })
        }
    }
}
