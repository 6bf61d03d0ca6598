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

/// Keys asked for in a listing's first page.
pub const LIST_PAGE: usize = 1000;
/// The most keys asked for in one page.
pub const LIST_PAGE_MAX: usize = 64_000;
/// About how many bytes of records a page is sized to hold.
pub const LIST_PAGE_BYTES: usize = 16 * 1024 * 1024;

/// The size of a listing's next page, after a full page of `limit` records that held
/// `bytes`: twice as many, at most [`LIST_PAGE_MAX`] and about [`LIST_PAGE_BYTES`] at the
/// records' average size (fewer than `limit` if they are large), never 0 (which would ask
/// for everything).
///
/// Pages grow because etcd walks the whole rest of the range for every page it serves (it
/// counts the keys it does not return): in pages of a fixed 1000, listing n records visits
/// about n²/2000 keys, and 1 M records took 110 s to list on a 2-core machine.
pub fn next_page_limit(limit: usize, bytes: usize) -> usize {
    let per_record = (bytes / limit.max(1)).max(1);
    limit.saturating_mul(2).min(LIST_PAGE_MAX).min(LIST_PAGE_BYTES / per_record).max(1)
}

/// The bytes a page of keys and values held: what [`next_page_limit`] sizes the next by.
pub fn page_bytes(kvs: &[KeyValue]) -> usize {
    kvs.iter().map(|kv| kv.key.len() + kv.value.len()).sum()
}

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
    ///
    /// The next page is asked for before this one is decoded, so the registry serves it
    /// while this task decodes: a listing takes about the longer of the two, not their sum.
    /// Pages grow as the listing goes ([`next_page_limit`]).
    async fn relist(&self, registry: &RegistryRef) -> crate::registry::Result<i64> {
        let mut fresh = BTreeMap::new();
        let mut limit = LIST_PAGE;
        let mut page = registry.range_page(&self.prefix, "", limit).await?;
        let first_revision = page.revision;
        loop {
            // A full page may have more behind it.
            let after = match page.kvs.last() {
                Some(last) if page.kvs.len() == limit => Some(last.key.clone()),
                _ => None,
            };
            limit = next_page_limit(limit, page_bytes(&page.kvs));
            let fetch = async {
                match &after {
                    Some(after) => Some(registry.range_page(&self.prefix, after, limit).await),
                    None => None,
                }
            };
            // `join!` polls the fetch first: its request is on its way before decoding starts.
            let decode = async { self.decode_into(&mut fresh, &page.kvs) };
            let (next, ()) = futures::join!(fetch, decode);
            match next {
                Some(next) => page = next?,
                None => break,
            }
        }
        *self.write() = fresh;
        self.heard();
        self.bump();
        Ok(first_revision)
    }

    fn decode_into(&self, fresh: &mut BTreeMap<String, Entry<T>>, kvs: &[KeyValue]) {
        for kv in kvs {
            let Some(id) = Keys::id_of(&kv.key, &self.prefix) else { continue };
            match records::decode::<T>(&kv.key, &kv.value) {
                Ok(record) => {
                    fresh.insert(id.to_owned(), Entry { record: Arc::new(record), mod_revision: kv.mod_revision });
                }
                Err(error) => tracing::warn!(key = %kv.key, %error, "skipping undecodable record"),
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::embedded::EmbeddedRegistry;
    use crate::registry::{Txn, TxnOp};

    fn drain(node_id: &str) -> DrainRecord {
        DrainRecord {
            version: records::RECORD_VERSION,
            node_id: node_id.to_owned(),
            drained_by: "ops".into(),
            drained_at_ms: 1,
            released: Vec::new(),
        }
    }

    /// Pages double from LIST_PAGE, stop at LIST_PAGE_MAX, hold about LIST_PAGE_BYTES of
    /// records (fewer records when they are large) and never ask for everything.
    #[test]
    fn pages_grow_up_to_a_count_and_a_size() {
        assert_eq!(next_page_limit(LIST_PAGE, LIST_PAGE * 500), 2 * LIST_PAGE);
        assert_eq!(next_page_limit(LIST_PAGE_MAX, LIST_PAGE_MAX * 10), LIST_PAGE_MAX);
        assert_eq!(next_page_limit(40_000, 40_000 * 10), LIST_PAGE_MAX);
        // 4 KiB records: 16 MiB holds 4096 of them.
        assert_eq!(next_page_limit(4000, 4000 * 4096), LIST_PAGE_BYTES / 4096);
        // 160 KiB records (a big env): fewer than the page before.
        assert_eq!(next_page_limit(LIST_PAGE, LIST_PAGE * 160 * 1024), LIST_PAGE_BYTES / (160 * 1024));
        // A record larger than the whole budget still moves the listing on.
        assert_eq!(next_page_limit(10, 10 * (LIST_PAGE_BYTES + 1)), 1);
        assert_eq!(next_page_limit(0, 0), 1);
        assert_eq!(next_page_limit(usize::MAX, 0), LIST_PAGE_MAX);
    }

    /// A listing reads every page (the next one asked for while the last is decoded, pages
    /// of 1000, 2000, 4000, …) and keeps each record with the revision that wrote it: around
    /// and on page boundaries, with an undecodable record skipped and a key of another prefix
    /// ignored.
    #[tokio::test]
    async fn a_relist_sees_every_record_across_pages() {
        let two_pages = LIST_PAGE + 2 * LIST_PAGE;
        for count in [0, 1, LIST_PAGE - 1, LIST_PAGE, LIST_PAGE + 1, two_pages, two_pages + 1, 7 * LIST_PAGE + 345] {
            let embedded = EmbeddedRegistry::new();
            let registry: RegistryRef = embedded;
            let keys = Keys::new("/t");
            let mut written = BTreeMap::new();
            for batch in (0..count).collect::<Vec<_>>().chunks(100) {
                let puts = batch.iter().map(|index| {
                    let id = format!("node-{index:05}");
                    TxnOp::put(keys.drain(&id), records::encode(&drain(&id)))
                });
                let revision = registry.txn(Txn::new().and_then(puts)).await.unwrap().revision;
                written.extend(batch.iter().map(|index| (format!("node-{index:05}"), revision)));
            }
            registry.put(&keys.drain("zz-garbage"), bytes::Bytes::from_static(b"{not json")).await.unwrap();
            registry.put("/t-other/drains/node-x", records::encode(&drain("node-x"))).await.unwrap();
            let before = registry.range("/t").await.unwrap().revision;

            let mirror = Mirror::<DrainRecord>::new(keys.drains_prefix());
            let from = mirror.relist(&registry).await.unwrap();
            assert_eq!(from, before, "{count} records: the listing's revision");
            let listed: BTreeMap<String, i64> =
                mirror.all().into_iter().map(|entry| (entry.record.node_id.clone(), entry.mod_revision)).collect();
            assert_eq!(listed.len(), count, "{count} records listed");
            assert!(listed == written, "{count} records: ids or revisions differ");
        }
    }
}
