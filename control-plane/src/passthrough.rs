//! `ReadFile` relayed as HTTP/2 frames: the node's response body goes to the client as it
//! arrives, never decoded or re-encoded by the replica.
//!
//! Through the generated service, a replica decodes each `FileChunk` the node sends once it
//! has arrived whole, then encodes it again for its client: a 1 MiB chunk crosses the
//! second hop only after all of it crossed the first, and is copied twice on the way.
//! [`ReadFilePassthrough`] sits in front of the generated `WorkspaceService` server and takes
//! `ReadFile` alone: the request (one small message) is decoded and goes the one forwarding
//! path every call takes (authorize, validate, route, one retry on a stale route; see
//! `forward.rs`), then the node's response is relayed frame by frame, trailers included,
//! so the node's status (and any error after the first byte) reaches the client unchanged.
//! Every other call passes to the generated server untouched.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use berth_proto::frames::{self, READ_FILE_PATH};
use berth_proto::v1;
use tonic::Status;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tower::Service;

use crate::forward::Forwarder;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The generated `WorkspaceService` server `S`, with `ReadFile` relayed undecoded.
#[derive(Clone)]
pub struct ReadFilePassthrough<S> {
    inner: S,
    forward: Arc<Forwarder>,
}

impl<S> ReadFilePassthrough<S> {
    pub fn new(inner: S, forward: Forwarder) -> Self {
        Self { inner, forward: Arc::new(forward) }
    }
}

impl<S: NamedService> NamedService for ReadFilePassthrough<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for ReadFilePassthrough<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != READ_FILE_PATH {
            return Box::pin(self.inner.call(request));
        }
        let forward = Arc::clone(&self.forward);
        Box::pin(async move { Ok(read_file(&forward, request).await.unwrap_or_else(Status::into_http)) })
    }
}

async fn read_file(forward: &Forwarder, request: http::Request<Body>) -> Result<http::Response<Body>, Status> {
    let (parts, body) = request.into_parts();
    let message = frames::single_message::<v1::ReadFileRequest>(body, frames::MAX_READ_FILE_REQUEST_BYTES).await?;
    let request = tonic::Request::from_parts(MetadataMap::from_headers(parts.headers), parts.extensions, message);
    forward.read_file_passthrough(request).await
}
