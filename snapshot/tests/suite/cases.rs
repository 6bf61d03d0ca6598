//! The cases of `snapshot_store_suite!`. Each takes a store of its own.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::time::Duration;

use berth_snapshot::{SnapshotError, SnapshotOptions, SnapshotStoreRef};
use bytes::Bytes;

use super::tree;

fn hash(data: &[u8]) -> String {
    blake3::hash(data).to_hex().to_string()
}

fn blob(data: &[u8]) -> (String, Bytes) {
    (hash(data), Bytes::from(zstd::bulk::compress(data, 3).unwrap()))
}

fn temp() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("berth-snapshot-test-").tempdir().unwrap()
}

fn incremental(parent: &str) -> SnapshotOptions {
    SnapshotOptions { parent: Some(parent.to_owned()), ..SnapshotOptions::default() }
}

pub async fn blob_round_trip(store: SnapshotStoreRef) {
    assert!(!store.describe().is_empty());
    let (first, first_data) = blob(b"first blob");
    let (second, second_data) = blob(b"second blob");
    assert!(!store.has_blob(&first).await.unwrap());
    store.put_blob(&first, first_data.clone()).await.unwrap();
    store.put_blob(&second, second_data.clone()).await.unwrap();
    assert!(store.has_blob(&first).await.unwrap());
    assert_eq!(store.get_blob(&first).await.unwrap(), first_data);
    assert_eq!(store.get_blob(&second).await.unwrap(), second_data);
    let mut listed = store.list_blobs().await.unwrap();
    listed.sort();
    let mut expected = vec![first.clone(), second.clone()];
    expected.sort();
    assert_eq!(listed, expected);
    let (missing, _) = blob(b"never stored");
    assert_eq!(store.has_blobs(&[first.clone(), missing, second.clone()]).await.unwrap(), vec![true, false, true]);
    let entries = store.list_blob_entries().await.unwrap();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
    for entry in entries {
        assert!(
            entry.written_unix_ms <= now + 5_000 && entry.written_unix_ms + 600_000 > now,
            "{entry:?} vs now {now}"
        );
    }
    store.delete_blob(&first).await.unwrap();
    assert!(!store.has_blob(&first).await.unwrap());
    assert_eq!(store.list_blobs().await.unwrap(), vec![second]);
}

pub async fn put_is_idempotent(store: SnapshotStoreRef) {
    let (address, data) = blob(b"twice");
    store.put_blob(&address, data.clone()).await.unwrap();
    store.put_blob(&address, data.clone()).await.unwrap();
    assert_eq!(store.get_blob(&address).await.unwrap(), data);
    assert_eq!(store.list_blobs().await.unwrap(), vec![address]);
    store.put_manifest("ws-a", "s1", Bytes::from_static(b"m")).await.unwrap();
    store.put_manifest("ws-a", "s1", Bytes::from_static(b"m")).await.unwrap();
    assert_eq!(store.list_manifests("ws-a").await.unwrap(), vec!["s1".to_owned()]);
    // Concurrent puts of one blob (two snapshots sharing a chunk) all succeed.
    let shared = hash(b"shared");
    let puts = (0..8).map(|_| store.put_blob(&shared, Bytes::from_static(b"shared-bytes")));
    for result in futures::future::join_all(puts).await {
        result.unwrap();
    }
    assert_eq!(store.get_blob(&hash(b"shared")).await.unwrap(), Bytes::from_static(b"shared-bytes"));
}

pub async fn not_found_is_typed(store: SnapshotStoreRef) {
    let (missing, _) = blob(b"missing");
    assert!(matches!(store.get_blob(&missing).await, Err(SnapshotError::NotFound { kind: "blob", .. })));
    assert!(matches!(store.get_manifest("ws-none", "s1").await, Err(SnapshotError::NotFound { kind: "manifest", .. })));
    store.delete_blob(&missing).await.unwrap();
    store.delete_manifest("ws-none", "s1").await.unwrap();
    assert!(store.list_manifests("ws-none").await.unwrap().is_empty());
    assert!(store.list_workspaces().await.unwrap().is_empty());
    let target = temp();
    assert!(matches!(
        berth_snapshot::restore(&*store, "ws-none", "s1", &target.path().join("into")).await,
        Err(SnapshotError::NotFound { .. })
    ));
    assert!(berth_snapshot::list(&*store, "ws-none").await.unwrap().is_empty());
}

