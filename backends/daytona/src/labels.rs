//! The labels every Berth sandbox carries at Daytona. Labels can be replaced
//! (`PUT /sandbox/{id}/labels`), so an adoption writes its generation there too; the
//! record file inside the sandbox (`config::generation_file`) is what every spawn and
//! write checks in the same call, so a superseded gateway is refused even between label
//! reads.

use std::collections::BTreeMap;

use berth_workspace::driver::LabelledSandbox;
use berth_workspace::id::WorkspaceId;

pub const WORKSPACE_ID: &str = "berth.workspace.id";
pub const GENERATION: &str = "berth.generation";
pub const OWNER: &str = "berth.owner";
/// The cluster's key prefix: lookups always filter on it.
pub const CLUSTER: &str = "berth.cluster";

/// Labels of a sandbox at `generation` (a new one, or an adopted one's replacement set).
pub fn of_placement(
    workspace_id: &WorkspaceId,
    generation: u64,
    owner: &str,
    cluster: &str,
) -> BTreeMap<String, String> {
    BTreeMap::from([
        (WORKSPACE_ID.to_owned(), workspace_id.as_str().to_owned()),
        (GENERATION.to_owned(), generation.to_string()),
        (OWNER.to_owned(), owner.to_owned()),
        (CLUSTER.to_owned(), cluster.to_owned()),
    ])
}

/// The label filter of one workspace's sandboxes in this cluster.
pub fn of_workspace(workspace_id: &WorkspaceId, cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        (WORKSPACE_ID.to_owned(), workspace_id.as_str().to_owned()),
        (CLUSTER.to_owned(), cluster.to_owned()),
    ])
}

/// The label filter of every sandbox of this cluster.
pub fn of_cluster(cluster: &str) -> BTreeMap<String, String> {
    BTreeMap::from([(CLUSTER.to_owned(), cluster.to_owned())])
}

/// The generation a sandbox's labels name (0 when missing or malformed).
pub fn generation(labels: &BTreeMap<String, String>) -> u64 {
    labels.get(GENERATION).and_then(|value| value.parse().ok()).unwrap_or(0)
}

/// The janitor's view of a listed sandbox; provider answers are untrusted, so an id that
/// does not validate is `None`.
pub fn labelled(provider_id: &str, labels: &BTreeMap<String, String>, created_at_ms: i64) -> LabelledSandbox {
    LabelledSandbox {
        provider_id: provider_id.to_owned(),
        workspace_id: labels.get(WORKSPACE_ID).and_then(|id| WorkspaceId::new(id).ok()),
        generation: generation(labels),
        created_at_ms,
    }
}
