//! Group commit of session records: a storm of first sessions costs a few etcd round trips,
//! not one per session.
//!
//! Every `CreateSession` ends in a conditional create: the session id is free and its
//! workspace's record exists. One committer task per replica takes whatever creates are
//! queued, writes them in one transaction — each session key absent, each distinct
//! workspace present, then every put — and answers each caller once that transaction has
//! committed. While a transaction is in flight the next creates queue up, so a lone create
//! costs one round trip as before and a burst of N costs about N / 127 of them.
//!
//! A batch whose compares fail (a session id that exists, a workspace deleted meanwhile),
//! whose transaction fails (a batch that may have landed is then found as sessions that
//! exist with the same binding: idempotent for the caller) or that etcd refuses (a
//! `--max-txn-ops` below 128) is settled create by create, as it would have been without
//! batching: each caller gets its own answer.

use std::collections::{BTreeSet, VecDeque};

use tokio::sync::{mpsc, oneshot};

use crate::error::{ControlPlaneError, Result};
use crate::group_commit::{MAX_TXN_OPS, run_batches};
use crate::records::{self, SessionRecord};
use crate::registry::{Compare, CompareOp, CompareTarget, RegistryError, RegistryRef, Txn, TxnOp};

/// What creating a session found.
#[derive(Debug)]
pub enum SessionCreated {
    Created,
    /// A session of that id exists (idempotent when it is the same binding).
    Exists(SessionRecord),
    /// The workspace's record is gone (deleted since the caller read it).
    WorkspaceGone,
}

/// One queued create.
struct Pending {
    key: String,
    workspace_key: String,
    session: SessionRecord,
    reply: oneshot::Sender<Result<SessionCreated>>,
}

/// The queue of one replica's session creates; its committer task ends when this is dropped.
pub struct SessionCommitter {
    queue: mpsc::UnboundedSender<Pending>,
}

impl SessionCommitter {
    /// Starts the committer on the current runtime.
    pub fn start(registry: RegistryRef) -> Self {
        let (queue, receiver) = mpsc::unbounded_channel();
        tokio::spawn(run(registry, receiver));
        Self { queue }
    }

