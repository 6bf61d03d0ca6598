//! The metadata every Berth sandbox carries at E2B. E2B sets metadata at create only (the
//! API has no call to change it), so the generation of a later adoption is recorded in a
//! file inside the sandbox (`E2bConfig::generation_file`), written at adoption and checked
//! before every adoption and every mutating call; the metadata's generation is the one the
//! sandbox was created at, the fallback when the file is missing.

use std::collections::BTreeMap;

use berth_workspace::driver::LabelledSandbox;
use berth_workspace::id::WorkspaceId;

pub const WORKSPACE_ID: &str = "berth.workspace.id";
pub const GENERATION: &str = "berth.generation";
pub const OWNER: &str = "berth.owner";
/// The cluster's key prefix: lookups always filter on it.
pub const CLUSTER: &str = "berth.cluster";

/// Metadata of a new sandbox.
pub fn for_create(workspace_id: &WorkspaceId, generation: u64, owner: &str, cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (WORKSPACE_ID.to_owned(), workspace_id.as_str().to_owned()),
        (GENERATION.to_owned(), generation.to_string()),
        (OWNER.to_owned(), owner.to_owned()),
        (CLUSTER.to_owned(), cluster.to_owned()),
    ])
}

/// The metadata filter of one workspace's sandboxes in this cluster.
pub fn of_workspace(workspace_id: &WorkspaceId, cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (WORKSPACE_ID.to_owned(), workspace_id.as_str().to_owned()),
        (CLUSTER.to_owned(), cluster.to_owned()),
    ])
}

/// The metadata filter of every sandbox of this cluster.
pub fn of_cluster(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(CLUSTER.to_owned(), cluster.to_owned())])
}

/// The generation a sandbox was created at (0 when missing or malformed).
pub fn generation(metadata: &BTreeMap<String, String>) -> u64 {
    metadata.get(GENERATION).and_then(|value| value.parse().ok()).unwrap_or(0)
}

/// The janitor's view of a listed sandbox; provider answers are untrusted, so an id that
/// does not validate is `None`.
pub fn labelled(provider_id: &str, metadata: &BTreeMap<String, String>, created_at_ms: i64) -> LabelledSandbox {
    LabelledSandbox {
        provider_id: provider_id.to_owned(),
        workspace_id: metadata.get(WORKSPACE_ID).and_then(|id| WorkspaceId::new(id).ok()),
        generation: generation(metadata),
        created_at_ms,
    }
}
