//! Live MCP clients of a node: created lazily on first use, kept in an LRU with an idle
//! timeout and a per-node cap.
//!
//! Single-flight: each `(workspace, server)` has one slot whose async lock is held while
//! its server starts, so concurrent first calls start exactly one server and the others
//! wait for it. The lock is *not* held during calls: a call clones the `Peer` (rmcp
//! multiplexes concurrent requests over one connection). A dead client is noticed at the
//! next call (or by the call that sees it die) and replaced by a fresh start.
//!
//! Rebuilt at start: everything (no state survives a node-agent restart; servers start
//! again on their next call).

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rmcp::Peer;
use rmcp::RoleClient;
use tokio_util::sync::CancellationToken;

use super::client::LiveClient;
use berth_workspace::error::Result;
use berth_workspace::id::WorkspaceId;

/// Bounds of a node's client pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct McpPoolConfig {
    /// Most live clients on the node; past it the least recently used one is closed.
    pub max_live: usize,
    /// A client unused this long is closed (its stdio server stopped).
    pub idle_timeout: Duration,
}

impl Default for McpPoolConfig {
    fn default() -> Self {
        Self { max_live: 64, idle_timeout: Duration::from_secs(600) }
    }
}

type Key = (WorkspaceId, String);

/// One `(workspace, server)`.
#[derive(Default)]
struct Slot {
    client: tokio::sync::Mutex<Option<LiveClient>>,
    /// Mirrors `client.is_some()` for readers that must not wait on the lock.
    live: AtomicBool,
    last_used_ms: AtomicI64,
}

impl Slot {
    fn touch(&self, now_ms: i64) {
        self.last_used_ms.store(now_ms, Ordering::Relaxed);
    }
}

/// The pool. Cheap to clone; the idle reaper stops when the last clone is dropped.
#[derive(Clone)]
pub struct McpPool {
    inner: Arc<Inner>,
}

struct Inner {
    config: McpPoolConfig,
    slots: Mutex<HashMap<Key, Arc<Slot>>>,
    starts: AtomicU64,
    epoch: tokio::time::Instant,
    stop_reaper: CancellationToken,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop_reaper.cancel();
    }
}

