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
use bytes::{BufMut, Bytes, BytesMut};
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderValue, Method, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full, Limited};
use prost::Message;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tonic::{Code, Status};
use tower::Service;

use crate::forward::Forwarder;
use crate::node_client::NodeChannel;

/// The one RPC relayed undecoded.
pub const READ_FILE_PATH: &str = "/berth.v1.WorkspaceService/ReadFile";

/// Largest `ReadFile` request body accepted (a workspace id, a path, a chunk size).
const MAX_REQUEST_BYTES: usize = 64 * 1024;

/// gRPC's length-prefixed message header: a compression flag and a 4-byte length.
const FRAME_HEADER_BYTES: usize = 5;

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

/// The node's `ReadFile` answer, undecoded: its status if it refused at once, else its
/// response (headers, the body's frames as they come, trailers).
pub async fn read_file_from_node(
    mut channel: NodeChannel,
    request: tonic::Request<v1::ReadFileRequest>,
) -> Result<tonic::Response<http::Response<Body>>, Status> {
    let (metadata, extensions, message) = request.into_parts();
    let mut frame = BytesMut::with_capacity(FRAME_HEADER_BYTES + message.encoded_len());
    frame.put_u8(0);
    frame.put_u32(u32::try_from(message.encoded_len()).map_err(|_| Status::invalid_argument("request too large"))?);
    message.encode(&mut frame).map_err(|error| Status::internal(format!("encoding the node request: {error}")))?;
    let mut outbound = http::Request::new(Body::new(Full::new(Bytes::from(frame))));
    *outbound.method_mut() = Method::POST;
    *outbound.uri_mut() = Uri::from_static(READ_FILE_PATH);
    *outbound.version_mut() = Version::HTTP_2;
    // The generation and any deadline (`grpc-timeout`) travel as metadata, as with a
    // generated client; the channel's interceptor adds the node credential and trace.
    *outbound.headers_mut() = metadata.into_headers();
    outbound.headers_mut().insert(TE, HeaderValue::from_static("trailers"));
    outbound.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    *outbound.extensions_mut() = extensions;

    // The errors map as a generated client maps them, so the router's retry rules (which
    // look for a connect error in the source chain) apply unchanged.
    std::future::poll_fn(|cx| channel.poll_ready(cx))
        .await
        .map_err(|error| Status::unknown(format!("Service was not ready: {error}")))?;
    let response = channel.call(outbound).await.map_err(|error| Status::from_error(error.into()))?;
    if let Some(status) = Status::from_header_map(response.headers())
        && status.code() != Code::Ok
    {
        return Err(status);
    }
    if response.status() != StatusCode::OK {
        return Err(Status::unknown(format!("the node answered ReadFile with HTTP {}", response.status())));
    }
    let (parts, body) = response.into_parts();
    let mut relayed = http::Response::new(Body::new(body));
    *relayed.headers_mut() = parts.headers;
    Ok(tonic::Response::new(relayed))
}
