//! What the lock janitor may take (issue 13, finding 5): a lock carrying this replica's id
//! that no bind in flight here owns — never a lock held by a bind of this replica, never
//! another replica's (even one whose id extends ours), and only at the create revision it
//! was seen with.

use std::sync::Arc;
use std::time::Duration;

use berth_control_plane::RegistryRef;
use berth_control_plane::keys::Keys;
use berth_control_plane::lease::ReplicaLease;
use berth_control_plane::registry::embedded::EmbeddedRegistry;
use berth_control_plane::store::{Lock, WorkspaceStore};
use berth_control_plane::view::ReplicaView;
use berth_workspace::WorkspaceId;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn only_this_replicas_locks_that_no_bind_holds_are_orphans() {
    let registry: RegistryRef = EmbeddedRegistry::new();
    let cancel = CancellationToken::new();
    let keys = Keys::default();
    let view = ReplicaView::start(Arc::clone(&registry), &keys, cancel.clone()).await.unwrap();
    let lease = ReplicaLease::start(
        Arc::clone(&registry),
        Duration::from_secs(5),
        keys.replica("replica-a"),
        "x".into(),
        cancel.clone(),
    )
    .await
    .unwrap();
    let lease_id = lease.id();
    let store = WorkspaceStore::new(Arc::clone(&registry), keys.clone(), view, lease, "replica-a");
    let id = |name: &str| WorkspaceId::new(name).unwrap();

    // A lock a bind of ours holds is not an orphan.
    let Lock::Ours(_) = store.acquire_lock(&id("ws-held")).await.unwrap() else { panic!("lock taken") };
    // Planted: an orphan of ours, a lock of a replica whose id extends ours, another's.
    let orphan_key = keys.lock(&id("ws-orphan"));
    let orphan_revision = registry
        .create_if_absent(&orphan_key, Bytes::from("replica-a/00000000deadbeef"), lease_id)
        .await
        .unwrap()
        .unwrap();
    for (name, value) in [("ws-nested", "replica-a/b/0000000000000001"), ("ws-other", "replica-b/0000000000000002")] {
        registry.create_if_absent(&keys.lock(&id(name)), Bytes::from(value), 0).await.unwrap().unwrap();
    }
    assert_eq!(store.orphan_locks().await.unwrap(), vec![(orphan_key.clone(), orphan_revision)]);

    // The delete compares the create revision: a lock re-created since is left alone.
    assert!(!store.delete_lock_created_at(&orphan_key, orphan_revision - 1).await.unwrap());
    assert!(store.delete_lock_created_at(&orphan_key, orphan_revision).await.unwrap());
    assert!(registry.get(&orphan_key).await.unwrap().is_none());
    assert!(store.orphan_locks().await.unwrap().is_empty());
    cancel.cancel();
}
