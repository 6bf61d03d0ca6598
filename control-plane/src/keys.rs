//! The registry key layout (docs/design.md §4.1). Every key is built here.

use berth_workspace::WorkspaceId;

/// Key builder under a configurable prefix (default `/berth`).
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Self {
        Self { prefix: prefix.trim_end_matches('/').to_owned() }
    }

    /// The prefix every key starts with (no trailing `/`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn workspaces_prefix(&self) -> String {
        format!("{}/workspaces/", self.prefix)
    }
    pub fn workspace(&self, id: &WorkspaceId) -> String {
        format!("{}/workspaces/{}", self.prefix, id)
    }
    pub fn locks_prefix(&self) -> String {
        format!("{}/locks/", self.prefix)
    }
    pub fn lock(&self, id: &WorkspaceId) -> String {
        format!("{}/locks/{}", self.prefix, id)
    }
    /// `/tombstones/<id>`: a deleted workspace whose copies are not all confirmed gone.
    pub fn tombstone(&self, id: &str) -> String {
        format!("{}/tombstones/{}", self.prefix, id)
    }
    pub fn sessions_prefix(&self) -> String {
        format!("{}/sessions/", self.prefix)
    }
    pub fn session(&self, id: &str) -> String {
        format!("{}/sessions/{}", self.prefix, id)
    }
    pub fn nodes_prefix(&self) -> String {
        format!("{}/nodes/", self.prefix)
    }
    pub fn node(&self, id: &str) -> String {
        format!("{}/nodes/{}", self.prefix, id)
    }
    pub fn drains_prefix(&self) -> String {
        format!("{}/drains/", self.prefix)
    }
    /// A node's drain: present (no lease) from `nodes drain` until `nodes undrain`.
    pub fn drain(&self, node_id: &str) -> String {
        format!("{}/drains/{}", self.prefix, node_id)
    }
    pub fn replicas_prefix(&self) -> String {
        format!("{}/replicas/", self.prefix)
    }
    pub fn replica(&self, id: &str) -> String {
        format!("{}/replicas/{}", self.prefix, id)
    }
    pub fn leader(&self, role: &str) -> String {
        format!("{}/leader/{}", self.prefix, role)
    }

    /// The id part of a key under `prefix`, if the key is directly under it.
    pub fn id_of<'k>(key: &'k str, prefix: &str) -> Option<&'k str> {
        key.strip_prefix(prefix).filter(|rest| !rest.is_empty() && !rest.contains('/'))
    }
}

impl Default for Keys {
    fn default() -> Self {
        Self::new("/berth")
    }
}
