//! The workspace contract: three primitives per backend, everything else derived.
//!
//! Primitives (required): [`Backend::spawn`] (a process with streamed stdio — `exec`,
//! `exec_stream` and MCP stdio servers are built on it), [`Backend::read_file`] (a chunk
//! stream) and [`Backend::write_file`] (from a chunk stream, atomic). Derived (provided):
//! `exec`, `exec_stream`, `stat`, `list_dir`, `remove`, `mkdir`, `exists`, `append_file`,
//! `rename`, `symlink`, whole-buffer reads and writes. The provided file operations run POSIX tools through `exec` inside the
//! sandbox, so any backend with a shell works; host backends override them with a native
//! fast path (`HostFs`).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};

use crate::error::{Result, WorkspaceError};
use crate::exec;
pub use crate::file::{ByteStream, DEFAULT_CHUNK_BYTES, FileInfo, FileKind, WriteOptions};
use crate::path::RelPath;
use crate::posix;
pub use crate::process::{
    BoxedReader, BoxedWriter, DEFAULT_EXEC_TIMEOUT, DEFAULT_MAX_OUTPUT_BYTES, ExecEvent, ExecOutput, ExecSpec,
    ExitInfo, MAX_ARGV_BYTES, MAX_ARGV_ENTRIES, MAX_EXEC_TIMEOUT, MAX_OUTPUT_BYTES_LIMIT, MAX_STDIN_BYTES,
    ProcessControl, SpawnRole, SpawnSpec, Spawned,
};

/// What a backend can do beyond the minimum of its primitives (see
/// [`Backend::capabilities`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// A process's stdout and stderr arrive as two streams (a provider that answers only
    /// combined output has `false`, and says so in every exec it runs).
    pub separate_stderr: bool,
    /// A running process accepts stdin after it started (needed by MCP stdio servers and
    /// streamed stdin).
    pub streaming_stdin: bool,
}

impl Capabilities {
    pub const FULL: Self = Self { separate_stderr: true, streaming_stdin: true };
}

/// Shared handle to one workspace's backend.
pub type BackendRef = Arc<dyn Backend>;

/// One workspace's sandbox, as seen through three primitives.
///
/// Guarantees: every `RelPath` is resolved inside the workspace root — a symlink leading
/// out is refused with `PathEscapesRoot`, never followed; `write_file` is atomic (readers
/// see the old content or the whole new one, never a prefix) and creates parent
/// directories; `spawn` runs with the workspace root as the base of `cwd`.
///
/// Errors: `NotFound`, `PathEscapesRoot`, `InvalidArgument` / `LimitExceeded` for bad input,
/// `SpawnFailed` when argv[0] cannot start, `BackendUnavailable` when the sandbox is gone.
#[async_trait]
pub trait Backend: Send + Sync {
    /// Backend name for logs and metric labels (`local`, `bubblewrap`, `docker`, …).
    fn name(&self) -> &'static str;

    /// What this backend can do beyond the primitives (all of it on host backends). A
    /// backend without a capability refuses the calls that need it with
    /// [`WorkspaceError::Unsupported`]; it never merges or drops data silently.
    fn capabilities(&self) -> Capabilities {
        Capabilities::FULL
    }

    /// Starts a process in the workspace's sandbox with piped stdio.
    async fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned>;

    /// Streams a regular file's content in chunks.
    async fn read_file(&self, path: &RelPath) -> Result<ByteStream>;

    /// Writes a file from a chunk stream, atomically; returns the bytes written.
    async fn write_file(&self, path: &RelPath, data: ByteStream, options: WriteOptions) -> Result<u64>;

    // ---- derived operations -------------------------------------------------------------

    /// Runs a command to completion with stdin, a timeout (the whole process tree is killed
    /// when it passes) and a cap per output stream.
    async fn exec(&self, spec: &ExecSpec) -> Result<ExecOutput> {
        spec.validate()?;
        let spawned = self.spawn(&spec.spawn).await?;
        exec::run_to_completion(spawned, spec).await
    }