impl McpPool {
    /// Creates the pool and its idle reaper (needs a tokio runtime).
    pub fn new(config: McpPoolConfig) -> Self {
        let inner = Arc::new(Inner {
            config,
            slots: Mutex::new(HashMap::new()),
            starts: AtomicU64::new(0),
            epoch: tokio::time::Instant::now(),
            stop_reaper: CancellationToken::new(),
        });
        let weak = Arc::downgrade(&inner);
        let stop = inner.stop_reaper.clone();
        let period = (config.idle_timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(period);
            loop {
                tokio::select! {
                    _ = ticker.tick() => {}
                    () = stop.cancelled() => return,
                }
                let Some(inner) = weak.upgrade() else { return };
                McpPool { inner }.reap_idle();
            }
        });
        Self { inner }
    }

    pub fn config(&self) -> McpPoolConfig {
        self.inner.config
    }

    /// How many servers this pool has started (tests: single-flight, restarts).
    pub fn starts(&self) -> u64 {
        self.inner.starts.load(Ordering::Relaxed)
    }

    /// Live clients on the node.
    pub fn live_count(&self) -> usize {
        self.slots().values().filter(|slot| slot.live.load(Ordering::Relaxed)).count()
    }

    /// Names of the workspace's servers with a live client.
    pub fn live_servers(&self, workspace: &WorkspaceId) -> Vec<String> {
        let mut names: Vec<String> = self
            .slots()
            .iter()
            .filter(|((id, _), slot)| id == workspace && slot.live.load(Ordering::Relaxed))
            .map(|((_, name), _)| name.clone())
            .collect();
        names.sort();
        names
    }

    fn slots(&self) -> MutexGuard<'_, HashMap<Key, Arc<Slot>>> {
        // Single inserts and removals: a panic cannot leave the map half-updated.
        self.inner.slots.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn now_ms(&self) -> i64 {
        self.inner.epoch.elapsed().as_millis() as i64
    }

    /// The peer of a usable client for `(workspace, server)` with this `fingerprint`,
    /// starting one with `start` when there is none (or it died, or its declaration
    /// changed). Returns whether this call started it.
    pub async fn peer<F, Fut>(
        &self,
        workspace: &WorkspaceId,
        server: &str,
        fingerprint: &str,
        start: F,
    ) -> Result<(Peer<RoleClient>, bool)>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<LiveClient>>,
    {
        let key = (workspace.clone(), server.to_owned());
        let slot = Arc::clone(self.slots().entry(key.clone()).or_default());
        let mut client = slot.client.lock().await;
        slot.touch(self.now_ms());
        if let Some(live) = client.as_ref() {
            if live.fingerprint == fingerprint && live.is_usable() {
                return Ok((live.service.peer().clone(), false));
            }
            tracing::info!(ws_id = %workspace, server, "restarting an mcp server (gone, or its declaration changed)");
        }
        // Holding the slot's lock while starting: concurrent first calls wait here.
        *client = None;
        slot.live.store(false, Ordering::Relaxed);
        let live = start().await?;
        let peer = live.service.peer().clone();
        *client = Some(live);
        slot.live.store(true, Ordering::Relaxed);
        drop(client);
        self.inner.starts.fetch_add(1, Ordering::Relaxed);
        self.enforce_cap(&key);
        Ok((peer, true))
    }

    /// Why the client of `(workspace, server)` is no longer usable, if it is not (for
    /// error messages); waits for a start in progress.
    pub async fn failure_detail(&self, workspace: &WorkspaceId, server: &str) -> Option<String> {
        let slot = self.slots().get(&(workspace.clone(), server.to_owned())).cloned()?;
        let client = slot.client.lock().await;
        client.as_ref().map(LiveClient::failure_detail)
    }

    /// Drops the client of `(workspace, server)` if it is still the one that failed.
    pub fn discard(&self, workspace: &WorkspaceId, server: &str) {
        self.close_where(|(id, name)| id == workspace && name == server, true);
    }

    /// Closes every client of a workspace (released or destroyed).
    pub fn forget_workspace(&self, workspace: &WorkspaceId) {
        self.close_where(|(id, _)| id == workspace, true);
    }

    fn close_where(&self, matches: impl Fn(&Key) -> bool, remove: bool) {
        let chosen: Vec<(Key, Arc<Slot>)> = {
            let mut slots = self.slots();
            let keys: Vec<Key> = slots.keys().filter(|key| matches(key)).cloned().collect();
            keys.into_iter()
                .filter_map(|key| {
                    let slot = if remove { slots.remove(&key) } else { slots.get(&key).cloned() };
                    slot.map(|slot| (key, slot))
                })
                .collect()
        };
        for (key, slot) in chosen {
            close_slot(&key, &slot);
        }
    }

    /// Closes the least recently used clients past the cap (never `keep`, just started).
    fn enforce_cap(&self, keep: &Key) {
        let mut live: Vec<(Key, Arc<Slot>, i64)> = self
            .slots()
            .iter()
            .filter(|(key, slot)| *key != keep && slot.live.load(Ordering::Relaxed))
            .map(|(key, slot)| (key.clone(), Arc::clone(slot), slot.last_used_ms.load(Ordering::Relaxed)))
            .collect();
        let max_others = self.inner.config.max_live.saturating_sub(1);
        if live.len() <= max_others {
            return;
        }
        live.sort_by_key(|(_, _, last_used)| *last_used);
        let excess = live.len() - max_others;
        for (key, slot, _) in live.into_iter().take(excess) {
            tracing::info!(ws_id = %key.0, server = %key.1, "closing the least recently used mcp client (node cap)");
            close_slot(&key, &slot);
        }
    }

    fn reap_idle(&self) {
        let idle_ms = self.inner.config.idle_timeout.as_millis() as i64;
        let now = self.now_ms();
        let idle: Vec<(Key, Arc<Slot>)> = self
            .slots()
            .iter()
            .filter(|(_, slot)| slot.live.load(Ordering::Relaxed))
            .filter(|(_, slot)| now - slot.last_used_ms.load(Ordering::Relaxed) >= idle_ms)
            .map(|(key, slot)| (key.clone(), Arc::clone(slot)))
            .collect();
        for (key, slot) in idle {
            tracing::debug!(ws_id = %key.0, server = %key.1, "closing an idle mcp client");
            close_slot(&key, &slot);
        }
    }
}

/// Takes the client out of a slot, unless the slot is busy starting one (that start wins).
fn close_slot(key: &Key, slot: &Slot) {
    let Ok(mut client) = slot.client.try_lock() else {
        tracing::debug!(ws_id = %key.0, server = %key.1, "mcp client busy starting; not closed now");
        return;
    };
    slot.live.store(false, Ordering::Relaxed);
    if let Some(live) = client.take() {
        // Cancelling the service closes the transport; dropping the process kills it.
        drop(live);
    }
}
