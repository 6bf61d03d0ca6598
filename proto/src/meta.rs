//! gRPC metadata keys Berth puts on requests and statuses. Retry facts travel here, not in
//! message prose (docs/design.md §4.4).

/// Request metadata (replica -> node agent): generation of the workspace the replica
/// believes the node holds.
pub const GENERATION: &str = "x-berth-generation";

/// Status metadata: a stable machine-readable error kind (see [`ErrorKind`]).
pub const ERROR_KIND: &str = "x-berth-error";

/// Status metadata: "true" when the same call may succeed if retried.
pub const RETRYABLE: &str = "x-berth-retryable";

/// Request metadata (CLI / service -> replica): act for this user.
pub const ACT_AS: &str = "x-berth-act-as";

/// Request metadata: W3C trace context.
pub const TRACEPARENT: &str = "traceparent";

/// Stable error kinds carried in [`ERROR_KIND`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// The node holds another generation of the workspace (or none): re-read and retry.
    WrongGeneration,
    /// The node has seen a newer generation than the caller's: its placement was superseded.
    StaleGeneration,
    /// The node has lost its lease and is not serving until it registers again.
    NodeFenced,
    /// The path resolved outside the workspace root.
    PathEscapesRoot,
    /// An input is over a limit (the message names the limit).
    LimitExceeded,
    /// An MCP server inside the workspace failed to start or died; the next call restarts it.
    McpServerFailed,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WrongGeneration => "wrong-generation",
            Self::NodeFenced => "node-fenced",
            Self::StaleGeneration => "stale-generation",
            Self::PathEscapesRoot => "path-escapes-root",
            Self::LimitExceeded => "limit-exceeded",
            Self::McpServerFailed => "mcp-server-failed",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [
            Self::WrongGeneration,
            Self::StaleGeneration,
            Self::NodeFenced,
            Self::PathEscapesRoot,
            Self::LimitExceeded,
            Self::McpServerFailed,
        ]
        .into_iter()
        .find(|kind| kind.as_str() == text)
    }

    /// The kind carried by a status, if any.
    pub fn of(status: &tonic::Status) -> Option<Self> {
        status.metadata().get(ERROR_KIND).and_then(|value| value.to_str().ok()).and_then(Self::parse)
    }

    /// Attaches this kind to a status.
    pub fn attach(self, mut status: tonic::Status) -> tonic::Status {
        status.metadata_mut().insert(ERROR_KIND, tonic::metadata::MetadataValue::from_static(self.as_str()));
        status
    }
}

/// Marks a status as retryable.
pub fn mark_retryable(mut status: tonic::Status) -> tonic::Status {
    status.metadata_mut().insert(RETRYABLE, tonic::metadata::MetadataValue::from_static("true"));
    status
}

pub fn is_retryable(status: &tonic::Status) -> bool {
    status.metadata().get(RETRYABLE).is_some_and(|value| value == "true")
}
