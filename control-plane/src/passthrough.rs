//! `ReadFile` relayed as HTTP/2 frames: the node's response body goes to the client as it
//! arrives, never decoded or re-encoded by the replica.
//!
//! Through the generated service, a replica decodes each `FileChunk` the node sends once it
//! has arrived whole, then encodes it again for its client: a 1 MiB chunk crosses the
//! second hop only after all of it crossed the first, and is copied twice on the way.
//! [`ReadFilePassthrough`] sits in front of the generated `WorkspaceService` server and takes
//! `ReadFile` alone (`berth_proto::frames::TakeReadFile`, which refuses a malformed body,
//! typed): the request (one small message) goes the one forwarding path every call takes
//! (authorize, validate, route, one retry on a stale route; see `forward.rs`), then the
//! node's response is relayed frame by frame, trailers included, so the node's status (and
//! any error after the first byte) reaches the client unchanged. Every other call passes to
//! the generated server untouched.

use berth_proto::frames::{ReadFileHandler, TakeReadFile};
use berth_proto::v1;
use futures::future::BoxFuture;
use tonic::Status;
use tonic::body::Body;

use crate::forward::Forwarder;

/// The generated `WorkspaceService` server `S`, with `ReadFile` relayed undecoded.
pub type ReadFilePassthrough<S> = TakeReadFile<S, Forwarder>;

impl ReadFileHandler for Forwarder {
    fn read_file(
        &self,
        request: tonic::Request<v1::ReadFileRequest>,
    ) -> BoxFuture<'_, Result<http::Response<Body>, Status>> {
        Box::pin(self.read_file_passthrough(request))
    }
}
