//! The metadata every Berth sandbox carries, and how a workspace id fits into it.
//!
//! OpenSandbox validates metadata as Kubernetes labels: values are at most 63 characters
//! of `[A-Za-z0-9._-]`, alphanumeric at both ends, and only create-time metadata is kept on
//! the Docker runtime's containers. So:
//!
//! - `berth.cluster`: the first 32 hex digits of SHA-256 of the cluster's key prefix — a
//!   driver lists, adopts and deletes only sandboxes with its own;
//! - `berth.workspace`: the first 40 hex digits of SHA-256 of the workspace id, the key
//!   lookups filter on;
//! - `berth.workspace.id.0`, `.1`, …: the id itself, hex-encoded in chunks of 62 digits (ids
//!   may hold `@` and `:` and be 128 bytes long), checked against the hash when read;
//! - `berth.owner`: the owner's user id the same way (hex, first 62 digits), informational;
//! - `berth.generation`: the placement's generation, rewritten (PATCH) at adoption.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use berth_workspace::id::WorkspaceId;

pub const CLUSTER: &str = "berth.cluster";
pub const WORKSPACE: &str = "berth.workspace";
pub const WORKSPACE_ID_CHUNK: &str = "berth.workspace.id.";
pub const OWNER: &str = "berth.owner";
pub const GENERATION: &str = "berth.generation";
const CHUNK: usize = 62;

fn digest(text: &str, digits: usize) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))[..digits].to_owned()
}

pub fn cluster_value(prefix: &str) -> String {
    digest(prefix, 32)
}

pub fn workspace_value(id: &WorkspaceId) -> String {
    digest(id.as_str(), 40)
}

/// The create-time metadata of a workspace's sandbox.
pub fn for_workspace(prefix: &str, id: &WorkspaceId, owner: &str, generation: u64) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::from([
        (CLUSTER.to_owned(), cluster_value(prefix)),
        (WORKSPACE.to_owned(), workspace_value(id)),
        (GENERATION.to_owned(), generation.to_string()),
    ]);
    let encoded = hex::encode(id.as_str());
    for (index, chunk) in encoded.as_bytes().chunks(CHUNK).enumerate() {
        labels.insert(format!("{WORKSPACE_ID_CHUNK}{index}"), String::from_utf8_lossy(chunk).into_owned());
    }
    if !owner.is_empty() {
        let owner = hex::encode(owner);
        labels.insert(OWNER.to_owned(), owner[..owner.len().min(CHUNK)].to_owned());
    }
    labels
}

/// The workspace id a sandbox's metadata names, when its chunks decode and match its hash.
pub fn workspace_id(metadata: &BTreeMap<String, String>) -> Option<WorkspaceId> {
    let mut encoded = String::new();
    for index in 0.. {
        match metadata.get(&format!("{WORKSPACE_ID_CHUNK}{index}")) {
            Some(chunk) => encoded.push_str(chunk),
            None => break,
        }
    }
    let bytes = hex::decode(encoded).ok()?;
    let id = WorkspaceId::new(String::from_utf8(bytes).ok()?).ok()?;
    (metadata.get(WORKSPACE) == Some(&workspace_value(&id))).then_some(id)
}

/// The `berth.generation` of a sandbox (0 when missing or unreadable).
pub fn generation(metadata: &BTreeMap<String, String>) -> u64 {
    metadata.get(GENERATION).and_then(|value| value.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_ids_round_trip_within_label_limits() {
        let id = WorkspaceId::new(format!("ws-{}@team:x", "a".repeat(116))).unwrap();
        let labels = for_workspace("/berth/prod", &id, "alice@example.com", 42);
        for (key, value) in &labels {
            assert!(value.len() <= 63, "{key}={value}");
            assert!(value.bytes().all(|byte| byte.is_ascii_alphanumeric()), "{key}={value}");
        }
        assert_eq!(workspace_id(&labels), Some(id.clone()));
        assert_eq!(generation(&labels), 42);
        let mut forged = labels.clone();
        forged.insert(WORKSPACE.into(), "0".repeat(40));
        assert_eq!(workspace_id(&forged), None, "a hash mismatch must not name a workspace");
        assert_ne!(cluster_value("/a"), cluster_value("/b"));
    }
}
