//! Cases for transactions: create-if-absent, CAS races, fencing, compares, branches.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;

use super::case::{Case, ok, within};
use berth_control_plane::registry::{Compare, CompareOp, CompareTarget, RegistryError, Txn, TxnOp, TxnOpResponse};

pub async fn create_if_absent_creates_once(case: Case) {
    let registry = &case.registry;
    let key = case.key("lock");
    let created = ok("first create", registry.create_if_absent(&key, Bytes::from_static(b"mine"), 0))
        .await
        .expect("the first create wins");
    let existing = ok("second create", registry.create_if_absent(&key, Bytes::from_static(b"theirs"), 0))
        .await
        .expect_err("the second create loses");
    assert_eq!(existing.value, Bytes::from_static(b"mine"));
    assert_eq!(existing.create_revision, created);
    assert_eq!(ok("get", registry.get(&key)).await.map(|kv| kv.value), Some(Bytes::from_static(b"mine")));
}

pub async fn create_if_absent_race_has_one_winner(case: Case) {
    const RACERS: usize = 200;
    let key = Arc::new(case.key("contended"));
    let mut racers = Vec::with_capacity(RACERS);
    for racer in 0..RACERS {
        let registry = case.registry.clone();
        let key = key.clone();
        racers.push(tokio::spawn(async move {
            let value = Bytes::from(format!("racer-{racer}"));
            let outcome = registry.create_if_absent(&key, value.clone(), 0).await;
            (value, outcome)
        }));
    }
    let mut winners = Vec::new();
    let mut losers = Vec::new();
    for racer in racers {
        let (value, outcome) = within("racer", racer).await.expect("racer task");
        match outcome {
            Ok(Ok(revision)) => winners.push((value, revision)),
            Ok(Err(existing)) => losers.push(existing),
            Err(error) => panic!("create_if_absent failed: {error}"),
        }
    }
    assert_eq!(winners.len(), 1, "exactly one winner, got {}", winners.len());
    let (winning_value, winning_revision) = &winners[0];
    for existing in &losers {
        assert_eq!(&existing.value, winning_value, "losers see the winner's value");
        assert_eq!(existing.create_revision, *winning_revision);
    }
    let stored = ok("get", case.registry.get(&key)).await.expect("key");
    assert_eq!(&stored.value, winning_value);
    assert_eq!(stored.version, 1, "nobody overwrote the winner");
}

pub async fn txn_fencing_with_lock_create_revision(case: Case) {
    let registry = &case.registry;
    let lock = case.key("locks/ws");
    let record = case.key("workspaces/ws");
    let guarded_write = |token: i64, value: &'static str| {
        Txn::new().when([Compare::create_revision(lock.clone(), token)]).and_then([TxnOp::put(record.clone(), value)])
    };

    let first_token = ok("lock", registry.create_if_absent(&lock, Bytes::new(), 0)).await.expect("lock is free");
    let first = ok("fenced write", registry.txn(guarded_write(first_token, "first"))).await;
    assert!(first.succeeded, "the holder's token admits its write");

    // The holder loses the lock; someone else takes it.
    assert!(ok("unlock", registry.delete(&lock)).await);
    let second_token =
        ok("relock", registry.create_if_absent(&lock, Bytes::new(), 0)).await.expect("lock is free again");
    assert!(second_token > first_token, "a new lock gets a newer token");

    let stale = ok("stale write", registry.txn(guarded_write(first_token, "stale"))).await;
    assert!(!stale.succeeded, "the old token is fenced off");
    let current = ok("current write", registry.txn(guarded_write(second_token, "second"))).await;
    assert!(current.succeeded);
    let stored = ok("get", registry.get(&record)).await.expect("record");
    assert_eq!(stored.value, Bytes::from_static(b"second"));
}

pub async fn txn_mod_revision_compare(case: Case) {
    let registry = &case.registry;
    let key = case.key("k");
    let written = ok("put", registry.put(&key, Bytes::from_static(b"0"))).await;
    let update = |expected: i64, value: &'static str| {
        Txn::new().when([Compare::mod_revision(key.clone(), expected)]).and_then([TxnOp::put(key.clone(), value)])
    };
    let first = ok("update at the read revision", registry.txn(update(written, "1"))).await;
    assert!(first.succeeded);
    assert!(first.revision > written);
    let lost = ok("update at a stale revision", registry.txn(update(written, "2"))).await;
    assert!(!lost.succeeded, "a stale mod_revision loses");
    let stored = ok("get", registry.get(&key)).await.expect("key");
    assert_eq!(stored.value, Bytes::from_static(b"1"));
    assert_eq!(stored.mod_revision, first.revision);
}

