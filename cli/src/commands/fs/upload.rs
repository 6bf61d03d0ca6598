//! Client-streaming WriteFile from stdin: a header, then chunks, in bounded memory.
//!
//! The hard part is failing safely. The server commits the file when the request stream
//! ends without error, and with hyper + tonic a client that merely drops the call sends
//! RST_STREAM(CANCEL), which the server's `Streaming` reports as a *clean* end: dropping
//! an upload half-way would commit a truncated file. So an upload we cannot finish (stdin
//! failed) is ended with a request-body *error* instead: we feed the encoder a message
//! larger than the client's encoding limit, tonic fails the body, and hyper resets the
//! stream with INTERNAL_ERROR, which the server sees as a failed upload. The oversized
//! message never reaches the wire.

use std::time::Duration;

use berth_proto::v1::{WriteFileHeader, WriteFileRequest, WriteFileResponse, write_file_request};
use futures::{StreamExt, future, stream};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{RpcError, WorkspaceClient};

/// Size of one WriteFile chunk, matching the server's default ReadFile chunk.
pub const UPLOAD_CHUNK_BYTES: usize = 64 * 1024;

/// Items read ahead of the network. Small: it only smooths the hand-off between reading
/// stdin and sending, and bounds memory to a few chunks whatever the file size.
const UPLOAD_QUEUE_ITEMS: usize = 2;

/// Protobuf framing of a message beyond its payload strings (tags and lengths); generous.
const MESSAGE_OVERHEAD_BYTES: usize = 1024;

/// How long to wait for the server to acknowledge an aborted upload before giving up on
/// it; the abort is already on the wire, this only collects the server's answer.
const ABORT_ANSWER_WAIT: Duration = Duration::from_secs(5);

/// What the stdin reader hands to the request stream.
enum UploadItem {
    Message(WriteFileRequest),
    /// All of stdin was sent: end the stream cleanly so the server commits.
    Finish,
    /// Stdin failed: fail the stream so the server discards what it received.
    Abort,
}

/// Streams `stdin` to `header.path`. Errors are the RPC's or `read stdin: ...`; the
/// caller adds which file.
pub async fn upload(
    client: &WorkspaceClient,
    stdin: &mut (dyn AsyncRead + Unpin + Send),
    header: WriteFileHeader,
) -> anyhow::Result<WriteFileResponse> {
    // Every real message fits under this limit; the abort marker is one byte over it.
    let encoding_limit =
        UPLOAD_CHUNK_BYTES.max(header.workspace_id.len() + header.path.len()).saturating_add(MESSAGE_OVERHEAD_BYTES);
    let mut client = client.clone().max_encoding_message_size(encoding_limit);

    let (sender, receiver) = mpsc::channel::<UploadItem>(UPLOAD_QUEUE_ITEMS);
    let messages = ReceiverStream::new(receiver)
        // The channel closing without `Finish` (this future dropped mid-upload) must not
        // read as a clean end either: the stream then stays open until the call is gone.
        .chain(stream::pending())
        .take_while(|item| future::ready(!matches!(item, UploadItem::Finish)))
        .filter_map(move |item| {
            future::ready(match item {
                UploadItem::Message(message) => Some(message),
                UploadItem::Abort => Some(oversized_chunk(encoding_limit)),
                UploadItem::Finish => None,
            })
        });
    let call = client.write_file(messages);
    let feed = feed(stdin, sender, header);
    tokio::pin!(call, feed);

    let response = tokio::select! {
        // The server answered before we finished sending: it refused the upload.
        response = &mut call => response,
        fed = &mut feed => match fed {
            Ok(()) => call.await,
            Err(read_error) => {
                // Let the reset reach the server before the call is dropped; the
                // server's answer itself is of no interest, the read error is the cause.
                let _ = tokio::time::timeout(ABORT_ANSWER_WAIT, &mut call).await;
                return Err(read_error);
            }
        },
    };
    response.map(tonic::Response::into_inner).map_err(|status| anyhow::Error::new(RpcError::from(status)))
}

/// Sends the header, stdin chunk by chunk, then `Finish` (or `Abort` when stdin fails).
/// Returns `Ok` also when the call stops taking messages: its own result says why.
async fn feed(
    stdin: &mut (dyn AsyncRead + Unpin + Send),
    sender: mpsc::Sender<UploadItem>,
    header: WriteFileHeader,
) -> anyhow::Result<()> {
    let header = WriteFileRequest { msg: Some(write_file_request::Msg::Header(header)) };
    if sender.send(UploadItem::Message(header)).await.is_err() {
        return Ok(());
    }
    loop {
        let chunk = match read_chunk(stdin, UPLOAD_CHUNK_BYTES).await {
            Ok(chunk) => chunk,
            Err(error) => {
                // A send failure means the call is over already; nothing left to abort.
                let _ = sender.send(UploadItem::Abort).await;
                return Err(anyhow::anyhow!("read stdin: {error}"));
            }
        };
        if chunk.is_empty() {
            let _ = sender.send(UploadItem::Finish).await;
            return Ok(());
        }
        let message = WriteFileRequest { msg: Some(write_file_request::Msg::Chunk(chunk)) };
        if sender.send(UploadItem::Message(message)).await.is_err() {
            return Ok(());
        }
    }
}

/// A chunk the client refuses to encode (see the module comment).
fn oversized_chunk(encoding_limit: usize) -> WriteFileRequest {
    WriteFileRequest { msg: Some(write_file_request::Msg::Chunk(vec![0; encoding_limit + 1])) }
}

/// Reads until `limit` bytes or end of input; empty means end of input. Filling whole
/// chunks (a pipe hands over far less per read) keeps the message count low.
async fn read_chunk(reader: &mut (dyn AsyncRead + Unpin + Send), limit: usize) -> std::io::Result<Vec<u8>> {
    let mut chunk = Vec::with_capacity(limit);
    let mut limited = reader.take(u64::try_from(limit).unwrap_or(u64::MAX));
    limited.read_to_end(&mut chunk).await?;
    Ok(chunk)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn chunks_are_full_until_the_last() {
        let input = vec![7_u8; 2 * UPLOAD_CHUNK_BYTES + 10];
        let mut reader: &[u8] = &input;
        let mut sizes = Vec::new();
        loop {
            let chunk = read_chunk(&mut reader, UPLOAD_CHUNK_BYTES).await.unwrap();
            if chunk.is_empty() {
                break;
            }
            sizes.push(chunk.len());
        }
        assert_eq!(sizes, [UPLOAD_CHUNK_BYTES, UPLOAD_CHUNK_BYTES, 10]);
    }
}
