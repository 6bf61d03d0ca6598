//! Suite cases: file primitives and the derived file operations.

use bytes::Bytes;
use futures::StreamExt;

use super::{BackendFixture, chunks, names, read, rel, sh_ok, write};
use crate::assert_err;
use berth_workspace::backend::{FileKind, WriteOptions};
use berth_workspace::error::WorkspaceError;
use berth_workspace::layout;

/// A recognisable byte pattern (not all zeros, so offsets matter).
fn pattern(length: usize) -> Vec<u8> {
    (0..length).map(|index| (index * 31 % 251) as u8).collect()
}

pub async fn write_read_small(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let written = backend.write_bytes(&rel("hello.txt"), Bytes::from_static(b"hello\n"), 0o644).await.unwrap();
    assert_eq!(written, 6);
    assert_eq!(read(&*backend, "hello.txt").await.unwrap(), b"hello\n");
    // An empty file is a file too.
    write(&*backend, "empty", b"").await;
    assert_eq!(read(&*backend, "empty").await.unwrap(), b"");
    assert!(backend.exists(&rel("hello.txt")).await.unwrap());
    assert!(!backend.exists(&rel("absent.txt")).await.unwrap());
}

pub async fn write_read_large_streamed(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let data = pattern(5 * 1024 * 1024 + 123);
    // Odd-sized chunks, so no chunk boundary lines up with a buffer size.
    let parts = data.chunks(100_003).map(|chunk| Ok(Bytes::copy_from_slice(chunk))).collect();
    let written = backend.write_file(&rel("big.bin"), chunks(parts), WriteOptions::default()).await.unwrap();
    assert_eq!(written, data.len() as u64);
    let mut stream = backend.read_file(&rel("big.bin")).await.unwrap();
    let mut read_back = Vec::with_capacity(data.len());
    let mut chunk_count = 0;
    while let Some(chunk) = stream.next().await {
        read_back.extend_from_slice(&chunk.unwrap());
        chunk_count += 1;
    }
    assert!(chunk_count > 1, "a 5 MiB file came back in one chunk");
    assert_eq!(read_back.len(), data.len());
    assert!(read_back == data, "content differs after a streamed roundtrip");
    let info = backend.stat(&rel("big.bin")).await.unwrap();
    assert_eq!(info.size, data.len() as u64);
}

/// Files whose sizes sit on and around the 1 MiB blocks backends read and write in (and
/// the 64 KiB wire chunks): every byte comes back, in order, from a fresh read.
pub async fn sizes_around_block_boundaries(fixture: &dyn BackendFixture) {
    const MIB: usize = 1024 * 1024;
    let backend = fixture.backend();
    for size in [64 * 1024 - 1, 64 * 1024, MIB - 1, MIB, MIB + 1, 2 * MIB] {
        let data = pattern(size + 7)[7..].to_vec();
        let name = format!("edge-{size}.bin");
        // Chunks of one byte less than a block, so writes straddle block ends too.
        let parts = data.chunks(MIB - 1).map(|chunk| Ok(Bytes::copy_from_slice(chunk))).collect();
        let written = backend.write_file(&rel(&name), chunks(parts), WriteOptions::default()).await.unwrap();
        assert_eq!(written, size as u64, "{name}: bytes written");
        let back = read(&*backend, &name).await.unwrap();
        assert_eq!(back.len(), size, "{name}: length read back");
        assert!(back == data, "{name}: content differs after a roundtrip");
    }
}

pub async fn write_creates_parents(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    write(&*backend, "a/b/c/file.txt", b"deep").await;
    assert_eq!(read(&*backend, "a/b/c/file.txt").await.unwrap(), b"deep");
    for dir in ["a", "a/b", "a/b/c"] {
        assert_eq!(backend.stat(&rel(dir)).await.unwrap().kind, FileKind::Directory, "{dir}");
    }
    // A parent that is a file cannot be a directory.
    write(&*backend, "plain", b"x").await;
    assert_err!(
        backend.write_bytes(&rel("plain/child"), Bytes::from_static(b"y"), 0o644).await,
        WorkspaceError::NotADirectory { .. }
    );
}

pub async fn overwrite_is_atomic(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    write(&*backend, "dir/f", b"first version, longer than the second").await;
    write(&*backend, "dir/f", b"second").await;
    assert_eq!(read(&*backend, "dir/f").await.unwrap(), b"second");
    // No temp file survives a successful write.
    assert_eq!(names(&*backend, "dir").await, ["f"]);
}

