//! `RedisStore`: snapshots in Redis.
//!
//! ```text
//! P:blob:HASH           hash: t = written (unix ms), n = parts, 0..n-1 = the value in parts
//! P:blobs               sorted set of blob hashes, score = written (unix ms)
//! P:manifest:WS:ID      hash, same layout as a blob
//! P:manifests:WS        sorted set of the workspace's snapshot ids
//! P:workspaces          set of workspaces with at least one manifest
//! ```
//!
//! `P` is the URL's `prefix` (default `berth:snapshots`). Values are split into parts of
//! `PART_BYTES` (Redis refuses values over 512 MiB, and big values stall the server), and
//! every write is one `MULTI`/`EXEC` pipeline that first deletes the old key, so a reader
//! sees the whole old value or the whole new one and an overwrite leaves no stale parts.
//! Manifest deletes run as one Lua script (delete, unindex, drop the workspace when it has
//! no manifest left) so a concurrent put cannot be lost from the index.

use std::time::Duration;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use tokio::sync::OnceCell;

use super::names::{validate_hash, validate_snapshot_id, validate_workspace_id};
use super::seam::{BlobEntry, SnapshotStore};
use crate::engine::now_unix_ms;
use crate::error::SnapshotError;

/// Largest part of a value: far below Redis's 512 MiB limit and small enough that one part
/// does not block the server for long.
const PART_BYTES: usize = 4 << 20;
const DEFAULT_PREFIX: &str = "berth:snapshots";

pub struct RedisStore {
    client: redis::Client,
    connection: OnceCell<ConnectionManager>,
    prefix: String,
    description: String,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("RedisStore").field("store", &self.description).finish_non_exhaustive()
    }
}

impl RedisStore {
    /// `redis://[user[:password]@]host[:port][/db][?prefix=P&password_file=PATH]`. The
    /// connection is made at first use. A password is better given as `password_file` (a
    /// file holding it) than in the URL, which ends up in process listings.
    pub fn open(url: &str) -> Result<RedisStore, SnapshotError> {
        let invalid = |reason: String| SnapshotError::InvalidUrl { url: super::names::redact(url), reason };
        let mut parsed = url::Url::parse(url).map_err(|error| invalid(error.to_string()))?;
        if parsed.scheme() != "redis" {
            return Err(invalid("only redis:// is built in (no TLS)".to_owned()));
        }
        let mut prefix = DEFAULT_PREFIX.to_owned();
        let mut password_file = None;
        for (key, value) in parsed.query_pairs() {
            match key.as_ref() {
                "prefix" => prefix = value.into_owned(),
                "password_file" => password_file = Some(value.into_owned()),
                other => return Err(invalid(format!("unknown parameter {other:?} (prefix, password_file)"))),
            }
        }
        if prefix.is_empty()
            || prefix.len() > 200
            || !prefix
                .bytes()
                .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b':' | b'.' | b'_' | b'-' | b'/'))
        {
            return Err(invalid("prefix must be 1-200 characters of A-Z a-z 0-9 : . _ - /".to_owned()));
        }
        parsed.set_query(None);
        if let Some(path) = password_file {
            let password = std::fs::read_to_string(&path)
                .map_err(|source| SnapshotError::io("read redis password file", &path, source))?;
            parsed
                .set_password(Some(password.trim_end_matches(['\r', '\n'])))
                .map_err(|()| invalid("cannot carry a password".to_owned()))?;
        }
        let mut shown = parsed.clone();
        let _ = shown.set_password(None);
        let _ = shown.set_username("");
        shown.set_query(Some(&format!("prefix={prefix}")));
        let client = redis::Client::open(parsed.as_str()).map_err(|error| invalid(error.to_string()))?;
        Ok(RedisStore { client, connection: OnceCell::new(), prefix, description: shown.to_string() })
    }

    async fn connection(&self) -> Result<ConnectionManager, SnapshotError> {
        let manager = self
            .connection
            .get_or_try_init(|| async {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(Duration::from_secs(5)))
                    .set_response_timeout(Some(Duration::from_secs(30)))
                    .set_number_of_retries(3);
                ConnectionManager::new_with_config(self.client.clone(), config).await
            })
            .await
            .map_err(|error| self.failed("connect", error))?;
        Ok(manager.clone())
    }

    fn failed(&self, operation: &'static str, error: redis::RedisError) -> SnapshotError {
        SnapshotError::Store { store: self.description.clone(), operation, reason: error.to_string() }
    }

    fn blob_key(&self, hash: &str) -> String {
        format!("{}:blob:{hash}", self.prefix)
    }

    fn blobs_key(&self) -> String {
        format!("{}:blobs", self.prefix)
    }

    fn manifest_key(&self, workspace_id: &str, snapshot_id: &str) -> String {
        format!("{}:manifest:{workspace_id}:{snapshot_id}", self.prefix)
    }

    fn manifests_key(&self, workspace_id: &str) -> String {
        format!("{}:manifests:{workspace_id}", self.prefix)
    }

    fn workspaces_key(&self) -> String {
        format!("{}:workspaces", self.prefix)
    }

    /// Adds "replace `key` with `data` in parts" to an atomic pipeline.
    fn add_value(pipe: &mut redis::Pipeline, key: &str, data: &Bytes, written_unix_ms: u64) {
        let parts: Vec<&[u8]> = if data.is_empty() { Vec::new() } else { data.chunks(PART_BYTES).collect() };
        pipe.del(key).ignore();
        pipe.hset_multiple(key, &[("t", written_unix_ms.to_string()), ("n", parts.len().to_string())]).ignore();
        for (index, part) in parts.iter().enumerate() {
            pipe.hset(key, index.to_string(), *part).ignore();
        }
    }

    /// Reads a value written by `add_value`: the part count first, then each part (so a
    /// large value never travels as one reply), all parts from one `MULTI` so a concurrent
    /// overwrite is never mixed in.
    async fn get_value(&self, key: &str, kind: &'static str, name: String) -> Result<Bytes, SnapshotError> {
        let mut connection = self.connection().await?;
        let count: Option<usize> = redis::cmd("HGET")
            .arg(key)
            .arg("n")
            .query_async(&mut connection)
            .await
            .map_err(|error| self.failed("get", error))?;
        let Some(count) = count else { return Err(SnapshotError::not_found(kind, name)) };
        let mut pipe = redis::pipe();
        pipe.atomic();
        pipe.hget(key, "n");
        for index in 0..count {
            pipe.hget(key, index.to_string());
        }
        let mut replies: Vec<Option<Vec<u8>>> =
            pipe.query_async(&mut connection).await.map_err(|error| self.failed("get", error))?;
        let counted = replies.first().cloned().flatten();
        if counted.as_deref() != Some(count.to_string().as_bytes()) {
            // Deleted or rewritten between the two calls: read the new state.
            return match counted {
                None => Err(SnapshotError::not_found(kind, name)),
                Some(_) => Box::pin(self.get_value(key, kind, name)).await,
            };
        }
        let mut value = BytesMut::new();
        for part in replies.drain(1..) {
            let part = part.ok_or_else(|| SnapshotError::Store {
                store: self.description.clone(),
                operation: "get",
                reason: format!("{kind} {name}: a part is missing"),
            })?;
            value.extend_from_slice(&part);
        }
        Ok(value.freeze())
    }
}

