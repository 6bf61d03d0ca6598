//! Networked Docker workspaces: the container is created with `--network none` and, once
//! started, its network namespace gets pasta and the node's address policy
//! ([`berth_backend_host::netns`], the same code as bubblewrap's): attached by the
//! container's init pid as `/run/netns/berth-dk-<hash>`, re-attached on every provision
//! that finds it gone or stale (a restarted container has a new namespace), removed at
//! release and destroy. The container has `cap_drop: ALL`, so it cannot change the rules.

use berth_backend_host::netns::SandboxNetworks;
use berth_workspace::id::WorkspaceId;

/// Name of a workspace's namespace: unique per node and workspace, like the container's.
pub fn netns_name(node_id: &str, workspace_id: &WorkspaceId) -> String {
    SandboxNetworks::name_for("dk", super::config::container_name(node_id, workspace_id).as_bytes())
}