pub async fn failing_stream_leaves_nothing(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    write(&*backend, "dir/f", b"old").await;
    let failing = || {
        chunks(vec![
            Ok(Bytes::from_static(b"new content that must never be seen")),
            Err(WorkspaceError::InvalidArgument("client went away".into())),
        ])
    };
    assert_err!(
        backend.write_file(&rel("dir/f"), failing(), WriteOptions::default()).await,
        WorkspaceError::InvalidArgument(_)
    );
    assert_eq!(read(&*backend, "dir/f").await.unwrap(), b"old");
    assert_eq!(names(&*backend, "dir").await, ["f"]);
    // A failed write into new directories leaves neither file nor directories.
    assert_err!(
        backend.write_file(&rel("fresh/sub/f"), failing(), WriteOptions::default()).await,
        WorkspaceError::InvalidArgument(_)
    );
    assert!(!backend.exists(&rel("fresh")).await.unwrap());
    assert_eq!(names(&*backend, "").await, ["dir"]);
}

pub async fn max_bytes_leaves_nothing(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let limited = WriteOptions { max_bytes: 10, ..WriteOptions::default() };
    let eleven = || chunks(vec![Ok(Bytes::from_static(b"123456")), Ok(Bytes::from_static(b"78901"))]);
    assert_err!(
        backend.write_file(&rel("new"), eleven(), limited).await,
        WorkspaceError::LimitExceeded { limit: "file size", size: 11, max: 10 }
    );
    assert!(!backend.exists(&rel("new")).await.unwrap());
    assert_err!(backend.write_file(&rel("nested/new"), eleven(), limited).await, WorkspaceError::LimitExceeded { .. });
    assert!(!backend.exists(&rel("nested")).await.unwrap());
    write(&*backend, "kept", b"old").await;
    assert_err!(backend.write_file(&rel("kept"), eleven(), limited).await, WorkspaceError::LimitExceeded { .. });
    assert_eq!(read(&*backend, "kept").await.unwrap(), b"old");
    assert_eq!(names(&*backend, "").await, ["kept"]);
    // Exactly at the limit is fine.
    let ten = chunks(vec![Ok(Bytes::from_static(b"1234567890"))]);
    assert_eq!(backend.write_file(&rel("ten"), ten, limited).await.unwrap(), 10);
}

pub async fn read_errors(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    assert_err!(read(&*backend, "missing").await, WorkspaceError::NotFound { .. });
    assert_err!(read(&*backend, "missing/deeper").await, WorkspaceError::NotFound { .. });
    backend.mkdir(&rel("dir"), false).await.unwrap();
    assert_err!(read(&*backend, "dir").await, WorkspaceError::IsADirectory { .. });
    assert_err!(read(&*backend, "").await, WorkspaceError::IsADirectory { .. });
    assert_err!(
        backend.write_bytes(&rel("dir"), Bytes::from_static(b"x"), 0o644).await,
        WorkspaceError::IsADirectory { .. }
    );
}

pub async fn write_mode(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    backend.write_bytes(&rel("secret"), Bytes::from_static(b"s"), 0o600).await.unwrap();
    assert_eq!(backend.stat(&rel("secret")).await.unwrap().mode, 0o600);
    // Replacing a file keeps its permission bits.
    backend.write_bytes(&rel("secret"), Bytes::from_static(b"t"), 0o644).await.unwrap();
    assert_eq!(backend.stat(&rel("secret")).await.unwrap().mode, 0o600);
    backend.write_bytes(&rel("run.sh"), Bytes::from_static(b"#!/bin/sh\necho ran\n"), 0o755).await.unwrap();
    let output = sh_ok(&*backend, "./run.sh", &[]).await;
    assert_eq!(&output.stdout[..], b"ran\n");
}

pub async fn stat_kinds(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    write(&*backend, "file", b"12345").await;
    backend.mkdir(&rel("dir"), false).await.unwrap();
    sh_ok(&*backend, "ln -s file link && ln -s dir dirlink && ln -s nowhere dangling", &[]).await;
    let file = backend.stat(&rel("file")).await.unwrap();
    assert_eq!((file.kind, file.size, file.name()), (FileKind::File, 5, "file"));
    assert!(file.modified.is_some());
    assert_eq!(backend.stat(&rel("dir")).await.unwrap().kind, FileKind::Directory);
    // Symlinks are reported, not followed — also dangling ones.
    for link in ["link", "dirlink", "dangling"] {
        assert_eq!(backend.stat(&rel(link)).await.unwrap().kind, FileKind::Symlink, "{link}");
    }
    // A symlinked directory in the middle of a path is followed.
    write(&*backend, "dir/inner", b"i").await;
    assert_eq!(backend.stat(&rel("dirlink/inner")).await.unwrap().size, 1);
    let root = backend.stat(&rel("")).await.unwrap();
    assert_eq!(root.kind, FileKind::Directory);
    assert_err!(backend.stat(&rel("missing")).await, WorkspaceError::NotFound { .. });
    assert_err!(backend.stat(&rel("missing/x")).await, WorkspaceError::NotFound { .. });
    assert_err!(backend.stat(&rel("file/x")).await, WorkspaceError::NotADirectory { .. });
}

