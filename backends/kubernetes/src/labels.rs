//! The labels and annotations every Berth object (Pod, PVC) carries, and its name.
//!
//! Label values are at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends,
//! so:
//! - `berth.cluster`: the first 32 hex digits of SHA-256 of the cluster's key prefix — a
//!   driver lists, adopts and deletes only objects with its own;
//! - `berth.workspace.id`: the workspace id itself when it is a valid label value, else
//!   `h-` and the first 40 hex digits of its SHA-256; the annotation of the same name holds
//!   the id in full, and a lookup accepts an object only when both agree;
//! - `berth.owner`: the owner the same way (label, annotation with the full value);
//! - `berth.generation`: the placement's generation (label and annotation), written at
//!   adoption with the PVC's `resourceVersion` as the compare — the fence.
//!
//! Names: the PVC of a workspace is `berth-<24 hex of SHA-256(prefix, id)>`, one per
//! workspace and cluster by construction (a second create is 409); its Pod adds the
//! generation (`…-g<generation>`), so a newer placement's Pod never shares a name with a
//! Pod an older gateway still talks to.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use berth_workspace::id::WorkspaceId;

pub const CLUSTER: &str = "berth.cluster";
pub const WORKSPACE: &str = "berth.workspace.id";
pub const OWNER: &str = "berth.owner";
pub const GENERATION: &str = "berth.generation";
/// `app.kubernetes.io/managed-by: berth` on everything (operators' tooling).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "berth");

fn digest(text: &str, digits: usize) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))[..digits].to_owned()
}

pub fn cluster_value(prefix: &str) -> String {
    digest(prefix, 32)
}

/// Whether `text` can be a label value as it is.
pub fn valid_label_value(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
        && text.as_bytes()[0].is_ascii_alphanumeric()
        && text.as_bytes()[text.len() - 1].is_ascii_alphanumeric()
}

/// A value as a label: itself when it fits, else `h-` + a hash of it.
pub fn label_value(text: &str) -> String {
    if valid_label_value(text) { text.to_owned() } else { format!("h-{}", digest(text, 40)) }
}

/// The name of a workspace's PVC (and the stem of its Pods' names).
pub fn volume_name(prefix: &str, id: &WorkspaceId) -> String {
    format!("berth-{}", digest(&format!("{prefix}\0{}", id.as_str()), 24))
}

pub fn pod_name(prefix: &str, id: &WorkspaceId, generation: u64) -> String {
    format!("{}-g{generation}", volume_name(prefix, id))
}

/// Labels and annotations of a workspace's objects.
pub fn for_workspace(
    prefix: &str,
    id: &WorkspaceId,
    owner: &str,
    generation: u64,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut labels = BTreeMap::from([
        (CLUSTER.to_owned(), cluster_value(prefix)),
        (WORKSPACE.to_owned(), label_value(id.as_str())),
        (GENERATION.to_owned(), generation.to_string()),
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
    ]);
    let mut annotations = BTreeMap::from([
        (WORKSPACE.to_owned(), id.as_str().to_owned()),
        (GENERATION.to_owned(), generation.to_string()),
    ]);
    if !owner.is_empty() {
        labels.insert(OWNER.to_owned(), label_value(owner));
        annotations.insert(OWNER.to_owned(), owner.to_owned());
    }
    (labels, annotations)
}

/// The selector of this cluster's objects of one workspace.
pub fn selector(prefix: &str, id: &WorkspaceId) -> String {
    format!("{CLUSTER}={},{WORKSPACE}={}", cluster_value(prefix), label_value(id.as_str()))
}

pub fn cluster_selector(prefix: &str) -> String {
    format!("{CLUSTER}={}", cluster_value(prefix))
}

/// The workspace an object names, when its label and annotation agree (a hashed label
/// must be the hash of the annotation; a plain one must equal it, or stand alone).
pub fn workspace_id(
    labels: Option<&BTreeMap<String, String>>,
    annotations: Option<&BTreeMap<String, String>>,
) -> Option<WorkspaceId> {
    let label = labels?.get(WORKSPACE)?;
    match annotations.and_then(|annotations| annotations.get(WORKSPACE)) {
        Some(full) if label_value(full) == *label => WorkspaceId::new(full.clone()).ok(),
        Some(_) => None,
        None if !label.starts_with("h-") => WorkspaceId::new(label.clone()).ok(),
        None => None,
    }
}

/// The generation an object carries (the annotation, else the label; 0 when missing).
pub fn generation(labels: Option<&BTreeMap<String, String>>, annotations: Option<&BTreeMap<String, String>>) -> u64 {
    annotations
        .and_then(|annotations| annotations.get(GENERATION))
        .or_else(|| labels.and_then(|labels| labels.get(GENERATION)))
        .and_then(|value| value.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_ids_hash_into_labels_and_round_trip() {
        let long = WorkspaceId::new(format!("ws-{}@team:x", "a".repeat(116))).unwrap();
        let short = WorkspaceId::new("ws-1").unwrap();
        for id in [&long, &short] {
            let (labels, annotations) = for_workspace("/berth/prod", id, "alice@example.com", 42);
            for (key, value) in &labels {
                assert!(valid_label_value(value), "{key}={value}");
            }
            assert_eq!(workspace_id(Some(&labels), Some(&annotations)).as_ref(), Some(id));
            assert_eq!(generation(Some(&labels), Some(&annotations)), 42);
        }
        let (labels, mut annotations) = for_workspace("/p", &long, "", 1);
        annotations.insert(WORKSPACE.into(), "ws-other".into());
        assert_eq!(workspace_id(Some(&labels), Some(&annotations)), None, "label and annotation must agree");
        assert!(volume_name("/a", &short).len() <= 63 - 22);
        assert!(crate::config::dns_label(&pod_name("/a", &short, u64::MAX)));
        assert_ne!(volume_name("/a", &short), volume_name("/b", &short));
    }
}
