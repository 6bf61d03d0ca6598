//! Tar / tar.gz extraction (`tree::upload`, the path skills and tree uploads take) into a
//! local workspace whose parent holds an `outside` directory with a secret.
//!
//! Input: the first byte picks gzip (odd) or plain tar (even) for the rest, which is the
//! archive. Properties, after every archive: nothing next to the root changed; the root
//! holds no leftover temp directory; a refused archive left no destination behind; an
//! accepted one stays under its destination — every symlink it made resolves (when it
//! resolves at all) inside the root, and the limits held.
#![no_main]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use berth_backend_host::LocalBackend;
use berth_features::tree::{TEMP_PREFIX, TreeLimits, upload};
use berth_workspace::{ByteStream, RelPath};
use bytes::Bytes;
use futures::StreamExt;
use libfuzzer_sys::fuzz_target;

const SECRET: &[u8] = b"OUTSIDE-SECRET\n";
const LIMITS: TreeLimits = TreeLimits { max_bytes: 256 * 1024, max_files: 128 };

struct Fixture {
    runtime: tokio::runtime::Runtime,
    backend: LocalBackend,
    root: PathBuf,
    outside: PathBuf,
    _dir: tempfile::TempDir,
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("root");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("secret"), SECRET).unwrap();
        // A link already in the root that leads out: extraction must not write through it.
        std::os::unix::fs::symlink("../outside", root.join("out")).unwrap();
        let backend = LocalBackend::open(&root).expect("open root");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let root = root.canonicalize().unwrap();
        Fixture { runtime, backend, root, outside, _dir: dir }
    })
}

fn outside_unchanged(fixture: &Fixture) {
    let names: Vec<_> = std::fs::read_dir(&fixture.outside).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("secret")], "something appeared outside the root");
    assert_eq!(std::fs::read(fixture.outside.join("secret")).unwrap(), SECRET, "the outside file changed");
}

/// Walks an extracted tree: counts entries and content bytes, checks every symlink.
fn check_tree(root: &Path, dir: &Path, files: &mut u64, bytes: &mut u64) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        *files += 1;
        if meta.file_type().is_symlink() {
            if let Ok(resolved) = path.canonicalize() {
                assert!(resolved.starts_with(root), "symlink {path:?} resolves outside the root: {resolved:?}");
            }
        } else if meta.is_dir() {
            check_tree(root, &path, files, bytes);
        } else {
            assert!(meta.is_file(), "{path:?} is neither a file, a directory nor a symlink");
            *bytes += meta.len();
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, archive)) = data.split_first() else { return };
    let archive = if mode % 2 == 1 {
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        encoder.write_all(archive).unwrap();
        encoder.finish().unwrap()
    } else {
        archive.to_vec()
    };
    let fixture = fixture();
    let dest = RelPath::parse("dest").unwrap();
    // Archives arrive in small chunks, as from a gRPC stream.
    let chunks: Vec<_> = archive.chunks(509).map(|chunk| Ok(Bytes::copy_from_slice(chunk))).collect();
    let input: ByteStream = futures::stream::iter(chunks).boxed();
    let outcome = fixture.runtime.block_on(upload(&fixture.backend, &dest, input, LIMITS, false));

    outside_unchanged(fixture);
    let leftovers: Vec<_> = std::fs::read_dir(&fixture.root)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with(TEMP_PREFIX))
        .collect();
    assert!(leftovers.is_empty(), "temp dirs left behind: {leftovers:?}");
    let dest_path = fixture.root.join("dest");
    match outcome {
        Ok(stats) => {
            let (mut files, mut bytes) = (0, 0);
            check_tree(&fixture.root, &dest_path, &mut files, &mut bytes);
            assert!(files <= LIMITS.max_files, "{files} entries past the limit");
            assert!(bytes <= LIMITS.max_bytes, "{bytes} bytes past the limit");
            assert_eq!(bytes, stats.bytes, "stats disagree with the disk");
            std::fs::remove_dir_all(&dest_path).unwrap();
        }
        Err(_) => assert!(!dest_path.exists(), "a refused archive left {dest_path:?} behind"),
    }
});
