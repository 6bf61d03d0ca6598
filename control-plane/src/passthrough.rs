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

use berth_proto::v1;
use http_body_util::{BodyExt, Limited};
use prost::Message;
use tonic::Status;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tower::Service;

use crate::forward::Forwarder;
use crate::node_client::{FRAME_HEADER_BYTES, READ_FILE_PATH};

/// Largest `ReadFile` request body accepted (a workspace id, a path, a chunk size).
const MAX_REQUEST_BYTES: usize = 64 * 1024;

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
    let message = single_message(body).await?;
    let request = tonic::Request::from_parts(MetadataMap::from_headers(parts.headers), parts.extensions, message);
    forward.read_file_passthrough(request).await
}

/// The request's one message. A compressed message is refused (Berth negotiates no
/// compression), as is a body that is not exactly one message.
async fn single_message(body: Body) -> Result<v1::ReadFileRequest, Status> {
    let bytes = Limited::new(body, MAX_REQUEST_BYTES)
        .collect()
        .await
        .map_err(|error| {
            if error.is::<http_body_util::LengthLimitError>() {
                Status::resource_exhausted(format!("a ReadFile request is at most {MAX_REQUEST_BYTES} bytes"))
            } else {
                Status::from_error(error)
            }
        })?
        .to_bytes();
    let Some((header, payload)) = bytes.split_at_checked(FRAME_HEADER_BYTES) else {
        return Err(Status::invalid_argument("the ReadFile request holds no message"));
    };
    if header[0] != 0 {
        return Err(Status::unimplemented("compressed messages are not accepted"));
    }
    let declared = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if declared != payload.len() {
        return Err(Status::invalid_argument(format!(
            "the ReadFile request must be one message: {declared} bytes declared, {} sent",
            payload.len()
        )));
    }
    v1::ReadFileRequest::decode(payload)
        .map_err(|error| Status::invalid_argument(format!("the ReadFile request does not decode: {error}")))
}
