//! The replica's in-memory view of workspaces and nodes (docs/design.md §4.1): one watch-fed
//! mirror per key prefix, one writer task each, many readers. The hot path resolves a
//! workspace with a map lookup and no registry read.
//!
//! Consistency: a mirror lists its prefix in pages (each page at the then-latest revision),
//! then watches from the first page's revision + 1. Every change after the listing started
//! is therefore replayed by the watch, and an entry is only replaced by a change with a
//! higher mod revision, so replays and pages never move an entry backwards. On compaction
//! or a broken watch the mirror lists again. Entries are kept sorted by id, so listing
//! pages is a range scan.
//!
//! Freshness: a mirror is current as of its last listing, event or progress notification
//! (asked for every [`PROGRESS_INTERVAL`]). A registry that cannot vouch for being current
//! (an etcd member without a leader) ends the watch, and the listing fails too, so the
//! mirror goes silent; routing refuses once the view is silent for longer than the bound
//! (`ControlPlaneConfig::view_max_staleness`) instead of routing from a frozen view.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::keys::Keys;
use crate::records::{self, DrainRecord, NodeRecord, StoredState, WorkspaceRecord};
use crate::registry::{KeyValue, RegistryRef, WatchEvent};

/// Keys listed per registry call while (re)listing.
const LIST_PAGE: usize = 1000;

/// How often a quiet watch asks the registry to confirm it is current.
pub const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// A record as last seen, with the revision that wrote it.
#[derive(Debug)]
pub struct Entry<T> {
    pub record: Arc<T>,
    pub mod_revision: i64,
}

impl<T> Clone for Entry<T> {
    fn clone(&self) -> Self {
        Self { record: Arc::clone(&self.record), mod_revision: self.mod_revision }
    }
}

/// Mirror of one key prefix.
pub struct Mirror<T> {
    prefix: String,
    entries: RwLock<BTreeMap<String, Entry<T>>>,
    /// Bumped after every applied batch; waiters `changed().await` on it.
    version: watch::Sender<u64>,
    /// When the registry last vouched that this mirror was current (listing, event or
    /// progress notification).
    current_at: Mutex<Instant>,
}

