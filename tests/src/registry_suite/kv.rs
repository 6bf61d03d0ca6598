//! Cases for plain reads and writes: get / put / delete, key metadata, ranges, revisions.

use bytes::Bytes;

use super::case::{Case, ok};
use berth_control_plane::registry::{Txn, TxnOp};

pub async fn put_get_delete(case: Case) {
    let registry = &case.registry;
    let key = case.key("a");
    assert_eq!(ok("get missing", registry.get(&key)).await, None);

    let revision = ok("put", registry.put(&key, Bytes::from_static(b"one"))).await;
    let stored = ok("get", registry.get(&key)).await.expect("key after put");
    assert_eq!(stored.key, key);
    assert_eq!(stored.value, Bytes::from_static(b"one"));
    assert_eq!(stored.mod_revision, revision);
    assert_eq!(stored.lease, 0);

    assert!(ok("delete", registry.delete(&key)).await, "delete reports the key existed");
    assert_eq!(ok("get deleted", registry.get(&key)).await, None);
    assert!(!ok("delete again", registry.delete(&key)).await, "deleting a missing key reports false");
    // Keys are exact: a longer key with the same beginning is a different key.
    ok("put sibling", registry.put(&case.key("ab"), Bytes::new())).await;
    assert_eq!(ok("get a", registry.get(&key)).await, None);
}

pub async fn key_metadata_tracks_writes(case: Case) {
    let registry = &case.registry;
    let key = case.key("k");
    let created = ok("create", registry.put(&key, Bytes::from_static(b"1"))).await;
    let updated = ok("update", registry.put(&key, Bytes::from_static(b"2"))).await;
    let kv = ok("get", registry.get(&key)).await.expect("key");
    assert_eq!(kv.create_revision, created, "create_revision stays");
    assert_eq!(kv.mod_revision, updated, "mod_revision follows writes");
    assert_eq!(kv.version, 2, "version counts writes since creation");

    ok("delete", registry.delete(&key)).await;
    let recreated = ok("recreate", registry.put(&key, Bytes::from_static(b"3"))).await;
    let kv = ok("get recreated", registry.get(&key)).await.expect("key");
    assert_eq!(kv.create_revision, recreated, "a recreated key is a new key");
    assert_eq!(kv.version, 1);
}

pub async fn range_is_sorted_and_pages(case: Case) {
    let registry = &case.registry;
    let dir = case.key("dir/");
    // Written out of order; the range must come back sorted by key.
    let names = ["c", "a", "e", "b", "d"];
    let mut last_revision = 0;
    for name in names {
        last_revision = ok("put", registry.put(&format!("{dir}{name}"), Bytes::from(name.to_owned()))).await;
    }
    // Neighbours that share the beginning but are outside `dir/`.
    ok("put neighbour", registry.put(&case.key("dir"), Bytes::new())).await;
    ok("put neighbour", registry.put(&case.key("dir0"), Bytes::new())).await;
    ok("put neighbour", registry.put(&case.key("dis/x"), Bytes::new())).await;

    let all = ok("range", registry.range(&dir)).await;
    let keys: Vec<String> = all.kvs.iter().map(|kv| kv.key.clone()).collect();
    let expected: Vec<String> = ["a", "b", "c", "d", "e"].iter().map(|name| format!("{dir}{name}")).collect();
    assert_eq!(keys, expected);
    assert!(
        all.revision >= last_revision,
        "range revision {} is older than the last write {last_revision}",
        all.revision
    );

    // Pages of two, each starting after the previous page's last key.
    let mut paged = Vec::new();
    let mut after = String::new();
    loop {
        let page = ok("range page", registry.range_page(&dir, &after, 2)).await;
        assert!(page.kvs.len() <= 2, "limit respected");
        let Some(last) = page.kvs.last() else {
            break;
        };
        after = last.key.clone();
        paged.extend(page.kvs.into_iter().map(|kv| kv.key));
    }
    assert_eq!(paged, expected);

    let from_c = ok("range after c", registry.range_page(&dir, &format!("{dir}c"), 0)).await;
    let from_c: Vec<String> = from_c.kvs.into_iter().map(|kv| kv.key).collect();
    assert_eq!(from_c, expected[3..].to_vec(), "after is exclusive");
    let before_prefix = ok("range after a smaller key", registry.range_page(&dir, "/", 1)).await;
    assert_eq!(before_prefix.kvs.len(), 1);
    assert_eq!(before_prefix.kvs[0].key, expected[0]);
    let past_end = ok("range after the end", registry.range_page(&dir, &case.key("zzz"), 0)).await;
    assert!(past_end.kvs.is_empty());
    let empty = ok("range empty prefix", registry.range(&case.key("nothing/"))).await;
    assert!(empty.kvs.is_empty());
    assert!(empty.revision >= last_revision);
}

/// A page is as large as its records make it: 1000 records of 12 KiB (a workspace whose
/// spec carries a big env; 12 MB in all, past gRPC's default 4 MiB message limit) come
/// back in one page, and a whole-prefix range returns them too. A replica lists its
/// registry in such pages before it serves: a page it cannot decode would keep it from
/// starting.
pub async fn a_page_of_large_records_is_returned_whole(case: Case) {
    let registry = &case.registry;
    let dir = case.key("large/");
    let value = Bytes::from(vec![b'x'; 12 * 1024]);
    // 100 puts of 12 KiB per transaction: under etcd's default 128 operations and
    // 1.5 MiB request.
    for batch in (0..1000).collect::<Vec<usize>>().chunks(100) {
        let puts = batch.iter().map(|index| TxnOp::put(format!("{dir}{index:04}"), value.clone()));
        ok("put batch", registry.txn(Txn::new().and_then(puts))).await;
    }
    let page = ok("range page of 1000", registry.range_page(&dir, "", 1000)).await;
    assert_eq!(page.kvs.len(), 1000);
    assert!(page.kvs.iter().all(|kv| kv.value.len() == value.len()), "values came back whole");
    let all = ok("range of the prefix", registry.range(&dir)).await;
    assert_eq!(all.kvs.len(), 1000);
}

pub async fn revisions_strictly_increase(case: Case) {
    let registry = &case.registry;
    let mut previous = ok("range", registry.range(&case.prefix)).await.revision;
    for index in 0..20 {
        let key = case.key(&format!("k{}", index % 3));
        let revision = if index % 4 == 3 {
            // A multi-op txn spends one revision like a single put.
            let response = ok(
                "delete txn",
                registry
                    .txn(Txn::new().and_then([TxnOp::delete(key), TxnOp::put(case.key("other"), format!("{index}"))])),
            )
            .await;
            response.revision
        } else {
            ok("put", registry.put(&key, Bytes::from(format!("{index}")))).await
        };
        assert!(revision > previous, "write {index} got revision {revision} after {previous}");
        previous = revision;
        let observed = ok("range", registry.range(&case.prefix)).await.revision;
        assert!(observed >= revision, "a read after a write sees its revision");
    }
}
