//! The embedded registry's state machine: keys, leases, revisions and event history.
//!
//! Synchronous and clock-free (callers pass `now`), so it never awaits under the registry's
//! mutex and its etcd semantics are testable without a runtime. Mirrors etcd 3.4 where the
//! suite can observe a difference: a revision is spent only by a transaction that changes
//! something, a deleted key's `Delete` event carries the deleting revision, a `Value` compare
//! on a missing key is false whatever the operator, and a put on a missing lease fails the
//! whole transaction.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use crate::registry::{
    Compare, CompareOp, CompareTarget, KeyValue, LeaseId, RangeResponse, RegistryError, Result, Txn, TxnOp,
    TxnOpResponse, TxnResponse, WatchEvent,
};

/// All events of one write transaction (or one lease expiry), sharing its revision.
#[derive(Clone, Debug)]
pub(super) struct Batch {
    pub revision: i64,
    pub events: Arc<[WatchEvent]>,
}

impl Batch {
    /// The events under `prefix`, in transaction order; `None` when there are none.
    pub fn under_prefix(&self, prefix: &str) -> Option<Vec<WatchEvent>> {
        let events: Vec<WatchEvent> =
            self.events.iter().filter(|event| event.key().starts_with(prefix)).cloned().collect();
        (!events.is_empty()).then_some(events)
    }
}

struct LeaseState {
    ttl: Duration,
    deadline: Instant,
    /// Keys currently attached; kept in sync by put / delete so expiry deletes exactly these.
    keys: BTreeSet<String>,
}

pub(super) struct Store {
    /// Revision of the last write; 1 for an empty store, like etcd.
    revision: i64,
    keys: BTreeMap<String, KeyValue>,
    leases: HashMap<LeaseId, LeaseState>,
    next_lease_id: LeaseId,
    /// No lease expires before this instant. A lower bound: keep-alives only move deadlines
    /// later, so it is recomputed when it passes rather than on every renewal.
    earliest_lease_deadline: Option<Instant>,
    min_lease_ttl: Duration,
    /// Write batches in revision order, for watches that start in the past.
    history: VecDeque<Batch>,
    history_events: usize,
    history_limit: usize,
    /// A watch may start at this revision or later; older history is gone.
    oldest_watchable: i64,
    /// Revision of the last explicit `compact`, 0 when never compacted.
    compacted: i64,
}

impl Store {
    pub fn new(history_limit: usize, min_lease_ttl: Duration) -> Self {
        Self {
            revision: 1,
            keys: BTreeMap::new(),
            leases: HashMap::new(),
            next_lease_id: 1,
            earliest_lease_deadline: None,
            min_lease_ttl,
            history: VecDeque::new(),
            history_events: 0,
            history_limit,
            oldest_watchable: 1,
            compacted: 0,
        }
    }

    pub fn revision(&self) -> i64 {
        self.revision
    }

    /// Moves the revision forward to at least `revision` (a journal replay: the store was at
    /// that revision before the restart).
    pub fn advance_revision(&mut self, revision: i64) {
        self.revision = self.revision.max(revision);
    }

    pub fn get(&self, key: &str) -> Option<KeyValue> {
        self.keys.get(key).cloned()
    }

    pub fn range_page(&self, prefix: &str, after: &str, limit: usize) -> RangeResponse {
        let start = if after.is_empty() || after < prefix { Bound::Included(prefix) } else { Bound::Excluded(after) };
        let limit = if limit == 0 { usize::MAX } else { limit };
        let kvs = self
            .keys
            .range::<str, _>((start, Bound::Unbounded))
            .take_while(|(key, _)| key.starts_with(prefix))
            .take(limit)
            .map(|(_, kv)| kv.clone())
            .collect();
        RangeResponse { kvs, revision: self.revision }
    }

    pub fn txn(&mut self, txn: &Txn) -> Result<(TxnResponse, Option<Batch>)> {
        let succeeded = txn.compares.iter().all(|compare| self.compare(compare));
        let ops = if succeeded { &txn.success } else { &txn.failure };
        // Validate the whole branch first: a refused transaction must change nothing.
        self.validate(ops)?;
        let write_revision = self.revision + 1;
        let mut events = Vec::new();
        let mut responses = Vec::with_capacity(ops.len());
        for op in ops {
            match op {
                TxnOp::Put { key, value, lease } => {
                    let kv = self.put(key, value, *lease, write_revision);
                    events.push(WatchEvent::Put(kv));
                    responses.push(TxnOpResponse::Put);
                }
                TxnOp::Delete { key } => {
                    let deleted = self.remove(key);
                    if deleted {
                        events.push(WatchEvent::Delete { key: key.clone(), mod_revision: write_revision });
                    }
                    responses.push(TxnOpResponse::Delete(i64::from(deleted)));
                }
                // Reads see the branch's earlier writes, as in etcd.
                TxnOp::Get { key } => responses.push(TxnOpResponse::Get(self.get(key))),
            }
        }
        let batch = self.commit(events);
        let response = TxnResponse { succeeded, revision: self.revision, responses };
        Ok((response, batch))
    }

