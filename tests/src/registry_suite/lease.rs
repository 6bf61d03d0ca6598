//! Cases for leases: expiry, keep-alive, revoke, missing leases, re-attaching keys.
//!
//! Lease cases use the shortest TTL (1 s requested; etcd 3.4 grants 2 s) and wait for
//! expiry by polling with a deadline, never by sleeping a fixed time and hoping.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use berth_testkit::wait_until;

use super::case::{Case, ok, within};
use berth_control_plane::registry::{Registry, RegistryError, Txn, TxnOp};

/// Requested TTL; implementations may round it up to their minimum.
const TTL: Duration = Duration::from_secs(1);
/// Longest a key may outlive its lease's TTL: etcd's minimum TTL (2 s) plus its expiry
/// checks and a loaded machine.
const EXPIRY_DEADLINE: Duration = Duration::from_secs(15);

async fn put_on_lease(registry: &dyn Registry, key: &str, lease: i64) {
    let response =
        ok("put on lease", registry.txn(Txn::new().and_then([TxnOp::put_with_lease(key, "leased", lease)]))).await;
    assert!(response.succeeded);
}

async fn gone(registry: &dyn Registry, key: &str) -> bool {
    ok("get", registry.get(key)).await.is_none()
}

async fn assert_lease_not_found(registry: &dyn Registry, lease: i64, what: &str) {
    match within(what, registry.keep_alive(lease)).await {
        Err(RegistryError::LeaseNotFound(reported)) => assert_eq!(reported, lease, "{what}"),
        other => panic!("{what}: expected LeaseNotFound, got {other:?}"),
    }
}

pub async fn lease_expiry_deletes_keys(case: Case) {
    let registry = case.registry.as_ref();
    let key = case.key("ephemeral");
    let granted = Instant::now();
    let lease = ok("grant", registry.grant_lease(TTL)).await;
    put_on_lease(registry, &key, lease).await;
    let stored = ok("get", registry.get(&key)).await.expect("key on a live lease");
    assert_eq!(stored.lease, lease);

    assert!(
        wait_until(EXPIRY_DEADLINE, || gone(registry, &key)).await,
        "key on an unrenewed lease still present {EXPIRY_DEADLINE:?} after the grant"
    );
    let lifetime = granted.elapsed();
    assert!(lifetime >= TTL - Duration::from_millis(100), "key vanished after {lifetime:?}, before the TTL");
    assert_lease_not_found(registry, lease, "keep-alive after expiry").await;
}

pub async fn lease_keep_alive_extends_past_ttl(case: Case) {
    let registry = case.registry.as_ref();
    let key = case.key("renewed");
    let lease = ok("grant", registry.grant_lease(TTL)).await;
    put_on_lease(registry, &key, lease).await;

    // Renew every 200 ms (a fifth of the shortest TTL, so a stalled test runtime does not
    // expire it) for well past twice the longest TTL any implementation grants.
    let renew_until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < renew_until {
        let remaining = ok("keep_alive", registry.keep_alive(lease)).await;
        assert!(remaining >= TTL, "renewal returned remaining TTL {remaining:?}");
        assert!(ok("get", registry.get(&key)).await.is_some(), "key vanished while its lease was renewed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Once renewals stop, it expires as usual.
    assert!(wait_until(EXPIRY_DEADLINE, || gone(registry, &key)).await, "key still present after renewals stopped");
}

pub async fn lease_revoke_deletes_keys_now(case: Case) {
    let registry = case.registry.as_ref();
    let first = case.key("first");
    let second = case.key("second");
    let lease = ok("grant", registry.grant_lease(Duration::from_secs(60))).await;
    put_on_lease(registry, &first, lease).await;
    put_on_lease(registry, &second, lease).await;

    ok("revoke", registry.revoke_lease(lease)).await;
    // Linearizable: the very next read sees the deletion.
    assert!(gone(registry, &first).await, "revoke deletes the lease's keys at once");
    assert!(gone(registry, &second).await);
    ok("revoke again", registry.revoke_lease(lease)).await;
    assert_lease_not_found(registry, lease, "keep-alive after revoke").await;
}

pub async fn keep_alive_on_missing_lease_fails(case: Case) {
    let registry = case.registry.as_ref();
    // Ids nobody granted: etcd's are random 63-bit numbers, the embedded ones count up.
    let never_granted = 0x7ead_beef_0000_0000 | i64::from(rand::random::<u32>());
    assert_lease_not_found(registry, never_granted, "keep-alive of a never granted lease").await;
    ok("revoke a never granted lease", registry.revoke_lease(never_granted)).await;

    // A lease renewed once (which may cache a stream) and then revoked.
    let lease = ok("grant", registry.grant_lease(Duration::from_secs(60))).await;
    ok("keep_alive", registry.keep_alive(lease)).await;
    ok("revoke", registry.revoke_lease(lease)).await;
    assert_lease_not_found(registry, lease, "keep-alive after revoke").await;
}

pub async fn put_without_lease_detaches_key(case: Case) {
    let registry = case.registry.as_ref();
    let key = case.key("moved");
    let lease = ok("grant", registry.grant_lease(Duration::from_secs(60))).await;
    put_on_lease(registry, &key, lease).await;
    ok("put without lease", registry.put(&key, Bytes::from_static(b"kept"))).await;
    let stored = ok("get", registry.get(&key)).await.expect("key");
    assert_eq!(stored.lease, 0, "a put without lease detaches the key");

    ok("revoke", registry.revoke_lease(lease)).await;
    let kept = ok("get after revoke", registry.get(&key)).await;
    assert_eq!(
        kept.map(|kv| kv.value),
        Some(Bytes::from_static(b"kept")),
        "revoking the old lease leaves a detached key alone"
    );
}
