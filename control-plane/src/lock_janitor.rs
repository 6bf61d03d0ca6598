//! Lock janitor (docs/design.md §4.2): one task per replica deletes bind locks that carry
//! this replica's id but that no bind or state change in flight here owns. Such a lock is
//! left by a create whose answer was lost and whose re-read found nothing (the create landed
//! later); it hangs on this replica's lease, so without the janitor every bind of that
//! workspace, on every replica, would wait its whole timeout until this replica restarts.
//!
//! Safe against races: an acquire registers its lock value before sending the create, so a
//! lock in flight is never an orphan; a lock must be seen orphaned for [`MIN_ORPHAN_AGE`]
//! before it goes; and the delete compares the create revision, so a newer lock on the same
//! key is never touched.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::store::WorkspaceStoreRef;

/// How often the janitor lists this replica's locks.
pub const JANITOR_PERIOD: Duration = Duration::from_secs(1);

/// How long a lock must have been seen orphaned before it is deleted.
pub const MIN_ORPHAN_AGE: Duration = Duration::from_secs(2);

pub struct LockJanitor {
    store: WorkspaceStoreRef,
    /// Orphans by (lock key, create revision), with when this janitor first saw each.
    orphans_since: HashMap<(String, i64), Instant>,
}

impl LockJanitor {
    pub fn new(store: WorkspaceStoreRef) -> Self {
        Self { store, orphans_since: HashMap::new() }
    }

    pub async fn run(mut self, cancel: CancellationToken) {
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = tokio::time::sleep(JANITOR_PERIOD) => {}
            }
            if let Err(error) = self.pass().await {
                tracing::debug!(%error, "lock janitor pass failed; trying again next period");
            }
        }
    }

    async fn pass(&mut self) -> crate::error::Result<()> {
        let orphans = self.store.orphan_locks().await?;
        let mut seen = HashMap::with_capacity(orphans.len());
        for (lock_key, create_revision) in orphans {
            let since =
                self.orphans_since.get(&(lock_key.clone(), create_revision)).copied().unwrap_or_else(Instant::now);
            if since.elapsed() < MIN_ORPHAN_AGE {
                seen.insert((lock_key, create_revision), since);
                continue;
            }
            match self.store.delete_lock_created_at(&lock_key, create_revision).await {
                Ok(true) => tracing::info!(
                    lock = %lock_key,
                    create_revision,
                    replica_id = %self.store.replica_id(),
                    "deleted an orphaned bind lock of this replica"
                ),
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(lock = %lock_key, %error, "deleting an orphaned bind lock failed");
                    seen.insert((lock_key, create_revision), since);
                }
            }
        }
        self.orphans_since = seen;
        Ok(())
    }
}