pub async fn invalid_names_refused(store: SnapshotStoreRef) {
    let data = Bytes::from_static(b"x");
    for bad in ["../../etc/passwd", "ABCDEF", "", &"g".repeat(64)] {
        assert!(matches!(store.put_blob(bad, data.clone()).await, Err(SnapshotError::InvalidName { .. })), "{bad:?}");
        assert!(matches!(store.get_blob(bad).await, Err(SnapshotError::InvalidName { .. })), "{bad:?}");
    }
    for bad in ["..", "../x", "a/b", ".hidden", "", "a b"] {
        assert!(
            matches!(store.put_manifest(bad, "s1", data.clone()).await, Err(SnapshotError::InvalidName { .. })),
            "{bad:?}"
        );
        assert!(
            matches!(store.put_manifest("ws", bad, data.clone()).await, Err(SnapshotError::InvalidName { .. })),
            "{bad:?}"
        );
        assert!(matches!(store.list_manifests(bad).await, Err(SnapshotError::InvalidName { .. })), "{bad:?}");
    }
    assert!(store.list_workspaces().await.unwrap().is_empty());
}

pub async fn manifest_listing_and_deletes(store: SnapshotStoreRef) {
    for (workspace, snapshot) in [("ws-a", "s1"), ("ws-a", "s2"), ("ws-b", "s1")] {
        store.put_manifest(workspace, snapshot, Bytes::from(format!("{workspace}/{snapshot}"))).await.unwrap();
    }
    let mut workspaces = store.list_workspaces().await.unwrap();
    workspaces.sort();
    assert_eq!(workspaces, vec!["ws-a".to_owned(), "ws-b".to_owned()]);
    let mut snapshots = store.list_manifests("ws-a").await.unwrap();
    snapshots.sort();
    assert_eq!(snapshots, vec!["s1".to_owned(), "s2".to_owned()]);
    assert_eq!(store.get_manifest("ws-b", "s1").await.unwrap(), Bytes::from_static(b"ws-b/s1"));
    store.delete_manifest("ws-a", "s1").await.unwrap();
    assert_eq!(store.list_manifests("ws-a").await.unwrap(), vec!["s2".to_owned()]);
    store.delete_manifest("ws-b", "s1").await.unwrap();
    assert_eq!(store.list_workspaces().await.unwrap(), vec!["ws-a".to_owned()]);
    // A workspace id that is a prefix of another's stays separate.
    store.put_manifest("ws-a2", "s9", Bytes::from_static(b"other")).await.unwrap();
    assert_eq!(store.list_manifests("ws-a").await.unwrap(), vec!["s2".to_owned()]);
}

pub async fn large_blob_and_manifest(store: SnapshotStoreRef) {
    let data = Bytes::from(tree::noise(7, 40 << 20));
    let address = hash(&data);
    store.put_blob(&address, data.clone()).await.unwrap();
    let back = store.get_blob(&address).await.unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "large blob differs");
    store.put_manifest("ws-large", "s1", data.clone()).await.unwrap();
    assert!(store.get_manifest("ws-large", "s1").await.unwrap() == data, "large manifest differs");
    // Overwriting a large value with a small one leaves no stale parts behind.
    store.put_manifest("ws-large", "s1", Bytes::from_static(b"small")).await.unwrap();
    assert_eq!(store.get_manifest("ws-large", "s1").await.unwrap(), Bytes::from_static(b"small"));
    store.delete_blob(&address).await.unwrap();
    assert!(matches!(store.get_blob(&address).await, Err(SnapshotError::NotFound { .. })));
}

