//! The `SnapshotStore` seam: a flat blob space addressed by content hash, plus manifests
//! per workspace. Implementations: `dir` (a local or mounted directory), `redis`, `s3`.
//! `open(url)` is the one place a URL becomes a store.

pub mod dir;
mod names;
pub mod redis;
pub mod s3;
mod seam;

use std::sync::Arc;

use crate::error::SnapshotError;

pub use self::names::{validate_hash, validate_snapshot_id, validate_workspace_id};
pub use self::seam::{BlobEntry, SnapshotStore, SnapshotStoreRef};

/// Opens the store a `--snapshot-store` URL names:
/// - `file:///absolute/dir` — a directory (created when missing),
/// - `redis://[user:password@]host:port/db` (or `rediss://`),
/// - `s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1[&credentials_file=PATH]`
///   with credentials from the `AWS_*` environment or the file.
pub fn open(url: &str) -> Result<SnapshotStoreRef, SnapshotError> {
    let invalid = |reason: &str| SnapshotError::InvalidUrl { url: names::redact(url), reason: reason.to_owned() };
    let parsed = url::Url::parse(url).map_err(|error| invalid(&error.to_string()))?;
    match parsed.scheme() {
        "file" => {
            if parsed.host_str().is_some_and(|host| !host.is_empty() && host != "localhost") {
                return Err(invalid("a file:// url names no host (file:///absolute/path)"));
            }
            if parsed.query().is_some() || parsed.fragment().is_some() {
                return Err(invalid("a file:// url takes no query or fragment"));
            }
            let path = parsed.to_file_path().map_err(|()| invalid("not an absolute local path"))?;
            Ok(Arc::new(dir::DirStore::open(path)?))
        }
        "redis" => Ok(Arc::new(redis::RedisStore::open(url)?)),
        "rediss" => Err(invalid("redis over TLS is not built in (use redis://)")),
        "s3" => Ok(Arc::new(s3::S3Store::open(url)?)),
        other => Err(invalid(&format!("unknown scheme {other:?} (file, redis, s3)"))),
    }
}
