//! `read_file` / `write_file` of Docker workspaces: streamed through an exec of `read.sh`
//! (`cat`) or `write.sh` (stdin to a temp file, then `mv`), never through the archive API.
//!
//! Why not the archive API: `GET/PUT /containers/{id}/archive` runs in the daemon as root.
//! A client path would have to be checked first (the API follows symlinks anywhere in the
//! container), and between that check and the daemon's open the workspace's own processes
//! can swap a directory for a symlink; the daemon would then read or write, as root, a file
//! the workspace user cannot touch. PUT also needs the size up front (a tar header), so a
//! stream of unknown length would have to be spooled first. Through exec, the confinement
//! check (`resolve.sh`) and the I/O run as the workspace user inside the container: a
//! process racing the check can only redirect the I/O to a place that user could already
//! read or write with `exec`, so the race is not a privilege boundary. The guarantee that
//! symlinks leading out of `/workspace` are refused is exact for a workspace nobody is
//! changing concurrently; under a concurrent swap it degrades to "anything the workspace
//! user can reach", which is what exec already grants.
//!
//! Atomicity: the temp file is created beside the target (same filesystem) and renamed
//! over it. Limits and failures: the content is followed by a trailer naming its size; a
//! caller that gives up (max_bytes exceeded, failing source stream, dropped future) closes
//! stdin without it, and the script removes the temp file and the directories it created.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::io::ReaderStream;

use berth_workspace::backend::{
    BoxedReader, BoxedWriter, ByteStream, DEFAULT_CHUNK_BYTES, ProcessControl, Spawned, WriteOptions,
};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use super::container::{ContainerHandle, run_plain};
use super::errors::{is_aborted, script_error};
use super::process::spawn;
use super::scripts;

/// Most stderr kept from a file script (it writes one line).
const SCRIPT_STDERR_MAX_BYTES: usize = 64 * 1024;
/// How long a dropped write may take to clean up before it is killed.
const ABANDON_GRACE: Duration = Duration::from_secs(10);

fn script_argv(script: &str, name: &str, args: &[&str]) -> Vec<String> {
    let mut argv = vec![scripts::SHELL.to_owned(), "-c".to_owned(), script.to_owned(), name.to_owned()];
    argv.extend(args.iter().map(|arg| (*arg).to_owned()));
    argv
}

/// Streams a regular file. Errors before the first chunk (`NotFound`, `IsADirectory`,
/// `PathEscapesRoot`, `InvalidArgument` for a FIFO or device) are returned here.
pub(crate) async fn read_file(container: &Arc<ContainerHandle>, path: &RelPath) -> Result<ByteStream> {
    let display = path.as_fs_str().to_owned();
    let argv = script_argv(&container.scripts.read, "berth-read", &[path.as_str()]);
    let Spawned { stdin, mut stdout, stderr, mut control } =
        spawn(container, argv, &RelPath::root(), Vec::new()).await?;
    drop(stdin);
    // Wait for the first chunk or the end: only then is it known whether the script
    // refused the path (it writes nothing to stdout when it does).
    let mut first = BytesMut::with_capacity(DEFAULT_CHUNK_BYTES);
    let read = stdout.read_buf(&mut first).await.map_err(|error| WorkspaceError::from_io("read", &display, error))?;
    if read == 0 {
        finish(control.as_mut(), stderr, "read", &display).await?;
        return Ok(futures::stream::empty().boxed());
    }
    let state = ReadState {
        first: Some(first.freeze()),
        chunks: ReaderStream::with_capacity(stdout, DEFAULT_CHUNK_BYTES),
        stderr: Some(stderr),
        control,
        display,
        done: false,
    };
    Ok(futures::stream::unfold(state, |mut state| async move {
        let item = state.next().await?;
        Some((item, state))
    })
    .boxed())
}

struct ReadState {
    first: Option<Bytes>,
    chunks: ReaderStream<BoxedReader>,
    stderr: Option<BoxedReader>,
    control: Box<dyn ProcessControl>,
    display: String,
    done: bool,
}

impl ReadState {
    async fn next(&mut self) -> Option<Result<Bytes>> {
        if self.done {
            return None;
        }
        if let Some(first) = self.first.take() {
            return Some(Ok(first));
        }
        match self.chunks.next().await {
            Some(Ok(chunk)) => Some(Ok(chunk)),
            Some(Err(error)) => {
                self.done = true;
                Some(Err(WorkspaceError::from_io("read", &self.display, error)))
            }
            None => {
                // End of content: a failing `cat` (disk error) is reported as the last item.
                self.done = true;
                let stderr = self.stderr.take()?;
                finish(self.control.as_mut(), stderr, "read", &self.display).await.err().map(Err)
            }
        }
    }
}

/// Waits for a file script and maps a failure.
async fn finish(
    control: &mut dyn ProcessControl,
    mut stderr: BoxedReader,
    operation: &str,
    display: &str,
) -> Result<()> {
    let (code, stderr) = exit_and_stderr(control, &mut stderr).await?;
    if code == 0 {
        return Ok(());
    }
    Err(script_error(operation, display, code, &stderr))
}

async fn exit_and_stderr(control: &mut dyn ProcessControl, stderr: &mut BoxedReader) -> Result<(i64, Vec<u8>)> {
    let mut text = Vec::new();
    // Bounded, so a misbehaving script cannot make us buffer without limit.
    let _ = stderr.as_mut().take(SCRIPT_STDERR_MAX_BYTES as u64).read_to_end(&mut text).await;
    let status = control.wait().await?;
    let code = match (status.code, status.signal) {
        (Some(code), _) => code as i64,
        (None, Some(signal)) => 128 + signal as i64,
        (None, None) => -1,
    };
    Ok((code, text))
}

