//! Control-plane errors and their one mapping to gRPC statuses: every status a replica
//! answers with is made by `From<ControlPlaneError> for Status` below (workspace errors
//! through berth-proto's `status_from_workspace_error`); handlers return this type and
//! convert with `?`.

use std::sync::Arc;

use berth_proto::convert::status_from_workspace_error;
use berth_proto::meta::{ErrorKind, mark_retryable};
use berth_workspace::WorkspaceError;
use tonic::Status;

use crate::auth::error::AuthError;
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

    /// A workspace operation or validation failed; mapped by berth-proto.
    #[error(transparent)]
    Workspace(Arc<WorkspaceError>),

    /// A client stream did not start with its header message.
    #[error("the first {rpc} message must be a header")]
    MissingHeader { rpc: &'static str },

    /// A client stream ended before its header message.
    #[error("the stream is empty; a header comes first")]
    EmptyStream,

    /// A client stream broke while it was piped to a node.
    #[error("client stream failed: {reason}")]
    ClientStreamFailed { reason: String },

    /// Another replica (or a bind on this one) holds the workspace's bind lock.
    #[error("workspace {workspace_id} is being bound or swept right now; retry")]
    LockBusy { workspace_id: String },

    /// The caller can see the object but may not do this to it.
    #[error("{principal} may not {what}")]
    PermissionDenied { principal: String, what: String },

    /// A service acting for users named two different users.
    #[error("user_id {requested:?} differs from the x-berth-act-as user {acting:?}")]
    ActAsMismatch { requested: String, acting: String },

    /// A node registration that cannot be served.
    #[error("{reason}")]
    BadRegistration { reason: String },

    /// This replica cannot renew a node's lease (etcd unreachable or too slow): the node
    /// must heartbeat elsewhere at once.
    #[error("replica cannot renew the lease of node {node_id}: {reason}")]
    NodeLeaseUnrenewable { node_id: String, reason: String },

    /// The connection to the node broke after the call was sent: the node may have run it,
    /// so it is not retried.
    #[error("the connection to the node broke after the call was sent; it may have run (not retried): {reason}")]
    OutcomeUnknown { reason: String },

    #[error("node {node_id} is not live and holds no workspace record")]
    NodeNotFound { node_id: String },

    /// A drain without `force` of a node whose workspaces' data would be lost.
    #[error(
        "draining node {node_id} would lose the data of {count} workspace(s) (without snapshots \
         to move them — a store on replicas and nodes, and another node taking snapshots — they are re-placed empty \
         on another node): {}{}; repeat with force (`berth nodes drain --force`) to drain anyway",
        named.join(", "),
        if *more > 0 { format!(" and {more} more") } else { String::new() }
    )]
    DrainLosesData { node_id: String, count: usize, named: Vec<String>, more: usize },

    #[error("bad node address {address:?}: {reason}")]
    BadNodeAddress { address: String, reason: String },

    #[error("node {address} serves TLS but this replica has no node TLS configured (--node-ca-cert)")]
    NodeTlsMissing { address: String },

    /// A per-user quota of this replica is used up (see `quota.rs`).
    #[error("user {user} is at the quota of {max} {quota} (replica {flag}); finish or close some first")]
    QuotaExceeded { user: String, quota: &'static str, max: u32, flag: &'static str },

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

    /// The node has seen a newer placement of the workspace than this bind's: another
    /// replica placed it meanwhile (this one lost its lock, or read a stale record).
    #[error("workspace {workspace_id} was placed again meanwhile ({detail}); retry")]
    BindSuperseded { workspace_id: String, detail: String },

    /// The node holding the workspace's files is not live; they are kept for it until the
    /// lost-node grace runs out, after which the workspace is placed again, empty.
    #[error(
        "workspace {workspace_id} is on node {node_id}, which has not been live for {absent_secs} s; its files are \
         kept there: retry (after {grace_secs} s without the node it is re-created empty elsewhere)"
    )]
    NodeAway { workspace_id: String, node_id: String, absent_secs: u64, grace_secs: u64 },

    /// This replica's lease expired while it held the bind lock; another replica may bind.
    #[error("lost the bind lock of workspace {workspace_id}; retry")]
    LostLock { workspace_id: String },

    #[error(transparent)]
    Registry(Arc<RegistryError>),

    /// A public call whose credentials did not authenticate.
    #[error(transparent)]
    Auth(#[from] AuthError),

    /// A NodeService call without the node credential.
    #[error("node credentials missing or wrong")]
    NodeCredentials,

    /// A node's credential names another node id than the one it registers as.
    #[error("this node credential is node {authenticated}'s; it may not register or heartbeat as node {claimed}")]
    NodeIdentityMismatch { authenticated: String, claimed: String },

    /// Another process holds the node id: its record lives on a lease this registration
    /// does not present. Retry once that lease has expired (at most the node lease TTL).
    #[error(
        "node id {node_id} is held by a live registration on another lease; a second process may not take it over \
         (it frees up within the node lease ttl after its holder stops)"
    )]
    NodeIdInUse { node_id: String },

    /// A handler found no authenticated caller: the server was built without the auth layer.
    #[error("no authenticated caller on this request")]
    NoCaller,

    /// A status from a node agent or a workspace operation, passed on as it is.
    #[error("{}", .0.message())]
    Status(Status),

    #[error("control plane is shutting down")]
    ShuttingDown,

    /// The replica's view has not been confirmed current by the registry for longer than
    /// the bound (e.g. its etcd member lost the majority): it refuses to route from it.
    #[error(
        "this replica's view of {prefix} is stale ({silent_ms} ms without word from the registry, bound {bound_ms} ms); retry, possibly on another replica"
    )]
    ViewStale { prefix: String, silent_ms: u64, bound_ms: u64 },

    /// A snapshot taken by a node holding an older (or another) placement: it is never
    /// recorded as the workspace's latest.
    #[error(
        "snapshot {snapshot_id} of workspace {workspace_id} was taken at generation {snapshot_generation} on node \
         {node_id}, but the workspace is at generation {record_generation}{}: refused as its latest",
        if record_node.is_empty() { String::new() } else { format!(" on node {record_node}") }
    )]
    SnapshotFenced {
        workspace_id: String,
        snapshot_id: String,
        node_id: String,
        snapshot_generation: u64,
        record_generation: u64,
        record_node: String,
    },

    /// No snapshot store is configured (`--snapshot-store`) where the call needs one.
    #[error("{what}: no snapshot store is configured (--snapshot-store on replicas and nodes)")]
    SnapshotsDisabled { what: String },

    /// The snapshot store failed (listing, deleting, collecting garbage).
    #[error("snapshot store: {reason}")]
    SnapshotStore { reason: String },

    #[error("snapshot {snapshot_id} of workspace {workspace_id} not found")]
    SnapshotNotFound { workspace_id: String, snapshot_id: String },

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
        Self::Workspace(Arc::new(error))
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
            E::Workspace(inner) => status_from_workspace_error(&inner),
            E::MissingHeader { .. } | E::EmptyStream | E::ActAsMismatch { .. } | E::BadRegistration { .. } => {
                Status::invalid_argument(message)
            }
            E::ClientStreamFailed { .. } => Status::aborted(message),
            E::LockBusy { .. } => mark_retryable(Status::aborted(message)),
            E::PermissionDenied { .. } => Status::permission_denied(message),
            E::NodeNotFound { .. } => Status::not_found(message),
            E::DrainLosesData { .. } | E::NodeTlsMissing { .. } => Status::failed_precondition(message),
            E::BadNodeAddress { .. } => Status::internal(message),
            E::NoLiveNode { .. } => mark_retryable(Status::unavailable(message)),
            E::NodeLeaseUnrenewable { .. } => Status::unavailable(message),
            // Not UNAVAILABLE: clients retry that, and a retry could run the call twice.
            E::OutcomeUnknown { .. } => Status::unknown(message),
            E::QuotaExceeded { .. } => ErrorKind::LimitExceeded.attach(Status::resource_exhausted(message)),
            E::ProvisionFailed { code, .. } => match code {
                // A spec over a node's ceiling is the node's INVALID_ARGUMENT; its message names
                // the limit, the value and the ceiling.
                tonic::Code::InvalidArgument => Status::invalid_argument(message),
                tonic::Code::ResourceExhausted => Status::resource_exhausted(message),
                tonic::Code::Unavailable | tonic::Code::DeadlineExceeded => {
                    mark_retryable(Status::unavailable(message))
                }
                _ => Status::failed_precondition(message),
            },
            E::WorkspaceFailed { .. } => Status::failed_precondition(message),
            E::BindTimeout { .. } => Status::deadline_exceeded(message),
            E::LostLock { .. } | E::BindSuperseded { .. } => mark_retryable(Status::aborted(message)),
            E::NodeAway { .. } => mark_retryable(Status::unavailable(message)),
            E::Registry(inner) => match &*inner {
                RegistryError::Corrupt { .. } => Status::internal(message),
                _ => mark_retryable(Status::unavailable(message)),
            },
            E::Auth(AuthError::MayNotActAs { .. }) => Status::permission_denied(message),
            E::Auth(AuthError::BadActAs(_)) => Status::invalid_argument(message),
            E::Auth(_) | E::NodeCredentials | E::NoCaller => Status::unauthenticated(message),
            E::NodeIdentityMismatch { .. } => Status::permission_denied(message),
            E::NodeIdInUse { .. } => Status::already_exists(message),
            E::Status(status) => status,
            E::ShuttingDown | E::ViewStale { .. } => mark_retryable(Status::unavailable(message)),
            E::SnapshotFenced { .. } => ErrorKind::StaleGeneration.attach(Status::failed_precondition(message)),
            E::SnapshotsDisabled { .. } => Status::failed_precondition(message),
            E::SnapshotStore { .. } => mark_retryable(Status::unavailable(message)),
            E::SnapshotNotFound { .. } => Status::not_found(message),
            E::Internal(_) => Status::internal(message),
        }
    }
}
