//! Group commit of fenced writes: the READY (or FAILED) records of binds that end together
//! cost one etcd transaction, not one each.
//!
//! A bind ends with a fenced write: its record put and its lock deleted, only if the lock
//! still has the create revision it was taken with. One committer task per replica takes
//! whatever writes are queued and makes them one transaction — every lock compared, then
//! every write and every lock delete — and answers each caller with that transaction's
//! revision once it has committed. While a transaction is in flight the next writes queue
//! up, so a lone write costs one round trip as before.
//!
//! A transaction is all or nothing, so a batch commits only where each of its writes would
//! have committed on its own at that revision: the fencing is the same. A batch with a
//! compare that fails (a lock lost or taken over) or that etcd refuses (a `--max-txn-ops`
//! below 128) is settled write by write, each against its own lock, as without batching. A
//! batch whose transaction failed ambiguously (it may have landed) answers every caller with
//! that failure, as each one's own transaction would have.

use std::collections::{BTreeSet, VecDeque};

use tokio::sync::{mpsc, oneshot};

use crate::error::{ControlPlaneError, Result};
use crate::group_commit::{MAX_TXN_OPS, run_batches};
use crate::registry::{Compare, RegistryError, RegistryRef, Txn, TxnOp};

/// What a fenced write found.
#[derive(Debug, PartialEq, Eq)]
pub enum Fenced {
    /// Written at this revision; the lock is gone with it.
    Committed(i64),
    /// The lock no longer has the fence's create revision: nothing was written.
    LockLost,
}

/// One queued write.
struct Pending {
    lock_key: String,
    fence: i64,
    changes: Vec<TxnOp>,
    reply: oneshot::Sender<Result<Fenced>>,
}

impl Pending {
    /// Its operations in a transaction: its changes, then its lock's delete.
    fn operations(&self) -> impl Iterator<Item = TxnOp> + '_ {
        self.changes.iter().cloned().chain([TxnOp::delete(&self.lock_key)])
    }

    /// How many of them there are.
    fn operation_count(&self) -> usize {
        self.changes.len() + 1
    }

    fn compare(&self) -> Compare {
        Compare::create_revision(&self.lock_key, self.fence)
    }
}

/// The queue of one replica's fenced writes; its committer task ends when this is dropped.
pub struct FencedCommitter {
    queue: mpsc::UnboundedSender<Pending>,
}

