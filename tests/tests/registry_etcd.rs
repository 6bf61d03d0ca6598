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

/// The transaction committer against a real etcd (bind-lock takes and fenced writes, the
/// way `WorkspaceStore` sends them): 300 lock takes queued together are accepted in full
/// batches (64 compares, 128 operations) and each gets its own record read; their 300 fenced
/// writes the same. A take of a held lock in a batch of others fails alone, answered from its
/// own failure branch, and the others win theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lock_takes_and_fenced_writes_committed_together_fit_etcds_transaction_limits() {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use berth_control_plane::registry::{Compare, Registry, Txn, TxnOp, TxnOpResponse, TxnResponse};
    use berth_control_plane::txn_commit::TxnCommitter;

    let registry = berth_tests::etcd::shared_registry().await;
    let prefix = format!("/berth-txn-commit-{:08x}", rand::random::<u32>());
    let lease = registry.grant_lease(Duration::from_secs(60)).await.expect("lease");
    let committer = TxnCommitter::start(registry.clone());
    let lock = |index: usize| format!("{prefix}/locks/ws-{index}");
    let record = |index: usize| format!("{prefix}/workspaces/ws-{index}");
    // Every third workspace has a record the take must read back as its own.
    for index in (0..300).step_by(3) {
        registry.put(&record(index), bytes::Bytes::from(format!("record {index}"))).await.expect("record");
    }
    let take = |index: usize| {
        Txn::new()
            .when([Compare::absent(lock(index))])
            .and_then([TxnOp::put_with_lease(lock(index), "holder", lease), TxnOp::get(record(index))])
            .or_else([TxnOp::get(lock(index)), TxnOp::get(record(index))])
    };
    let read = |response: &TxnResponse, at: usize| match response.responses.get(at) {
        Some(TxnOpResponse::Get(value)) => value.as_ref().map(|kv| kv.value.clone()),
        other => panic!("expected a read at {at}, got {other:?}"),
    };

    let takes = futures::future::join_all((0..300).map(|index| committer.txn(take(index)))).await;
    let mut fences = Vec::new();
    for (index, answer) in takes.into_iter().enumerate() {
        let answer = answer.expect("lock take");
        assert!(answer.succeeded, "ws-{index}: a free lock");
        assert_eq!(answer.responses.len(), 2, "ws-{index}: its own two responses");
        let expected = (index % 3 == 0).then(|| bytes::Bytes::from(format!("record {index}")));
        assert_eq!(read(&answer, 1), expected, "ws-{index}: its own record");
        fences.push(answer.revision);
    }
    let transactions: BTreeSet<i64> = fences.iter().copied().collect();
    assert!(transactions.len() <= 20, "300 lock takes took {} etcd transactions", transactions.len());
    for (index, fence) in fences.iter().enumerate().step_by(37) {
        let stored = registry.get(&lock(index)).await.expect("get").expect("lock taken");
        assert_eq!(stored.create_revision, *fence, "ws-{index}: the fence is the lock's create revision");
        assert_eq!(stored.lease, lease);
    }

    let writes = futures::future::join_all(fences.iter().enumerate().map(|(index, fence)| {
        committer.txn(
            Txn::new()
                .when([Compare::create_revision(lock(index), *fence)])
                .and_then([TxnOp::put(record(index), format!("ready {index}")), TxnOp::delete(lock(index))]),
        )
    }))
    .await;
    let mut write_revisions = BTreeSet::new();
    for (index, answer) in writes.into_iter().enumerate() {
        let answer = answer.expect("fenced write");
        assert!(answer.succeeded, "ws-{index}: its lock is still its own");
        write_revisions.insert(answer.revision);
    }
    assert!(write_revisions.len() <= 20, "300 fenced writes took {} etcd transactions", write_revisions.len());
    assert!(registry.range(&format!("{prefix}/locks/")).await.expect("range").kvs.is_empty(), "every lock deleted");
    let stored = registry.get(&record(299)).await.expect("get").expect("written");
    assert_eq!(stored.value, bytes::Bytes::from("ready 299"));

    // A held lock among free ones: whichever batch it lands in fails, and is settled take by
    // take (the committer runs on the other worker while these queue, so only the answers
    // are asserted).
    let held = 1000;
    registry.put(&lock(held), bytes::Bytes::from_static(b"another bind")).await.expect("held lock");
    let (others, contested) = futures::join!(
        futures::future::join_all((300..340).map(|index| committer.txn(take(index)))),
        committer.txn(take(held))
    );
    let contested = contested.expect("answered");
    assert!(!contested.succeeded, "a held lock is not taken over");
    assert_eq!(read(&contested, 0), Some(bytes::Bytes::from_static(b"another bind")), "its failure branch");
    for answer in others {
        assert!(answer.expect("lock take").succeeded);
    }
    registry.revoke_lease(lease).await.expect("revoke");
}