pub async fn list_dir_sorted(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    for name in ["b", "a", ".hidden", "sp ace", "new\nline", "-dash"] {
        write(&*backend, name, name.as_bytes()).await;
    }
    backend.mkdir(&rel("c"), false).await.unwrap();
    write(&*backend, "c/x", b"x").await;
    sh_ok(&*backend, "ln -s a l", &[]).await;
    let entries = backend.list_dir(&rel("")).await.unwrap();
    let listed: Vec<(&str, FileKind)> = entries.iter().map(|info| (info.name(), info.kind)).collect();
    assert_eq!(
        listed,
        [
            ("-dash", FileKind::File),
            (".hidden", FileKind::File),
            ("a", FileKind::File),
            ("b", FileKind::File),
            ("c", FileKind::Directory),
            ("l", FileKind::Symlink),
            ("new\nline", FileKind::File),
            ("sp ace", FileKind::File),
        ]
    );
    let sizes: Vec<u64> = entries.iter().map(|info| info.size).collect();
    assert_eq!(sizes[0], 5);
    let nested = backend.list_dir(&rel("c")).await.unwrap();
    assert_eq!(nested.len(), 1);
    assert_eq!(nested[0].path, rel("c/x"));
    assert_err!(backend.list_dir(&rel("missing")).await, WorkspaceError::NotFound { .. });
    assert_err!(backend.list_dir(&rel("a")).await, WorkspaceError::NotADirectory { .. });
    backend.mkdir(&rel("empty"), false).await.unwrap();
    assert!(backend.list_dir(&rel("empty")).await.unwrap().is_empty());
}

pub async fn remove_semantics(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    write(&*backend, "file", b"x").await;
    assert!(backend.remove(&rel("file"), false).await.unwrap());
    assert!(!backend.remove(&rel("file"), false).await.unwrap());
    assert!(!backend.remove(&rel("missing/deeper"), true).await.unwrap());
    backend.mkdir(&rel("empty"), false).await.unwrap();
    assert!(backend.remove(&rel("empty"), false).await.unwrap());
    write(&*backend, "tree/a/b", b"x").await;
    write(&*backend, "tree/c", b"y").await;
    assert_err!(backend.remove(&rel("tree"), false).await, WorkspaceError::DirectoryNotEmpty { .. });
    assert!(backend.exists(&rel("tree/a/b")).await.unwrap());
    assert!(backend.remove(&rel("tree"), true).await.unwrap());
    assert!(!backend.exists(&rel("tree")).await.unwrap());
    assert_err!(backend.remove(&rel(""), true).await, WorkspaceError::InvalidPath { .. });
    // Removing a symlink removes the link, not its target (also for a directory link).
    write(&*backend, "target/keep", b"k").await;
    sh_ok(&*backend, "ln -s target dirlink && ln -s target/keep filelink && ln -s gone dangling", &[]).await;
    assert!(backend.remove(&rel("dirlink"), true).await.unwrap());
    assert!(backend.remove(&rel("filelink"), false).await.unwrap());
    assert!(backend.remove(&rel("dangling"), false).await.unwrap());
    assert_eq!(read(&*backend, "target/keep").await.unwrap(), b"k");
    assert_eq!(names(&*backend, "").await, ["target"]);
}

pub async fn remove_recursive_keeps_link_targets(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    write(&*backend, "keep/file", b"k").await;
    sh_ok(
        &*backend,
        "mkdir -p doomed/sub && ln -s ../keep doomed/inside && ln -s ../../.. doomed/sub/outside \
         && echo victim > ../berth-recursive-victim",
        &[],
    )
    .await;
    assert!(backend.remove(&rel("doomed"), true).await.unwrap());
    assert_eq!(read(&*backend, "keep/file").await.unwrap(), b"k");
    let outside = sh_ok(&*backend, "cat ../berth-recursive-victim", &[]).await;
    assert_eq!(&outside.stdout[..], b"victim\n");
}

