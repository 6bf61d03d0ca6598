//! In-process registry with etcd semantics, for `berth up` and tests.
//!
//! One std mutex guards the whole state ([`store::Store`] plus the watchers); it is never
//! held across an `.await`, so every call is a short critical section and none can hang.
//! Lease expiry happens lazily at the start of every call and eagerly in a background reaper
//! task, so watchers see expiry `Delete` events even when nobody else calls the registry.
//!
//! Durability: none by default. [`EmbeddedRegistry::open`] adds a journal of the keys without
//! a lease (workspace and session records), so `berth up` keeps its workspaces across
//! restarts; leased keys are re-created by their owners.

mod journal;
mod store;
mod watch;

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use self::store::Store;
use self::watch::Watchers;
use crate::registry::{KeyValue, LeaseId, RangeResponse, Registry, Result, Txn, TxnResponse, WatchStream};

#[derive(Clone, Debug)]
pub struct EmbeddedConfig {
    /// Events kept for watches that start in the past; older ones are compacted away.
    pub history_limit: usize,
    /// Batches a watcher may have queued before it is cut off with `Compacted`.
    pub watch_buffer: usize,
    /// Shortest lease TTL granted.
    pub min_lease_ttl: Duration,
}

impl Default for EmbeddedConfig {
    fn default() -> Self {
        Self { history_limit: 100_000, watch_buffer: 1024, min_lease_ttl: Duration::from_secs(1) }
    }
}

struct State {
    store: Store,
    watchers: Watchers,
}

impl State {
    /// Expires due leases and tells the watchers. Every call does this first, so no call
    /// ever observes a lease (or its keys) past the lease's deadline.
    fn expire_leases(&mut self, now: Instant) {
        for batch in self.store.expire(now) {
            self.watchers.dispatch(&batch);
        }
    }
}

pub struct EmbeddedRegistry {
    state: Mutex<State>,
    /// Wakes the reaper when a lease with an earlier deadline appears.
    reaper_wakeup: Arc<Notify>,
    reaper: Mutex<Option<JoinHandle<()>>>,
    /// Cancelled on drop so the reaper stops with the registry.
    shutdown: CancellationToken,
    this: Weak<EmbeddedRegistry>,
    journal: Option<journal::Journal>,
}

impl EmbeddedRegistry {
    /// A registry with default limits; usable as a `RegistryRef` by coercion.
    pub fn new() -> Arc<Self> {
        Self::with_config(EmbeddedConfig::default())
    }

    pub fn with_config(config: EmbeddedConfig) -> Arc<Self> {
        Self::build(config, None)
    }

    /// A registry whose durable keys (those without a lease) are journaled at `path` and
    /// restored from it.
    pub fn open(path: &std::path::Path, config: EmbeddedConfig) -> std::io::Result<Arc<Self>> {
        let (journal, durable, revision) = journal::Journal::open(path)?;
        let registry = Self::build(config, Some(journal));
        if !durable.is_empty() {
            let restore =
                Txn::new().and_then(durable.into_iter().map(|(key, value)| crate::registry::TxnOp::put(key, value)));
            registry.lock().store.txn(&restore).map_err(std::io::Error::other)?;
        }
        // Revisions never go back across a restart (generations derive from them).
        registry.lock().store.advance_revision(revision);
        Ok(registry)
    }

    fn build(config: EmbeddedConfig, journal: Option<journal::Journal>) -> Arc<Self> {
        Arc::new_cyclic(|this| Self {
            state: Mutex::new(State {
                store: Store::new(config.history_limit, config.min_lease_ttl),
                watchers: Watchers::new(config.watch_buffer),
            }),
            reaper_wakeup: Arc::new(Notify::new()),
            reaper: Mutex::new(None),
            shutdown: CancellationToken::new(),
            this: this.clone(),
            journal,
        })
    }

    /// Forgets history before `revision`; watches from an older revision get `Compacted`.
    /// Like etcd, compacting at or below the last compaction is `Compacted` and beyond the
    /// current revision is `InvalidRequest`.
    pub async fn compact(&self, revision: i64) -> Result<()> {
        self.lock().store.compact(revision)
    }

