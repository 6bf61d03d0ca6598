//! Placement: which live node gets a workspace (docs/design.md §4.3).
//!
//! Among live, non-draining nodes that offer the backend and match the selector: the node
//! that already holds the workspace's data if it qualifies, else the least loaded. Load is
//! the node's last reported workspace count plus what this replica placed there since that
//! report, so a burst of binds does not pile onto one node between heartbeats. Ties are
//! broken by rendezvous hashing of (workspace, node), which spreads equal nodes evenly and
//! identically on every replica.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

use crate::error::ControlPlaneError;
use crate::records::NodeRecord;
use crate::view::ReplicaView;

/// Spec labels with this prefix select nodes: `berth.node/zone=a` needs node label `zone=a`.
pub const NODE_SELECTOR_PREFIX: &str = "berth.node/";

#[derive(Default)]
pub struct Placement {
    /// node id -> (mod revision of the node record seen, placements since then).
    recent: Mutex<HashMap<String, (i64, u32)>>,
}

impl Placement {
    pub fn new() -> Self {
        Self::default()
    }

    /// Picks a node for `workspace_id`. `backend` empty means "any node, its default" — only
    /// a node whose default is sandboxed when `sandboxed_default_only` (a caller without the
    /// grant for unsandboxed backends must not land on one by naming none).
    pub fn choose(
        &self,
        view: &ReplicaView,
        workspace_id: &str,
        backend: &str,
        labels: &BTreeMap<String, String>,
        prefer: Option<&str>,
        sandboxed_default_only: bool,
    ) -> Result<Arc<NodeRecord>, ControlPlaneError> {
        let selector: Vec<(&str, &str)> = labels
            .iter()
            .filter_map(|(key, value)| key.strip_prefix(NODE_SELECTOR_PREFIX).map(|key| (key, value.as_str())))
            .collect();
        let eligible = |node: &NodeRecord| {
            // The drain key, not the node record's `draining` copy of it: the record is
            // rewritten only every few seconds, and an undrain must take effect at once.
            !view.is_draining(&node.node_id)
                && (if backend.is_empty() {
                    !sandboxed_default_only || !berth_proto::backends::is_unsandboxed(&node.default_backend)
                } else {
                    node.backends.iter().any(|offered| offered == backend)
                })
                && selector.iter().all(|(key, value)| node.labels.get(*key).map(String::as_str) == Some(*value))
        };
        let has_room =
            |node: &NodeRecord| node.capacity_workspaces == 0 || node.load.workspaces < node.capacity_workspaces;
        let entries = view.nodes.all();
        // The node holding the workspace's data takes it back even when full: its count
        // already includes this workspace, and placing it elsewhere would leave it empty.
        if let Some(preferred) = prefer
            && let Some(entry) = entries.iter().find(|entry| entry.record.node_id == preferred)
            && eligible(&entry.record)
        {
            self.note_placement(&entry.record.node_id, entry.mod_revision);
            return Ok(Arc::clone(&entry.record));
        }
        let recent = self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let best = entries
            .iter()
            .filter(|entry| eligible(&entry.record) && has_room(&entry.record))
            .map(|entry| {
                let placed_since = match recent.get(&entry.record.node_id) {
                    Some((seen, count)) if *seen == entry.mod_revision => *count,
                    _ => 0,
                };
                let load = entry.record.load.workspaces + placed_since;
                (load, rendezvous(workspace_id, &entry.record.node_id), entry)
            })
            .min_by(|left, right| (left.0, left.1).cmp(&(right.0, right.1)))
            .map(|(_, _, entry)| entry.clone());
        drop(recent);
        match best {
            Some(entry) => {
                self.note_placement(&entry.record.node_id, entry.mod_revision);
                Ok(entry.record)
            }
            None => Err(ControlPlaneError::NoLiveNode {
                backend: match (backend.is_empty(), sandboxed_default_only) {
                    (false, _) => backend.into(),
                    (true, false) => "(node default)".into(),
                    (true, true) => "(node default, sandboxed)".into(),
                },
                selector: if selector.is_empty() {
                    String::new()
                } else {
                    format!(
                        " matching {}",
                        selector.iter().map(|(key, value)| format!("{key}={value}")).collect::<Vec<_>>().join(",")
                    )
                },
            }),
        }
    }

    fn note_placement(&self, node_id: &str, mod_revision: i64) {
        let mut recent = self.recent.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let slot = recent.entry(node_id.to_owned()).or_insert((mod_revision, 0));
        if slot.0 != mod_revision {
            *slot = (mod_revision, 0);
        }
        slot.1 += 1;
    }
}

