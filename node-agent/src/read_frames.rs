//! `ReadFile` written as gRPC frames by hand, so a file's bytes go from the disk read to
//! the socket without being copied on the node (`berth_proto::frames`).
//!
//! The generated server encodes every `FileChunk` into its own buffer before it sends it: a
//! copy of every byte read, and about a sixth of the node's CPU on a 1 MiB read.
//! [`ReadFileFrames`] sits in front of the generated `WorkspaceService` server and takes
//! `ReadFile` alone (`berth_proto::frames::TakeReadFile`, which refuses a malformed body,
//! typed). The request (one small message) passes the same gate as every call
//! (`DataPlane::read_pieces`); each piece of the file then goes out as a small prefix frame
//! followed by the piece's own `Bytes`, and the stream ends in trailers that carry the
//! status: OK, or the error that stopped the read, so a read never ends looking whole when
//! it is not. A refusal before the first byte is a trailers-only answer, as from the
//! generated server. Every other call passes to the generated server untouched; the node's
//! credential check (`auth.rs`) stands in front of both.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use berth_proto::frames::{self, ReadFileHandler, TakeReadFile};
use berth_proto::v1;
use bytes::Bytes;
use futures::StreamExt;
use futures::future::BoxFuture;
use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderValue};
use http_body::Frame;
use tonic::Status;
use tonic::body::Body;

use crate::data_plane::DataPlane;
use crate::files::BoxStream;

/// The generated `WorkspaceService` server `S`, with `ReadFile` written as frames by hand.
pub type ReadFileFrames<S> = TakeReadFile<S, DataPlane>;

impl ReadFileHandler for DataPlane {
    fn read_file(
        &self,
        request: tonic::Request<v1::ReadFileRequest>,
    ) -> BoxFuture<'_, Result<http::Response<Body>, Status>> {
        Box::pin(async move {
            let (metadata, _, message) = request.into_parts();
            let pieces = self.read_pieces(&metadata, message).await?;
            let mut response = http::Response::new(Body::new(ChunkFrames::new(pieces)));
            response.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            Ok(response)
        })
    }
}

/// A response body of one `FileChunk` message per piece, then the trailers.
struct ChunkFrames {
    /// `None` once the trailers went.
    pieces: Option<BoxStream<Bytes>>,
    /// A piece whose prefix went and whose bytes are due next.
    due: Option<Bytes>,
}

impl ChunkFrames {
    fn new(pieces: BoxStream<Bytes>) -> Self {
        Self { pieces: Some(pieces), due: None }
    }
}

impl http_body::Body for ChunkFrames {
    type Data = Bytes;
    /// Never returned: an error ends the body in trailers that carry it.
    type Error = Status;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(data) = this.due.take() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        let Some(pieces) = this.pieces.as_mut() else {
            return Poll::Ready(None);
        };
        let status = match ready!(pieces.poll_next_unpin(cx)) {
            Some(Ok(data)) => match frames::file_chunk_prefix(data.len()) {
                Ok(prefix) => {
                    this.due = (!data.is_empty()).then_some(data);
                    return Poll::Ready(Some(Ok(Frame::data(prefix))));
                }
                Err(status) => status,
            },
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        // The read stops here; the rest of the file (if any) is never read.
        this.pieces = None;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))))
    }

    fn is_end_stream(&self) -> bool {
        self.pieces.is_none() && self.due.is_none()
    }
}

/// The trailers that end a `ReadFile` answer with `status`.
fn trailers(status: &Status) -> HeaderMap {
    let mut trailers = HeaderMap::new();
    if status.add_header(&mut trailers).is_err() {
        // Only a message no header can carry gets here; the code still goes.
        trailers.clear();
        let _ = Status::new(status.code(), "").add_header(&mut trailers);
    }
    trailers
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use prost::Message;
    use tonic::Code;

    /// The frames of a body, split into its messages and its trailers.
    async fn drain(pieces: Vec<Result<Bytes, Status>>) -> (Vec<v1::FileChunk>, Status) {
        let body = ChunkFrames::new(Box::pin(futures::stream::iter(pieces)));
        let collected = body.collect().await.expect("the body never fails");
        let trailers = collected.trailers().cloned().expect("trailers");
        let mut bytes = collected.to_bytes();
        let mut messages = Vec::new();
        while !bytes.is_empty() {
            assert_eq!(bytes[0], 0, "an uncompressed message");
            let length = u32::from_be_bytes([bytes[1], bytes[2], bytes[3], bytes[4]]) as usize;
            let message = bytes.split_to(frames::FRAME_HEADER_BYTES + length).split_off(frames::FRAME_HEADER_BYTES);
            messages.push(v1::FileChunk::decode(message).expect("a FileChunk"));
        }
        (messages, Status::from_header_map(&trailers).expect("a grpc-status"))
    }

    #[tokio::test]
    async fn each_piece_is_one_message_and_the_trailers_say_ok() {
        let pieces = [Bytes::from_static(b"abc"), Bytes::from(vec![7u8; 300_000]), Bytes::from_static(b"z")];
        let (messages, status) = drain(pieces.iter().cloned().map(Ok).collect()).await;
        assert_eq!(messages.into_iter().map(|chunk| chunk.data).collect::<Vec<_>>(), pieces.to_vec());
        assert_eq!(status.code(), Code::Ok, "{status:?}");

        let (messages, status) = drain(Vec::new()).await;
        assert!(messages.is_empty(), "{messages:?}");
        assert_eq!(status.code(), Code::Ok, "an empty file: {status:?}");
    }

    #[tokio::test]
    async fn an_error_mid_read_ends_the_body_in_its_status_and_nothing_after_it_is_sent() {
        let mut failure = Status::data_loss("the disk failed\nat block 2");
        failure.metadata_mut().insert("x-berth-kind", "disk".parse().expect("a value"));
        let pieces = vec![Ok(Bytes::from_static(b"first")), Err(failure), Ok(Bytes::from_static(b"never"))];
        let (messages, status) = drain(pieces).await;
        assert_eq!(messages.len(), 1, "only what came before the error: {messages:?}");
        assert_eq!(messages[0].data, Bytes::from_static(b"first"));
        assert_eq!(status.code(), Code::DataLoss, "{status:?}");
        assert_eq!(status.message(), "the disk failed\nat block 2");
        assert_eq!(status.metadata().get("x-berth-kind").map(|value| value.to_str().ok()), Some(Some("disk")));
    }
}