pub async fn snapshot_restore_round_trip(store: SnapshotStoreRef) {
    let dir = temp();
    let source = dir.path().join("source");
    tree::sample(&source, 1);
    let info = berth_snapshot::snapshot(&*store, "ws-rt", 3, &source, SnapshotOptions::default()).await.unwrap();
    assert_eq!(info.workspace_id, "ws-rt");
    assert_eq!(info.generation, 3);
    assert_eq!(info.files, 7);
    assert_eq!(info.bytes, fs::metadata(source.join("data/big.bin")).unwrap().len() + 2 * 13_000 + 4 + 18 + 7);
    assert!(info.uploaded_bytes > 3 << 20, "{info:?}");
    assert_eq!(info.deduplicated_bytes, 13_000, "the second copy is deduplicated: {info:?}");
    assert!(info.manifest_bytes > 0);
    let into = dir.path().join("restored");
    let restored = berth_snapshot::restore(&*store, "ws-rt", &info.id, &into).await.unwrap();
    assert_eq!(restored.id, info.id);
    assert_eq!(tree::describe(&into), tree::describe(&source));
    assert_eq!(fs::read_link(into.join("absolute-link")).unwrap().to_str(), Some("/etc/hostname"));
    assert!(tree::leftovers(dir.path(), ".restored.").is_empty());
    let listed = berth_snapshot::list(&*store, "ws-rt").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, info.id);
    assert_eq!(listed[0].files, info.files);
}

pub async fn incremental_uploads_only_changes(store: SnapshotStoreRef) {
    let dir = temp();
    let source = dir.path().join("source");
    tree::sample(&source, 2);
    tree::write(&source, "data/large.bin", &tree::noise(22, 8 << 20), 0o644);
    tree::age(&source, Duration::from_secs(3600));
    let first = berth_snapshot::snapshot(&*store, "ws-inc", 1, &source, SnapshotOptions::default()).await.unwrap();
    // One 1 KiB edit in the middle of the large file.
    let mut large = fs::read(source.join("data/large.bin")).unwrap();
    large[4 << 20..(4 << 20) + 1024].copy_from_slice(&tree::noise(99, 1024));
    fs::write(source.join("data/large.bin"), &large).unwrap();
    let second = berth_snapshot::snapshot(&*store, "ws-inc", 1, &source, incremental(&first.id)).await.unwrap();
    assert!(second.id > first.id, "ids sort by time: {} then {}", first.id, second.id);
    assert_eq!(second.parent.as_deref(), Some(first.id.as_str()));
    assert!(second.uploaded_bytes < 1 << 20, "a 1 KiB edit uploaded {} bytes", second.uploaded_bytes);
    assert!(second.deduplicated_bytes > second.bytes - (1 << 20), "{second:?}");
    // Without a parent the walk reads everything but still uploads only new chunks.
    let third = berth_snapshot::snapshot(&*store, "ws-inc", 1, &source, SnapshotOptions::default()).await.unwrap();
    assert_eq!(third.uploaded_bytes, 0, "{third:?}");
    // Both snapshots restore to what they saw.
    let restored = dir.path().join("restored");
    berth_snapshot::restore(&*store, "ws-inc", &second.id, &restored).await.unwrap();
    assert_eq!(tree::describe(&restored), tree::describe(&source));
    berth_snapshot::restore(&*store, "ws-inc", &first.id, &restored).await.unwrap();
    assert_ne!(fs::read(restored.join("data/large.bin")).unwrap(), large);
    assert_eq!(fs::read(restored.join("data/large.bin")).unwrap(), tree::noise(22, 8 << 20));
}

pub async fn restore_replaces_target_atomically(store: SnapshotStoreRef) {
    let dir = temp();
    let source = dir.path().join("source");
    tree::sample(&source, 3);
    let info = berth_snapshot::snapshot(&*store, "ws-swap", 1, &source, SnapshotOptions::default()).await.unwrap();
    let into = dir.path().join("workspace");
    tree::write(&into, "stale/file.txt", b"not in the snapshot", 0o644);
    berth_snapshot::restore(&*store, "ws-swap", &info.id, &into).await.unwrap();
    assert_eq!(tree::describe(&into), tree::describe(&source));
    assert!(tree::leftovers(dir.path(), ".workspace.").is_empty(), "{:?}", tree::leftovers(dir.path(), "."));
    // A target whose parent does not exist is refused before anything is fetched.
    assert!(berth_snapshot::restore(&*store, "ws-swap", &info.id, &dir.path().join("no/such/parent")).await.is_err());
}

