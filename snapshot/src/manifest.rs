//! The manifest: what a snapshot holds, stored as zstd-compressed JSON (format 1).
//!
//! Durable and a compatibility contract: `format` is bumped on any change a reader of the
//! old format would misread; fields are only added with defaults. A manifest is untrusted
//! input on restore (a tenant's tree, or a store someone else can write): decoding is
//! bounded, and every path is checked by [`validate_entry_path`] and the restore plan.

use serde::{Deserialize, Serialize};

use crate::chunk;
use crate::error::SnapshotError;

/// Largest manifest a reader decompresses (a million files is about 300 MiB of JSON).
pub(crate) const MAX_MANIFEST_BYTES: usize = 512 << 20;
/// Longest path and symlink target accepted.
pub(crate) const MAX_PATH_BYTES: usize = 4096;
const FORMAT: u32 = 1;

/// What one snapshot is, as `snapshot`, `restore` and `list` report it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotInfo {
    /// `{created_unix_ms:013}-{generation:020}-{random:016x}`: sorts by time.
    pub id: String,
    pub workspace_id: String,
    /// The workspace generation of the node that took it (fencing is the caller's: the
    /// record's latest-snapshot pointer is written in the generation-fenced transaction).
    pub generation: u64,
    pub created_unix_ms: u64,
    /// Regular files in the snapshot.
    pub files: u64,
    /// Their content bytes (uncompressed).
    pub bytes: u64,
    /// Compressed chunk bytes this snapshot put into the store (the manifest not counted:
    /// see `manifest_bytes`).
    pub uploaded_bytes: u64,
    /// Content bytes not uploaded because their chunks were already stored.
    pub deduplicated_bytes: u64,
    /// Entries left out: special files (devices, FIFOs, sockets) and names that are not
    /// UTF-8.
    #[serde(default)]
    pub skipped: u64,
    /// Size of the encoded manifest in the store (filled when it is written or read; not
    /// part of the stored manifest itself).
    #[serde(default)]
    pub manifest_bytes: u64,
    /// The snapshot the incremental walk started from, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum EntryKind {
    File,
    Dir,
    Symlink,
}

/// One chunk of a file: BLAKE3 of its uncompressed bytes and their length.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ChunkRef {
    #[serde(rename = "h")]
    pub hash: String,
    #[serde(rename = "n")]
    pub size: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Entry {
    /// Relative, `/`-separated, no `.` / `..` / empty components.
    pub path: String,
    pub kind: EntryKind,
    /// Permission bits as on disk (`st_mode & 0o7777`); restore applies `& 0o777`.
    pub mode: u32,
    #[serde(default)]
    pub size: u64,
    /// Nanoseconds since the Unix epoch.
    #[serde(default)]
    pub mtime_ns: i64,
    /// BLAKE3 of the whole content (files).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hash: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunks: Vec<ChunkRef>,
    /// Link target, stored as written, never followed (symlinks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Manifest {
    pub format: u32,
    /// `blake3` (content and chunk addresses).
    pub hash: String,
    /// `zstd` (every chunk blob is one zstd frame).
    pub compression: String,
    /// `fastcdc2020:MIN:AVG:MAX` — informational: restore needs only the chunk lists.
    pub chunking: String,
    pub info: SnapshotInfo,
    pub entries: Vec<Entry>,
}

impl Manifest {
    pub(crate) fn new(info: SnapshotInfo, entries: Vec<Entry>) -> Manifest {
        Manifest {
            format: FORMAT,
            hash: "blake3".to_owned(),
            compression: "zstd".to_owned(),
            chunking: format!("fastcdc2020:{}:{}:{}", chunk::MIN_SIZE, chunk::AVG_SIZE, chunk::MAX_SIZE),
            info,
            entries,
        }
    }

    pub(crate) fn encode(&self) -> Result<Vec<u8>, SnapshotError> {
        let json = serde_json::to_vec(self)
            .map_err(|error| SnapshotError::InvalidInput(format!("encode manifest: {error}")))?;
        chunk::compress(&json, 3).map_err(|source| SnapshotError::io("compress manifest", "", source))
    }

    /// Decodes and checks a stored manifest; every failure is `Corrupt` for `snapshot_id`.
    pub(crate) fn decode(data: &[u8], workspace_id: &str, snapshot_id: &str) -> Result<Manifest, SnapshotError> {
        let corrupt = |reason: String| SnapshotError::Corrupt {
            snapshot_id: snapshot_id.to_owned(),
            what: "manifest".to_owned(),
            path: String::new(),
            reason,
        };
        let json = chunk::decompress_bounded(data, MAX_MANIFEST_BYTES).map_err(corrupt)?;
        let mut manifest: Manifest =
            serde_json::from_slice(&json).map_err(|error| corrupt(format!("not a manifest: {error}")))?;
        if manifest.format != FORMAT {
            return Err(corrupt(format!("unknown manifest format {}", manifest.format)));
        }
        if manifest.hash != "blake3" || manifest.compression != "zstd" {
            return Err(corrupt(format!("unknown hash {:?} or compression {:?}", manifest.hash, manifest.compression)));
        }
        if manifest.info.id != snapshot_id || manifest.info.workspace_id != workspace_id {
            return Err(corrupt(format!(
                "manifest says it is {}/{}, stored as {workspace_id}/{snapshot_id}",
                manifest.info.workspace_id, manifest.info.id
            )));
        }
        manifest.info.manifest_bytes = data.len() as u64;
        Ok(manifest)
    }
}

/// Checks one manifest path: relative, `/`-separated, each component non-empty, not `.` or
/// `..`, no NUL, bounded length. (Whether its parent is a directory of the manifest is the
/// restore plan's check.)
pub(crate) fn validate_entry_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("empty path");
    }
    if path.len() > MAX_PATH_BYTES {
        return Err("path too long");
    }
    if path.contains('\0') {
        return Err("NUL in path");
    }
    if path.starts_with('/') {
        return Err("absolute path");
    }
    for component in path.split('/') {
        match component {
            "" => return Err("empty path component"),
            "." | ".." => return Err("dot component"),
            _ if component.len() > 255 => return Err("path component too long"),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_paths() {
        for good in ["a", "a/b", "a/.b", "..a", "a/b..c"] {
            assert!(validate_entry_path(good).is_ok(), "{good}");
        }
        for bad in ["", "/etc/passwd", "../x", "a/../../x", "a//b", "a/", "./a", "a/.", "a\0b"] {
            assert!(validate_entry_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn manifest_round_trip_and_identity_check() {
        let info = SnapshotInfo { id: "s1".into(), workspace_id: "w1".into(), ..Default::default() };
        let encoded = Manifest::new(info, Vec::new()).encode().unwrap();
        let decoded = Manifest::decode(&encoded, "w1", "s1").unwrap();
        assert_eq!(decoded.info.manifest_bytes, encoded.len() as u64);
        assert!(matches!(Manifest::decode(&encoded, "w2", "s1"), Err(SnapshotError::Corrupt { .. })));
        assert!(matches!(Manifest::decode(b"garbage", "w1", "s1"), Err(SnapshotError::Corrupt { .. })));
    }
}
