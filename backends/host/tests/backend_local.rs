//! The backend conformance suite on the local backend, three ways:
//!
//! - `local`: `LocalBackend` with its native (`HostFs`) file operations;
//! - `local_primitives`: only its three primitives, so `stat`/`list_dir`/`remove`/`mkdir`
//!   run the `posix.rs` defaults through `exec` with GNU coreutils;
//! - `local_primitives_busybox`: the same with every tool resolved to busybox applets.
//!
//! Plus tests of what only the local backend has (driver, owner, chunking, env).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use berth_backend_host::{HostFs, LocalBackend, LocalDriver};
use berth_testkit::{Fixture, PrimitivesOnly, assert_eventually, rel};
use berth_workspace::{
    Backend, BackendDriver, BackendRef, ExecSpec, ProvisionContext, WorkspaceError, WorkspaceId, WorkspaceSpec,
    WriteOptions,
};
use bytes::Bytes;
use futures::StreamExt;
use tempfile::TempDir;

/// A temp dir holding the workspace root at `<tmp>/ws`, so the root's parent is private to
/// the test (the escape corpus checks it stays untouched).
fn temp_root() -> (TempDir, PathBuf) {
    let dir = tempfile::Builder::new().prefix("berth-local-").tempdir().expect("create a temp dir");
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).expect("create the workspace root");
    (dir, root)
}

async fn local_fixture() -> Fixture<TempDir> {
    let (dir, root) = temp_root();
    let backend = LocalBackend::open(&root).expect("open the local backend");
    Fixture::new(Arc::new(backend), dir)
}

async fn primitives_fixture() -> Fixture<TempDir> {
    let (dir, root) = temp_root();
    let local: BackendRef = Arc::new(LocalBackend::open(&root).expect("open the local backend"));
    Fixture::new(Arc::new(PrimitivesOnly::new(local)), dir)
}

/// A directory of `<applet> -> busybox` links for every applet, used as the only `PATH`.
fn busybox_bin(parent: &Path) -> PathBuf {
    let busybox = ["/usr/bin/busybox", "/bin/busybox"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.exists())
        .expect("busybox is required for the busybox conformance suite (apt-get install busybox)");
    let listed = std::process::Command::new(&busybox).arg("--list").output().expect("run busybox --list");
    let bin = parent.join("busybox-bin");
    std::fs::create_dir(&bin).expect("create the applet dir");
    for applet in String::from_utf8_lossy(&listed.stdout).lines() {
        std::os::unix::fs::symlink(&busybox, bin.join(applet)).expect("link an applet");
    }
    bin
}

async fn busybox_fixture() -> Fixture<TempDir> {
    let (dir, root) = temp_root();
    let bin = busybox_bin(dir.path());
    let local: BackendRef = Arc::new(LocalBackend::open(&root).expect("open the local backend"));
    let env = BTreeMap::from([("PATH".to_owned(), bin.display().to_string())]);
    Fixture::new(Arc::new(PrimitivesOnly::new(local).with_env(env)), dir)
}

berth_testkit::backend_suite!(local, local_fixture());
berth_testkit::backend_suite!(local_primitives, primitives_fixture());
berth_testkit::backend_suite!(local_primitives_busybox, busybox_fixture());

// ---- local-only behaviour ------------------------------------------------------------

#[tokio::test]
async fn busybox_suite_really_uses_busybox() {
    let fixture = busybox_fixture().await;
    let backend = berth_testkit::BackendFixture::backend(&fixture);
    // Every tool the posix defaults use, looked up the way a spawn looks it up.
    for tool in ["sh", "stat", "find", "readlink", "rm", "rmdir", "mkdir"] {
        let output = backend.exec(&ExecSpec::new(vec![tool.into(), "--help".into()])).await.unwrap();
        let banner = [&output.stdout[..], &output.stderr[..]].concat();
        assert!(
            String::from_utf8_lossy(&banner).contains("BusyBox"),
            "{tool} is not busybox: {:?}",
            String::from_utf8_lossy(&banner)
        );
    }
}

