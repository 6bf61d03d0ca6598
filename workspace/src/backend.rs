//! The workspace contract: three primitives per backend, everything else derived.
//!
//! Primitives (required): [`Backend::spawn`] (a process with streamed stdio — `exec`,
//! `exec_stream` and MCP stdio servers are built on it), [`Backend::read_file`] (a chunk
//! stream) and [`Backend::write_file`] (from a chunk stream, atomic). Derived (provided):
//! `exec`, `exec_stream`, `stat`, `list_dir`, `remove`, `mkdir`, `exists`, `append_file`,
//! `rename`, `symlink`, whole-buffer reads and writes. The provided file operations run POSIX tools through `exec` inside the
//! sandbox, so any backend with a shell works; host backends override them with a native
//! fast path (`HostFs`).

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::{Result, WorkspaceError};
use crate::exec;
use crate::path::RelPath;
use crate::spec::validate_env;

/// Shared handle to one workspace's backend.
pub type BackendRef = Arc<dyn Backend>;

/// A stream of file chunks. Errors before the first chunk are returned by the call that
/// made the stream; errors later arrive in the stream.
pub type ByteStream = BoxStream<'static, Result<Bytes>>;

pub type BoxedReader = Pin<Box<dyn AsyncRead + Send>>;
pub type BoxedWriter = Pin<Box<dyn AsyncWrite + Send>>;

/// Default exec timeout when a request gives none.
pub const DEFAULT_EXEC_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest exec timeout a client may ask for.
pub const MAX_EXEC_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Default cap per output stream of `exec`.
pub const DEFAULT_MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// Largest cap per output stream a client may ask for.
pub const MAX_OUTPUT_BYTES_LIMIT: usize = 64 * 1024 * 1024;
/// Largest argv (sum of argument bytes) accepted.
pub const MAX_ARGV_BYTES: usize = 256 * 1024;
/// Most arguments accepted.
pub const MAX_ARGV_ENTRIES: usize = 4096;
/// Largest stdin buffer of a unary exec.
pub const MAX_STDIN_BYTES: usize = 16 * 1024 * 1024;
/// Chunk size of file streams.
pub const DEFAULT_CHUNK_BYTES: usize = 64 * 1024;

/// What to run: an argv (no shell unless argv asks for one) and how.
#[derive(Clone, Debug)]
pub struct SpawnSpec {
    pub argv: Vec<String>,
    /// Working directory relative to the workspace root.
    pub cwd: RelPath,
    pub env: BTreeMap<String, String>,
}

impl SpawnSpec {
    pub fn new(argv: Vec<String>) -> Self {
        Self { argv, cwd: RelPath::root(), env: BTreeMap::new() }
    }

    /// Checks argv and env against the limits; every backend calls this before spawning.
    pub fn validate(&self) -> Result<()> {
        let Some(program) = self.argv.first() else {
            return Err(WorkspaceError::InvalidArgument("argv must not be empty".into()));
        };
        if program.is_empty() {
            return Err(WorkspaceError::InvalidArgument("argv[0] must not be empty".into()));
        }
        if self.argv.len() > MAX_ARGV_ENTRIES {
            return Err(WorkspaceError::LimitExceeded {
                limit: "argv entries",
                size: self.argv.len() as u64,
                max: MAX_ARGV_ENTRIES as u64,
            });
        }
        let total: usize = self.argv.iter().map(|arg| arg.len() + 1).sum();
        if total > MAX_ARGV_BYTES {
            return Err(WorkspaceError::LimitExceeded {
                limit: "argv size",
                size: total as u64,
                max: MAX_ARGV_BYTES as u64,
            });
        }
        if self.argv.iter().any(|arg| arg.contains('\0')) {
            return Err(WorkspaceError::InvalidArgument("argv contains a NUL byte".into()));
        }
        validate_env(&self.env)
    }
}

/// A unary exec: the spawn spec plus stdin, timeout and output cap.
#[derive(Clone, Debug)]
pub struct ExecSpec {
    pub spawn: SpawnSpec,
    pub stdin: Bytes,
    pub timeout: Duration,
    /// Cap per output stream; bytes past it are read and dropped, and the stream is
    /// flagged truncated.
    pub max_output_bytes: usize,
}

impl ExecSpec {
    pub fn new(argv: Vec<String>) -> Self {
        Self {
            spawn: SpawnSpec::new(argv),
            stdin: Bytes::new(),
            timeout: DEFAULT_EXEC_TIMEOUT,
            max_output_bytes: DEFAULT_MAX_OUTPUT_BYTES,
        }
    }

