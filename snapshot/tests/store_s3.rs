//! The store conformance suite against `S3Store` and a real S3-compatible server
//! (`moto_server` from PyPI, `.ci/venv snapshot`), one server per case on loopback.
//! Credentials come from a credentials file, as `--snapshot-store` takes them.

#[macro_use]
mod suite;

snapshot_store_suite!(s3, async {
    let bucket = "berth-snapshots";
    let server = berth_testkit::store_servers::moto(bucket);
    let prefix = format!("ci/{:016x}", rand::random::<u64>());
    let endpoint = format!("http://127.0.0.1:{}", server.port);
    let url = server.s3_url(bucket, &prefix);
    let store = berth_snapshot::open(&url).unwrap();
    assert_eq!(store.name(), "s3");
    assert_eq!(store.describe(), format!("s3://{bucket}/{prefix}?endpoint={endpoint}"));
    suite::Fixture { store, _guard: Box::new(server) }
});
