//! `NodeError`: what failed in a node-agent call, and its one mapping to a gRPC status.
//!
//! Every status the node agent answers with is made by `From<NodeError> for Status`;
//! workspace errors go through berth-proto's `status_from_workspace_error`, so the replica
//! and the node agent answer a workspace error identically. Retry facts (fenced, wrong
//! generation, limit exceeded) travel as `x-berth-error` metadata the replica's router
//! reads.

use berth_proto::convert::status_from_workspace_error;
use berth_proto::meta::ErrorKind;
use berth_workspace::{WorkspaceError, WorkspaceId};
use tonic::Status;

#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// A workspace operation or validation failed.
    #[error(transparent)]
    Workspace(#[from] WorkspaceError),

    /// The watchdog fenced this node (its lease may have expired): it serves no workspace.
    #[error("node has lost its lease and is not serving")]
    Fenced,

    #[error("workspace {workspace_id} is not provisioned on this node")]
    NotHeld { workspace_id: WorkspaceId },

    /// The replica names another generation than this node holds.
    #[error("workspace {workspace_id} is at generation {held} on this node, not {expected}")]
    WrongGeneration { workspace_id: WorkspaceId, held: u64, expected: u64 },

    /// The node has seen a newer generation of the workspace than the caller names: the
    /// caller's placement was superseded (it lost its lock, or its record is stale).
    #[error(
        "workspace {workspace_id}: generation {asked} is stale on this node, which has seen generation {newest}; \
         a newer placement superseded it"
    )]
    StaleGeneration { workspace_id: WorkspaceId, newest: u64, asked: u64 },

    /// The workspace is not held on this node, so a quarantined copy cannot be restored here.
    #[error("workspace {workspace_id} is not on this node; restore its quarantined copy on the node that holds it")]
    RestoreElsewhere { workspace_id: WorkspaceId },

    #[error("workspace {workspace_id} is released on this node")]
    Released { workspace_id: WorkspaceId },

    /// `--max-execs-per-workspace` execs already run in the workspace.
    #[error("concurrent execs per workspace exceeded: {attempted} > {max} (node --max-execs-per-workspace)")]
    TooManyExecs { attempted: u32, max: u32 },

    /// A spec or exec limit above the operator's ceiling; never satisfiable on this node.
    #[error("{limit} {requested} is above this node's ceiling {ceiling} (node {flag})")]
    AboveCeiling { limit: &'static str, flag: &'static str, requested: u64, ceiling: u64 },

    /// The node-wide budget of buffered exec output cannot cover this exec right now.
    #[error(
        "exec output budget of this node exhausted: the exec needs {wanted} bytes of buffer, {available} of {budget} \
         are free (node --exec-output-budget-bytes); retry later, stream the exec, or ask for less max_output_bytes"
    )]
    OutputBudgetExhausted { wanted: u64, available: u64, budget: u64 },

    /// A client stream did not start with its header; `rpc` is empty for the contract calls.
    #[error("the first {rpc}message must be a header")]
    MissingHeader { rpc: &'static str },

    #[error("the stream is empty; a header comes first")]
    EmptyStream,

    #[error("the workspace root cannot be removed; close the workspace instead")]
    RemoveRoot,

    /// The spawned provisioning task panicked or was cancelled.
    #[error("provision task failed: {reason}")]
    ProvisionTask { reason: String },

    /// A session, record or sharing call: those are the control plane's alone.
    #[error("served by the control plane, not by a node agent")]
    ReplicaOnly,
    /// A call without the control plane's credentials.
    #[error("node agents accept only the control plane's credentials")]
    Unauthenticated,

    /// The node has no snapshot store (`--snapshot-store`).
    #[error("this node has no snapshot store (--snapshot-store)")]
    SnapshotsDisabled,

    /// A snapshot or restore failed (the store, a corrupt blob, the workspace's files).
    #[error("workspace {workspace_id}: {what} failed: {reason}")]
    Snapshot { workspace_id: WorkspaceId, what: &'static str, reason: String },

    /// The inbound stream broke; its status is passed on as it is.
    #[error("{}", .0.message())]
    Stream(Status),
}

impl From<Status> for NodeError {
    fn from(status: Status) -> Self {
        Self::Stream(status)
    }
}

impl From<NodeError> for Status {
    fn from(error: NodeError) -> Status {
        use NodeError as E;
        let message = error.to_string();
        match error {
            E::Workspace(inner) => status_from_workspace_error(&inner),
            // A fenced node runs nothing: the call may be repeated once the node (or the
            // workspace's next placement) serves again, and the caller is told so.
            E::Fenced => berth_proto::meta::mark_retryable(ErrorKind::NodeFenced.attach(Status::unavailable(message))),
            E::StaleGeneration { .. } => ErrorKind::StaleGeneration.attach(Status::failed_precondition(message)),
            E::RestoreElsewhere { .. } => Status::failed_precondition(message),
            E::NotHeld { .. } | E::WrongGeneration { .. } | E::Released { .. } => {
                ErrorKind::WrongGeneration.attach(Status::failed_precondition(message))
            }
            E::TooManyExecs { .. } | E::OutputBudgetExhausted { .. } => {
                ErrorKind::LimitExceeded.attach(Status::resource_exhausted(message))
            }
            E::AboveCeiling { .. } => ErrorKind::LimitExceeded.attach(Status::invalid_argument(message)),
            E::MissingHeader { .. } | E::EmptyStream | E::RemoveRoot => Status::invalid_argument(message),
            E::ProvisionTask { .. } => Status::internal(message),
            E::Unauthenticated => Status::unauthenticated(message),
            E::ReplicaOnly => Status::unimplemented(message),
            E::SnapshotsDisabled => Status::failed_precondition(message),
            E::Snapshot { .. } => Status::failed_precondition(message),
            E::Stream(status) => status,
        }
    }
}

/// A workspace error as a status (for `map_err` on backend calls and stream items).
pub(crate) fn status(error: WorkspaceError) -> Status {
    NodeError::from(error).into()
}