/// How feeding the content ended.
enum Fed {
    Complete(u64),
    TooLarge(u64),
    SourceFailed(WorkspaceError),
    /// Writing to stdin failed: the script exited early (it refused the path).
    Broken,
}

/// Writes a file atomically from a chunk stream (see the module docs).
pub(crate) async fn write_file(
    container: &Arc<ContainerHandle>,
    path: &RelPath,
    mut data: ByteStream,
    options: WriteOptions,
) -> Result<u64> {
    let display = path.as_fs_str().to_owned();
    if path.is_root() {
        return Err(WorkspaceError::IsADirectory { path: display });
    }
    let nonce = scripts::nonce();
    let mode = format!("{:o}", options.mode & 0o7777);
    let argv = script_argv(&container.scripts.write, "berth-write", &[path.as_str(), &mode, &nonce]);
    let Spawned { stdin, stderr, control, .. } = spawn(container, argv, &RelPath::root(), Vec::new()).await?;
    let mut guard = WriteGuard {
        pipes: Some(WritePipes { stdin, stderr, control }),
        container: container.clone(),
        nonce: nonce.clone(),
    };
    let fed = match guard.pipes.as_mut() {
        Some(pipes) => pipes.send(&mut data, options.max_bytes, &nonce).await,
        None => Fed::Broken,
    };
    // The guard stays armed until the script's status is known: dropped while the script
    // commits, it must wait for it rather than kill it half-way.
    let status = match guard.pipes.as_mut() {
        Some(pipes) => exit_and_stderr(pipes.control.as_mut(), &mut pipes.stderr).await,
        None => Err(WorkspaceError::Backend {
            backend: super::config::BACKEND_NAME,
            message: format!("write {display:?}: lost the exec"),
        }),
    };
    guard.pipes = None;
    let (code, stderr_text) = status?;
    match fed {
        Fed::Complete(written) if code == 0 => Ok(written),
        Fed::TooLarge(size) if is_aborted(code, &stderr_text) => {
            Err(WorkspaceError::LimitExceeded { limit: "file size", size, max: options.max_bytes })
        }
        Fed::SourceFailed(error) if is_aborted(code, &stderr_text) => Err(error),
        _ if code == 0 => Err(WorkspaceError::Backend {
            backend: super::config::BACKEND_NAME,
            message: format!("write {display:?}: the content stream ended early"),
        }),
        _ => Err(script_error("write", &display, code, &stderr_text)),
    }
}

/// The exec of one write.
struct WritePipes {
    stdin: BoxedWriter,
    stderr: BoxedReader,
    control: Box<dyn ProcessControl>,
}

impl WritePipes {
    /// Feeds the content, then the trailer when it is complete, then closes stdin.
    async fn send(&mut self, data: &mut ByteStream, max_bytes: u64, nonce: &str) -> Fed {
        let fed = tokio::select! {
            fed = feed(&mut self.stdin, data, max_bytes) => fed,
            // The script exited while we were still writing: it refused the path.
            _ = self.control.wait() => Fed::Broken,
        };
        if let Fed::Complete(written) = fed {
            // A failed trailer write means the script is gone; its status says why.
            let trailer = scripts::write_trailer(nonce, written);
            let _ = self.stdin.write_all(trailer.as_bytes()).await;
        }
        // Without the trailer, closing stdin makes the script discard what it wrote.
        let _ = self.stdin.shutdown().await;
        fed
    }
}

async fn feed(stdin: &mut BoxedWriter, data: &mut ByteStream, max_bytes: u64) -> Fed {
    let mut written: u64 = 0;
    while let Some(chunk) = data.next().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(error) => return Fed::SourceFailed(error),
        };
        let total = written + chunk.len() as u64;
        if total > max_bytes {
            return Fed::TooLarge(total);
        }
        if stdin.write_all(&chunk).await.is_err() {
            return Fed::Broken;
        }
        written = total;
    }
    Fed::Complete(written)
}

/// An in-flight write. Dropped while it still holds the exec (the caller's future was
/// cancelled), it closes stdin without a trailer so the script cleans up, and kills the
/// script and removes the temp file itself if that does not finish in time.
struct WriteGuard {
    pipes: Option<WritePipes>,
    container: Arc<ContainerHandle>,
    nonce: String,
}

impl Drop for WriteGuard {
    fn drop(&mut self) {
        let Some(mut pipes) = self.pipes.take() else {
            return;
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let container = self.container.clone();
        let nonce = std::mem::take(&mut self.nonce);
        runtime.spawn(async move {
            let _ = pipes.stdin.shutdown().await;
            let WritePipes { mut stderr, mut control, .. } = pipes;
            let cleaned = tokio::time::timeout(ABANDON_GRACE, exit_and_stderr(control.as_mut(), &mut stderr)).await;
            if matches!(cleaned, Ok(Ok(_))) {
                return;
            }
            let _ = control.kill().await;
            remove_temp_files(&container, &nonce).await;
        });
    }
}

/// Last resort after a killed write: the temp file's directory is only known to the script.
async fn remove_temp_files(container: &ContainerHandle, nonce: &str) {
    let cmd = vec![
        "find".to_owned(),
        container.scripts.mount_point.clone(),
        "-xdev".to_owned(),
        "-name".to_owned(),
        format!(".berth-tmp-{nonce}"),
        "-type".to_owned(),
        "f".to_owned(),
        "-delete".to_owned(),
    ];
    if let Err(error) = run_plain(container, cmd).await {
        tracing::warn!(container = %container.container_name, %error, "could not remove the temp file of an abandoned write");
    }
}
