//! Per-node credentials between replicas and node agents (docs/design.md §5, "Credentials").
//!
//! Replicas hold one **node credential key** (`--node-credential-key-file`). From it every
//! node's credential is derived, `berth-node.<node id>.<hex HMAC-SHA256(key, "berth-node/v1/<node id>")>`,
//! and handed to that node alone (`berth node-credential`, or `deploy/certs/make-dev-certs.sh`).
//! A node presents it on its heartbeats; the replica recomputes it from the key and the node
//! id it names, so a node can register only as itself, and no node can make another's.
//!
//! Replica → node calls carry the **replica credential for that node**,
//! `berth-replica.<node id>.<hex HMAC-SHA256(node credential, "berth-replica/v1")>`. A node
//! checks it against the value its own credential gives; replicas make it from the key. A
//! node can therefore compute the replica credential for itself only: nothing a node holds or
//! sees is accepted by another node, and no replica credential is a node credential (the
//! prefixes differ and each verifies only under its own derivation).
//!
//! The older shared node secret (`--shared-node-secret-file`, one value for every replica and
//! node) stays for loopback development; beyond loopback it is refused.

use std::fmt;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::auth::Secret;

const NODE_PREFIX: &str = "berth-node.";
const REPLICA_PREFIX: &str = "berth-replica.";
const NODE_CONTEXT: &str = "berth-node/v1/";
const REPLICA_CONTEXT: &str = "berth-replica/v1";

/// Why a credential file or value was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    #[error("reading credential file {path}: {reason}")]
    Read { path: String, reason: String },
    #[error("credential file {path}: {reason}")]
    Invalid { path: String, reason: String },
    #[error("credential file {path} is for node {found:?}, this node is {expected:?}")]
    WrongNode { path: String, found: String, expected: String },
}

/// The key replicas derive node and replica credentials from. Never given to a node.
#[derive(Clone)]
pub struct NodeCredentialKey(Secret);

impl NodeCredentialKey {
    pub fn new(secret: Secret) -> Result<Self, String> {
        secret.validate()?;
        Ok(Self(secret))
    }

    /// A fresh random key (`berth up`).
    pub fn random() -> Self {
        Self(Secret::random())
    }

    pub fn from_file(path: &Path) -> Result<Self, String> {
        Self::new(Secret::from_file(path)?)
    }

    /// The credential of node `node_id`: what its `--node-credential-file` holds.
    pub fn node_credential(&self, node_id: &str) -> NodeCredential {
        let mac = hmac_sha256(self.0.expose().as_bytes(), format!("{NODE_CONTEXT}{node_id}").as_bytes());
        NodeCredential {
            node_id: node_id.to_owned(),
            secret: Secret::new(format!("{NODE_PREFIX}{node_id}.{}", hex(&mac))),
        }
    }

    /// The node id a presented node credential proves, or `None` if it was not derived from
    /// this key (compared in constant time).
    pub fn verify_node(&self, presented: &str) -> Option<String> {
        let node_id = node_id_of(presented, NODE_PREFIX)?;
        self.node_credential(node_id).secret.matches(presented).then(|| node_id.to_owned())
    }

    /// What a replica presents when it calls node `node_id`.
    pub fn replica_credential(&self, node_id: &str) -> Secret {
        self.node_credential(node_id).replica_credential()
    }
}

impl fmt::Debug for NodeCredentialKey {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("NodeCredentialKey(<redacted>)")
    }
}

/// One node's own credential (`--node-credential-file`).
#[derive(Clone)]
pub struct NodeCredential {
    node_id: String,
    secret: Secret,
}

impl NodeCredential {
    /// Parses a credential value (`berth-node.<id>.<hex>`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let node_id = node_id_of(text, NODE_PREFIX)
            .ok_or_else(|| "not a node credential (berth-node.<node id>.<64 hex digits>)".to_owned())?;
        Ok(Self { node_id: node_id.to_owned(), secret: Secret::new(text) })
    }

    /// Reads the credential file of node `node_id`; one made for another node is refused.
    pub fn from_file(path: &Path, node_id: &str) -> Result<Self, CredentialError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|error| CredentialError::Read { path: shown.clone(), reason: error.to_string() })?;
        let credential =
            Self::parse(&text).map_err(|reason| CredentialError::Invalid { path: shown.clone(), reason })?;
        if credential.node_id != node_id {
            return Err(CredentialError::WrongNode {
                path: shown,
                found: credential.node_id,
                expected: node_id.to_owned(),
            });
        }
        Ok(credential)
    }

    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    /// Presented on heartbeats.
    pub fn secret(&self) -> &Secret {
        &self.secret
    }

    /// The replica credential this node accepts (and no other node does).
    pub fn replica_credential(&self) -> Secret {
        let mac = hmac_sha256(self.secret.expose().as_bytes(), REPLICA_CONTEXT.as_bytes());
        Secret::new(format!("{REPLICA_PREFIX}{}.{}", self.node_id, hex(&mac)))
    }

    /// Whether `presented` is the replica credential for this node (constant time).
    pub fn accepts_replica(&self, presented: &str) -> bool {
        self.replica_credential().matches(presented)
    }
}

