//! Local side of tree transfer: a directory packed as a tar stream (on a blocking thread,
//! in bounded memory), and a tar stream unpacked into a directory.

use std::io::Write;
use std::path::{Path, PathBuf};

use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// Size of the chunks sent to the server.
pub const CHUNK_BYTES: usize = 64 * 1024;

/// Packs `dir`'s contents (not `dir` itself; symlinks stored as links, never followed)
/// into tar chunks on `sender`. Ends with an error item if reading fails.
pub fn pack_dir(dir: PathBuf, sender: mpsc::Sender<anyhow::Result<Vec<u8>>>) {
    std::thread::spawn(move || {
        let writer = ChunkWriter { sender: sender.clone(), buffer: Vec::with_capacity(CHUNK_BYTES) };
        let mut builder = tar::Builder::new(writer);
        builder.follow_symlinks(false);
        let packed =
            builder.append_dir_all(".", &dir).and_then(|()| builder.into_inner()).and_then(|mut writer| writer.flush());
        if let Err(error) = packed {
            let _ = sender.blocking_send(Err(anyhow::anyhow!("pack {}: {error}", dir.display())));
        }
    });
}

struct ChunkWriter {
    sender: mpsc::Sender<anyhow::Result<Vec<u8>>>,
    buffer: Vec<u8>,
}

impl Write for ChunkWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buffer.extend_from_slice(data);
        if self.buffer.len() >= CHUNK_BYTES {
            self.flush()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buffer.is_empty() {
            return Ok(());
        }
        let chunk = std::mem::replace(&mut self.buffer, Vec::with_capacity(CHUNK_BYTES));
        self.sender.blocking_send(Ok(chunk)).map_err(|_| std::io::Error::other("the upload stopped"))
    }
}

/// A blocking reader over chunks received from the server.
pub struct ChunkReader {
    pub receiver: mpsc::Receiver<Vec<u8>>,
    pub current: Vec<u8>,
    pub offset: usize,
}

impl std::io::Read for ChunkReader {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        while self.offset >= self.current.len() {
            match self.receiver.blocking_recv() {
                Some(chunk) => {
                    self.current = chunk;
                    self.offset = 0;
                }
                None => return Ok(0),
            }
        }
        let length = buffer.len().min(self.current.len() - self.offset);
        buffer[..length].copy_from_slice(&self.current[self.offset..self.offset + length]);
        self.offset += length;
        Ok(length)
    }
}

/// Unpacks a tar read from `reader` into `dir` (created). The tar crate refuses entries
/// that would land outside `dir` (absolute paths, `..`).
pub fn unpack_into(reader: ChunkReader, dir: &Path) -> anyhow::Result<u64> {
    std::fs::create_dir_all(dir).map_err(|error| anyhow::anyhow!("create {}: {error}", dir.display()))?;
    let mut archive = tar::Archive::new(reader);
    let mut count = 0;
    for entry in archive.entries()? {
        let mut entry = entry?;
        if !entry.unpack_in(dir)? {
            anyhow::bail!("refused an entry outside {}: {:?}", dir.display(), entry.path()?);
        }
        count += 1;
    }
    Ok(count)
}

/// Runs a client-streaming upload: `header`, then every chunk from `chunks` wrapped by
/// `chunk_message`. A local read failure must not look like a clean end of stream (the
/// server would commit a partial archive): the feeder stops without closing, and the call
/// is dropped with the local error.
pub async fn stream_upload<M, R, F, Fut>(
    header: M,
    mut chunks: mpsc::Receiver<anyhow::Result<Vec<u8>>>,
    chunk_message: fn(Vec<u8>) -> M,
    call: F,
) -> anyhow::Result<Result<tonic::Response<R>, tonic::Status>>
where
    M: Send + 'static,
    F: FnOnce(ReceiverStream<M>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
{
    let (messages, outbound) = mpsc::channel::<M>(4);
    messages.send(header).await.map_err(|_| anyhow::anyhow!("the upload stream closed before its header"))?;
    let feeder = tokio::spawn(async move {
        while let Some(chunk) = chunks.recv().await {
            if messages.send(chunk_message(chunk?)).await.is_err() {
                break;
            }
        }
        anyhow::Ok(())
    });
    let call = call(ReceiverStream::new(outbound));
    tokio::pin!(call);
    Ok(tokio::select! {
        response = &mut call => response,
        fed = feeder => {
            fed??;
            call.await
        }
    })
}
