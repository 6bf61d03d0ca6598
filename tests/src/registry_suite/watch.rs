//! Cases for watches: prefix filtering, ordering, txn grouping, replay, lease expiry,
//! concurrency and compaction.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use super::case::{Case, next_batch, ok, within};
use berth_control_plane::registry::{RegistryError, Txn, TxnOp, WatchEvent, WatchStream};

/// Expects the next watch item to be exactly one `Put` of `key` with `value` at `revision`.
async fn expect_put(watch: &mut WatchStream, key: &str, value: &str, revision: i64) {
    let batch = next_batch(watch, &format!("put of {key}")).await;
    match batch.as_slice() {
        [WatchEvent::Put(kv)] => {
            assert_eq!(kv.key, key);
            assert_eq!(kv.value, Bytes::from(value.to_owned()));
            assert_eq!(kv.mod_revision, revision, "event revision of {key}");
        }
        other => panic!("expected one put of {key} at {revision}, got {other:?}"),
    }
}

async fn expect_delete(watch: &mut WatchStream, key: &str, revision: i64) {
    let batch = next_batch(watch, &format!("delete of {key}")).await;
    assert_eq!(batch, vec![WatchEvent::Delete { key: key.to_owned(), mod_revision: revision }]);
}

pub async fn watch_sees_prefix_puts_and_deletes_in_order(case: Case) {
    let registry = &case.registry;
    let dir = case.key("watched/");
    let mut watch = ok("watch", registry.watch_prefix(&dir, 0)).await;

    let a = format!("{dir}a");
    let b = format!("{dir}b");
    let first = ok("put a", registry.put(&a, Bytes::from_static(b"1"))).await;
    // Outside the prefix, including a neighbour that shares its beginning.
    ok("put outside", registry.put(&case.key("other/a"), Bytes::new())).await;
    ok("put neighbour", registry.put(&case.key("watched0"), Bytes::new())).await;
    let second = ok("put b", registry.put(&b, Bytes::from_static(b"2"))).await;
    let deleted = ok("delete a", registry.txn(Txn::new().and_then([TxnOp::delete(&a)]))).await.revision;
    let updated = ok("update b", registry.put(&b, Bytes::from_static(b"3"))).await;

    expect_put(&mut watch, &a, "1", first).await;
    expect_put(&mut watch, &b, "2", second).await;
    expect_delete(&mut watch, &a, deleted).await;
    expect_put(&mut watch, &b, "3", updated).await;
}

pub async fn watch_groups_txn_events(case: Case) {
    let registry = &case.registry;
    let [a, b, c] = [case.key("a"), case.key("b"), case.key("c")];
    ok("put c", registry.put(&c, Bytes::from_static(b"old"))).await;
    let mut watch = ok("watch", registry.watch_prefix(&case.prefix, 0)).await;

    let response = ok(
        "txn",
        registry.txn(Txn::new().and_then([
            TxnOp::put(a.clone(), "1"),
            TxnOp::put(b.clone(), "2"),
            TxnOp::delete(c.clone()),
        ])),
    )
    .await;
    let single = ok("put after txn", registry.put(&a, Bytes::from_static(b"4"))).await;

    let batch = next_batch(&mut watch, "txn events").await;
    let summary: Vec<(String, i64, bool)> = batch
        .iter()
        .map(|event| {
            let is_put = matches!(event, WatchEvent::Put(_));
            (event.key().to_owned(), event.revision(), is_put)
        })
        .collect();
    let revision = response.revision;
    assert_eq!(
        summary,
        vec![(a.clone(), revision, true), (b, revision, true), (c, revision, false)],
        "a txn's events arrive together, in op order"
    );
    expect_put(&mut watch, &a, "4", single).await;
}

pub async fn watch_replays_from_start_revision(case: Case) {
    let registry = &case.registry;
    let [a, b] = [case.key("a"), case.key("b")];
    let mut revisions = Vec::new();
    for (key, value) in [(&a, "1"), (&b, "2"), (&a, "3")] {
        revisions.push(ok("put", registry.put(key, Bytes::from(value))).await);
    }
    let deleted = ok("delete b", registry.txn(Txn::new().and_then([TxnOp::delete(&b)]))).await;
    revisions.push(deleted.revision);

    // From the second write: exactly the writes from then on, then live ones.
    let mut watch = ok("watch", registry.watch_prefix(&case.prefix, revisions[1])).await;
    expect_put(&mut watch, &b, "2", revisions[1]).await;
    expect_put(&mut watch, &a, "3", revisions[2]).await;
    expect_delete(&mut watch, &b, revisions[3]).await;
    let live = ok("live put", registry.put(&b, Bytes::from_static(b"5"))).await;
    expect_put(&mut watch, &b, "5", live).await;

    // From the first write: all of it.
    let mut full = ok("watch all", registry.watch_prefix(&case.prefix, revisions[0])).await;
    expect_put(&mut full, &a, "1", revisions[0]).await;
    expect_put(&mut full, &b, "2", revisions[1]).await;
    expect_put(&mut full, &a, "3", revisions[2]).await;
    expect_delete(&mut full, &b, revisions[3]).await;
    expect_put(&mut full, &b, "5", live).await;
}