pub async fn concurrent_snapshots_of_two_workspaces(store: SnapshotStoreRef) {
    let dir = temp();
    let (left, right) = (dir.path().join("left"), dir.path().join("right"));
    tree::sample(&left, 10);
    tree::sample(&right, 11);
    let (left_info, right_info) = tokio::join!(
        berth_snapshot::snapshot(&*store, "ws-left", 1, &left, SnapshotOptions::default()),
        berth_snapshot::snapshot(&*store, "ws-right", 1, &right, SnapshotOptions::default()),
    );
    let (left_info, right_info) = (left_info.unwrap(), right_info.unwrap());
    let (left_into, right_into) = (dir.path().join("left-restored"), dir.path().join("right-restored"));
    let (left_restore, right_restore) = tokio::join!(
        berth_snapshot::restore(&*store, "ws-left", &left_info.id, &left_into),
        berth_snapshot::restore(&*store, "ws-right", &right_info.id, &right_into),
    );
    left_restore.unwrap();
    right_restore.unwrap();
    assert_eq!(tree::describe(&left_into), tree::describe(&left));
    assert_eq!(tree::describe(&right_into), tree::describe(&right));
    assert_ne!(tree::describe(&left_into), tree::describe(&right_into));
    assert_eq!(berth_snapshot::list(&*store, "ws-left").await.unwrap().len(), 1);
    assert_eq!(berth_snapshot::list(&*store, "ws-right").await.unwrap().len(), 1);
}

pub async fn corrupt_blob_fails_naming_file_and_falls_back(store: SnapshotStoreRef) {
    let dir = temp();
    let source = dir.path().join("source");
    tree::sample(&source, 4);
    tree::write(&source, "notes/a.txt", b"version one", 0o644);
    let older = berth_snapshot::snapshot(&*store, "ws-corrupt", 1, &source, SnapshotOptions::default()).await.unwrap();
    tree::write(&source, "notes/a.txt", b"version two", 0o644);
    let newer = berth_snapshot::snapshot(&*store, "ws-corrupt", 2, &source, incremental(&older.id)).await.unwrap();
    // Bit rot: the blob of "version two" now decodes to other bytes.
    store.put_blob(&hash(b"version two"), Bytes::from(zstd::bulk::compress(b"version 2!!", 3).unwrap())).await.unwrap();

    let into = dir.path().join("workspace");
    tree::write(&into, "before.txt", b"what was there", 0o644);
    let error = berth_snapshot::restore(&*store, "ws-corrupt", &newer.id, &into).await.unwrap_err();
    match &error {
        SnapshotError::Corrupt { path, snapshot_id, .. } => {
            assert_eq!(path, "notes/a.txt");
            assert_eq!(snapshot_id, &newer.id);
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(error.to_string().contains("notes/a.txt"), "{error}");
    assert_eq!(
        fs::read(into.join("before.txt")).unwrap(),
        b"what was there",
        "a failed restore leaves the target alone"
    );
    assert!(tree::leftovers(dir.path(), ".workspace.").is_empty());

    let candidates = vec![newer.id.clone(), older.id.clone()];
    let (restored, failures) = berth_snapshot::restore_latest(&*store, "ws-corrupt", &candidates, &into).await.unwrap();
    assert_eq!(restored.id, older.id);
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].0, newer.id);
    assert!(matches!(failures[0].1, SnapshotError::Corrupt { .. }));
    assert_eq!(fs::read(into.join("notes/a.txt")).unwrap(), b"version one");
    assert!(!into.join("before.txt").exists());

    // Garbage that is not zstd at all fails the same way; with no good candidate left,
    // restore_latest says so.
    store.put_blob(&hash(b"version one"), Bytes::from_static(b"garbage")).await.unwrap();
    match berth_snapshot::restore_latest(&*store, "ws-corrupt", &candidates, &into).await {
        Err(SnapshotError::NoRestorableSnapshot { tried: 2, last: Some(last), .. }) => {
            assert!(matches!(*last, SnapshotError::Corrupt { .. }))
        }
        other => panic!("expected NoRestorableSnapshot, got {other:?}"),
    }
    assert!(matches!(
        berth_snapshot::restore_latest(&*store, "ws-corrupt", &[], &into).await,
        Err(SnapshotError::NoRestorableSnapshot { tried: 0, .. })
    ));
}