fn rendezvous(workspace_id: &str, node_id: &str) -> [u8; 8] {
    let digest = Sha256::new().chain_update(workspace_id).chain_update([0]).chain_update(node_id).finalize();
    let mut prefix = [0u8; 8];
    prefix.copy_from_slice(&digest[..8]);
    prefix
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::keys::Keys;
    use crate::records::{self, DrainRecord, NodeLoadRecord, RECORD_VERSION};
    use crate::registry::RegistryRef;
    use crate::registry::embedded::EmbeddedRegistry;

    fn node(node_id: &str, workspaces: u32) -> NodeRecord {
        NodeRecord {
            version: RECORD_VERSION,
            node_id: node_id.into(),
            address: format!("http://{node_id}:7071"),
            backends: vec!["local".into()],
            default_backend: "local".into(),
            labels: BTreeMap::new(),
            capacity_workspaces: 0,
            lease_id: 0,
            node_generation: 1,
            replica_id: "r".into(),
            last_heartbeat_ms: 0,
            load: NodeLoadRecord { workspaces, ..NodeLoadRecord::default() },
            last_access_ms: BTreeMap::new(),
            workspace_use: BTreeMap::new(),
            draining: false,
            agent_version: String::new(),
            snapshots: false,
        }
    }

    /// A drained node is skipped even when it is the least loaded and holds the workspace's
    /// data; once undrained it is preferred again. Views are started after each change so
    /// they reflect it from their listing.
    #[tokio::test]
    async fn drained_nodes_get_no_placements_until_undrained() {
        let registry: RegistryRef = EmbeddedRegistry::new();
        let keys = Keys::new("/placement-test");
        registry.put(&keys.node("node-a"), records::encode(&node("node-a", 0))).await.unwrap();
        registry.put(&keys.node("node-b"), records::encode(&node("node-b", 5))).await.unwrap();
        let drain = DrainRecord {
            version: RECORD_VERSION,
            node_id: "node-a".into(),
            drained_by: "admin".into(),
            drained_at_ms: 0,
            released: Vec::new(),
        };
        registry.put(&keys.drain("node-a"), records::encode(&drain)).await.unwrap();
        let cancel = CancellationToken::new();
        let placement = Placement::new();

        let view = ReplicaView::start(Arc::clone(&registry), &keys, cancel.clone()).await.unwrap();
        assert!(view.is_draining("node-a") && !view.node_holds_workspaces("node-a"));
        let chosen = placement.choose(&view, "ws-1", "local", &BTreeMap::new(), Some("node-a"), true).unwrap();
        assert_eq!(chosen.node_id, "node-b");

        registry.delete(&keys.drain("node-a")).await.unwrap();
        let view = ReplicaView::start(Arc::clone(&registry), &keys, cancel.clone()).await.unwrap();
        assert!(view.node_holds_workspaces("node-a"));
        let chosen = placement.choose(&view, "ws-1", "local", &BTreeMap::new(), Some("node-a"), true).unwrap();
        assert_eq!(chosen.node_id, "node-a");
        cancel.cancel();
    }

    /// A caller without the grant for unsandboxed backends, naming no backend, never lands
    /// on a node whose default is `local`, however idle that node is.
    #[tokio::test]
    async fn an_unsandboxed_default_is_only_for_callers_who_may_use_it() {
        let registry: RegistryRef = EmbeddedRegistry::new();
        let keys = Keys::new("/placement-test");
        registry.put(&keys.node("node-local"), records::encode(&node("node-local", 0))).await.unwrap();
        let sandboxed = NodeRecord {
            backends: vec!["bubblewrap".into()],
            default_backend: "bubblewrap".into(),
            ..node("node-bwrap", 9)
        };
        registry.put(&keys.node("node-bwrap"), records::encode(&sandboxed)).await.unwrap();
        let cancel = CancellationToken::new();
        let view = ReplicaView::start(Arc::clone(&registry), &keys, cancel.clone()).await.unwrap();
        let placement = Placement::new();
        let chosen = placement.choose(&view, "ws-1", "", &BTreeMap::new(), None, true).unwrap();
        assert_eq!(chosen.node_id, "node-bwrap");
        let chosen = placement.choose(&view, "ws-1", "", &BTreeMap::new(), None, false).unwrap();
        assert_eq!(chosen.node_id, "node-local");
        cancel.cancel();
    }
}