    fn compare(&self, compare: &Compare) -> bool {
        let current = self.keys.get(&compare.key);
        let ordering = match (&compare.target, current) {
            // etcd: a value compare against a missing key is false for every operator.
            (CompareTarget::Value(_), None) => return false,
            (CompareTarget::Value(expected), Some(kv)) => kv.value.as_ref().cmp(expected.as_ref()),
            // The other targets treat a missing key as all zeroes.
            (CompareTarget::CreateRevision(expected), current) => {
                current.map_or(0, |kv| kv.create_revision).cmp(expected)
            }
            (CompareTarget::ModRevision(expected), current) => current.map_or(0, |kv| kv.mod_revision).cmp(expected),
            (CompareTarget::Version(expected), current) => current.map_or(0, |kv| kv.version).cmp(expected),
        };
        match compare.op {
            CompareOp::Equal => ordering == Ordering::Equal,
            CompareOp::NotEqual => ordering != Ordering::Equal,
            CompareOp::Greater => ordering == Ordering::Greater,
            CompareOp::Less => ordering == Ordering::Less,
        }
    }

    /// The checks etcd applies to the branch that runs: non-empty keys, existing leases, and
    /// no key written twice (etcd: "duplicate key given in txn request").
    fn validate(&self, ops: &[TxnOp]) -> Result<()> {
        let mut written = HashSet::new();
        for op in ops {
            let key = match op {
                TxnOp::Put { key, .. } | TxnOp::Delete { key } | TxnOp::Get { key } => key,
            };
            if key.is_empty() {
                return Err(RegistryError::InvalidRequest("empty key in txn".into()));
            }
            match op {
                TxnOp::Put { key, lease, .. } => {
                    if *lease != 0 && !self.leases.contains_key(lease) {
                        return Err(RegistryError::LeaseNotFound(*lease));
                    }
                    if !written.insert(key.as_str()) {
                        return Err(RegistryError::InvalidRequest(format!("duplicate key {key} in txn")));
                    }
                }
                TxnOp::Delete { .. } | TxnOp::Get { .. } => {}
            }
        }
        for op in ops {
            if let TxnOp::Delete { key } = op
                && written.contains(key.as_str())
            {
                return Err(RegistryError::InvalidRequest(format!("duplicate key {key} in txn")));
            }
        }
        Ok(())
    }

    fn put(&mut self, key: &str, value: &Bytes, lease: LeaseId, revision: i64) -> KeyValue {
        let (create_revision, version, previous_lease) = match self.keys.get(key) {
            Some(existing) => (existing.create_revision, existing.version + 1, existing.lease),
            None => (revision, 1, 0),
        };
        // A put moves the key to the new lease (or to none), like etcd.
        if previous_lease != 0 && previous_lease != lease {
            self.detach(previous_lease, key);
        }
        if let Some(state) = self.leases.get_mut(&lease) {
            state.keys.insert(key.to_owned());
        }
        let kv = KeyValue {
            key: key.to_owned(),
            value: value.clone(),
            create_revision,
            mod_revision: revision,
            version,
            lease,
        };
        self.keys.insert(key.to_owned(), kv.clone());
        kv
    }

    fn remove(&mut self, key: &str) -> bool {
        match self.keys.remove(key) {
            Some(removed) => {
                if removed.lease != 0 {
                    self.detach(removed.lease, key);
                }
                true
            }
            None => false,
        }
    }

    fn detach(&mut self, lease: LeaseId, key: &str) {
        if let Some(state) = self.leases.get_mut(&lease) {
            state.keys.remove(key);
        }
    }

    /// Spends a revision on `events` (if any) and records them for watches.
    fn commit(&mut self, events: Vec<WatchEvent>) -> Option<Batch> {
        if events.is_empty() {
            return None;
        }
        self.revision += 1;
        let batch = Batch { revision: self.revision, events: events.into() };
        self.history_events += batch.events.len();
        self.history.push_back(batch.clone());
        while self.history_events > self.history_limit {
            let Some(oldest) = self.history.pop_front() else {
                break;
            };
            self.history_events -= oldest.events.len();
            self.oldest_watchable = oldest.revision + 1;
        }
        Some(batch)
    }

    // ---- leases ---------------------------------------------------------------------------

    /// Grants a lease; the TTL is rounded up to whole seconds and at least the minimum.
    pub fn grant_lease(&mut self, ttl: Duration, now: Instant) -> LeaseId {
        let ttl = whole_seconds(ttl).max(self.min_lease_ttl);
        let id = self.next_lease_id;
        self.next_lease_id += 1;
        let deadline = now + ttl;
        self.leases.insert(id, LeaseState { ttl, deadline, keys: BTreeSet::new() });
        self.earliest_lease_deadline =
            Some(self.earliest_lease_deadline.map_or(deadline, |earliest| earliest.min(deadline)));
        id
    }

    /// Renews a lease for its full TTL. Call [`Store::expire`] first so that a lease past its
    /// deadline is gone rather than revived.
    pub fn keep_alive(&mut self, lease: LeaseId, now: Instant) -> Result<Duration> {
        let state = self.leases.get_mut(&lease).ok_or(RegistryError::LeaseNotFound(lease))?;
        state.deadline = now + state.ttl;
        Ok(state.ttl)
    }

