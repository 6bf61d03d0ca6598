//! A session is never handed out for a workspace whose record is gone, even when this
//! replica's view still shows it (a view that has not caught up, e.g. right after a
//! partition from etcd healed, while another replica deleted the workspace).

use std::time::Duration;

use berth_control_plane::keys::Keys;
use berth_control_plane::lease::ReplicaLease;
use berth_control_plane::records::{self, Origin, RECORD_VERSION, SessionRecord, StoredState, WorkspaceRecord};
use berth_control_plane::registry::embedded::EmbeddedRegistry;
use berth_control_plane::store::{SessionCreated, WorkspaceStore};
use berth_control_plane::view::ReplicaView;
use berth_control_plane::{IsolationPolicy, RegistryRef};
use berth_workspace::WorkspaceId;
use tokio_util::sync::CancellationToken;

fn record(id: &WorkspaceId) -> WorkspaceRecord {
    WorkspaceRecord {
        version: RECORD_VERSION,
        id: id.clone(),
        owner: "kim".into(),
        agent: "agent".into(),
        policy: IsolationPolicy::PerAgent,
        backend: "local".into(),
        spec: Default::default(),
        state: StoredState::Ready,
        node_id: Some("node-a".into()),
        generation: 9,
        created_at_ms: 0,
        updated_at_ms: 0,
        failure: None,
        changed_by: "test".into(),
        shared_with: Vec::new(),
        origin: Origin::Fresh,
        origin_generation: 9,
        snapshot: None,
    }
}

fn session(id: &str, workspace_id: &WorkspaceId) -> SessionRecord {
    SessionRecord {
        version: RECORD_VERSION,
        session_id: id.into(),
        user: "kim".into(),
        agent: "agent".into(),
        workspace_id: workspace_id.clone(),
        created_at_ms: 0,
    }
}

#[tokio::test]
async fn a_session_for_a_workspace_deleted_behind_a_stale_view_is_refused() {
    let registry: RegistryRef = EmbeddedRegistry::new();
    let keys = Keys::default();
    let workspace_id = WorkspaceId::new("ws-guarded").expect("id");
    registry.put(&keys.workspace(&workspace_id), records::encode(&record(&workspace_id))).await.expect("put");

    // A view that stops following the registry once it has seen the record.
    let view_cancel = CancellationToken::new();
    let view = ReplicaView::start(registry.clone(), &keys, view_cancel.clone()).await.expect("view");
    let cancel = CancellationToken::new();
    let lease = ReplicaLease::start(registry.clone(), Duration::from_secs(5), keys.replica("r"), "x".into(), cancel)
        .await
        .expect("lease");
    let store = WorkspaceStore::new(registry.clone(), keys.clone(), view, lease, "r");
    assert!(store.cached(&workspace_id).is_some(), "the view has the record");
    view_cancel.cancel();

    // Another replica deletes the workspace; this view does not hear of it.
    registry.delete(&keys.workspace(&workspace_id)).await.expect("delete");
    assert!(store.cached(&workspace_id).is_some(), "the view is stale, as after a partition");

    let created = store.create_session(&session("sess-1", &workspace_id)).await.expect("txn");
    assert!(matches!(created, SessionCreated::WorkspaceGone), "{created:?}");
    assert!(registry.get(&keys.session("sess-1")).await.expect("get").is_none(), "no session was written");

    // With the record back, the same call creates the session; again is idempotent.
    registry.put(&keys.workspace(&workspace_id), records::encode(&record(&workspace_id))).await.expect("put");
    let created = store.create_session(&session("sess-1", &workspace_id)).await.expect("txn");
    assert!(matches!(created, SessionCreated::Created), "{created:?}");
    let again = store.create_session(&session("sess-1", &workspace_id)).await.expect("txn");
    assert!(
        matches!(again, SessionCreated::Exists(ref existing) if existing.workspace_id == workspace_id),
        "{again:?}"
    );
}
