//! What can fail inside a workspace. One enum for the crate; every variant carries the
//! typed context a caller needs to act on it. Mapping to gRPC status codes happens once, in
//! `berth-proto::convert`.

use std::io;

/// Errors of workspace operations and backends.
#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    /// A client path is not a valid relative path (absolute, `..`, NUL, empty component…).
    #[error("invalid path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },

    /// A path resolved (through a symlink) to a place outside the workspace root.
    #[error("path {path:?} escapes the workspace root")]
    PathEscapesRoot { path: String },

    #[error("path {path:?} not found")]
    NotFound { path: String },

    #[error("path {path:?} already exists")]
    AlreadyExists { path: String },

    #[error("path {path:?} is a directory")]
    IsADirectory { path: String },

    #[error("path {path:?} is not a directory")]
    NotADirectory { path: String },

    #[error("directory {path:?} is not empty")]
    DirectoryNotEmpty { path: String },

    /// An identifier (workspace, session, user, agent, node, MCP server, skill…) is malformed.
    #[error("invalid {kind} {value:?}: {reason}")]
    InvalidId { kind: &'static str, value: String, reason: &'static str },

    /// A bounded input is over its limit; `limit` names which one.
    #[error("{limit} exceeded: {size} > {max}")]
    LimitExceeded { limit: &'static str, size: u64, max: u64 },

    /// The request itself is malformed (empty argv, bad env name, …).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// The program of an exec could not be started (not found, not executable).
    #[error("cannot start {program:?}: {reason}")]
    SpawnFailed { program: String, reason: String },

    /// The workspace has no runtime on this node (never provisioned, released, destroyed).
    #[error("workspace {workspace_id} is not provisioned here")]
    NotProvisioned { workspace_id: String },

    /// The backend cannot run (missing binary, daemon down, image missing…).
    #[error("backend {backend} unavailable: {reason}")]
    BackendUnavailable { backend: &'static str, reason: String },

    /// The named backend does not exist on this node.
    #[error("unknown backend {name:?} (this node offers: {offered})")]
    UnknownBackend { name: String, offered: String },

    /// An operation ran out of its deadline (not an exec timeout: that is a result).
    #[error("{operation} timed out after {millis} ms")]
    Timeout { operation: &'static str, millis: u64 },

    /// A file on disk that Berth owns (state, config) is not what it should be.
    #[error("corrupt {what}: {reason}")]
    Corrupt { what: String, reason: String },

    /// Any other I/O failure, with the operation and path it happened on.
    #[error("{op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },

    /// A named thing of the workspace contract (MCP server, skill…) does not exist.
    #[error("{kind} {name:?} not found")]
    NameNotFound { kind: &'static str, name: String },

    /// A named thing of the workspace contract already exists (and replacing was not asked).
    #[error("{kind} {name:?} already exists")]
    NameExists { kind: &'static str, name: String },

    /// An MCP server could not be started, or exited or broke its connection mid-call.
    /// The next call starts it again.
    #[error("mcp server {server:?} failed: {reason}")]
    McpServerFailed { server: String, reason: String },

    /// The node refuses to run or reach an MCP server as declared: a policy, not a fault
    /// (PERMISSION_DENIED). The reason says what to change.
    #[error("mcp server {server:?} refused: {reason}")]
    McpRefused { server: String, reason: McpRefusal },

    /// Failure inside a backend that has no better variant (docker API error…).
    #[error("{backend}: {message}")]
    Backend { backend: &'static str, message: String },

    /// The backend cannot do what the call needs (a provider without separate stderr,
    /// without stdin streaming, …): the call is refused, never half-done.
    #[error("backend {backend} does not support {capability}")]
    Unsupported { backend: &'static str, capability: &'static str },

    /// A provider refused for quota or rate (after retries): RESOURCE_EXHAUSTED.
    #[error("{provider} quota exhausted: {message}")]
    ProviderQuota { provider: &'static str, message: String },

    /// A provider refused the gateway's credential: FAILED_PRECONDITION naming it.
    #[error("{provider} refused the credential {credential}: {message}")]
    ProviderAuth { provider: &'static str, credential: String, message: String },

    /// A provider sandbox is labelled with a newer generation than this call's: a newer
    /// placement adopted it, so this (older) one must not touch it.
    #[error("sandbox of {workspace_id} is at generation {held}; refusing generation {asked}")]
    SandboxFenced { workspace_id: String, held: u64, asked: u64 },
}

/// Why the node refuses an MCP server (see [`WorkspaceError::McpRefused`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum McpRefusal {
    /// A stdio server that receives secrets runs a program from the workspace without a
    /// SHA-256 pin: the agent could swap the program and read the secrets.
    #[error(
        "its command {command:?} is a workspace path and it receives secrets; pin the program with its sha256 in the declaration"
    )]
    UnpinnedProgram { command: String },
    /// An HTTP server's address is in a range the node does not connect to (loopback,
    /// private, link-local...) and no `--mcp-allow-cidr` of the node allows it.
    #[error("{host} resolves to {address}, a {class} address; the node allows it only with --mcp-allow-cidr")]
    TargetForbidden { host: String, address: std::net::IpAddr, class: &'static str },
    /// An HTTP server that was not declared through AddMcp (written into `.mcp` from inside
    /// the workspace): the node would connect for the agent from the node's network
    /// position, which the sandbox does not have.
    #[error(
        "it is an HTTP server that was not declared through AddMcp (the node connects only to HTTP servers its tenant declared, never to ones written into .mcp); add it with AddMcp"
    )]
    NotDeclared,
}

pub type Result<T, E = WorkspaceError> = std::result::Result<T, E>;

impl WorkspaceError {
    /// Classifies an `io::Error` raised while working on `path`: not-found, exists, the
    /// confinement errors of cap-std, and the rest as `Io`.
    pub fn from_io(op: &'static str, path: &str, source: io::Error) -> Self {
        use io::ErrorKind as K;
        match source.kind() {
            K::NotFound => Self::NotFound { path: path.to_owned() },
            K::AlreadyExists => Self::AlreadyExists { path: path.to_owned() },
            K::IsADirectory => Self::IsADirectory { path: path.to_owned() },
            K::NotADirectory => Self::NotADirectory { path: path.to_owned() },
            K::DirectoryNotEmpty => Self::DirectoryNotEmpty { path: path.to_owned() },
            // cap-std reports "a path led outside of the filesystem" as PermissionDenied; a
            // symlink loop (ELOOP) while resolving is also a refusal to follow, not a disk fault.
            K::PermissionDenied if is_escape_message(&source) => Self::PathEscapesRoot { path: path.to_owned() },
            _ if source.raw_os_error() == Some(nix::libc::ELOOP) || source.raw_os_error() == Some(nix::libc::EXDEV) => {
                Self::PathEscapesRoot { path: path.to_owned() }
            }
            _ => Self::Io { op, path: path.to_owned(), source },
        }
    }

    /// True for errors that say "this path is bad" rather than "the disk failed".
    pub fn is_client_error(&self) -> bool {
        !matches!(
            self,
            Self::Io { .. }
                | Self::Backend { .. }
                | Self::BackendUnavailable { .. }
                | Self::Corrupt { .. }
                | Self::Timeout { .. }
                | Self::McpServerFailed { .. }
                | Self::ProviderQuota { .. }
                | Self::ProviderAuth { .. }
        )
    }
}

fn is_escape_message(err: &io::Error) -> bool {
    let text = err.to_string();
    text.contains("outside of the filesystem") || text.contains("escape")
}
