//! `MeteredRegistry`: the registry seam with every call of its required core timed into
//! `berth_control_plane_etcd_call_*` (latency including retries, final errors by kind).
//!
//! A decorator applied by the composition root (`server.rs`), so the registry module
//! knows nothing of metrics. Only the etcd registry is metered: the series are named after
//! etcd, and an embedded registry has no calls worth timing. Provided methods are not
//! forwarded: they run on the metered core (a `create_if_absent` counts as a `txn`, as it
//! did when etcd recorded its own calls), so an inner fast path would be bypassed — no
//! implementation has one today.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use crate::metrics;
use crate::registry::{KeyValue, LeaseId, RangeResponse, Registry, RegistryRef, Result, Txn, TxnResponse, WatchStream};

/// `registry`, metered when it is etcd.
pub fn metered(registry: RegistryRef) -> RegistryRef {
    if registry.name() == "etcd" { Arc::new(MeteredRegistry { inner: registry }) } else { registry }
}

pub struct MeteredRegistry {
    inner: RegistryRef,
}

async fn timed<T>(operation: &'static str, call: impl Future<Output = Result<T>>) -> Result<T> {
    let started = Instant::now();
    let outcome = call.await;
    metrics::etcd_call(operation, started.elapsed(), outcome.as_ref().err());
    outcome
}

#[async_trait]
impl Registry for MeteredRegistry {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        timed("get", self.inner.get(key)).await
    }

    async fn range_page(&self, prefix: &str, after: &str, limit: usize) -> Result<RangeResponse> {
        timed("range", self.inner.range_page(prefix, after, limit)).await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        timed("txn", self.inner.txn(txn)).await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        timed("grant_lease", self.inner.grant_lease(ttl)).await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        timed("keep_alive", self.inner.keep_alive(lease)).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        timed("revoke_lease", self.inner.revoke_lease(lease)).await
    }

    async fn watch_prefix(&self, prefix: &str, start_revision: i64) -> Result<WatchStream> {
        timed("watch", self.inner.watch_prefix(prefix, start_revision)).await
    }
}