pub async fn txn_compare_operators(case: Case) {
    let registry = &case.registry;
    let key = case.key("k");
    let missing = case.key("missing");
    let written = ok("put", registry.put(&key, Bytes::from_static(b"m"))).await;
    ok("put again", registry.put(&key, Bytes::from_static(b"m"))).await;

    let compare = |key: &str, op: CompareOp, target: CompareTarget| Compare { key: key.to_owned(), op, target };
    let value = |bytes: &'static [u8]| CompareTarget::Value(Bytes::from_static(bytes));
    let expectations = [
        // Version is 2 after two writes.
        (compare(&key, CompareOp::Equal, CompareTarget::Version(2)), true),
        (compare(&key, CompareOp::NotEqual, CompareTarget::Version(2)), false),
        (compare(&key, CompareOp::Greater, CompareTarget::Version(1)), true),
        (compare(&key, CompareOp::Less, CompareTarget::Version(3)), true),
        (compare(&key, CompareOp::Less, CompareTarget::Version(2)), false),
        (compare(&key, CompareOp::Equal, CompareTarget::CreateRevision(written)), true),
        (compare(&key, CompareOp::Greater, CompareTarget::ModRevision(written)), true),
        (compare(&key, CompareOp::Equal, value(b"m")), true),
        (compare(&key, CompareOp::NotEqual, value(b"m")), false),
        (compare(&key, CompareOp::Greater, value(b"a")), true),
        (compare(&key, CompareOp::Less, value(b"z")), true),
        (compare(&key, CompareOp::Less, value(b"a")), false),
        // A missing key has zero revisions and version...
        (compare(&missing, CompareOp::Equal, CompareTarget::CreateRevision(0)), true),
        (compare(&missing, CompareOp::Equal, CompareTarget::ModRevision(0)), true),
        (compare(&missing, CompareOp::Less, CompareTarget::Version(1)), true),
        // ...and no value: every value compare on it is false.
        (compare(&missing, CompareOp::Equal, value(b"")), false),
        (compare(&missing, CompareOp::NotEqual, value(b"m")), false),
        (compare(&missing, CompareOp::Less, value(b"z")), false),
    ];
    for (index, (condition, expected)) in expectations.into_iter().enumerate() {
        let description = format!("compare #{index} {condition:?}");
        let response = ok(&description, registry.txn(Txn::new().when([condition]))).await;
        assert_eq!(response.succeeded, expected, "{description}");
    }

    // All compares of a txn must hold.
    let mixed = Txn::new().when([
        compare(&key, CompareOp::Equal, CompareTarget::Version(2)),
        compare(&key, CompareOp::Equal, CompareTarget::Version(3)),
    ]);
    assert!(!ok("mixed compares", registry.txn(mixed)).await.succeeded);
}

pub async fn txn_failure_branch_get(case: Case) {
    let registry = &case.registry;
    let key = case.key("k");
    let other = case.key("other");
    ok("put", registry.put(&key, Bytes::from_static(b"held"))).await;
    let response = ok(
        "txn",
        registry.txn(
            Txn::new()
                .when([Compare::absent(key.clone())])
                .and_then([TxnOp::put(key.clone(), "stolen")])
                .or_else([TxnOp::get(key.clone()), TxnOp::get(other.clone())]),
        ),
    )
    .await;
    assert!(!response.succeeded);
    assert_eq!(response.responses.len(), 2, "one response per failure op");
    let held = response.first_get().expect("the failure branch read the key");
    assert_eq!(held.value, Bytes::from_static(b"held"));
    assert_eq!(response.responses[1], TxnOpResponse::Get(None));
    assert_eq!(
        ok("get", registry.get(&key)).await.map(|kv| kv.value),
        Some(Bytes::from_static(b"held")),
        "the success branch did not run"
    );
}

pub async fn txn_is_atomic(case: Case) {
    let registry = &case.registry;
    let [a, b, c] = [case.key("a"), case.key("b"), case.key("c")];
    ok("put c", registry.put(&c, Bytes::from_static(b"old"))).await;
    let response = ok(
        "txn",
        registry.txn(Txn::new().and_then([
            TxnOp::put(a.clone(), "1"),
            TxnOp::put(b.clone(), "2"),
            TxnOp::delete(c.clone()),
            TxnOp::get(a.clone()),
        ])),
    )
    .await;
    assert!(response.succeeded);
    assert_eq!(response.responses[0], TxnOpResponse::Put);
    assert_eq!(response.responses[2], TxnOpResponse::Delete(1));
    let read_back = response.first_get().expect("a get after a put sees the put");
    assert_eq!(read_back.mod_revision, response.revision);

    let range = ok("range", registry.range(&case.prefix)).await;
    let keys: HashSet<String> = range.kvs.iter().map(|kv| kv.key.clone()).collect();
    assert_eq!(keys, HashSet::from([a.clone(), b.clone()]));
    for kv in &range.kvs {
        assert_eq!(kv.mod_revision, response.revision, "one revision for the whole txn");
    }

    // A failed compare writes nothing and spends no revision on our keys.
    let refused = ok(
        "refused txn",
        registry.txn(
            Txn::new()
                .when([Compare::absent(a.clone())])
                .and_then([TxnOp::put(a.clone(), "x"), TxnOp::delete(b.clone())]),
        ),
    )
    .await;
    assert!(!refused.succeeded);
    assert!(refused.responses.is_empty());
    let unchanged = ok("range again", registry.range(&case.prefix)).await;
    assert_eq!(unchanged.kvs, range.kvs);
}

pub async fn txn_put_on_missing_lease_fails(case: Case) {
    let registry = &case.registry;
    let lease = ok("grant", registry.grant_lease(std::time::Duration::from_secs(30))).await;
    ok("revoke", registry.revoke_lease(lease)).await;
    let plain = case.key("plain");
    let leased = case.key("leased");
    let result = within(
        "txn on a revoked lease",
        registry.txn(
            Txn::new().and_then([TxnOp::put(plain.clone(), "x"), TxnOp::put_with_lease(leased.clone(), "y", lease)]),
        ),
    )
    .await;
    match result {
        Err(RegistryError::LeaseNotFound(reported)) => assert_eq!(reported, lease),
        other => panic!("expected LeaseNotFound, got {other:?}"),
    }
    assert_eq!(ok("get plain", registry.get(&plain)).await, None, "nothing was written");
    assert_eq!(ok("get leased", registry.get(&leased)).await, None);
}