    /// Locks the state, expiring due leases first.
    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing under this lock is expected to panic (no unwrap, no indexing); if something
        // ever does, keep serving rather than fail every later call on a poisoned mutex.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.expire_leases(Instant::now());
        state
    }

    /// Starts the expiry reaper on the current runtime unless one is running. Called from
    /// the lease and watch calls (always inside a runtime); a reaper whose runtime has shut
    /// down reports finished and is replaced here.
    fn ensure_reaper(&self) {
        let mut reaper = self.reaper.lock().unwrap_or_else(PoisonError::into_inner);
        if reaper.as_ref().is_some_and(|handle| !handle.is_finished()) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        *reaper = Some(runtime.spawn(reap(self.this.clone(), self.reaper_wakeup.clone(), self.shutdown.clone())));
    }
}

impl Drop for EmbeddedRegistry {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// Expires leases at their deadlines. Holds only a weak reference between rounds so that it
/// never keeps the registry alive.
async fn reap(registry: Weak<EmbeddedRegistry>, wakeup: Arc<Notify>, shutdown: CancellationToken) {
    // Without leases there is nothing to wait for; a grant wakes the reaper.
    const IDLE: Duration = Duration::from_secs(3600);
    loop {
        let next_deadline = {
            let Some(registry) = registry.upgrade() else {
                return;
            };
            // `lock` expires due leases and notifies watchers.
            registry.lock().store.next_lease_deadline()
        };
        let sleep_until = next_deadline.unwrap_or_else(|| Instant::now() + IDLE);
        // All arms are cancellation-safe: a missed `notify_one` is kept as a permit.
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = wakeup.notified() => {}
            () = tokio::time::sleep_until(sleep_until) => {}
        }
    }
}

