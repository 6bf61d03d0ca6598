//! Control-plane errors and their one mapping to gRPC statuses.

use std::sync::Arc;

use berth_proto::convert::status_from_workspace_error;
use berth_proto::meta::mark_retryable;
use berth_workspace::WorkspaceError;
use tonic::Status;

use crate::registry::RegistryError;

/// What failed in a control-plane operation. `Clone` so one bind result can be handed to
/// every waiter of a single-flight.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ControlPlaneError {
    #[error("workspace {0} not found")]
    WorkspaceNotFound(String),

    #[error("session {0} not found")]
    SessionNotFound(String),

    /// The session id is bound to another user, agent or workspace.
    #[error("session {session_id} already exists with another binding")]
    SessionConflict { session_id: String },

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("no live node offers backend {backend:?}{selector}")]
    NoLiveNode { backend: String, selector: String },

    /// Provisioning on a node failed; the node's status says why.
    #[error("provisioning workspace {workspace_id} on node {node_id} failed: {status_message}")]
    ProvisionFailed { workspace_id: String, node_id: String, code: tonic::Code, status_message: String },

    /// The workspace's last provisioning failed (seen by a replica that waited for another).
    #[error("workspace {workspace_id} failed: {reason}")]
    WorkspaceFailed { workspace_id: String, reason: String },

    #[error("binding workspace {workspace_id} did not finish within {millis} ms")]
    BindTimeout { workspace_id: String, millis: u64 },

    /// This replica's lease expired while it held the bind lock; another replica may bind.
    #[error("lost the bind lock of workspace {workspace_id}; retry")]
    LostLock { workspace_id: String },

    #[error(transparent)]
    Registry(Arc<RegistryError>),

    /// A status from a node agent or a workspace operation, passed on as it is.
    #[error("{}", .0.message())]
    Status(Status),

    #[error("control plane is shutting down")]
    ShuttingDown,

    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T, E = ControlPlaneError> = std::result::Result<T, E>;

impl From<RegistryError> for ControlPlaneError {
    fn from(error: RegistryError) -> Self {
        Self::Registry(Arc::new(error))
    }
}

impl From<WorkspaceError> for ControlPlaneError {
    fn from(error: WorkspaceError) -> Self {
        Self::Status(status_from_workspace_error(&error))
    }
}

impl From<Status> for ControlPlaneError {
    fn from(status: Status) -> Self {
        Self::Status(status)
    }
}

impl From<ControlPlaneError> for Status {
    fn from(error: ControlPlaneError) -> Status {
        use ControlPlaneError as E;
        let message = error.to_string();
        match error {
            E::WorkspaceNotFound(_) | E::SessionNotFound(_) => Status::not_found(message),
            E::SessionConflict { .. } => Status::already_exists(message),
            E::InvalidArgument(_) => Status::invalid_argument(message),
            E::NoLiveNode { .. } => mark_retryable(Status::unavailable(message)),
            E::ProvisionFailed { code, .. } => match code {
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => {
                    mark_retryable(Status::unavailable(message))
                }
                tonic::Code::InvalidArgument => Status::invalid_argument(message),
                _ => Status::failed_precondition(message),
            },
            E::WorkspaceFailed { .. } => Status::failed_precondition(message),
            E::BindTimeout { .. } => Status::deadline_exceeded(message),
            E::LostLock { .. } => mark_retryable(Status::aborted(message)),
            E::Registry(inner) => match &*inner {
                RegistryError::Corrupt { .. } => Status::internal(message),
                _ => mark_retryable(Status::unavailable(message)),
            },
            E::Status(status) => status,
            E::ShuttingDown => mark_retryable(Status::unavailable(message)),
            E::Internal(_) => Status::internal(message),
        }
    }
}