/// A file comes off the disk in blocks of at most `READ_BLOCK_BYTES` (the node cuts them
/// to the caller's chunk size): one block for a small file, full blocks then the rest for
/// a larger one.
#[tokio::test]
async fn reads_in_blocks_of_at_most_a_mebibyte() {
    use berth_backend_host::hostfs::READ_BLOCK_BYTES;
    let (_dir, root) = temp_root();
    let backend = LocalBackend::open(&root).unwrap();
    for (size, expected) in [
        (300 * 1024, vec![300 * 1024]),
        (READ_BLOCK_BYTES, vec![READ_BLOCK_BYTES]),
        (READ_BLOCK_BYTES * 5 / 2, vec![READ_BLOCK_BYTES, READ_BLOCK_BYTES, READ_BLOCK_BYTES / 2]),
    ] {
        let data: Vec<u8> = (0..size).map(|index| (index % 253) as u8).collect();
        backend.write_bytes(&rel("f"), Bytes::from(data.clone()), 0o644).await.unwrap();
        let mut stream = backend.read_file(&rel("f")).await.unwrap();
        let mut back = Vec::new();
        let mut lengths = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.unwrap();
            lengths.push(chunk.len());
            back.extend_from_slice(&chunk);
        }
        assert_eq!(lengths, expected, "{size} bytes");
        assert!(back == data, "{size} bytes: content differs");
    }
}

#[tokio::test]
async fn process_env_is_minimal() {
    let (_dir, root) = temp_root();
    let backend =
        LocalBackend::open(&root).unwrap().with_env(BTreeMap::from([("FROM_SPEC".to_owned(), "1".to_owned())]));
    let mut spec = ExecSpec::new(vec!["env".into()]);
    spec.spawn.env = BTreeMap::from([("FROM_EXEC".to_owned(), "2".to_owned())]);
    let output = backend.exec(&spec).await.unwrap();
    let mut lines: Vec<String> = String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect();
    lines.sort();
    let home = format!("HOME={}", backend.root().display());
    assert_eq!(
        lines,
        [
            "FROM_EXEC=2".to_owned(),
            "FROM_SPEC=1".to_owned(),
            home,
            "LANG=C.UTF-8".to_owned(),
            format!("PATH={}", berth_backend_host::local::DEFAULT_PATH),
        ]
    );
}

#[tokio::test]
async fn fifo_is_not_read() {
    let (_dir, root) = temp_root();
    let backend = LocalBackend::open(&root).unwrap();
    let made = backend.exec(&ExecSpec::new(vec!["mkfifo".into(), "fifo".into()])).await.unwrap();
    assert_eq!(made.exit_code, 0);
    // Opening a FIFO for reading would block until a writer shows up; it must not.
    let result = tokio::time::timeout(Duration::from_secs(10), backend.read_file(&rel("fifo")))
        .await
        .expect("reading a FIFO hung");
    assert!(matches!(result, Err(WorkspaceError::InvalidArgument(_))));
}

#[tokio::test]
async fn dropped_write_leaves_no_temp_file() {
    let (_dir, root) = temp_root();
    let backend = LocalBackend::open(&root).unwrap();
    let (consumed_sender, consumed) = tokio::sync::oneshot::channel::<()>();
    // One chunk, then a signal that it was taken, then a stream that never ends.
    let first = futures::stream::once(async { Ok(Bytes::from_static(b"partial")) });
    let signal = futures::stream::once(async move {
        let _ = consumed_sender.send(());
        std::future::pending::<berth_workspace::Result<Bytes>>().await
    });
    let stream = first.chain(signal).boxed();
    let target = rel("dir/f");
    let write = backend.write_file(&target, stream, WriteOptions::default());
    tokio::select! {
        result = write => panic!("the write finished: {result:?}"),
        _ = consumed => {}
    }
    // The write future is dropped here, mid-stream.
    let dir = root.clone();
    assert_eventually("the dropped write to clean up", Duration::from_secs(10), || {
        let dir = dir.clone();
        async move { std::fs::read_dir(&dir).map(|entries| entries.count() == 0).unwrap_or(false) }
    })
    .await;
}