pub async fn missing_blob_fails_restore(store: SnapshotStoreRef) {
    let dir = temp();
    let source = dir.path().join("source");
    tree::sample(&source, 5);
    tree::write(&source, "only/here.txt", b"a chunk nobody else has", 0o644);
    let info = berth_snapshot::snapshot(&*store, "ws-missing", 1, &source, SnapshotOptions::default()).await.unwrap();
    store.delete_blob(&hash(b"a chunk nobody else has")).await.unwrap();
    let into = dir.path().join("workspace");
    match berth_snapshot::restore(&*store, "ws-missing", &info.id, &into).await {
        Err(SnapshotError::Corrupt { path, reason, .. }) => {
            assert_eq!(path, "only/here.txt");
            assert!(reason.contains("missing"), "{reason}");
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(!into.exists());
    assert!(tree::leftovers(dir.path(), ".workspace.").is_empty());
    // The next snapshot notices the chunk is gone and uploads it again.
    let again = berth_snapshot::snapshot(&*store, "ws-missing", 1, &source, incremental(&info.id)).await.unwrap();
    assert!(again.uploaded_bytes > 0);
    berth_snapshot::restore(&*store, "ws-missing", &again.id, &into).await.unwrap();
    assert_eq!(tree::describe(&into), tree::describe(&source));
}

/// A manifest written by hand, as a hostile store or tenant could.
fn crafted_manifest(workspace_id: &str, snapshot_id: &str, entries: serde_json::Value) -> Bytes {
    let manifest = serde_json::json!({
        "format": 1, "hash": "blake3", "compression": "zstd", "chunking": "fastcdc2020:32768:131072:524288",
        "info": { "id": snapshot_id, "workspace_id": workspace_id, "generation": 1, "created_unix_ms": 1,
                  "files": 1, "bytes": 5, "uploaded_bytes": 0, "deduplicated_bytes": 0 },
        "entries": entries,
    });
    Bytes::from(zstd::bulk::compress(&serde_json::to_vec(&manifest).unwrap(), 3).unwrap())
}

pub async fn hostile_manifest_paths_refused(store: SnapshotStoreRef) {
    let dir = temp();
    let outside = dir.path().join("outside");
    fs::create_dir(&outside).unwrap();
    let (address, data) = blob(b"pwned");
    store.put_blob(&address, data).await.unwrap();
    let file = |path: &str| {
        serde_json::json!({ "path": path, "kind": "file", "mode": 420, "size": 5, "hash": address,
                            "chunks": [ { "h": address, "n": 5 } ] })
    };
    let outside_text = outside.display().to_string();
    let hostile: Vec<(&str, serde_json::Value)> = vec![
        ("dotdot", serde_json::json!([file("../outside/pwned")])),
        ("absolute", serde_json::json!([file(&format!("{outside_text}/pwned"))])),
        (
            "inner-dotdot",
            serde_json::json!([{ "path": "a", "kind": "dir", "mode": 493 }, file("a/../../outside/pwned")]),
        ),
        (
            "through-symlink",
            serde_json::json!([{ "path": "link", "kind": "symlink", "mode": 511, "target": outside_text }, file("link/pwned")]),
        ),
        ("no-parent", serde_json::json!([file("missing-dir/pwned")])),
        ("duplicate", serde_json::json!([file("twice"), file("twice")])),
        ("empty-component", serde_json::json!([{ "path": "a", "kind": "dir", "mode": 493 }, file("a//pwned")])),
    ];
    for (name, entries) in hostile {
        let snapshot_id = format!("hostile-{name}");
        store
            .put_manifest("ws-hostile", &snapshot_id, crafted_manifest("ws-hostile", &snapshot_id, entries))
            .await
            .unwrap();
        let into = dir.path().join("restore-here");
        let result = berth_snapshot::restore(&*store, "ws-hostile", &snapshot_id, &into).await;
        assert!(matches!(result, Err(SnapshotError::UnsafePath { .. })), "{name}: {result:?}");
        assert!(!outside.join("pwned").exists(), "{name} wrote outside the target");
        assert!(!into.exists(), "{name} left a target behind");
        assert!(tree::leftovers(dir.path(), ".restore-here.").is_empty(), "{name} left a staging directory");
    }
    // A manifest stored under another workspace's name is refused as corrupt.
    store.put_manifest("ws-other", "s1", crafted_manifest("ws-hostile", "s1", serde_json::json!([]))).await.unwrap();
    assert!(matches!(
        berth_snapshot::restore(&*store, "ws-other", "s1", &dir.path().join("x")).await,
        Err(SnapshotError::Corrupt { .. })
    ));
    // A chunk claiming to be huge is refused before anything is fetched.
    let huge = serde_json::json!([{ "path": "f", "kind": "file", "mode": 420, "size": 1u64 << 40, "hash": address,
                                   "chunks": [ { "h": address, "n": 1u64 << 40 } ] }]);
    store.put_manifest("ws-hostile", "huge", crafted_manifest("ws-hostile", "huge", huge)).await.unwrap();
    assert!(matches!(
        berth_snapshot::restore(&*store, "ws-hostile", "huge", &dir.path().join("x")).await,
        Err(SnapshotError::Corrupt { .. })
    ));
}

pub async fn symlinks_not_followed_and_specials_skipped(store: SnapshotStoreRef) {
    let dir = temp();
    let outside = dir.path().join("outside");
    tree::write(&outside, "secret.txt", b"host secret", 0o600);
    let source = dir.path().join("source");
    tree::write(&source, "own.txt", b"mine", 0o644);
    std::os::unix::fs::symlink(&outside, source.join("to-outside-dir")).unwrap();
    std::os::unix::fs::symlink(outside.join("secret.txt"), source.join("to-outside-file")).unwrap();
    nix::unistd::mkfifo(&source.join("fifo"), nix::sys::stat::Mode::from_bits_truncate(0o644)).unwrap();
    let socket = std::os::unix::net::UnixListener::bind(source.join("socket")).unwrap();

    let info = berth_snapshot::snapshot(&*store, "ws-links", 1, &source, SnapshotOptions::default()).await.unwrap();
    drop(socket);
    assert_eq!(info.files, 1, "only own.txt is a file of the tree: {info:?}");
    assert_eq!(info.bytes, 4);
    assert_eq!(info.skipped, 2, "the FIFO and the socket: {info:?}");
    let into = dir.path().join("restored");
    berth_snapshot::restore(&*store, "ws-links", &info.id, &into).await.unwrap();
    assert_eq!(fs::read_link(into.join("to-outside-dir")).unwrap(), outside);
    assert_eq!(fs::read_link(into.join("to-outside-file")).unwrap(), outside.join("secret.txt"));
    assert!(!into.join("fifo").exists() && !into.join("socket").exists());
    assert_eq!(tree::describe(&into).len(), 3);
    // A snapshot root that is itself a symlink is refused, not followed.
    std::os::unix::fs::symlink(&source, dir.path().join("root-link")).unwrap();
    assert!(matches!(
        berth_snapshot::snapshot(&*store, "ws-links", 1, &dir.path().join("root-link"), SnapshotOptions::default())
            .await,
        Err(SnapshotError::InvalidInput(_))
    ));
    assert_eq!(fs::metadata(outside.join("secret.txt")).unwrap().mode() & 0o777, 0o600);
}

pub async fn gc_removes_only_unreferenced_old_blobs(store: SnapshotStoreRef) {
    let dir = temp();
    let source = dir.path().join("source");
    tree::write(&source, "keep.txt", b"kept by the newer snapshot", 0o644);
    tree::write(&source, "change.txt", b"only in the older snapshot", 0o644);
    let older = berth_snapshot::snapshot(&*store, "ws-gc", 1, &source, SnapshotOptions::default()).await.unwrap();
    tree::write(&source, "change.txt", b"only in the newer snapshot", 0o644);
    let newer = berth_snapshot::snapshot(&*store, "ws-gc", 1, &source, SnapshotOptions::default()).await.unwrap();
    // Another workspace shares a chunk with the older snapshot.
    let other = dir.path().join("other");
    tree::write(&other, "same.txt", b"kept by the newer snapshot", 0o644);
    let other_info =
        berth_snapshot::snapshot(&*store, "ws-gc-other", 1, &other, SnapshotOptions::default()).await.unwrap();
    let (orphan, orphan_data) = blob(b"uploaded by a snapshot still in flight");
    store.put_blob(&orphan, orphan_data).await.unwrap();

    // Everything is young: a long grace deletes nothing, even unreferenced blobs.
    let report = berth_snapshot::collect_garbage(&*store, Duration::from_secs(3600)).await.unwrap();
    assert!(report.deleted.is_empty(), "{report:?}");
    assert_eq!(report.kept_young, 1, "the orphan: {report:?}");
    assert_eq!(report.manifests, 3);

    assert_eq!(berth_snapshot::prune(&*store, "ws-gc", 1).await.unwrap(), vec![older.id.clone()]);
    let report = berth_snapshot::collect_garbage(&*store, Duration::ZERO).await.unwrap();
    let mut deleted = report.deleted.clone();
    deleted.sort();
    let mut expected = vec![hash(b"only in the older snapshot"), orphan];
    expected.sort();
    assert_eq!(deleted, expected, "{report:?}");
    assert!(store.has_blob(&hash(b"kept by the newer snapshot")).await.unwrap());
    for (workspace, snapshot) in [("ws-gc", &newer.id), ("ws-gc-other", &other_info.id)] {
        let into = dir.path().join(format!("restored-{workspace}"));
        berth_snapshot::restore(&*store, workspace, snapshot, &into).await.unwrap();
    }
    // Deleting the workspaces makes every chunk garbage.
    berth_snapshot::delete_workspace(&*store, "ws-gc").await.unwrap();
    berth_snapshot::delete_workspace(&*store, "ws-gc-other").await.unwrap();
    berth_snapshot::collect_garbage(&*store, Duration::ZERO).await.unwrap();
    assert!(store.list_blobs().await.unwrap().is_empty());
}

pub async fn retention_prune_list_delete(store: SnapshotStoreRef) {
    let dir = temp();
    let source = dir.path().join("source");
    let mut ids = Vec::new();
    for round in 0..3u64 {
        tree::write(&source, "counter.txt", round.to_string().as_bytes(), 0o644);
        let info =
            berth_snapshot::snapshot(&*store, "ws-keep", round, &source, SnapshotOptions::default()).await.unwrap();
        ids.push(info.id);
    }
    let listed: Vec<String> =
        berth_snapshot::list(&*store, "ws-keep").await.unwrap().into_iter().map(|info| info.id).collect();
    assert_eq!(listed, ids.iter().rev().cloned().collect::<Vec<_>>(), "newest first");
    let deleted = berth_snapshot::prune(&*store, "ws-keep", 2).await.unwrap();
    assert_eq!(deleted, vec![ids[0].clone()]);
    assert!(berth_snapshot::prune(&*store, "ws-keep", 2).await.unwrap().is_empty());
    let listed: Vec<u64> =
        berth_snapshot::list(&*store, "ws-keep").await.unwrap().into_iter().map(|info| info.generation).collect();
    assert_eq!(listed, vec![2, 1]);
    berth_snapshot::delete_workspace(&*store, "ws-keep").await.unwrap();
    assert!(berth_snapshot::list(&*store, "ws-keep").await.unwrap().is_empty());
    assert!(store.list_workspaces().await.unwrap().is_empty());
}
