//! Client-streaming WriteFile from stdin: a header, then chunks, in bounded memory, then a
//! commit naming the total size.
//!
//! The server commits the file only when the commit arrives and matches what it received.
//! A client that drops the call half-way may look like a clean end of stream to the server
//! (hyper reports RST_STREAM(CANCEL) that way), so the commit is what makes a truncated
//! upload impossible: when stdin fails we simply never send it.

use berth_proto::convert::write_file_commit;
use berth_proto::v1::{WriteFileHeader, WriteFileRequest, WriteFileResponse, write_file_request};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use crate::client::{RpcError, WorkspaceClient};

/// Size of one WriteFile chunk, matching the server's default ReadFile chunk.
pub const UPLOAD_CHUNK_BYTES: usize = 64 * 1024;

/// Messages read ahead of the network. Small: it only smooths the hand-off between reading
/// stdin and sending, and bounds memory to a few chunks whatever the file size.
const UPLOAD_QUEUE_ITEMS: usize = 2;

/// Streams `stdin` to `header.path`. Errors are the RPC's or `read stdin: ...`; the
/// caller adds which file.
pub async fn upload(
    client: &WorkspaceClient,
    stdin: &mut (dyn AsyncRead + Unpin + Send),
    header: WriteFileHeader,
) -> anyhow::Result<WriteFileResponse> {
    let mut client = client.clone();
    let (sender, receiver) = mpsc::channel::<WriteFileRequest>(UPLOAD_QUEUE_ITEMS);
    let call = client.write_file(ReceiverStream::new(receiver));
    let feed = feed(stdin, sender, header);
    tokio::pin!(call, feed);
    let response = tokio::select! {
        // The server answered before we finished sending: it refused the upload.
        response = &mut call => response,
        fed = &mut feed => match fed {
            Ok(()) => call.await,
            // No commit was sent, so whatever reached the server is discarded; dropping
            // the call ends it.
            Err(read_error) => return Err(read_error),
        },
    };
    response.map(tonic::Response::into_inner).map_err(|status| anyhow::Error::new(RpcError::from(status)))
}

/// Sends the header, stdin chunk by chunk, then the commit. Returns `Ok` also when the
/// call stops taking messages: its own result says why.
async fn feed(
    stdin: &mut (dyn AsyncRead + Unpin + Send),
    sender: mpsc::Sender<WriteFileRequest>,
    header: WriteFileHeader,
) -> anyhow::Result<()> {
    let header = WriteFileRequest { msg: Some(write_file_request::Msg::Header(header)) };
    if sender.send(header).await.is_err() {
        return Ok(());
    }
    let mut total = 0u64;
    loop {
        let chunk =
            read_chunk(stdin, UPLOAD_CHUNK_BYTES).await.map_err(|error| anyhow::anyhow!("read stdin: {error}"))?;
        if chunk.is_empty() {
            let _ = sender.send(write_file_commit(total)).await;
            return Ok(());
        }
        total += chunk.len() as u64;
        let message = WriteFileRequest { msg: Some(write_file_request::Msg::Chunk(chunk.into())) };
        if sender.send(message).await.is_err() {
            return Ok(());
        }
    }
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