#[async_trait]
impl SnapshotStore for RedisStore {
    fn describe(&self) -> String {
        self.description.clone()
    }

    fn name(&self) -> &'static str {
        "redis"
    }

    async fn put_blob(&self, hash: &str, data: Bytes) -> Result<(), SnapshotError> {
        validate_hash(hash)?;
        let written = now_unix_ms();
        let mut pipe = redis::pipe();
        pipe.atomic();
        let key = self.blob_key(hash);
        Self::add_value(&mut pipe, &key, &data, written);
        pipe.zadd(self.blobs_key(), hash, written).ignore();
        let mut connection = self.connection().await?;
        pipe.query_async::<()>(&mut connection).await.map_err(|error| self.failed("put blob", error))
    }

    async fn get_blob(&self, hash: &str) -> Result<Bytes, SnapshotError> {
        validate_hash(hash)?;
        self.get_value(&self.blob_key(hash), "blob", hash.to_owned()).await
    }

    async fn has_blob(&self, hash: &str) -> Result<bool, SnapshotError> {
        validate_hash(hash)?;
        let mut connection = self.connection().await?;
        redis::cmd("EXISTS")
            .arg(self.blob_key(hash))
            .query_async(&mut connection)
            .await
            .map_err(|error| self.failed("has blob", error))
    }

    async fn has_blobs(&self, hashes: &[String]) -> Result<Vec<bool>, SnapshotError> {
        let mut answers = Vec::with_capacity(hashes.len());
        let mut connection = self.connection().await?;
        for batch in hashes.chunks(1000) {
            let mut pipe = redis::pipe();
            for hash in batch {
                validate_hash(hash)?;
                pipe.exists(self.blob_key(hash));
            }
            let found: Vec<bool> =
                pipe.query_async(&mut connection).await.map_err(|error| self.failed("has blobs", error))?;
            answers.extend(found);
        }
        Ok(answers)
    }

    async fn delete_blob(&self, hash: &str) -> Result<(), SnapshotError> {
        validate_hash(hash)?;
        let mut pipe = redis::pipe();
        pipe.atomic().del(self.blob_key(hash)).ignore().zrem(self.blobs_key(), hash).ignore();
        let mut connection = self.connection().await?;
        pipe.query_async::<()>(&mut connection).await.map_err(|error| self.failed("delete blob", error))
    }

    async fn list_blob_entries(&self) -> Result<Vec<BlobEntry>, SnapshotError> {
        let mut connection = self.connection().await?;
        let listed: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(self.blobs_key())
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut connection)
            .await
            .map_err(|error| self.failed("list blobs", error))?;
        Ok(listed
            .into_iter()
            .filter(|(hash, _)| validate_hash(hash).is_ok())
            .map(|(hash, written)| BlobEntry { hash, written_unix_ms: written.max(0.0) as u64 })
            .collect())
    }

    async fn put_manifest(&self, workspace_id: &str, snapshot_id: &str, data: Bytes) -> Result<(), SnapshotError> {
        validate_workspace_id(workspace_id)?;
        validate_snapshot_id(snapshot_id)?;
        let written = now_unix_ms();
        let mut pipe = redis::pipe();
        pipe.atomic();
        Self::add_value(&mut pipe, &self.manifest_key(workspace_id, snapshot_id), &data, written);
        pipe.zadd(self.manifests_key(workspace_id), snapshot_id, 0).ignore();
        pipe.sadd(self.workspaces_key(), workspace_id).ignore();
        let mut connection = self.connection().await?;
        pipe.query_async::<()>(&mut connection).await.map_err(|error| self.failed("put manifest", error))
    }

    async fn get_manifest(&self, workspace_id: &str, snapshot_id: &str) -> Result<Bytes, SnapshotError> {
        validate_workspace_id(workspace_id)?;
        validate_snapshot_id(snapshot_id)?;
        self.get_value(
            &self.manifest_key(workspace_id, snapshot_id),
            "manifest",
            format!("{workspace_id}/{snapshot_id}"),
        )
        .await
    }

    async fn list_manifests(&self, workspace_id: &str) -> Result<Vec<String>, SnapshotError> {
        validate_workspace_id(workspace_id)?;
        let mut connection = self.connection().await?;
        let ids: Vec<String> = redis::cmd("ZRANGE")
            .arg(self.manifests_key(workspace_id))
            .arg(0)
            .arg(-1)
            .query_async(&mut connection)
            .await
            .map_err(|error| self.failed("list manifests", error))?;
        Ok(ids.into_iter().filter(|id| validate_snapshot_id(id).is_ok()).collect())
    }

    async fn delete_manifest(&self, workspace_id: &str, snapshot_id: &str) -> Result<(), SnapshotError> {
        validate_workspace_id(workspace_id)?;
        validate_snapshot_id(snapshot_id)?;
        let script = redis::Script::new(
            r"redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
if redis.call('ZCARD', KEYS[2]) == 0 then redis.call('SREM', KEYS[3], ARGV[2]) end
return 0",
        );
        let mut connection = self.connection().await?;
        script
            .key(self.manifest_key(workspace_id, snapshot_id))
            .key(self.manifests_key(workspace_id))
            .key(self.workspaces_key())
            .arg(snapshot_id)
            .arg(workspace_id)
            .invoke_async::<i64>(&mut connection)
            .await
            .map(|_| ())
            .map_err(|error| self.failed("delete manifest", error))
    }

    async fn list_workspaces(&self) -> Result<Vec<String>, SnapshotError> {
        let mut connection = self.connection().await?;
        let workspaces: Vec<String> = redis::cmd("SMEMBERS")
            .arg(self.workspaces_key())
            .query_async(&mut connection)
            .await
            .map_err(|error| self.failed("list workspaces", error))?;
        Ok(workspaces.into_iter().filter(|workspace| validate_workspace_id(workspace).is_ok()).collect())
    }
}

/// Parts of a value as `add_value` lays them out, for tests.
#[cfg(test)]
fn parts_of(length: usize) -> usize {
    length.div_ceil(PART_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_parsing_hides_credentials() {
        let store = RedisStore::open("redis://user:secret@127.0.0.1:6390/2?prefix=t:1").unwrap();
        assert_eq!(store.describe(), "redis://127.0.0.1:6390/2?prefix=t:1");
        assert!(!format!("{store:?}").contains("secret"));
        assert!(RedisStore::open("redis://127.0.0.1/0?prefix=bad%20prefix").is_err());
        assert!(RedisStore::open("redis://127.0.0.1/0?unknown=1").is_err());
        match RedisStore::open("redis://u:hunter2@127.0.0.1/0?nope=1") {
            Err(error) => assert!(!error.to_string().contains("hunter2"), "{error}"),
            Ok(_) => panic!("unknown parameter accepted"),
        }
        assert_eq!(parts_of(PART_BYTES + 1), 2);
    }
}
