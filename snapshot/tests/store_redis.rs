//! The store conformance suite against `RedisStore` and a real `redis-server` (Debian's),
//! one server per case on a free loopback port.

#[macro_use]
mod suite;

snapshot_store_suite!(redis, async {
    let server = berth_testkit::store_servers::redis();
    // A random prefix as well: the store must keep to its prefix.
    let prefix = format!("berth-test:{:016x}", rand::random::<u64>());
    let url = server.redis_url(&prefix);
    let store = berth_snapshot::open(&url).unwrap();
    assert_eq!(store.name(), "redis");
    assert_eq!(store.describe(), url);
    suite::Fixture { store, _guard: Box::new(server) }
});

/// A password from a file reaches the server; the description never shows it.
#[tokio::test]
async fn password_file_authenticates() {
    let server = berth_testkit::store_servers::redis();
    let mut connection = ::redis::Client::open(format!("redis://127.0.0.1:{}/0", server.port))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    ::redis::cmd("CONFIG")
        .arg("SET")
        .arg("requirepass")
        .arg("s3cret-pw")
        .query_async::<()>(&mut connection)
        .await
        .unwrap();
    let password_file = server.dir.path().join("password");
    std::fs::write(&password_file, "s3cret-pw\n").unwrap();
    let url = format!("redis://127.0.0.1:{}/0?password_file={}", server.port, password_file.display());
    let store = berth_snapshot::open(&url).unwrap();
    assert!(!store.describe().contains("s3cret"));
    assert!(!store.has_blob(&"0".repeat(64)).await.unwrap());
    let wrong = berth_snapshot::open(&format!("redis://:wrong@127.0.0.1:{}/0", server.port)).unwrap();
    match wrong.has_blob(&"0".repeat(64)).await {
        Err(berth_snapshot::SnapshotError::Store { .. }) => {}
        other => panic!("expected a Store error with a wrong password, got {other:?}"),
    }
}
