//! Acceptance (issue 15): in a 256 MiB workspace (many small files and one large), a second
//! snapshot after one 1 KiB edit uploads less than 1 MiB, and both snapshots restore
//! exactly (content hashes compared). Against the dir store; the suites show the other
//! stores behave the same.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, SystemTime};

use berth_snapshot::SnapshotOptions;
use rand::RngCore;

const MIB: usize = 1 << 20;

fn tree_hashes(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for item in fs::read_dir(&dir).unwrap() {
            let path = item.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let relative = path.strip_prefix(root).unwrap().display().to_string();
                out.insert(relative, blake3::hash(&fs::read(&path).unwrap()).to_hex().to_string());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_kib_edit_in_256_mib_uploads_under_one_mib() {
    let dir = tempfile::Builder::new().prefix("berth-snapshot-acceptance-").tempdir().unwrap();
    let source = dir.path().join("workspace");
    let mut random = rand::rng();
    // 2048 small files of 64 KiB (half text-like, half random) in 32 directories…
    for index in 0..2048 {
        let path = source.join(format!("src/module-{:02}/file-{index:04}.dat", index % 32));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let mut data = vec![0u8; 64 * 1024];
        if index % 2 == 0 {
            random.fill_bytes(&mut data);
        } else {
            for (offset, byte) in data.iter_mut().enumerate() {
                *byte = b"fn main() { println!(\"berth\"); }\n"[(offset + index) % 33];
            }
        }
        fs::write(&path, &data).unwrap();
    }
    // …and one large random file of 128 MiB.
    let mut large = vec![0u8; 128 * MIB];
    random.fill_bytes(&mut large);
    fs::write(source.join("large.bin"), &large).unwrap();
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    fs::OpenOptions::new().write(true).open(source.join("large.bin")).unwrap().set_modified(an_hour_ago).unwrap();

    let store = berth_snapshot::open(&format!("file://{}", dir.path().join("store").display())).unwrap();
    let first =
        berth_snapshot::snapshot(&*store, "ws-acceptance", 1, &source, SnapshotOptions::default()).await.unwrap();
    assert_eq!(first.files, 2049);
    assert_eq!(first.bytes, 256 * MIB as u64);

    // One 1 KiB edit in the middle of the large file.
    let mut edit = vec![0u8; 1024];
    random.fill_bytes(&mut edit);
    large[64 * MIB..64 * MIB + 1024].copy_from_slice(&edit);
    fs::write(source.join("large.bin"), &large).unwrap();
    let options = SnapshotOptions { parent: Some(first.id.clone()), ..SnapshotOptions::default() };
    let second = berth_snapshot::snapshot(&*store, "ws-acceptance", 1, &source, options).await.unwrap();
    eprintln!(
        "first: uploaded {} B, manifest {} B; second: uploaded {} B, deduplicated {} B, manifest {} B",
        first.uploaded_bytes,
        first.manifest_bytes,
        second.uploaded_bytes,
        second.deduplicated_bytes,
        second.manifest_bytes
    );
    assert!(second.uploaded_bytes < MIB as u64, "a 1 KiB edit uploaded {} bytes", second.uploaded_bytes);
    assert!(second.deduplicated_bytes >= second.bytes - MIB as u64);

    let restored = dir.path().join("restored");
    berth_snapshot::restore(&*store, "ws-acceptance", &second.id, &restored).await.unwrap();
    assert!(tree_hashes(&restored) == tree_hashes(&source), "the restored tree differs from the workspace");
    berth_snapshot::restore(&*store, "ws-acceptance", &first.id, &restored).await.unwrap();
    let old_large = fs::read(restored.join("large.bin")).unwrap();
    assert_ne!(old_large[64 * MIB..64 * MIB + 1024], edit[..]);
    assert_eq!(old_large[..64 * MIB], large[..64 * MIB]);
}
