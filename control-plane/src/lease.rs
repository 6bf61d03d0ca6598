//! The replica's own lease: bind locks, the sweeper's leadership and the replica's record
//! hang on it, so all of them vanish when the replica dies (docs/design.md §4.2).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::registry::{LeaseId, RegistryError, RegistryRef, Txn, TxnOp};

/// How long a starting replica keeps trying to get its lease from a registry that answers
/// retryable errors before it gives up.
pub const START_PATIENCE: Duration = Duration::from_secs(30);

/// Keeps one lease alive; grants a new one (and re-attaches the replica record) if the
/// registry lost it. Holders of locks on the old lease find out through their fencing
/// compares, never by being told.
pub struct ReplicaLease {
    registry: RegistryRef,
    current: watch::Receiver<LeaseId>,
}

impl ReplicaLease {
    /// Grants the lease, writes `record_key = record` on it, and keeps it alive until
    /// `cancel` fires. While the registry answers retryable errors (an etcd member just
    /// died, a leader election) it tries again with a backoff for up to
    /// [`START_PATIENCE`]: a grant that may have landed only leaves a lease that expires
    /// unused.
    pub async fn start(
        registry: RegistryRef,
        ttl: Duration,
        record_key: String,
        record: Bytes,
        cancel: CancellationToken,
    ) -> crate::registry::Result<Arc<Self>> {
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(100);
        let lease = loop {
            let attempt = async {
                let lease = registry.grant_lease(ttl).await?;
                registry.txn(Txn::new().and_then([TxnOp::put_with_lease(&record_key, record.clone(), lease)])).await?;
                Ok::<_, RegistryError>(lease)
            };
            match attempt.await {
                Ok(lease) => break lease,
                Err(error) if error.is_retryable() && started.elapsed() < START_PATIENCE && !cancel.is_cancelled() => {
                    tracing::warn!(%error, "granting the replica lease failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
                Err(error) => return Err(error),
            }
        };
        let (sender, current) = watch::channel(lease);
        let keeper = Keeper { registry: Arc::clone(&registry), ttl, record_key, record, sender };
        tokio::spawn(keeper.run(cancel));
        Ok(Arc::new(Self { registry, current }))
    }

    pub fn id(&self) -> LeaseId {
        *self.current.borrow()
    }

    /// Revokes the lease: locks, leadership and the replica record go at once.
    pub async fn revoke(&self) {
        if let Err(error) = self.registry.revoke_lease(self.id()).await {
            tracing::warn!(%error, "revoking the replica lease failed; it will expire");
        }
    }
}

struct Keeper {
    registry: RegistryRef,
    ttl: Duration,
    record_key: String,
    record: Bytes,
    sender: watch::Sender<LeaseId>,
}

impl Keeper {
    async fn run(self, cancel: CancellationToken) {
        let period = self.ttl / 3;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(period) => {}
            }
            let lease = *self.sender.borrow();
            match self.registry.keep_alive(lease).await {
                Ok(_) => {}
                Err(RegistryError::LeaseNotFound(_)) => {
                    tracing::warn!(lease, "replica lease expired; granting a new one");
                    if let Err(error) = self.regrant().await {
                        tracing::warn!(%error, "granting a new replica lease failed; retrying");
                    }
                }
                Err(error) => tracing::warn!(%error, "replica lease keep-alive failed; retrying"),
            }
        }
    }

    async fn regrant(&self) -> crate::registry::Result<()> {
        let lease = self.registry.grant_lease(self.ttl).await?;
        self.registry
            .txn(Txn::new().and_then([TxnOp::put_with_lease(&self.record_key, self.record.clone(), lease)]))
            .await?;
        self.sender.send_replace(lease);
        Ok(())
    }
}
