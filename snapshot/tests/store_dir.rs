//! The store conformance suite against `DirStore` (`file://`).

#[macro_use]
mod suite;

snapshot_store_suite!(dir, async {
    let dir = tempfile::Builder::new().prefix("berth-snapshot-dir-").tempdir().unwrap();
    let url = format!("file://{}", dir.path().join("store").display());
    let store = berth_snapshot::open(&url).unwrap();
    assert_eq!(store.describe(), url);
    assert_eq!(store.name(), "dir");
    suite::Fixture { store, _guard: Box::new(dir) }
});
