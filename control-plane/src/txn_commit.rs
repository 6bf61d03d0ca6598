//! Group commit of conditional transactions: the bind-lock takes of binds that start
//! together, and the fenced READY (or FAILED) writes of binds that end together, cost one
//! etcd transaction per batch, not one each.
//!
//! A caller hands over the transaction it would have sent on its own (compares, a success
//! branch, a failure branch). One committer task per replica takes whatever transactions
//! are queued and makes them one: every compare, then every success branch. While a
//! transaction is in flight the next ones queue up, so a lone transaction costs one round
//! trip as before.
//!
//! A batch never touches a key twice (the members' keys, compared or operated on, are
//! disjoint), so when all of its compares hold, each member's success branch does at that
//! revision exactly what it would have done alone: each caller gets the answer its own
//! transaction would have had (`succeeded`, the batch's revision, the responses of its own
//! operations). Fencing is the same: a fenced write still commits only while its lock has
//! the create revision it was taken with. A batch with a compare that fails (a lock held
//! elsewhere, lost or taken over) or that etcd refuses (a `--max-txn-ops` below 128) is
//! settled transaction by transaction, each with its own failure branch, as without
//! batching. A batch whose transaction failed ambiguously (it may have landed) answers
//! every caller with that failure, as each one's own transaction would have; callers settle
//! an ambiguous outcome the way they did before (a lock take reads whether the lock is its
//! own).

use std::collections::{BTreeSet, VecDeque};

use tokio::sync::{mpsc, oneshot};

use crate::group_commit::{MAX_TXN_OPS, run_batches};
use crate::registry::{RegistryError, RegistryRef, Txn, TxnOp, TxnResponse};

/// One queued transaction.
struct Pending {
    txn: Txn,
    reply: oneshot::Sender<Result<TxnResponse, RegistryError>>,
}

impl Pending {
    /// Every key the transaction compares or operates on.
    fn keys(&self) -> impl Iterator<Item = &str> {
        fn op_key(op: &TxnOp) -> &str {
            match op {
                TxnOp::Put { key, .. } | TxnOp::Delete { key } | TxnOp::Get { key } => key,
            }
        }
        self.txn
            .compares
            .iter()
            .map(|compare| compare.key.as_str())
            .chain(self.txn.success.iter().chain(&self.txn.failure).map(op_key))
    }
}

/// The queue of one replica's transactions; its committer task ends when this is dropped.
pub struct TxnCommitter {
    queue: mpsc::UnboundedSender<Pending>,
}

