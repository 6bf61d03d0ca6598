//! The loop the group committers share (`session_commit.rs`, `txn_commit.rs`): one task
//! per committer takes whatever is queued, cuts from it the longest batch that fits one etcd
//! transaction, commits that batch, and goes on with the rest; while a transaction is in
//! flight the next items queue up. Each item carries its caller's reply.

use std::collections::VecDeque;
use std::future::Future;

use futures::FutureExt;
use tokio::sync::mpsc;

/// etcd's default `--max-txn-ops`: compares and each branch's operations are counted
/// separately against it.
pub const MAX_TXN_OPS: usize = 128;

/// Items taken from the queue at most in one pass (the rest wait for the next batch).
const MAX_QUEUED: usize = 4 * MAX_TXN_OPS;

/// Runs until every sender of `receiver` is gone: `take_batch` cuts a batch from the front
/// of what is queued, `commit` writes it and answers its callers. A panic in `commit` fails
/// that batch's callers (their replies are dropped), not every item after it; `what` names
/// the items in the error logged then.
pub async fn run_batches<P, C, F>(
    mut receiver: mpsc::UnboundedReceiver<P>,
    take_batch: fn(&mut VecDeque<P>) -> Vec<P>,
    commit: C,
    what: &'static str,
) where
    C: Fn(Vec<P>) -> F,
    F: Future<Output = ()>,
{
    let mut queued: VecDeque<P> = VecDeque::new();
    loop {
        if queued.is_empty() {
            match receiver.recv().await {
                Some(item) => queued.push_back(item),
                None => return,
            }
        }
        while queued.len() < MAX_QUEUED {
            match receiver.try_recv() {
                Ok(item) => queued.push_back(item),
                Err(_) => break,
            }
        }
        let batch = take_batch(&mut queued);
        if std::panic::AssertUnwindSafe(commit(batch)).catch_unwind().await.is_err() {
            tracing::error!("a batch of {what} panicked; its callers were answered with an error");
        }
    }
}