    /// Removes a lease and deletes its keys in one new revision (none if it had no keys).
    pub fn revoke_lease(&mut self, lease: LeaseId) -> Option<Batch> {
        let state = self.leases.remove(&lease)?;
        let mut events = Vec::with_capacity(state.keys.len());
        for key in state.keys {
            if self.keys.remove(&key).is_some() {
                events.push(WatchEvent::Delete { key, mod_revision: self.revision + 1 });
            }
        }
        self.commit(events)
    }

    /// Revokes every lease whose deadline has passed, one revision per lease.
    pub fn expire(&mut self, now: Instant) -> Vec<Batch> {
        match self.earliest_lease_deadline {
            Some(earliest) if earliest <= now => {}
            _ => return Vec::new(),
        }
        let mut expired: Vec<LeaseId> =
            self.leases.iter().filter(|(_, state)| state.deadline <= now).map(|(id, _)| *id).collect();
        // Deterministic revision order for leases expiring together.
        expired.sort_unstable();
        let batches = expired.into_iter().filter_map(|lease| self.revoke_lease(lease)).collect();
        self.earliest_lease_deadline = self.leases.values().map(|state| state.deadline).min();
        batches
    }

    /// When the next lease may expire.
    pub fn next_lease_deadline(&self) -> Option<Instant> {
        self.earliest_lease_deadline
    }

    // ---- history --------------------------------------------------------------------------

    /// The batches under `prefix` from `start_revision` on, or `Compacted` when that history
    /// is gone.
    pub fn replay(&self, prefix: &str, start_revision: i64) -> Result<Vec<Vec<WatchEvent>>> {
        if start_revision < self.oldest_watchable {
            return Err(RegistryError::Compacted {
                requested: start_revision,
                compact_revision: self.oldest_watchable,
            });
        }
        let first = self.history.partition_point(|batch| batch.revision < start_revision);
        Ok(self.history.range(first..).filter_map(|batch| batch.under_prefix(prefix)).collect())
    }

    /// Forgets history before `revision`, like etcd's compaction.
    pub fn compact(&mut self, revision: i64) -> Result<()> {
        if revision <= self.compacted {
            return Err(RegistryError::Compacted { requested: revision, compact_revision: self.compacted });
        }
        if revision > self.revision {
            return Err(RegistryError::InvalidRequest(format!(
                "cannot compact at future revision {revision} (current {})",
                self.revision
            )));
        }
        while let Some(oldest) = self.history.front() {
            if oldest.revision >= revision {
                break;
            }
            self.history_events -= oldest.events.len();
            self.history.pop_front();
        }
        self.oldest_watchable = self.oldest_watchable.max(revision);
        self.compacted = revision;
        Ok(())
    }
}

fn whole_seconds(ttl: Duration) -> Duration {
    let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    Duration::from_secs(seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Store {
        Store::new(4, Duration::from_secs(1))
    }

    #[test]
    fn history_is_trimmed_by_whole_batches() {
        let mut store = store();
        for index in 0..3 {
            let txn = Txn::new().and_then([TxnOp::put(format!("a{index}"), "x"), TxnOp::put(format!("b{index}"), "x")]);
            store.txn(&txn).expect("txn");
        }
        // Revisions 2, 3, 4 with two events each; a limit of 4 keeps only 3 and 4.
        assert!(matches!(store.replay("", 2), Err(RegistryError::Compacted { requested: 2, compact_revision: 3 })));
        assert_eq!(store.replay("", 3).expect("replay").len(), 2);
    }

    #[test]
    fn refused_txn_changes_nothing() {
        let mut store = store();
        let txn = Txn::new().and_then([TxnOp::put("a", "1"), TxnOp::put_with_lease("b", "2", 42)]);
        assert!(matches!(store.txn(&txn), Err(RegistryError::LeaseNotFound(42))));
        assert_eq!(store.revision(), 1);
        assert_eq!(store.get("a"), None);
        let duplicate = Txn::new().and_then([TxnOp::put("a", "1"), TxnOp::delete("a")]);
        assert!(matches!(store.txn(&duplicate), Err(RegistryError::InvalidRequest(_))));
    }

    #[test]
    fn lease_ttl_is_rounded_up() {
        let mut store = store();
        let now = Instant::now();
        let short = store.grant_lease(Duration::from_millis(10), now);
        let fractional = store.grant_lease(Duration::from_millis(2_100), now);
        assert_eq!(store.keep_alive(short, now).ok(), Some(Duration::from_secs(1)));
        assert_eq!(store.keep_alive(fractional, now).ok(), Some(Duration::from_secs(3)));
        assert_eq!(store.expire(now + Duration::from_millis(999)).len(), 0);
        // Neither lease had keys, so expiry spends no revision.
        assert_eq!(store.expire(now + Duration::from_secs(3)).len(), 0);
        assert!(store.keep_alive(short, now).is_err());
        assert_eq!(store.next_lease_deadline(), None);
    }
}