    pub fn validate(&self) -> Result<()> {
        self.spawn.validate()?;
        if self.stdin.len() > MAX_STDIN_BYTES {
            return Err(WorkspaceError::LimitExceeded {
                limit: "stdin size",
                size: self.stdin.len() as u64,
                max: MAX_STDIN_BYTES as u64,
            });
        }
        if self.timeout > MAX_EXEC_TIMEOUT {
            return Err(WorkspaceError::LimitExceeded {
                limit: "exec timeout (ms)",
                size: self.timeout.as_millis() as u64,
                max: MAX_EXEC_TIMEOUT.as_millis() as u64,
            });
        }
        if self.max_output_bytes > MAX_OUTPUT_BYTES_LIMIT {
            return Err(WorkspaceError::LimitExceeded {
                limit: "max output bytes",
                size: self.max_output_bytes as u64,
                max: MAX_OUTPUT_BYTES_LIMIT as u64,
            });
        }
        Ok(())
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit code when the process exited normally.
    pub code: Option<i32>,
    /// Terminating signal when it was killed.
    pub signal: Option<i32>,
}

/// Result of a unary exec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    /// The exit code; -1 when the process was killed by a signal or timed out.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub stdout: Bytes,
    pub stderr: Bytes,
    pub timed_out: bool,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration: Duration,
}

/// One event of a streamed exec: output in order, then exactly one `Exit` (whose output
/// buffers are empty).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Bytes),
    Stderr(Bytes),
    Exit(ExecOutput),
}

/// Controls a spawned process.
///
/// Guarantees: `kill` ends the process *and everything it started* (process group, pid
/// namespace or container exec) and is idempotent; dropping the control without `wait`
/// returning kills the tree too, so a cancelled request never leaks processes.
#[async_trait]
pub trait ProcessControl: Send {
    async fn wait(&mut self) -> Result<ExitInfo>;
    async fn kill(&mut self) -> Result<()>;
}

/// A running process with streamed stdio.
pub struct Spawned {
    pub stdin: BoxedWriter,
    pub stdout: BoxedReader,
    pub stderr: BoxedReader,
    pub control: Box<dyn ProcessControl>,
}

/// Options of a file write.
#[derive(Clone, Copy, Debug)]
pub struct WriteOptions {
    /// Permission bits of a new file.
    pub mode: u32,
    /// Largest file accepted; the write fails with `LimitExceeded` past it and leaves nothing.
    pub max_bytes: u64,
}

impl Default for WriteOptions {
    fn default() -> Self {
        Self { mode: 0o644, max_bytes: u64::MAX }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other,
}

/// Metadata of one entry. Symlinks are reported as such, not followed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    pub path: RelPath,
    pub kind: FileKind,
    pub size: u64,
    pub mode: u32,
    pub modified: Option<SystemTime>,
}

impl FileInfo {
    pub fn name(&self) -> &str {
        self.path.file_name().unwrap_or(".")
    }
}

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
        crate::posix::stat(self, path).await
    }

    async fn list_dir(&self, path: &RelPath) -> Result<Vec<FileInfo>> {
        crate::posix::list_dir(self, path).await
    }

    /// Removes a file, symlink or (with `recursive`, or when empty) directory. Returns
    /// whether it existed.
    async fn remove(&self, path: &RelPath, recursive: bool) -> Result<bool> {
        crate::posix::remove(self, path, recursive).await
    }

    async fn mkdir(&self, path: &RelPath, parents: bool) -> Result<()> {
        crate::posix::mkdir(self, path, parents).await
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
        crate::posix::append(self, path, data).await
    }

    /// Renames `from` to `to` (a file, symlink or directory), creating `to`'s parents.
    /// Never replaces: `AlreadyExists` when `to` exists, so a rename doubles as an
    /// exclusive create (write a temp file, then rename it into place). Host backends use
    /// `renameat2(RENAME_NOREPLACE)`, atomic; the default checks then runs `mv` inside the
    /// sandbox.
    async fn rename(&self, from: &RelPath, to: &RelPath) -> Result<()> {
        crate::posix::rename(self, from, to).await
    }

    /// Creates a symbolic link at `link` holding `target` as written, creating `link`'s
    /// parents. The target is not resolved here: reading through the link later is
    /// confined like any path (a link leading out is refused then). Callers that accept
    /// targets from clients validate them first (see `tree`).
    async fn symlink(&self, target: &str, link: &RelPath) -> Result<()> {
        crate::posix::symlink(self, target, link).await
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