    /// Runs a command and streams its output, then its exit (see [`ExecEvent`]).
    async fn exec_stream(&self, spec: &ExecSpec) -> Result<BoxStream<'static, Result<ExecEvent>>> {
        spec.validate()?;
        let spawned = self.spawn(&spec.spawn).await?;
        Ok(exec::stream_events(spawned, spec.clone()))
    }

    async fn stat(&self, path: &RelPath) -> Result<FileInfo> {
        posix::stat(self, path).await
    }

    async fn list_dir(&self, path: &RelPath) -> Result<Vec<FileInfo>> {
        posix::list_dir(self, path).await
    }

    /// Removes a file, symlink or (with `recursive`, or when empty) directory. Returns
    /// whether it existed.
    async fn remove(&self, path: &RelPath, recursive: bool) -> Result<bool> {
        posix::remove(self, path, recursive).await
    }

    async fn mkdir(&self, path: &RelPath, parents: bool) -> Result<()> {
        posix::mkdir(self, path, parents).await
    }

    async fn exists(&self, path: &RelPath) -> Result<bool> {
        match self.stat(path).await {
            Ok(_) => Ok(true),
            Err(WorkspaceError::NotFound { .. }) => Ok(false),
            Err(other) => Err(other),
        }
    }

    /// Appends `data` to a file, creating it (mode 0644) and its parents when missing;
    /// returns the bytes appended. Never reads the file: concurrent appenders do not lose
    /// each other's data the way a read-modify-write would. Host backends write with one
    /// `O_APPEND` write; the default runs `cat >> path` inside the sandbox.
    async fn append_file(&self, path: &RelPath, data: Bytes) -> Result<u64> {
        posix::append(self, path, data).await
    }

    /// Renames `from` to `to` (a file, symlink or directory), creating `to`'s parents.
    /// Never replaces: `AlreadyExists` when `to` exists, so a rename doubles as an
    /// exclusive create (write a temp file, then rename it into place). Host backends use
    /// `renameat2(RENAME_NOREPLACE)`, atomic; the default checks then runs `mv` inside the
    /// sandbox.
    async fn rename(&self, from: &RelPath, to: &RelPath) -> Result<()> {
        posix::rename(self, from, to).await
    }

    /// Creates a symbolic link at `link` holding `target` as written, creating `link`'s
    /// parents. The target is not resolved here: reading through the link later is
    /// confined like any path (a link leading out is refused then). Callers that accept
    /// targets from clients validate them first (see `tree`).
    async fn symlink(&self, target: &str, link: &RelPath) -> Result<()> {
        posix::symlink(self, target, link).await
    }

    /// Reads a whole file into memory, refusing files over `max_bytes`.
    async fn read_to_bytes(&self, path: &RelPath, max_bytes: u64) -> Result<Bytes> {
        let mut stream = self.read_file(path).await?;
        let mut buffer = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk?;
            if (buffer.len() + chunk.len()) as u64 > max_bytes {
                return Err(WorkspaceError::LimitExceeded {
                    limit: "file size",
                    size: (buffer.len() + chunk.len()) as u64,
                    max: max_bytes,
                });
            }
            buffer.extend_from_slice(&chunk);
        }
        Ok(Bytes::from(buffer))
    }

    /// Writes a whole buffer atomically.
    async fn write_bytes(&self, path: &RelPath, data: Bytes, mode: u32) -> Result<u64> {
        let stream = futures::stream::once(async move { Ok(data) }).boxed();
        self.write_file(path, stream, WriteOptions { mode, ..WriteOptions::default() }).await
    }
}

#[async_trait]
impl<B: Backend + ?Sized> posix::Runner for B {
    fn runner_name(&self) -> &'static str {
        self.name()
    }

    async fn run_exec(&self, spec: &ExecSpec) -> Result<ExecOutput> {
        self.exec(spec).await
    }
}