pub async fn watch_from_now_skips_history(case: Case) {
    let registry = &case.registry;
    let key = case.key("k");
    ok("put before", registry.put(&key, Bytes::from_static(b"before"))).await;
    let mut watch = ok("watch", registry.watch_prefix(&case.prefix, 0)).await;
    let after = ok("put after", registry.put(&key, Bytes::from_static(b"after"))).await;
    expect_put(&mut watch, &key, "after", after).await;
}

pub async fn watch_reports_lease_expiry(case: Case) {
    let registry = &case.registry;
    let key = case.key("ephemeral");
    let mut watch = ok("watch", registry.watch_prefix(&case.prefix, 0)).await;
    let lease = ok("grant", registry.grant_lease(Duration::from_secs(1))).await;
    let put = ok("put on lease", registry.txn(Txn::new().and_then([TxnOp::put_with_lease(&key, "x", lease)]))).await;
    expect_put(&mut watch, &key, "x", put.revision).await;
    // Nobody renews the lease; its expiry must show up as a delete at a later revision.
    let batch = next_batch(&mut watch, "expiry delete").await;
    match batch.as_slice() {
        [WatchEvent::Delete { key: deleted, mod_revision }] => {
            assert_eq!(deleted, &key);
            assert!(*mod_revision > put.revision);
        }
        other => panic!("expected the expiry delete of {key}, got {other:?}"),
    }
}

pub async fn watch_concurrent_writers_exactly_once(case: Case) {
    const WRITERS: usize = 20;
    const WRITES_EACH: usize = 25;
    const TOTAL: usize = WRITERS * WRITES_EACH;
    let mut watch = ok("watch", case.registry.watch_prefix(&case.prefix, 0)).await;

    let mut writers = Vec::with_capacity(WRITERS);
    for writer in 0..WRITERS {
        let registry = case.registry.clone();
        let prefix = case.prefix.clone();
        writers.push(tokio::spawn(async move {
            let mut written = Vec::with_capacity(WRITES_EACH);
            for write in 0..WRITES_EACH {
                // Each writer rewrites a few keys so versions and deletes interleave too.
                let key = format!("{prefix}w{writer}/k{}", write % 5);
                let value = format!("{writer}-{write}");
                let revision = registry
                    .put(&key, Bytes::from(value.clone()))
                    .await
                    .unwrap_or_else(|error| panic!("writer {writer} put failed: {error}"));
                written.push((revision, key, value));
            }
            written
        }));
    }

    let mut expected: HashMap<i64, (String, String)> = HashMap::new();
    for writer in writers {
        for (revision, key, value) in within("writer", writer).await.expect("writer task") {
            assert!(expected.insert(revision, (key, value)).is_none(), "two writes got revision {revision}");
        }
    }

    let mut seen = HashSet::new();
    let mut last_revision = 0;
    while seen.len() < TOTAL {
        let batch = next_batch(&mut watch, &format!("event {} of {TOTAL}", seen.len())).await;
        for event in batch {
            let WatchEvent::Put(kv) = event else {
                panic!("unexpected delete {event:?}");
            };
            assert!(kv.mod_revision > last_revision, "revision {} after {last_revision}", kv.mod_revision);
            last_revision = kv.mod_revision;
            let Some((key, value)) = expected.get(&kv.mod_revision) else {
                panic!("event at revision {} matches no write", kv.mod_revision);
            };
            assert_eq!((&kv.key, &kv.value), (key, &Bytes::from(value.clone())));
            assert!(seen.insert(kv.mod_revision), "duplicate event {}", kv.mod_revision);
        }
    }
    assert_eq!(seen.len(), TOTAL);
}

pub async fn watch_from_compacted_revision_fails(case: Case) {
    let registry = &case.registry;
    let key = case.key("k");
    let mut revisions = Vec::new();
    for value in ["1", "2", "3"] {
        revisions.push(ok("put", registry.put(&key, Bytes::from(value))).await);
    }
    ok("compact", case.fixture.compact(revisions[2])).await;

    let mut stale = ok("watch from compacted", registry.watch_prefix(&case.prefix, revisions[0])).await;
    match within("compacted item", stale.next()).await {
        Some(Err(RegistryError::Compacted { requested, compact_revision })) => {
            assert_eq!(requested, revisions[0]);
            assert_eq!(compact_revision, revisions[2]);
        }
        other => panic!("expected Compacted, got {other:?}"),
    }
    assert!(within("end after compacted", stale.next()).await.is_none(), "Compacted ends the stream");

    // The compaction revision itself is still watchable.
    let mut kept = ok("watch from compaction", registry.watch_prefix(&case.prefix, revisions[2])).await;
    expect_put(&mut kept, &key, "3", revisions[2]).await;
}