impl fmt::Debug for NodeCredential {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "NodeCredential({}, <redacted>)", self.node_id)
    }
}

/// The node id inside `<prefix><id>.<64 hex>`.
fn node_id_of<'a>(presented: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = presented.strip_prefix(prefix)?;
    let (node_id, mac) = rest.rsplit_once('.')?;
    let well_formed = mac.len() == 64 && mac.bytes().all(|byte| byte.is_ascii_hexdigit());
    (well_formed && berth_workspace::validate_id("node id", node_id).is_ok()).then_some(node_id)
}

/// HMAC-SHA256 (RFC 2104) over the `sha2` the crate already uses.
fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    const BLOCK: usize = 64;
    let mut block = [0u8; BLOCK];
    if key.len() > BLOCK {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.map(|key_byte| key_byte ^ byte);
    let inner = Sha256::new().chain_update(pad(0x36)).chain_update(message).finalize();
    Sha256::new().chain_update(pad(0x5c)).chain_update(inner).finalize().into()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231() {
        // Test case 2 of RFC 4231.
        let mac = hmac_sha256(b"Jefe", b"what do ya want for nothing?");
        assert_eq!(hex(&mac), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
        // Test case 6: a key longer than the block is hashed first.
        let mac = hmac_sha256(&[0xaa; 131], b"Test Using Larger Than Block-Size Key - Hash Key First");
        assert_eq!(hex(&mac), "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    }

    #[test]
    fn a_node_credential_proves_one_node_and_nothing_else() {
        let key = NodeCredentialKey::new(Secret::new("cluster-key-0123456789abcdef")).unwrap();
        let a = key.node_credential("node-a");
        let b = key.node_credential("node-b");
        assert_eq!(key.verify_node(a.secret().expose()).as_deref(), Some("node-a"));
        assert_eq!(key.verify_node(b.secret().expose()).as_deref(), Some("node-b"));
        // Renaming the id inside a credential breaks it.
        let renamed = a.secret().expose().replace("node-a", "node-b");
        assert_eq!(key.verify_node(&renamed), None);
        // Another cluster's key, a replica credential, garbage: none is a node credential.
        let other = NodeCredentialKey::new(Secret::new("another-key-0123456789abcdef")).unwrap();
        assert_eq!(other.verify_node(a.secret().expose()), None);
        assert_eq!(key.verify_node(key.replica_credential("node-a").expose()), None);
        assert_eq!(key.verify_node("berth-node.node-a.zz"), None);
        // Replica credentials: each node accepts exactly its own, not its own node credential.
        assert!(a.accepts_replica(key.replica_credential("node-a").expose()));
        assert!(!a.accepts_replica(key.replica_credential("node-b").expose()));
        assert!(!b.accepts_replica(a.replica_credential().expose()));
        assert!(!b.accepts_replica(a.secret().expose()));
        assert!(!a.accepts_replica(a.secret().expose()));
        // What a node file holds parses back; the debug form names the node only.
        let parsed = NodeCredential::parse(&format!("{}\n", a.secret().expose())).unwrap();
        assert_eq!(parsed.node_id(), "node-a");
        assert!(!format!("{parsed:?} {key:?}").contains(&a.secret().expose()[20..]));
        assert!(NodeCredential::parse("secret").is_err());
    }

    #[test]
    fn a_credential_file_of_another_node_is_refused() {
        let dir = std::env::temp_dir().join(format!("berth-cred-{:08x}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("node-a.credential");
        let key = NodeCredentialKey::random();
        std::fs::write(&path, key.node_credential("node-a").secret().expose()).unwrap();
        assert_eq!(NodeCredential::from_file(&path, "node-a").unwrap().node_id(), "node-a");
        let error = NodeCredential::from_file(&path, "node-b").unwrap_err();
        assert!(matches!(error, CredentialError::WrongNode { .. }), "{error}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