impl TxnCommitter {
    /// Starts the committer on the current runtime.
    pub fn start(registry: RegistryRef) -> Self {
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(registry, receiver));
        Self { queue }
    }

    /// Runs `txn`, possibly in one etcd transaction with others queued beside it; the
    /// answer is the one `txn` alone would have had at that revision.
    pub async fn txn(&self, txn: Txn) -> Result<TxnResponse, RegistryError> {
        let (reply, answer) = oneshot::channel();
        let gone = || RegistryError::Other("the transaction committer stopped before answering".into());
        self.queue.send(Pending { txn, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn run(registry: RegistryRef, receiver: mpsc::UnboundedReceiver<Pending>) {
    run_batches(receiver, take_batch, |batch| commit(&registry, batch), "transactions").await;
}

/// The longest prefix of `queued` that fits one transaction: at most [`MAX_TXN_OPS`]
/// compares and as many success operations, and no key twice (etcd refuses a transaction
/// that writes a key twice, and a read beside another member's write would depend on their
/// order; the second waits for the next batch).
fn take_batch(queued: &mut VecDeque<Pending>) -> Vec<Pending> {
    let mut keys = BTreeSet::new();
    let (mut compares, mut operations) = (0, 0);
    let mut batch = Vec::new();
    while let Some(next) = queued.front() {
        let fits =
            compares + next.txn.compares.len() <= MAX_TXN_OPS && operations + next.txn.success.len() <= MAX_TXN_OPS;
        if next.keys().any(|key| keys.contains(key)) || (!batch.is_empty() && !fits) {
            break;
        }
        keys.extend(next.keys().map(str::to_owned));
        compares += next.txn.compares.len();
        operations += next.txn.success.len();
        batch.extend(queued.pop_front());
    }
    batch
}

async fn commit(registry: &RegistryRef, batch: Vec<Pending>) {
    if batch.len() == 1 {
        return settle_each(registry, batch).await;
    }
    let txn = Txn::new()
        .when(batch.iter().flat_map(|pending| pending.txn.compares.iter().cloned()))
        .and_then(batch.iter().flat_map(|pending| pending.txn.success.iter().cloned()));
    match registry.txn(txn).await {
        Ok(response) if response.succeeded && response.responses.len() == batch_operations(&batch) => {
            let mut responses = response.responses.into_iter();
            for pending in batch {
                let own = responses.by_ref().take(pending.txn.success.len()).collect();
                let answer = TxnResponse { succeeded: true, revision: response.revision, responses: own };
                let _ = pending.reply.send(Ok(answer));
            }
        }
        Ok(response) if response.succeeded => {
            // Cannot be split by member: a registry that answers fewer responses than
            // operations. Nothing to undo (the writes landed); each caller is told it failed
            // ambiguously and settles it as after a lost answer.
            tracing::error!(batch = batch.len(), "a batched transaction's responses do not match its operations");
            for pending in batch {
                let failure = RegistryError::Unavailable("a batched transaction's answer was malformed".into());
                let _ = pending.reply.send(Err(failure));
            }
        }
        // A compare failed: each transaction is decided on its own, with its own failure branch.
        Ok(_) => settle_each(registry, batch).await,
        Err(RegistryError::InvalidRequest(reason)) => {
            tracing::warn!(batch = batch.len(), %reason, "etcd refused a batch of transactions; running them one by one");
            settle_each(registry, batch).await;
        }
        Err(error) => {
            for pending in batch {
                let _ = pending.reply.send(Err(same_failure(&error)));
            }
        }
    }
}

fn batch_operations(batch: &[Pending]) -> usize {
    batch.iter().map(|pending| pending.txn.success.len()).sum()
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
    let (txns, replies): (Vec<Txn>, Vec<_>) = batch.into_iter().map(|pending| (pending.txn, pending.reply)).unzip();
    let outcomes = futures::future::join_all(txns.into_iter().map(|txn| registry.txn(txn))).await;
    for (reply, outcome) in replies.into_iter().zip(outcomes) {
        let _ = reply.send(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::Compare;

    /// A fenced write of `workspace`: its lock compared, `changes` record puts and the
    /// lock's delete.
    fn fenced(workspace: &str, changes: usize) -> Pending {
        let (reply, _) = oneshot::channel();
        let lock = format!("l/{workspace}");
        let txn = Txn::new()
            .when([Compare::create_revision(&lock, 7)])
            .and_then((0..changes).map(|index| TxnOp::put(format!("w/{workspace}/{index}"), "x")))
            .and_then([TxnOp::delete(&lock)]);
        Pending { txn, reply }
    }

    /// A lock take of `workspace`: the lock created if absent, the record read.
    fn take(workspace: &str) -> Pending {
        let (reply, _) = oneshot::channel();
        let lock = format!("l/{workspace}");
        let record = format!("w/{workspace}/0");
        let txn = Txn::new()
            .when([Compare::absent(&lock)])
            .and_then([TxnOp::put_with_lease(&lock, "me", 1), TxnOp::get(&record)])
            .or_else([TxnOp::get(&lock), TxnOp::get(&record)]);
        Pending { txn, reply }
    }

    fn first_keys(batch: &[Pending]) -> Vec<&str> {
        batch.iter().map(|pending| pending.txn.compares[0].key.as_str()).collect()
    }

    #[test]
    fn a_batch_stops_before_a_repeated_key() {
        let mut queued: VecDeque<Pending> = [fenced("a", 1), fenced("b", 1), fenced("a", 1)].into();
        let batch = take_batch(&mut queued);
        assert_eq!(first_keys(&batch), ["l/a", "l/b"]);
        assert_eq!(queued.len(), 1, "the repeated lock starts the next batch");
        // A lock take reads the record a fenced write of the same workspace puts: not together.
        let mut queued: VecDeque<Pending> = [take("c"), take("d"), fenced("c", 1)].into();
        assert_eq!(first_keys(&take_batch(&mut queued)), ["l/c", "l/d"]);
    }

    #[test]
    fn a_batch_holds_at_most_max_txn_ops_compares_and_operations() {
        // A record put and a lock delete each: 64 writes fill the 128 operations.
        let mut queued: VecDeque<Pending> = (0..300).map(|i| fenced(&format!("w{i}"), 1)).collect();
        assert_eq!(take_batch(&mut queued).len(), MAX_TXN_OPS / 2);
        // With a tombstone too (3 operations each): 42.
        let mut queued: VecDeque<Pending> = (0..300).map(|i| fenced(&format!("w{i}"), 2)).collect();
        assert_eq!(take_batch(&mut queued).len(), MAX_TXN_OPS / 3);
        // Lock takes: a put and a get each (the failure branches are not sent in a batch).
        let mut queued: VecDeque<Pending> = (0..300).map(|i| take(&format!("t{i}"))).collect();
        assert_eq!(take_batch(&mut queued).len(), MAX_TXN_OPS / 2);
        // A transaction larger than a batch still goes, alone (etcd decides).
        let mut queued: VecDeque<Pending> = [fenced("big", MAX_TXN_OPS + 5), fenced("next", 1)].into();
        assert_eq!(take_batch(&mut queued).len(), 1);
    }
}