#[async_trait]
impl Registry for EmbeddedRegistry {
    fn name(&self) -> &'static str {
        "embedded"
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        Ok(self.lock().store.get(key))
    }

    async fn range_page(&self, prefix: &str, after: &str, limit: usize) -> Result<RangeResponse> {
        Ok(self.lock().store.range_page(prefix, after, limit))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let mut state = self.lock();
        let (response, batch) = state.store.txn(&txn)?;
        if let Some(batch) = batch {
            // Queued under the lock, so the journal sees batches in revision order.
            if let Some(journal) = &self.journal {
                journal.record(&batch.events);
            }
            state.watchers.dispatch(&batch);
        }
        Ok(response)
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        let lease = self.lock().store.grant_lease(ttl, Instant::now());
        self.ensure_reaper();
        self.reaper_wakeup.notify_one();
        Ok(lease)
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        self.ensure_reaper();
        self.lock().store.keep_alive(lease, Instant::now())
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        let mut state = self.lock();
        if let Some(batch) = state.store.revoke_lease(lease) {
            state.watchers.dispatch(&batch);
        }
        Ok(())
    }

    async fn watch_prefix(&self, prefix: &str, start_revision: i64) -> Result<WatchStream> {
        self.ensure_reaper();
        let mut state = self.lock();
        let from_revision = if start_revision <= 0 { state.store.revision() + 1 } else { start_revision };
        let replay = match state.store.replay(prefix, from_revision) {
            Ok(replay) => replay,
            Err(error) => return Ok(Watchers::failed(error)),
        };
        Ok(state.watchers.register(prefix, from_revision, replay))
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;
    use crate::registry::{RegistryError, TxnOp};

    #[tokio::test]
    async fn lagging_watcher_gets_compacted_after_its_queue() {
        let registry = EmbeddedRegistry::with_config(EmbeddedConfig { watch_buffer: 2, ..EmbeddedConfig::default() });
        let mut watch = registry.watch_prefix("k/", 0).await.expect("watch");
        let mut revisions = Vec::new();
        for index in 0..4 {
            revisions.push(registry.put(&format!("k/{index}"), "v".into()).await.expect("put"));
        }
        for expected in &revisions[..2] {
            let batch = watch.next().await.expect("item").expect("batch");
            assert_eq!(batch[0].revision(), *expected);
        }
        match watch.next().await {
            Some(Err(RegistryError::Compacted { requested, .. })) => {
                assert_eq!(requested, revisions[2]);
            }
            other => panic!("expected Compacted, got {other:?}"),
        }
        assert!(watch.next().await.is_none());
    }

    #[tokio::test]
    async fn dropped_watch_is_forgotten() {
        let registry = EmbeddedRegistry::new();
        let watch = registry.watch_prefix("k/", 0).await.expect("watch");
        drop(watch);
        registry.put("k/a", "v".into()).await.expect("put");
        assert!(registry.lock().watchers.is_empty());
    }

    #[tokio::test]
    async fn dropping_the_registry_stops_the_reaper() {
        let registry = EmbeddedRegistry::new();
        registry.grant_lease(Duration::from_secs(60)).await.expect("grant");
        let reaper = registry.reaper.lock().expect("reaper lock").take().expect("reaper started");
        drop(registry);
        tokio::time::timeout(Duration::from_secs(5), reaper)
            .await
            .expect("reaper stops")
            .expect("reaper does not panic");
    }

    /// Bind generations derive from lock revisions: a restart must never move the revision
    /// back, even when the last writes were leased keys only (locks). Before, a reopened
    /// store counted from the number of durable keys.
    #[tokio::test]
    async fn journal_keeps_the_revision_across_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("registry.journal");
        let before = {
            let registry = EmbeddedRegistry::open(&path, EmbeddedConfig::default()).expect("open");
            registry.put("/w/a", "1".into()).await.expect("put");
            let lease = registry.grant_lease(Duration::from_secs(60)).await.expect("lease");
            for index in 0..20 {
                let key = format!("/locks/{index}");
                registry.txn(Txn::new().and_then([TxnOp::put_with_lease(key, "held", lease)])).await.expect("lock");
            }
            let revision = registry.lock().store.revision();
            registry.journal.as_ref().expect("journal").close();
            revision
        };
        for _ in 0..2 {
            let reopened = EmbeddedRegistry::open(&path, EmbeddedConfig::default()).expect("reopen");
            let next = reopened.put("/w/b", "2".into()).await.expect("put");
            assert!(next > before, "revision went back: {next} after {before}");
            reopened.journal.as_ref().expect("journal").close();
        }
    }

    #[tokio::test]
    async fn journal_restores_durable_keys_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("registry.journal");
        {
            let registry = EmbeddedRegistry::open(&path, EmbeddedConfig::default()).expect("open");
            registry.put("/w/a", "1".into()).await.expect("put");
            registry.put("/w/b", "2".into()).await.expect("put");
            registry.put("/w/a", "3".into()).await.expect("overwrite");
            registry.delete("/w/b").await.expect("delete");
            let lease = registry.grant_lease(Duration::from_secs(60)).await.expect("lease");
            registry.txn(Txn::new().and_then([TxnOp::put_with_lease("/n/x", "leased", lease)])).await.expect("put");
            registry.put("/w/bin", bytes::Bytes::from_static(&[0xff, 0x00])).await.expect("binary");
            registry.journal.as_ref().expect("journal").close();
        }
        let reopened = EmbeddedRegistry::open(&path, EmbeddedConfig::default()).expect("reopen");
        let keys: Vec<(String, bytes::Bytes)> =
            reopened.range("/").await.expect("range").kvs.into_iter().map(|kv| (kv.key, kv.value)).collect();
        assert_eq!(
            keys,
            vec![
                ("/w/a".to_owned(), bytes::Bytes::from("3")),
                ("/w/bin".to_owned(), bytes::Bytes::from_static(&[0xff, 0x00]))
            ]
        );
    }

    #[test]
    fn txn_outside_a_runtime_works() {
        let registry = EmbeddedRegistry::new();
        let response =
            futures::executor::block_on(registry.txn(Txn::new().and_then([TxnOp::put("a", "b")]))).expect("txn");
        assert_eq!(response.revision, 2);
    }
}
