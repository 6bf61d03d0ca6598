//! What a backend runs: spawn and exec requests, their limits, and how a process ended.
//! Plain data plus validation; the exec engine (`exec.rs`) and the `Backend` trait build
//! on it.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::error::{Result, WorkspaceError};
use crate::path::RelPath;
use crate::spec::validate_env;

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

/// What to run: an argv (no shell unless argv asks for one) and how.
#[derive(Clone, Debug)]
pub struct SpawnSpec {
    pub argv: Vec<String>,
    /// Working directory relative to the workspace root.
    pub cwd: RelPath,
    pub env: BTreeMap<String, String>,
    /// Whom the process must be kept from; see [`SpawnRole`].
    pub role: SpawnRole,
    /// For a `SecretHolder` whose program lives in the workspace: argv[0] is a workspace
    /// path, and the backend copies it where no workspace process can write, checks the
    /// copy's SHA-256 against this pin and runs the copy (a mismatch is refused with
    /// `InvalidArgument`). `None`: argv[0] must resolve outside the workspace.
    pub program_sha256: Option<[u8; 32]>,
}

/// How a spawned process is isolated from the workspace's own processes.
///
/// Every backend honours the role or refuses the spawn with `BackendUnavailable`; none
/// silently runs a `SecretHolder` as an `Agent`. The `local` backend isolates nothing and
/// says so (it is offered only with `--allow-unsandboxed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpawnRole {
    /// A process of the workspace's agent: the workspace read-write, its uid, its `HOME`.
    #[default]
    Agent,
    /// A process holding secrets the agent must not read (an MCP server started with a
    /// `secret_ref` in its env): a host identity of its own that the workspace's processes
    /// cannot signal, trace or read `/proc/<pid>/environ` of; `HOME` and cwd in a private
    /// directory outside the workspace; the workspace not mounted; the program a system
    /// path or a copy the agent cannot write after it was checked.
    SecretHolder,
}

impl SpawnSpec {
    pub fn new(argv: Vec<String>) -> Self {
        Self { argv, cwd: RelPath::root(), env: BTreeMap::new(), role: SpawnRole::Agent, program_sha256: None }
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
