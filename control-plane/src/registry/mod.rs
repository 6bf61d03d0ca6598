//! The registry seam: the only state replicas share (docs/design.md §4.1).
//!
//! A small required core (`get`, `range`, `txn`, leases, `watch_prefix`) with etcd
//! semantics, and provided helpers built on it. Two implementations: [`etcd::EtcdRegistry`]
//! (production) and [`embedded::EmbeddedRegistry`] (in-process, for `berth up` and tests).
//! Both pass the same conformance suite (`registry_suite!`).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;

pub mod embedded;
pub mod etcd;

pub type RegistryRef = Arc<dyn Registry>;

/// An etcd lease id. Keys attached to a lease disappear when it expires or is revoked.
pub type LeaseId = i64;

/// Registry failures. `Unavailable` and `Timeout` are retryable; the rest are not.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("registry unavailable: {0}")]
    Unavailable(String),
    #[error("registry call {operation} timed out after {millis} ms")]
    Timeout { operation: &'static str, millis: u64 },
    /// The lease does not exist (expired or revoked).
    #[error("lease {0:x} not found")]
    LeaseNotFound(LeaseId),
    /// A watch asked for history the store no longer has; re-list and watch again.
    #[error("revision {requested} has been compacted (oldest available {compact_revision})")]
    Compacted { requested: i64, compact_revision: i64 },
    #[error("registry request refused: {0}")]
    InvalidRequest(String),
    /// A stored value could not be decoded.
    #[error("corrupt record at {key}: {reason}")]
    Corrupt { key: String, reason: String },
    #[error("registry error: {0}")]
    Other(String),
}

impl RegistryError {
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable(_) | Self::Timeout { .. })
    }
}

pub type Result<T, E = RegistryError> = std::result::Result<T, E>;

/// One stored key with its etcd-style revisions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Bytes,
    /// Revision of the transaction that created the key (fencing token for locks).
    pub create_revision: i64,
    /// Revision of the last write to the key.
    pub mod_revision: i64,
    /// Number of writes since creation (1 after create).
    pub version: i64,
    /// Lease the key is attached to; 0 for none.
    pub lease: LeaseId,
}

/// What a transaction compares.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    /// 0 when the key does not exist.
    CreateRevision(i64),
    ModRevision(i64),
    Version(i64),
    Value(Bytes),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareOp {
    Equal,
    NotEqual,
    Greater,
    Less,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub key: String,
    pub op: CompareOp,
    pub target: CompareTarget,
}

impl Compare {
    /// The key does not exist.
    pub fn absent(key: impl Into<String>) -> Self {
        Self { key: key.into(), op: CompareOp::Equal, target: CompareTarget::CreateRevision(0) }
    }
    pub fn create_revision(key: impl Into<String>, revision: i64) -> Self {
        Self { key: key.into(), op: CompareOp::Equal, target: CompareTarget::CreateRevision(revision) }
    }
    pub fn mod_revision(key: impl Into<String>, revision: i64) -> Self {
        Self { key: key.into(), op: CompareOp::Equal, target: CompareTarget::ModRevision(revision) }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOp {
    Put { key: String, value: Bytes, lease: LeaseId },
    Delete { key: String },
    Get { key: String },
}

impl TxnOp {
    pub fn put(key: impl Into<String>, value: impl Into<Bytes>) -> Self {
        Self::Put { key: key.into(), value: value.into(), lease: 0 }
    }
    pub fn put_with_lease(key: impl Into<String>, value: impl Into<Bytes>, lease: LeaseId) -> Self {
        Self::Put { key: key.into(), value: value.into(), lease }
    }
    pub fn delete(key: impl Into<String>) -> Self {
        Self::Delete { key: key.into() }
    }
    pub fn get(key: impl Into<String>) -> Self {
        Self::Get { key: key.into() }
    }
}

/// `if all(compares) then success else failure`, atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub compares: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

impl Txn {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn when(mut self, compares: impl IntoIterator<Item = Compare>) -> Self {
        self.compares.extend(compares);
        self
    }
    pub fn and_then(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.success.extend(ops);
        self
    }
    pub fn or_else(mut self, ops: impl IntoIterator<Item = TxnOp>) -> Self {
        self.failure.extend(ops);
        self
    }
}

/// Result of one op of the branch that ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOpResponse {
    Put,
    /// Number of keys deleted (0 or 1).
    Delete(i64),
    Get(Option<KeyValue>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnResponse {
    pub succeeded: bool,
    /// Store revision after the transaction (the revision of its writes, if any).
    pub revision: i64,
    pub responses: Vec<TxnOpResponse>,
}

impl TxnResponse {
    /// The first `Get` result of the branch that ran.
    pub fn first_get(&self) -> Option<&KeyValue> {
        self.responses.iter().find_map(|response| match response {
            TxnOpResponse::Get(value) => value.as_ref(),
            _ => None,
        })
    }
}

/// A change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    Put(KeyValue),
    /// The key was deleted (or its lease expired) at `mod_revision`.
    Delete {
        key: String,
        mod_revision: i64,
    },
}

impl WatchEvent {
    pub fn key(&self) -> &str {
        match self {
            Self::Put(kv) => &kv.key,
            Self::Delete { key, .. } => key,
        }
    }
    pub fn revision(&self) -> i64 {
        match self {
            Self::Put(kv) => kv.mod_revision,
            Self::Delete { mod_revision, .. } => *mod_revision,
        }
    }
}

/// Events of one revision, in order. A `Compacted` error ends the stream: re-list. Only a
/// watch opened with [`Registry::watch_prefix_with_progress`] yields empty batches
/// (progress notifications).
pub type WatchStream = BoxStream<'static, Result<Vec<WatchEvent>>>;

/// A consistent snapshot of a prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResponse {
    pub kvs: Vec<KeyValue>,
    /// Store revision the snapshot was taken at; watch from `revision + 1`.
    pub revision: i64,
}

/// The shared store.
///
/// Guarantees (both implementations, checked by `registry_suite!`): reads are linearizable;
/// a transaction is atomic and its compares see the latest committed state; revisions grow
/// strictly with every write transaction; a watch delivers every change of its prefix from
/// its start revision in revision order, without gaps, or ends with `Compacted`; keys on a
/// lease disappear (with a `Delete` event) within a short time after the lease's TTL passes
/// without keep-alive. The store never interprets values.
///
/// Errors: `Unavailable` / `Timeout` are retryable; every call has a deadline inside the
/// implementation, so none hangs.
#[async_trait]
pub trait Registry: Send + Sync {
    /// Implementation name for logs and metric labels (`etcd`, `embedded`).
    fn name(&self) -> &'static str;

