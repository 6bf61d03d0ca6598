//! The store conformance suite against `S3Store` and a real S3-compatible server
//! (`moto_server` from PyPI, `.ci/venv snapshot`), one server per case on loopback.
//! Credentials come from a credentials file, as `--snapshot-store` takes them.

#[macro_use]
mod suite;

snapshot_store_suite!(s3, async {
    let bucket = "berth-snapshots";
    let server = suite::servers::moto(bucket);
    let credentials = server.dir.path().join("credentials");
    std::fs::write(&credentials, "[default]\naws_access_key_id = testing\naws_secret_access_key = testing-secret\n")
        .unwrap();
    let prefix = format!("ci/{:016x}", rand::random::<u64>());
    let endpoint = format!("http://127.0.0.1:{}", server.port);
    let url = format!(
        "s3://{bucket}/{prefix}?endpoint={endpoint}&region=us-east-1&credentials_file={}",
        credentials.display()
    );
    let store = berth_snapshot::open(&url).unwrap();
    assert_eq!(store.name(), "s3");
    assert_eq!(store.describe(), format!("s3://{bucket}/{prefix}?endpoint={endpoint}"));
    suite::Fixture { store, _guard: Box::new(server) }
});