    /// Creates `session` (under `key`) if its id is free and `workspace_key` exists, once
    /// the batch it rides in has committed.
    pub async fn create(&self, key: String, workspace_key: String, session: SessionRecord) -> Result<SessionCreated> {
        let (reply, answer) = oneshot::channel();
        let gone = || ControlPlaneError::Internal("the session committer stopped before answering".into());
        self.queue.send(Pending { key, workspace_key, session, reply }).map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

async fn run(registry: RegistryRef, receiver: mpsc::UnboundedReceiver<Pending>) {
    let commit = |batch: Vec<Pending>| {
        crate::metrics::session_batch(batch.len());
        commit(&registry, batch)
    };
    run_batches(receiver, take_batch, commit, "session creates").await;
}

/// The longest prefix of `queued` that fits one transaction: at most [`MAX_TXN_OPS`]
/// compares (one per session, one per distinct workspace) and no session key twice (etcd
/// refuses a transaction that puts one key twice; the second waits for the next batch).
fn take_batch(queued: &mut VecDeque<Pending>) -> Vec<Pending> {
    let mut keys = BTreeSet::new();
    let mut workspaces = BTreeSet::new();
    let mut batch = Vec::new();
    while let Some(next) = queued.front() {
        let new_workspace = !workspaces.contains(&next.workspace_key);
        let compares = keys.len() + 1 + workspaces.len() + usize::from(new_workspace);
        if keys.contains(&next.key) || compares > MAX_TXN_OPS {
            break;
        }
        keys.insert(next.key.clone());
        workspaces.insert(next.workspace_key.clone());
        batch.extend(queued.pop_front());
    }
    batch
}

async fn commit(registry: &RegistryRef, batch: Vec<Pending>) {
    if batch.len() == 1 {
        return settle_each(registry, batch).await;
    }
    let workspaces: BTreeSet<&str> = batch.iter().map(|pending| pending.workspace_key.as_str()).collect();
    let compares = batch
        .iter()
        .map(|pending| Compare::absent(&pending.key))
        .chain(workspaces.into_iter().map(workspace_exists))
        .collect::<Vec<_>>();
    let puts = batch.iter().map(|pending| TxnOp::put(&pending.key, records::encode(&pending.session)));
    match registry.txn(Txn::new().when(compares).and_then(puts)).await {
        Ok(response) if response.succeeded => {
            for pending in batch {
                let _ = pending.reply.send(Ok(SessionCreated::Created));
            }
        }
        // An etcd run with a `--max-txn-ops` below 128 refuses the batch; each create still
        // goes through on its own, only slower.
        Err(RegistryError::InvalidRequest(reason)) => {
            tracing::warn!(batch = batch.len(), %reason, "etcd refused a batch of session creates; creating them one by one");
            settle_each(registry, batch).await;
        }
        // Some create stood in the way, or the batch may or may not have landed: each on
        // its own, concurrently.
        _ => settle_each(registry, batch).await,
    }
}

async fn settle_each(registry: &RegistryRef, batch: Vec<Pending>) {
    let outcomes = futures::future::join_all(batch.iter().map(|pending| create_one(registry, pending))).await;
    for (pending, outcome) in batch.into_iter().zip(outcomes) {
        let _ = pending.reply.send(outcome);
    }
}

fn workspace_exists(key: &str) -> Compare {
    Compare { key: key.to_owned(), op: CompareOp::NotEqual, target: CompareTarget::CreateRevision(0) }
}

/// One create in its own transaction: created, or what stood in the way.
async fn create_one(registry: &RegistryRef, pending: &Pending) -> Result<SessionCreated> {
    let key = &pending.key;
    let response = registry
        .txn(
            Txn::new()
                .when([Compare::absent(key), workspace_exists(&pending.workspace_key)])
                .and_then([TxnOp::put(key, records::encode(&pending.session))])
                .or_else([TxnOp::get(key)]),
        )
        .await?;
    if response.succeeded {
        return Ok(SessionCreated::Created);
    }
    match response.first_get() {
        Some(existing) => Ok(SessionCreated::Exists(records::decode(key, &existing.value)?)),
        None => Ok(SessionCreated::WorkspaceGone),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(session: &str, workspace: &str) -> Pending {
        let (reply, _) = oneshot::channel();
        let session_record = SessionRecord {
            version: records::RECORD_VERSION,
            session_id: session.into(),
            user: "alice".into(),
            agent: "coder".into(),
            workspace_id: berth_workspace::WorkspaceId::new(workspace).unwrap(),
            created_at_ms: 0,
        };
        Pending { key: format!("s/{session}"), workspace_key: format!("w/{workspace}"), session: session_record, reply }
    }

    #[test]
    fn a_batch_stops_before_a_repeated_session_id() {
        let mut queued: VecDeque<Pending> =
            [pending("a", "w1"), pending("b", "w1"), pending("a", "w1"), pending("c", "w1")].into();
        let batch = take_batch(&mut queued);
        assert_eq!(batch.iter().map(|p| p.key.as_str()).collect::<Vec<_>>(), ["s/a", "s/b"]);
        assert_eq!(queued.len(), 2, "the repeated id starts the next batch");
    }

    #[test]
    fn a_batch_holds_at_most_max_txn_ops_compares() {
        // One workspace: 127 sessions + 1 workspace compare.
        let mut queued: VecDeque<Pending> = (0..300).map(|i| pending(&format!("s{i}"), "w")).collect();
        assert_eq!(take_batch(&mut queued).len(), MAX_TXN_OPS - 1);
        // A workspace each: 64 sessions + 64 workspaces.
        let mut queued: VecDeque<Pending> = (0..300).map(|i| pending(&format!("s{i}"), &format!("w{i}"))).collect();
        assert_eq!(take_batch(&mut queued).len(), MAX_TXN_OPS / 2);
    }
}