#[tokio::test]
async fn owner_is_applied_to_new_files_and_dirs() {
    use std::os::unix::fs::MetadataExt;
    let (_dir, root) = temp_root();
    let (uid, gid) = if nix::unistd::geteuid().is_root() {
        (4242, 4343)
    } else {
        (nix::unistd::geteuid().as_raw(), nix::unistd::getegid().as_raw())
    };
    let files = HostFs::open(&root).unwrap().with_owner(Some((uid, gid)));
    let data = futures::stream::once(async { Ok(Bytes::from_static(b"x")) }).boxed();
    files.write_file(&rel("a/b/f"), data, WriteOptions::default()).await.unwrap();
    files.mkdir(&rel("c/d"), true).await.unwrap();
    for path in ["a", "a/b", "a/b/f", "c", "c/d"] {
        let metadata = std::fs::symlink_metadata(root.join(path)).unwrap();
        assert_eq!((metadata.uid(), metadata.gid()), (uid, gid), "{path}");
    }
}

#[tokio::test]
async fn driver_provision_is_idempotent() {
    let (_dir, root) = temp_root();
    let (_other_dir, other_root) = temp_root();
    let driver = LocalDriver::new();
    assert_eq!(driver.name(), "local");
    let id = WorkspaceId::new("ws-local-1").unwrap();
    let spec = WorkspaceSpec::default();
    let context = |root| ProvisionContext::unplaced(&id, root, &spec);
    let first = driver.provision(context(&root)).await.unwrap();
    let second = driver.provision(context(&root)).await.unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    assert_eq!(first.name(), "local");
    // A new root for the same id is opened anew.
    let moved = driver.provision(context(&other_root)).await.unwrap();
    assert!(!Arc::ptr_eq(&first, &moved));
    driver.release(&id).await.unwrap();
    driver.destroy(&id).await.unwrap();
    // Handles outlive release: the files are still there.
    first.mkdir(&rel("still-works"), false).await.unwrap();
    let missing = root.join("does-not-exist");
    assert!(matches!(driver.provision(context(&missing)).await, Err(WorkspaceError::NotFound { .. })));
}

// ---- the workspace contract (MCP, skills, offload, trees) --------------------------------

berth_testkit::contract_suite!(local_contract, local_fixture());
berth_testkit::contract_suite!(local_primitives_contract, primitives_fixture());

/// A bare program name is found as the child's `execvp` would find it, in the PATH the
/// process gets (the exec's own, relative entries from its working directory, entries that
/// are not executable files skipped), and a program sees the name it was given as argv[0]
/// (a script's interpreter gets the path it was found at, as the kernel hands it).
#[tokio::test]
async fn programs_are_found_in_the_processes_own_path() {
    use std::os::unix::fs::PermissionsExt;
    let (_dir, root) = temp_root();
    let backend = LocalBackend::open(&root).unwrap();
    let script = |path: &Path, body: &str, mode: u32| {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, body).unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    };
    // A decoy that is not executable, and a directory of the same name, ahead of the real one.
    script(&root.join("decoy/hello"), "#!/bin/sh\necho decoy\n", 0o644);
    std::fs::create_dir_all(root.join("dirs/hello")).unwrap();
    script(&root.join("work/bin/hello"), "#!/bin/sh\necho \"hello from $0\"\n", 0o755);
    let mut spec = ExecSpec::new(vec!["hello".into()]);
    spec.spawn.cwd = rel("work");
    spec.spawn.env =
        BTreeMap::from([("PATH".to_owned(), format!("{}:../dirs:bin:/usr/bin", root.join("decoy").display()))]);
    let output = backend.exec(&spec).await.unwrap();
    let expected = format!("hello from {}\n", root.join("work/bin/hello").display());
    assert_eq!(String::from_utf8_lossy(&output.stdout), expected, "{output:?}");
    assert_eq!(output.exit_code, 0);

    // Not in that PATH (it is in the default one): missing, as the child would find it.
    let mut spec = ExecSpec::new(vec!["true".into()]);
    spec.spawn.env = BTreeMap::from([("PATH".to_owned(), root.join("decoy").display().to_string())]);
    let error = backend.exec(&spec).await.expect_err("true is not in that PATH");
    assert!(matches!(error, WorkspaceError::SpawnFailed { .. }), "{error:?}");
    let output = backend.exec(&ExecSpec::new(vec!["sh".into(), "-c".into(), "echo $0".into()])).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "sh\n");
}