pub async fn mkdir_semantics(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    backend.mkdir(&rel("d"), false).await.unwrap();
    assert_eq!(backend.stat(&rel("d")).await.unwrap().kind, FileKind::Directory);
    assert_err!(backend.mkdir(&rel("d"), false).await, WorkspaceError::AlreadyExists { .. });
    backend.mkdir(&rel("d"), true).await.unwrap();
    assert_err!(backend.mkdir(&rel("x/y"), false).await, WorkspaceError::NotFound { .. });
    backend.mkdir(&rel("x/y/z"), true).await.unwrap();
    assert_eq!(backend.stat(&rel("x/y")).await.unwrap().kind, FileKind::Directory);
    write(&*backend, "f", b"file").await;
    assert_err!(backend.mkdir(&rel("f"), true).await, WorkspaceError::AlreadyExists { .. });
    assert_err!(backend.mkdir(&rel("f"), false).await, WorkspaceError::AlreadyExists { .. });
    assert_err!(backend.mkdir(&rel("f/sub"), true).await, WorkspaceError::NotADirectory { .. });
    assert_err!(backend.mkdir(&rel("f/sub"), false).await, WorkspaceError::NotADirectory { .. });
    backend.mkdir(&rel(""), true).await.unwrap();
    assert_err!(backend.mkdir(&rel(""), false).await, WorkspaceError::AlreadyExists { .. });
}

pub async fn symlinks_inside_work(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    write(&*backend, "dir/target.txt", b"original").await;
    sh_ok(
        &*backend,
        "ln -s dir/target.txt alias && ln -s dir dirlink && ln -s created.txt pending \
         && mkdir -p deep/er && ln -s ../../dir/target.txt deep/er/up",
        &[],
    )
    .await;
    assert_eq!(read(&*backend, "alias").await.unwrap(), b"original");
    assert_eq!(read(&*backend, "deep/er/up").await.unwrap(), b"original");
    assert_eq!(read(&*backend, "dirlink/target.txt").await.unwrap(), b"original");
    // Writing through a link replaces the target's content; the link stays a link.
    write(&*backend, "alias", b"updated").await;
    assert_eq!(read(&*backend, "dir/target.txt").await.unwrap(), b"updated");
    assert_eq!(backend.stat(&rel("alias")).await.unwrap().kind, FileKind::Symlink);
    write(&*backend, "deep/er/up", b"via relative parent").await;
    assert_eq!(read(&*backend, "dir/target.txt").await.unwrap(), b"via relative parent");
    // A dangling link inside the root creates its target.
    write(&*backend, "pending", b"new").await;
    assert_eq!(read(&*backend, "created.txt").await.unwrap(), b"new");
    write(&*backend, "dirlink/new.txt", b"n").await;
    assert_eq!(read(&*backend, "dir/new.txt").await.unwrap(), b"n");
    let listed = names(&*backend, "dirlink").await;
    assert_eq!(listed, ["new.txt", "target.txt"]);
    backend.mkdir(&rel("dirlink/sub"), true).await.unwrap();
    assert_eq!(backend.stat(&rel("dir/sub")).await.unwrap().kind, FileKind::Directory);
    backend.mkdir(&rel("dirlink"), true).await.unwrap();
}

pub async fn layout_ensure_idempotent(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    layout::ensure(&*backend).await.unwrap();
    assert_eq!(read(&*backend, ".mcp").await.unwrap(), layout::EMPTY_MCP);
    for dir in [layout::SKILLS_DIR, layout::DATA_DIR, layout::SESSIONS_DIR] {
        assert_eq!(backend.stat(&rel(dir)).await.unwrap().kind, FileKind::Directory, "{dir}");
    }
    layout::ensure(&*backend).await.unwrap();
    // An existing .mcp is never overwritten; a missing directory comes back.
    let declared = br#"[{"name":"files","command":["mcp-files"]}]"#;
    write(&*backend, ".mcp", declared).await;
    write(&*backend, "skills/demo/SKILL.md", b"# demo").await;
    assert!(backend.remove(&rel(layout::DATA_DIR), true).await.unwrap());
    layout::ensure(&*backend).await.unwrap();
    assert_eq!(read(&*backend, ".mcp").await.unwrap(), declared);
    assert_eq!(read(&*backend, "skills/demo/SKILL.md").await.unwrap(), b"# demo");
    assert!(backend.exists(&rel(layout::DATA_DIR)).await.unwrap());
    assert_eq!(names(&*backend, "").await, [".mcp", "data", "sessions", "skills"]);
}
