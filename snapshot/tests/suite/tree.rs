//! Test trees: made from a seed, compared by content hash, mode, link target and mtime.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::{Duration, SystemTime};

pub use berth_testkit::noise;

pub fn write(root: &Path, relative: &str, data: &[u8], mode: u32) {
    let path = root.join(relative);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, data).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
}

/// A small varied tree: empty file, text, a multi-chunk file, duplicates, nested and
/// empty directories, an executable, relative and absolute symlinks.
pub fn sample(root: &Path, seed: u64) {
    fs::create_dir_all(root).unwrap();
    write(root, "empty", b"", 0o644);
    write(root, "README.md", format!("tree {seed}\n").as_bytes(), 0o644);
    write(root, "bin/run.sh", b"#!/bin/sh\necho hi\n", 0o755);
    write(root, "data/big.bin", &noise(seed, 3 << 20), 0o600);
    write(root, "data/copy-1.txt", &b"same content ".repeat(1000), 0o644);
    write(root, "data/copy-2.txt", &b"same content ".repeat(1000), 0o644);
    write(root, "deep/a/b/c/d/leaf.txt", b"leaf", 0o640);
    fs::create_dir_all(root.join("empty-dir")).unwrap();
    std::os::unix::fs::symlink("../README.md", root.join("bin/readme-link")).unwrap();
    std::os::unix::fs::symlink("/etc/hostname", root.join("absolute-link")).unwrap();
    std::os::unix::fs::symlink("does-not-exist", root.join("dangling")).unwrap();
}

/// Sets every file's and directory's mtime `age` into the past (so an incremental
/// snapshot trusts size + mtime + mode).
pub fn age(root: &Path, age: Duration) {
    let when = SystemTime::now() - age;
    for (relative, _) in describe(root) {
        let path = root.join(&relative);
        let metadata = fs::symlink_metadata(&path).unwrap();
        if metadata.is_file() {
            fs::OpenOptions::new().write(true).open(&path).unwrap().set_modified(when).unwrap();
        }
    }
}

/// `path -> description` of every entry (kind, mode, content hash or link target, file
/// mtime), for equality checks.
pub fn describe(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut pending = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, prefix)) = pending.pop() {
        for item in fs::read_dir(&dir).unwrap() {
            let item = item.unwrap();
            let name = item.file_name().into_string().unwrap();
            let relative = if prefix.is_empty() { name } else { format!("{prefix}/{name}") };
            let metadata = fs::symlink_metadata(item.path()).unwrap();
            let mode = metadata.mode() & 0o777;
            let description = if metadata.is_symlink() {
                format!("link -> {}", fs::read_link(item.path()).unwrap().display())
            } else if metadata.is_dir() {
                pending.push((item.path(), relative.clone()));
                format!("dir {mode:o}")
            } else if metadata.is_file() {
                let hash = blake3::hash(&fs::read(item.path()).unwrap()).to_hex().to_string();
                format!("file {mode:o} {hash} mtime {}.{:09}", metadata.mtime(), metadata.mtime_nsec())
            } else {
                "special".to_owned()
            };
            out.insert(relative, description);
        }
    }
    out
}

/// The description without `special` entries (a snapshot skips them).
pub fn describe_without_specials(root: &Path) -> BTreeMap<String, String> {
    describe(root).into_iter().filter(|(_, description)| description != "special").collect()
}

/// Entries of `dir` whose names start with `prefix` (restore staging leftovers).
pub fn leftovers(dir: &Path, prefix: &str) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|item| item.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with(prefix))
        .collect()
}
