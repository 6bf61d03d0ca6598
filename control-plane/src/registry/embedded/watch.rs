//! Watchers of the embedded registry: replay, then live batches through a bounded channel.
//!
//! Every watcher is registered and fed under the registry's mutex, in commit order, so a
//! watch sees each revision once, in order, without gaps between its replay and its live
//! part. A watcher whose channel is full is dropped rather than buffered without bound: it
//! receives what was queued and then `Compacted`, and must re-list.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TrySendError;

use super::store::Batch;
use crate::registry::{RegistryError, Result, WatchEvent, WatchStream};

struct Watcher {
    prefix: String,
    /// Batches before this revision were (or will be) delivered by the replay.
    from_revision: i64,
    sender: mpsc::Sender<Vec<WatchEvent>>,
    /// First revision this watcher could not take; 0 while it keeps up.
    lagged_at: Arc<AtomicI64>,
}

pub(super) struct Watchers {
    entries: Vec<Watcher>,
    buffer: usize,
}

impl Watchers {
    pub fn new(buffer: usize) -> Self {
        Self { entries: Vec::new(), buffer: buffer.max(1) }
    }

    /// Adds a watcher that first yields `replay`, then every batch under `prefix` from
    /// `from_revision` on. Call under the same lock as the replay was read, so nothing is
    /// committed in between.
    pub fn register(&mut self, prefix: &str, from_revision: i64, replay: Vec<Vec<WatchEvent>>) -> WatchStream {
        let (sender, receiver) = mpsc::channel(self.buffer);
        let lagged_at = Arc::new(AtomicI64::new(0));
        self.entries.push(Watcher { prefix: prefix.to_owned(), from_revision, sender, lagged_at: lagged_at.clone() });
        Box::pin(EmbeddedWatch { replay: replay.into(), receiver, lagged_at, finished: false })
    }

    /// Delivers one committed batch to every interested watcher; drops watchers whose stream
    /// was dropped or whose buffer is full.
    pub fn dispatch(&mut self, batch: &Batch) {
        self.entries.retain(|watcher| {
            if watcher.sender.is_closed() {
                return false;
            }
            if batch.revision < watcher.from_revision {
                return true;
            }
            let Some(events) = batch.under_prefix(&watcher.prefix) else {
                return true;
            };
            match watcher.sender.try_send(events) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    // Dropping the sender ends the stream after what is queued; the flag
                    // turns that end into `Compacted`.
                    watcher.lagged_at.store(batch.revision, Ordering::Release);
                    false
                }
                Err(TrySendError::Closed(_)) => false,
            }
        });
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// A watch that fails right away, for a start revision that is no longer in history.
    pub fn failed(error: RegistryError) -> WatchStream {
        Box::pin(futures::stream::once(async move { Err(error) }))
    }
}

struct EmbeddedWatch {
    replay: VecDeque<Vec<WatchEvent>>,
    receiver: mpsc::Receiver<Vec<WatchEvent>>,
    lagged_at: Arc<AtomicI64>,
    finished: bool,
}

impl Stream for EmbeddedWatch {
    type Item = Result<Vec<WatchEvent>>;

    fn poll_next(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if this.finished {
            return Poll::Ready(None);
        }
        if let Some(batch) = this.replay.pop_front() {
            return Poll::Ready(Some(Ok(batch)));
        }
        match this.receiver.poll_recv(context) {
            Poll::Ready(Some(batch)) => Poll::Ready(Some(Ok(batch))),
            Poll::Ready(None) => {
                // The sender is gone: either this watcher lagged or the registry was dropped.
                // Never end silently, or the caller could not tell a gap from a quiet prefix.
                this.finished = true;
                let lagged_at = this.lagged_at.load(Ordering::Acquire);
                let error = if lagged_at > 0 {
                    RegistryError::Compacted { requested: lagged_at, compact_revision: lagged_at + 1 }
                } else {
                    RegistryError::Unavailable("embedded registry shut down".into())
                };
                Poll::Ready(Some(Err(error)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}