impl<T: DeserializeOwned + Send + Sync + 'static> Mirror<T> {
    fn new(prefix: String) -> Self {
        Self {
            prefix,
            entries: RwLock::new(BTreeMap::new()),
            version: watch::channel(0).0,
            current_at: Mutex::new(Instant::now()),
        }
    }

    /// How long since the registry last vouched that this mirror was current.
    pub fn silent_for(&self) -> Duration {
        self.current_at.lock().unwrap_or_else(PoisonError::into_inner).elapsed()
    }

    fn heard(&self) {
        *self.current_at.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    }

    pub fn get(&self, id: &str) -> Option<Entry<T>> {
        self.read().get(id).cloned()
    }

    pub fn all(&self) -> Vec<Entry<T>> {
        self.read().values().cloned().collect()
    }

    /// Up to `limit` entries with ids after `after` (exclusive) that pass `keep`, in id
    /// order, and whether more follow. Costs O(log n + what it scans), so paging through a
    /// large view is linear overall.
    pub fn page(&self, after: &str, limit: usize, mut keep: impl FnMut(&T) -> bool) -> (Vec<Entry<T>>, bool) {
        let entries = self.read();
        let start =
            if after.is_empty() { std::ops::Bound::Unbounded } else { std::ops::Bound::Excluded(after.to_owned()) };
        let mut page = Vec::new();
        for (_, entry) in entries.range((start, std::ops::Bound::Unbounded)) {
            if !keep(&entry.record) {
                continue;
            }
            if page.len() == limit {
                return (page, true);
            }
            page.push(entry.clone());
        }
        (page, false)
    }

    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BTreeMap<String, Entry<T>>> {
        // A poisoned lock only means a reader panicked; the map itself is always consistent
        // because every write is a single insert or remove.
        self.entries.read().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BTreeMap<String, Entry<T>>> {
        self.entries.write().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Applies a value read from the registry (a linearizable read or a watch event). Only
    /// moves forward: a write with a lower or equal mod revision than the stored one is
    /// ignored.
    pub fn apply_put(&self, kv: &KeyValue) {
        let Some(id) = Keys::id_of(&kv.key, &self.prefix) else { return };
        let record = match records::decode::<T>(&kv.key, &kv.value) {
            Ok(record) => record,
            Err(error) => {
                tracing::warn!(key = %kv.key, %error, "skipping undecodable record");
                return;
            }
        };
        let mut entries = self.write();
        if entries.get(id).is_some_and(|existing| existing.mod_revision >= kv.mod_revision) {
            return;
        }
        entries.insert(id.to_owned(), Entry { record: Arc::new(record), mod_revision: kv.mod_revision });
    }

    /// Applies a deletion seen at `revision` (a watch event, or a linearizable read that
    /// found nothing).
    pub fn apply_delete(&self, key: &str, revision: i64) {
        let Some(id) = Keys::id_of(key, &self.prefix) else { return };
        let mut entries = self.write();
        if entries.get(id).is_some_and(|existing| existing.mod_revision < revision) {
            entries.remove(id);
        }
    }

    fn bump(&self) {
        self.version.send_modify(|version| *version += 1);
    }

    /// Lists the prefix into a fresh map and swaps it in; returns the revision to watch from.
    async fn relist(&self, registry: &RegistryRef) -> crate::registry::Result<i64> {
        let mut fresh = BTreeMap::new();
        let mut after = String::new();
        let mut first_revision = None;
        loop {
            let page = registry.range_page(&self.prefix, &after, LIST_PAGE).await?;
            first_revision.get_or_insert(page.revision);
            for kv in &page.kvs {
                let Some(id) = Keys::id_of(&kv.key, &self.prefix) else { continue };
                match records::decode::<T>(&kv.key, &kv.value) {
                    Ok(record) => {
                        fresh.insert(id.to_owned(), Entry { record: Arc::new(record), mod_revision: kv.mod_revision });
                    }
                    Err(error) => tracing::warn!(key = %kv.key, %error, "skipping undecodable record"),
                }
            }
            match page.kvs.last() {
                Some(last) if page.kvs.len() == LIST_PAGE => after = last.key.clone(),
                _ => break,
            }
        }
        *self.write() = fresh;
        self.heard();
        self.bump();
        Ok(first_revision.unwrap_or(0))
    }

    /// Keeps the mirror current until cancelled: watch, and list again whenever the watch
    /// ends (compaction, broken stream).
    async fn run(self: Arc<Self>, registry: RegistryRef, mut watch_from: i64, cancel: CancellationToken) {
        let mut backoff = Duration::from_millis(100);
        loop {
            let watched = tokio::select! {
                _ = cancel.cancelled() => return,
                result = self.watch_until_broken(&registry, watch_from) => result,
            };
            if let Err(error) = watched {
                tracing::info!(prefix = %self.prefix, %error, "view watch ended; listing again");
            }
            loop {
                let listed = tokio::select! {
                    _ = cancel.cancelled() => return,
                    result = self.relist(&registry) => result,
                };
                match listed {
                    Ok(revision) => {
                        watch_from = revision + 1;
                        backoff = Duration::from_millis(100);
                        break;
                    }
                    Err(error) => {
                        tracing::warn!(prefix = %self.prefix, %error, "listing for the view failed; retrying");
                        tokio::select! {
                            _ = cancel.cancelled() => return,
                            _ = tokio::time::sleep(backoff) => {}
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
        }
    }

    async fn watch_until_broken(&self, registry: &RegistryRef, start_revision: i64) -> crate::registry::Result<()> {
        let mut stream = registry.watch_prefix_with_progress(&self.prefix, start_revision, PROGRESS_INTERVAL).await?;
        while let Some(batch) = stream.next().await {
            let batch = batch?;
            self.heard();
            if batch.is_empty() {
                // A progress notification: nothing changed, and the mirror is current.
                continue;
            }
            for event in batch {
                match &event {
                    WatchEvent::Put(kv) => self.apply_put(kv),
                    WatchEvent::Delete { key, mod_revision } => self.apply_delete(key, *mod_revision),
                }
            }
            self.bump();
        }
        Err(crate::registry::RegistryError::Unavailable("watch stream ended".into()))
    }
}

/// Effective state of a workspace as clients see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EffectiveState {
    Ready,
    Idle,
    /// Stored as ready, but its node is gone or drained.
    Lost,
    Failed,
}

/// The replica's view: workspaces, nodes and node drains.
pub struct ReplicaView {
    pub workspaces: Arc<Mirror<WorkspaceRecord>>,
    pub nodes: Arc<Mirror<NodeRecord>>,
    pub drains: Arc<Mirror<DrainRecord>>,
}

impl ReplicaView {
    /// Lists both prefixes (retrying until the registry answers or `cancel` fires), then
    /// keeps them current in background tasks.
    pub async fn start(
        registry: RegistryRef,
        keys: &Keys,
        cancel: CancellationToken,
    ) -> crate::registry::Result<Arc<Self>> {
        let workspaces = Arc::new(Mirror::new(keys.workspaces_prefix()));
        let nodes = Arc::new(Mirror::new(keys.nodes_prefix()));
        let drains = Arc::new(Mirror::new(keys.drains_prefix()));
        let workspaces_from = workspaces.relist(&registry).await? + 1;
        let nodes_from = nodes.relist(&registry).await? + 1;
        let drains_from = drains.relist(&registry).await? + 1;
        tokio::spawn(Arc::clone(&workspaces).run(Arc::clone(&registry), workspaces_from, cancel.clone()));
        tokio::spawn(Arc::clone(&nodes).run(Arc::clone(&registry), nodes_from, cancel.clone()));
        tokio::spawn(Arc::clone(&drains).run(registry, drains_from, cancel));
        Ok(Arc::new(Self { workspaces, nodes, drains }))
    }

    /// The mirror the registry has vouched for least recently, and for how long it has
    /// been silent. Routing refuses while this exceeds its bound.
    pub fn staleness(&self) -> (&str, Duration) {
        [
            (self.workspaces.prefix.as_str(), self.workspaces.silent_for()),
            (self.nodes.prefix.as_str(), self.nodes.silent_for()),
            (self.drains.prefix.as_str(), self.drains.silent_for()),
        ]
        .into_iter()
        .max_by_key(|(_, silent_for)| *silent_for)
        .unwrap_or(("", Duration::ZERO))
    }

    pub fn workspace(&self, id: &str) -> Option<Entry<WorkspaceRecord>> {
        self.workspaces.get(id)
    }

    pub fn node(&self, id: &str) -> Option<Arc<NodeRecord>> {
        self.nodes.get(id).map(|entry| entry.record)
    }

    pub fn node_is_live(&self, id: &str) -> bool {
        self.nodes.get(id).is_some()
    }

    /// Whether workspaces placed on the node may be served there: it is live and not
    /// drained. A READY workspace on any other node is LOST and is re-placed on next access.
    pub fn node_holds_workspaces(&self, id: &str) -> bool {
        self.node_is_live(id) && !self.is_draining(id)
    }

    /// Whether an operator drained the node (it may be live or not).
    pub fn is_draining(&self, node_id: &str) -> bool {
        self.drains.get(node_id).is_some()
    }

    pub fn live_nodes(&self) -> Vec<Arc<NodeRecord>> {
        self.nodes.all().into_iter().map(|entry| entry.record).collect()
    }

    pub fn effective_state(&self, record: &WorkspaceRecord) -> EffectiveState {
        match record.state {
            StoredState::Ready => match &record.node_id {
                Some(node) if self.node_holds_workspaces(node) => EffectiveState::Ready,
                _ => EffectiveState::Lost,
            },
            StoredState::Idle => EffectiveState::Idle,
            StoredState::Failed => EffectiveState::Failed,
        }
    }
}