impl FencedCommitter {
    /// Starts the committer on the current runtime.
    pub fn start(registry: RegistryRef) -> Self {
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(registry, receiver));
        Self { queue }
    }

    /// Applies `changes` and deletes `lock_key` if the lock's create revision is still
    /// `fence`, once the batch it rides in has committed.
    pub async fn write(&self, lock_key: String, fence: i64, changes: Vec<TxnOp>) -> Result<Fenced> {
        let (reply, answer) = oneshot::channel();
        let gone = || ControlPlaneError::Internal("the fenced-write committer stopped before answering".into());
        self.queue.send(Pending { lock_key, fence, changes, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn run(registry: RegistryRef, receiver: mpsc::UnboundedReceiver<Pending>) {
    run_batches(receiver, take_batch, |batch| commit(&registry, batch), "fenced writes").await;
}

/// The longest prefix of `queued` that fits one transaction: at most [`MAX_TXN_OPS`]
/// compares and as many operations, and no lock twice (etcd refuses a transaction that
/// touches a key twice; the second waits for the next batch).
fn take_batch(queued: &mut VecDeque<Pending>) -> Vec<Pending> {
    let mut locks = BTreeSet::new();
    let mut operations = 0;
    let mut batch = Vec::new();
    while let Some(next) = queued.front() {
        let fits = batch.len() < MAX_TXN_OPS && operations + next.operation_count() <= MAX_TXN_OPS;
        if locks.contains(&next.lock_key) || (!batch.is_empty() && !fits) {
            break;
        }
        locks.insert(next.lock_key.clone());
        operations += next.operation_count();
        batch.extend(queued.pop_front());
    }
    batch
}

async fn commit(registry: &RegistryRef, batch: Vec<Pending>) {
    if batch.len() == 1 {
        return settle_each(registry, batch).await;
    }
    let txn = Txn::new().when(batch.iter().map(Pending::compare)).and_then(batch.iter().flat_map(Pending::operations));
    match registry.txn(txn).await {
        Ok(response) if response.succeeded => {
            for pending in batch {
                let _ = pending.reply.send(Ok(Fenced::Committed(response.revision)));
            }
        }
        // A lock lost: nothing was written, and each write is decided against its own.
        Ok(_) => settle_each(registry, batch).await,
        Err(RegistryError::InvalidRequest(reason)) => {
            tracing::warn!(batch = batch.len(), %reason, "etcd refused a batch of fenced writes; writing them one by one");
            settle_each(registry, batch).await;
        }
        Err(error) => {
            for pending in batch {
                let _ = pending.reply.send(Err(ControlPlaneError::from(same_failure(&error))));
            }
        }
    }
}

/// A failure to answer one more caller with: retryable when the original is.
fn same_failure(error: &RegistryError) -> RegistryError {
    match error {
        RegistryError::Unavailable(reason) => RegistryError::Unavailable(reason.clone()),
        RegistryError::Timeout { operation, millis } => RegistryError::Timeout { operation, millis: *millis },
        other => RegistryError::Other(other.to_string()),
    }
}

async fn settle_each(registry: &RegistryRef, batch: Vec<Pending>) {
    let outcomes = futures::future::join_all(batch.iter().map(|pending| write_one(registry, pending))).await;
    for (pending, outcome) in batch.into_iter().zip(outcomes) {
        let _ = pending.reply.send(outcome);
    }
}

/// One write in its own transaction.
async fn write_one(registry: &RegistryRef, pending: &Pending) -> Result<Fenced> {
    let response = registry.txn(Txn::new().when([pending.compare()]).and_then(pending.operations())).await?;
    Ok(if response.succeeded { Fenced::Committed(response.revision) } else { Fenced::LockLost })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(workspace: &str, changes: usize) -> Pending {
        let (reply, _) = oneshot::channel();
        let changes = (0..changes).map(|index| TxnOp::put(format!("w/{workspace}/{index}"), "x")).collect();
        Pending { lock_key: format!("l/{workspace}"), fence: 7, changes, reply }
    }

    #[test]
    fn a_batch_stops_before_a_repeated_lock() {
        let mut queued: VecDeque<Pending> = [pending("a", 1), pending("b", 1), pending("a", 1)].into();
        let batch = take_batch(&mut queued);
        assert_eq!(batch.iter().map(|p| p.lock_key.as_str()).collect::<Vec<_>>(), ["l/a", "l/b"]);
        assert_eq!(queued.len(), 1, "the repeated lock starts the next batch");
    }

    #[test]
    fn a_batch_holds_at_most_max_txn_ops_operations() {
        // A record put and a lock delete each: 64 writes fill the 128 operations.
        let mut queued: VecDeque<Pending> = (0..300).map(|i| pending(&format!("w{i}"), 1)).collect();
        assert_eq!(take_batch(&mut queued).len(), MAX_TXN_OPS / 2);
        // With a tombstone too (3 operations each): 42.
        let mut queued: VecDeque<Pending> = (0..300).map(|i| pending(&format!("w{i}"), 2)).collect();
        assert_eq!(take_batch(&mut queued).len(), MAX_TXN_OPS / 3);
        // A write larger than a transaction still goes, alone (etcd decides).
        let mut queued: VecDeque<Pending> = [pending("big", MAX_TXN_OPS + 5), pending("next", 1)].into();
        assert_eq!(take_batch(&mut queued).len(), 1);
    }
}
