//! gRPC's length-prefixed messages, read and written by hand on the one call where the
//! generated code would copy the bulk of the bytes: `ReadFile`.
//!
//! A generated server encodes each `FileChunk` into its buffer (a copy of every byte it
//! sends), and a replica would decode the node's chunks and encode them again. Instead the
//! node writes each chunk as a small prefix (the message header and the field's tag and
//! length) followed by the chunk's own `Bytes` (node-agent `read_frames.rs`), and a replica
//! relays the node's frames undecoded (control-plane `passthrough.rs`). Both take the call
//! with [`TakeReadFile`] in front of their generated server, which reads the one request
//! message with [`single_message`]; on the wire nothing differs from what the generated
//! code sends, so every gRPC client reads the answer.

use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{BufMut, Bytes, BytesMut};
use futures::future::BoxFuture;
use http_body_util::{BodyExt, Limited};
use prost::Message;
use prost::encoding::{WireType, encode_key, encode_varint, encoded_len_varint, key_len};
use tonic::Status;
use tonic::body::Body;
use tonic::metadata::MetadataMap;
use tonic::server::NamedService;
use tower::Service;

use crate::v1;

/// The path of `WorkspaceService.ReadFile`.
pub const READ_FILE_PATH: &str = "/berth.v1.WorkspaceService/ReadFile";

/// gRPC's message header: a compression flag and a 4-byte big-endian length.
pub const FRAME_HEADER_BYTES: usize = 5;

/// Largest `ReadFile` request body accepted (a workspace id, a path, a chunk size).
pub const MAX_READ_FILE_REQUEST_BYTES: usize = 64 * 1024;

/// The field number of `FileChunk.data`.
const FILE_CHUNK_DATA: u32 = 1;

/// What answers `ReadFile` for [`TakeReadFile`]: the decoded request (with its metadata
/// and extensions) to the whole HTTP response, or a status for a trailers-only refusal.
pub trait ReadFileHandler: Send + Sync + 'static {
    fn read_file(
        &self,
        request: tonic::Request<v1::ReadFileRequest>,
    ) -> BoxFuture<'_, Result<http::Response<Body>, Status>>;
}

/// A generated `WorkspaceService` server `S` with `ReadFile` taken by `H`: the request body
/// is read as exactly one uncompressed message of at most [`MAX_READ_FILE_REQUEST_BYTES`]
/// (anything else is refused, typed) and handed to `H`. Every other call passes to `S`
/// untouched.
pub struct TakeReadFile<S, H> {
    inner: S,
    handler: Arc<H>,
}

impl<S, H> TakeReadFile<S, H> {
    pub fn new(inner: S, handler: Arc<H>) -> Self {
        Self { inner, handler }
    }
}

impl<S: Clone, H> Clone for TakeReadFile<S, H> {
    fn clone(&self) -> Self {
        Self { inner: self.inner.clone(), handler: Arc::clone(&self.handler) }
    }
}

impl<S: NamedService, H> NamedService for TakeReadFile<S, H> {
    const NAME: &'static str = S::NAME;
}

impl<S, H> Service<http::Request<Body>> for TakeReadFile<S, H>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
    H: ReadFileHandler,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path() != READ_FILE_PATH {
            return Box::pin(self.inner.call(request));
        }
        let handler = Arc::clone(&self.handler);
        Box::pin(async move { Ok(take_read_file(&*handler, request).await.unwrap_or_else(Status::into_http)) })
    }
}

async fn take_read_file<H: ReadFileHandler>(
    handler: &H,
    request: http::Request<Body>,
) -> Result<http::Response<Body>, Status> {
    let (parts, body) = request.into_parts();
    let message = single_message::<v1::ReadFileRequest>(body, MAX_READ_FILE_REQUEST_BYTES).await?;
    let metadata = MetadataMap::from_headers(parts.headers);
    handler.read_file(tonic::Request::from_parts(metadata, parts.extensions, message)).await
}

/// `message` as one uncompressed gRPC message: its header, then its bytes.
pub fn message_frame(message: &impl Message) -> Result<Bytes, Status> {
    let length = message.encoded_len();
    let declared = u32::try_from(length).map_err(|_| Status::invalid_argument("message too large"))?;
    let mut frame = BytesMut::with_capacity(FRAME_HEADER_BYTES + length);
    frame.put_u8(0);
    frame.put_u32(declared);
    message.encode(&mut frame).map_err(|error| Status::internal(format!("encoding a message: {error}")))?;
    Ok(frame.freeze())
}

/// What goes on the wire before a `FileChunk` holding `length` bytes: the message header
/// and the field's key and length. Followed by the bytes themselves, it is the frame a
/// generated server sends for `FileChunk { data }`. An empty chunk is an empty message.
pub fn file_chunk_prefix(length: usize) -> Result<Bytes, Status> {
    let field = if length == 0 { 0 } else { key_len(FILE_CHUNK_DATA) + encoded_len_varint(length as u64) };
    let declared = u32::try_from(field + length).map_err(|_| Status::internal("a file chunk over 4 GiB"))?;
    let mut prefix = BytesMut::with_capacity(FRAME_HEADER_BYTES + field);
    prefix.put_u8(0);
    prefix.put_u32(declared);
    if length > 0 {
        encode_key(FILE_CHUNK_DATA, WireType::LengthDelimited, &mut prefix);
        encode_varint(length as u64, &mut prefix);
    }
    Ok(prefix.freeze())
}

/// The request body's one message, of at most `max` bytes. A compressed message is
/// refused (Berth negotiates no compression), as is a body that is not exactly one message.
pub async fn single_message<M: Message + Default>(body: Body, max: usize) -> Result<M, Status> {
    let bytes = Limited::new(body, max)
        .collect()
        .await
        .map_err(|error| {
            if error.is::<http_body_util::LengthLimitError>() {
                Status::resource_exhausted(format!("a request is at most {max} bytes"))
            } else {
                Status::from_error(error)
            }
        })?
        .to_bytes();
    let Some((header, payload)) = bytes.split_at_checked(FRAME_HEADER_BYTES) else {
        return Err(Status::invalid_argument("the request holds no message"));
    };
    if header[0] != 0 {
        return Err(Status::unimplemented("compressed messages are not accepted"));
    }
    let declared = u32::from_be_bytes([header[1], header[2], header[3], header[4]]) as usize;
    if declared != payload.len() {
        return Err(Status::invalid_argument(format!(
            "the request must be one message: {declared} bytes declared, {} sent",
            payload.len()
        )));
    }
    M::decode(payload).map_err(|error| Status::invalid_argument(format!("the request does not decode: {error}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_and_the_bytes_are_the_frame_a_generated_server_sends() {
        for length in [0, 1, 127, 128, 16_383, 16_384, 65_536, 1024 * 1024, 4 * 1024 * 1024 + 3] {
            let data = Bytes::from((0..length).map(|index| (index % 251) as u8).collect::<Vec<u8>>());
            let mut by_hand = file_chunk_prefix(length).expect("prefix").to_vec();
            by_hand.extend_from_slice(&data);
            let generated = message_frame(&v1::FileChunk { data: data.clone() }).expect("frame");
            assert_eq!(by_hand, generated.to_vec(), "a chunk of {length} bytes");
            let decoded = v1::FileChunk::decode(&by_hand[FRAME_HEADER_BYTES..]).expect("decodes");
            assert_eq!(decoded.data, data, "a chunk of {length} bytes");
        }
    }
}
