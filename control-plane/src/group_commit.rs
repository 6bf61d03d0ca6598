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
            // The first item of a burst wakes this task before the rest of the burst is
            // sent: callers woken together (every waiter of one bind) run one after the
            // other, and this task, woken by the first, would run right after it and commit
            // that one alone. Yielding lets the callers already woken send theirs first; it
            // goes on while they do, until a batch is full.
            loop {
                tokio::task::yield_now().await;
                let before = queued.len();
                drain(&mut receiver, &mut queued);
                if queued.len() == before || queued.len() >= MAX_TXN_OPS {
                    break;
                }
            }
        }
        drain(&mut receiver, &mut queued);
        let batch = take_batch(&mut queued);
        if std::panic::AssertUnwindSafe(commit(batch)).catch_unwind().await.is_err() {
            tracing::error!("a batch of {what} panicked; its callers were answered with an error");
        }
    }
}

/// Moves what is queued in `receiver` to `queued`, up to [`MAX_QUEUED`] items.
fn drain<P>(receiver: &mut mpsc::UnboundedReceiver<P>, queued: &mut VecDeque<P>) {
    while queued.len() < MAX_QUEUED {
        match receiver.try_recv() {
            Ok(item) => queued.push_back(item),
            Err(_) => break,
        }
    }
}
