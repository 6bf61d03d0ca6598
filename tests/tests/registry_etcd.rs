//! The registry conformance suite against a real etcd (one process shared by this binary).

berth_tests::registry_suite!(etcd, async { berth_tests::etcd::shared_registry().await });

/// Group commit against a real etcd: full batches (127 session puts and 128 compares, at
/// etcd's default `--max-txn-ops`) are accepted, and 400 creates arriving together are
/// each answered Created with their record durable, in a few transactions (each write
/// transaction is one etcd revision, shared by the records it wrote: settled create by
/// create they would cost ~400); a create for a workspace that does not exist, in a storm
/// of others, is answered WorkspaceGone and the others Created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_creates_committed_together_fit_etcds_transaction_limits() {
    use std::sync::Arc;

    use berth_control_plane::records::{RECORD_VERSION, SessionRecord};
    use berth_control_plane::registry::Registry;
    use berth_control_plane::session_commit::SessionCommitter;
    use berth_control_plane::store::SessionCreated;

    let registry = berth_tests::etcd::shared_registry().await;
    let prefix = format!("/berth-group-commit-{:08x}", rand::random::<u32>());
    let workspace_key = format!("{prefix}/workspaces/ws-storm");
    registry.put(&workspace_key, bytes::Bytes::from_static(b"{}")).await.expect("workspace record");
    let committer = Arc::new(SessionCommitter::start(registry.clone()));
    let revision_before = registry.range(&workspace_key).await.expect("range").revision;
    let record = |id: &str| SessionRecord {
        version: RECORD_VERSION,
        session_id: id.into(),
        user: "alice".into(),
        agent: "coder".into(),
        workspace_id: berth_workspace::WorkspaceId::new("ws-storm").unwrap(),
        created_at_ms: 0,
    };
    // Queued in one pass (join_all polls every create before any answer can arrive), so
    // the committer finds full batches.
    let creates = futures::future::join_all((0..400).map(|index| {
        let id = format!("s-{index}");
        committer.create(format!("{prefix}/sessions/{id}"), workspace_key.clone(), record(&id))
    }));
    for answer in creates.await {
        assert!(matches!(answer, Ok(SessionCreated::Created)), "{answer:?}");
    }
    let stored = registry.range(&format!("{prefix}/sessions/")).await.expect("range");
    assert_eq!(stored.kvs.len(), 400);
    // The transactions that wrote the sessions are their distinct mod revisions (other tests
    // share this etcd and write meanwhile, so the revision counter alone says little).
    let transactions: std::collections::BTreeSet<i64> = stored.kvs.iter().map(|kv| kv.mod_revision).collect();
    assert!(
        transactions.len() <= 20,
        "400 session creates took {} etcd transactions: {transactions:?}",
        transactions.len()
    );
    assert!(transactions.iter().all(|revision| *revision > revision_before));

    // A create whose workspace does not exist, in a storm of others: its batch is refused
    // and settled create by create (the committer runs on the other worker thread while the
    // storm queues, so which batch it lands in varies; only the answers are asserted).
    let others = futures::future::join_all((0..50).map(|index| {
        let id = format!("t-{index}");
        committer.create(format!("{prefix}/sessions/{id}"), workspace_key.clone(), record(&id))
    }));
    let missing = committer.create(
        format!("{prefix}/sessions/s-missing"),
        format!("{prefix}/workspaces/ws-missing"),
        record("s-missing"),
    );
    let (answers, missing) = futures::join!(others, missing);
    assert!(matches!(missing, Ok(SessionCreated::WorkspaceGone)), "{missing:?}");
    for answer in answers {
        assert!(matches!(answer, Ok(SessionCreated::Created)), "{answer:?}");
    }
    assert_eq!(registry.get(&format!("{prefix}/sessions/s-missing")).await.expect("get"), None);
}
