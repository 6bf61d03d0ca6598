//! How replicas and node agents prove themselves to each other (docs/design.md §5,
//! "Credentials"): per-node credentials derived from the replicas' node credential key, or
//! the older shared secret (loopback development only), or nothing (loopback tests).

use berth_proto::auth::Secret;
use berth_proto::credentials::NodeCredentialKey;

/// What a replica checks on `NodeService` calls and sends on node calls.
#[derive(Clone, Debug, Default)]
pub enum NodeAuth {
    /// No node credential: loopback only (checked at start).
    #[default]
    Open,
    /// One secret for every node and replica (`--shared-node-secret-file`): no per-node
    /// identity, loopback only.
    Shared(Secret),
    /// Per-node credentials derived from this key (`--node-credential-key-file`).
    Keyed(NodeCredentialKey),
}

/// Which node a `NodeService` caller proved to be; in the request extensions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AuthenticatedNode {
    /// Any node id (open or shared-secret clusters).
    Any,
    /// Exactly this node id (its own credential).
    Node(String),
}

impl NodeAuth {
    pub fn name(&self) -> &'static str {
        match self {
            Self::Open => "none",
            Self::Shared(_) => "shared-secret",
            Self::Keyed(_) => "per-node",
        }
    }

    /// Whether every node proves its own id.
    pub fn is_per_node(&self) -> bool {
        matches!(self, Self::Keyed(_))
    }

    /// Checks the bearer credential of a `NodeService` call.
    pub fn authenticate(&self, presented: Option<&str>) -> Option<AuthenticatedNode> {
        match self {
            Self::Open => Some(AuthenticatedNode::Any),
            Self::Shared(secret) => presented.filter(|value| secret.matches(value)).map(|_| AuthenticatedNode::Any),
            Self::Keyed(key) => presented.and_then(|value| key.verify_node(value)).map(AuthenticatedNode::Node),
        }
    }

    /// The credential this replica presents when it calls node `node_id`.
    pub fn outbound(&self, node_id: &str) -> Option<Secret> {
        match self {
            Self::Open => None,
            Self::Shared(secret) => Some(secret.clone()),
            Self::Keyed(key) => Some(key.replica_credential(node_id)),
        }
    }
}
