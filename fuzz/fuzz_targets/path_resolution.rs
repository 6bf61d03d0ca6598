//! `join_path` + `HostFs` under temp roots whose symlinks lead out in every way we know.
//!
//! Properties: a parsed `RelPath` keeps its lexical invariants and re-parses to itself;
//! no read or listing through it ever reaches the `outside` directory next to the read
//! root, and no write or mkdir under the write root changes the directory next to it
//! (checked after every write). Reads and writes use separate roots, so what the fuzzer
//! writes can never look like an escape to a later read. The links lead only to temp
//! directories, never to /etc: a write that escaped would damage nothing real.
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use berth_workspace::path::{MAX_PATH_BYTES, MAX_PATH_DEPTH};
use berth_backend_host::HostFs;
use berth_workspace::{ByteStream, RelPath, WriteOptions, join_path};
use bytes::Bytes;
use futures::StreamExt;
use libfuzzer_sys::fuzz_target;

const SECRET: &[u8] = b"OUTSIDE-SECRET\n";

struct Fixture {
    runtime: tokio::runtime::Runtime,
    read_fs: HostFs,
    write_fs: HostFs,
    write_outside: PathBuf,
    _dir: tempfile::TempDir,
}

/// A root with the usual traps next to an `outside` directory holding the secret.
fn make_root(base: &std::path::Path) -> (PathBuf, PathBuf) {
    let root = base.join("root");
    let outside = base.join("outside");
    std::fs::create_dir_all(root.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), SECRET).unwrap();
    std::fs::write(root.join("sub/f"), b"inside\n").unwrap();
    let link = |target: &str, name: &str| std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    link("..", "up");
    link("../outside", "out");
    link(&outside.display().to_string(), "abs");
    link("../..", "sub/up2");
    link("sub", "inner");
    link("loop", "loop");
    link("a2", "a1");
    link("a1", "a2");
    link("../root/sub", "back");
    link("../outside/missing", "dangling");
    (root, outside)
}

fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("temp dir");
        let (read_root, _) = make_root(&dir.path().join("read"));
        let (write_root, write_outside) = make_root(&dir.path().join("write"));
        let read_fs = HostFs::open(&read_root).expect("open read root");
        let write_fs = HostFs::open(&write_root).expect("open write root");
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        Fixture { runtime, read_fs, write_fs, write_outside, _dir: dir }
    })
}

fn outside_unchanged(fixture: &Fixture) {
    let names: Vec<_> =
        std::fs::read_dir(&fixture.write_outside).unwrap().map(|entry| entry.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("secret")], "something appeared outside the root");
    assert_eq!(std::fs::read(fixture.write_outside.join("secret")).unwrap(), SECRET, "the outside file changed");
}

fuzz_target!(|data: &[u8]| {
    let Some((&op, rest)) = data.split_first() else { return };
    let Ok(client_path) = std::str::from_utf8(rest) else { return };
    let Ok(path) = join_path(&RelPath::root(), client_path) else { return };
    // Lexical invariants of every RelPath.
    let text = path.as_str();
    assert!(!text.starts_with('/') && !text.ends_with('/') && !text.contains('\0') && !text.contains("//"));
    assert!(path.components().all(|component| component != "." && component != ".." && !component.is_empty()));
    assert!(text.len() <= MAX_PATH_BYTES && path.depth() <= MAX_PATH_DEPTH);
    assert_eq!(RelPath::parse(text).expect("a RelPath re-parses"), path);

    let fixture = fixture();
    fixture.runtime.block_on(async {
        match op % 5 {
            0 => {
                if let Ok(stream) = fixture.read_fs.read_file(&path).await {
                    let chunks: Vec<_> = stream.collect().await;
                    let bytes: Vec<u8> = chunks.into_iter().filter_map(Result::ok).flatten().collect();
                    assert_ne!(bytes, SECRET, "read {text:?} returned the outside secret");
                }
            }
            1 => {
                if let Ok(entries) = fixture.read_fs.list_dir(&path).await {
                    // Nothing in the read root is named "secret": only the outside dir has one.
                    assert!(
                        entries.iter().all(|entry| entry.name() != "secret"),
                        "listed the outside dir via {text:?}"
                    );
                }
            }
            2 => {
                let _ = fixture.read_fs.stat(&path).await;
            }
            3 => {
                let stream: ByteStream = futures::stream::once(async { Ok(Bytes::from_static(b"fuzz")) }).boxed();
                let _ = fixture.write_fs.write_file(&path, stream, WriteOptions { mode: 0o644, max_bytes: 1024 }).await;
                outside_unchanged(fixture);
            }
            _ => {
                let _ = fixture.write_fs.mkdir(&path, true).await;
                outside_unchanged(fixture);
            }
        }
    });
});