    async fn get(&self, key: &str) -> Result<Option<KeyValue>>;

    /// All keys starting with `prefix`, sorted by key, with `limit` (0 = no limit) and the
    /// exclusive start key `after` (empty = from the beginning) for paging.
    async fn range_page(&self, prefix: &str, after: &str, limit: usize) -> Result<RangeResponse>;

    async fn txn(&self, txn: Txn) -> Result<TxnResponse>;

    /// Grants a lease with the given TTL (rounded up to whole seconds, at least the store's
    /// minimum).
    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId>;

    /// Renews a lease once; returns the remaining TTL, or `LeaseNotFound` when it is gone.
    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration>;

    /// Revokes a lease, deleting its keys. Revoking a missing lease is not an error.
    async fn revoke_lease(&self, lease: LeaseId) -> Result<()>;

    /// Watches every key starting with `prefix`, from `start_revision` (inclusive; 0 = from
    /// now).
    async fn watch_prefix(&self, prefix: &str, start_revision: i64) -> Result<WatchStream>;

    // ---- provided ------------------------------------------------------------------------

    /// Like [`Registry::watch_prefix`], and also yields an empty batch — a progress
    /// notification: every change up to about now has been delivered — at least every
    /// `progress_interval` while the watch is current. A watch that cannot vouch for being
    /// current (etcd: its member lost the leader) ends instead, so a reader that hears
    /// nothing for a while knows its view may be stale (docs/design.md §4.1).
    ///
    /// The provided version suits a registry in this process, whose watch cannot silently
    /// fall behind: it ticks beside the watch and ends with it. A networked registry must
    /// override it with the store's own progress notifications.
    async fn watch_prefix_with_progress(
        &self,
        prefix: &str,
        start_revision: i64,
        progress_interval: Duration,
    ) -> Result<WatchStream> {
        use futures::StreamExt;
        let watch = self.watch_prefix(prefix, start_revision).await?;
        let ticker = tokio::time::interval(progress_interval);
        Ok(futures::stream::unfold((watch, ticker), |(mut watch, mut ticker)| async move {
            let item = tokio::select! {
                biased;
                item = watch.next() => item?,
                _ = ticker.tick() => Ok(Vec::new()),
            };
            Some((item, (watch, ticker)))
        })
        .boxed())
    }

    /// All keys starting with `prefix`, in one consistent snapshot.
    async fn range(&self, prefix: &str) -> Result<RangeResponse> {
        self.range_page(prefix, "", 0).await
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<i64> {
        let response = self.txn(Txn::new().and_then([TxnOp::put(key, value)])).await?;
        Ok(response.revision)
    }

    async fn delete(&self, key: &str) -> Result<bool> {
        let response = self.txn(Txn::new().and_then([TxnOp::delete(key)])).await?;
        Ok(matches!(response.responses.first(), Some(TxnOpResponse::Delete(count)) if *count > 0))
    }

    /// Creates `key` only if it does not exist. `Ok(Ok(create_revision))` when created,
    /// `Ok(Err(existing))` when someone else holds it.
    async fn create_if_absent(
        &self,
        key: &str,
        value: Bytes,
        lease: LeaseId,
    ) -> Result<std::result::Result<i64, KeyValue>> {
        let response = self
            .txn(
                Txn::new()
                    .when([Compare::absent(key)])
                    .and_then([TxnOp::put_with_lease(key, value, lease)])
                    .or_else([TxnOp::get(key)]),
            )
            .await?;
        if response.succeeded {
            return Ok(Ok(response.revision));
        }
        match response.first_get() {
            Some(existing) => Ok(Err(existing.clone())),
            // Deleted between the compare and the get of the same txn cannot happen; treat it
            // as a lost race and let the caller retry.
            None => Err(RegistryError::Unavailable(format!("{key} vanished during create"))),
        }
    }
}
