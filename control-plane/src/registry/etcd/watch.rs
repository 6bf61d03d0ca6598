//! Adapts an etcd watch stream to the registry's `WatchStream`.
//!
//! etcd may put several revisions into one response while a watcher catches up; we split
//! responses into one item per revision so both implementations yield exactly "the events of
//! one transaction" per item. The stream never ends silently: compaction yields `Compacted`,
//! a broken or closed stream yields `Unavailable`, and then it ends; the caller re-lists.
//!
//! With progress on, the watch requests a progress notification every interval and yields
//! each one as an empty batch.

use std::collections::VecDeque;
use std::time::Duration;

use etcd_client::{WatchRequestSender, WatchResponseStream};
use futures::StreamExt;
use tokio::time::Instant;

use super::convert;
use crate::registry::{RegistryError, Result, WatchEvent, WatchStream};

pub(super) struct WatchState {
    requests: WatchRequestSender,
    responses: WatchResponseStream,
    /// How often to ask for progress, and when next; `None` for a plain watch.
    progress: Option<(Duration, Instant)>,
    pending: VecDeque<Result<Vec<WatchEvent>>>,
    /// The first revision not yet delivered, reported in `Compacted`.
    next_revision: i64,
    finished: bool,
}

impl WatchState {
    /// Takes a stream whose "created" reply has already been read.
    pub fn new(stream: etcd_client::WatchStream, start_revision: i64, progress: Option<Duration>) -> Self {
        let (requests, responses) = stream.split();
        Self {
            requests,
            responses,
            progress: progress.map(|every| (every, Instant::now() + every)),
            pending: VecDeque::new(),
            next_revision: start_revision,
            finished: false,
        }
    }

    pub fn into_stream(self) -> WatchStream {
        futures::stream::unfold(self, |mut state| async move {
            let item = state.next_item().await?;
            Some((item, state))
        })
        .boxed()
    }

    async fn next_item(&mut self) -> Option<Result<Vec<WatchEvent>>> {
        loop {
            if let Some(item) = self.pending.pop_front() {
                return Some(item);
            }
            if self.finished {
                return None;
            }
            let message = match self.progress {
                Some((every, next_request)) => tokio::select! {
                    message = self.responses.next() => message,
                    _ = tokio::time::sleep_until(next_request) => {
                        self.progress = Some((every, Instant::now() + every));
                        if let Err(error) = self.requests.request_progress().await {
                            self.fail(super::call::map_error(error, Default::default()));
                        }
                        continue;
                    }
                },
                None => self.responses.next().await,
            };
            match message {
                Some(Ok(response)) => self.absorb(&response),
                None => self.fail(RegistryError::Unavailable("etcd closed the watch stream".into())),
                Some(Err(error)) => self.fail(super::call::map_error(error, Default::default())),
            }
        }
    }

    fn fail(&mut self, error: RegistryError) {
        self.pending.push_back(Err(error));
        self.finished = true;
    }

    /// Queues the items of one response. Also used for the "created" reply, which may already
    /// carry the compaction verdict.
    pub fn absorb(&mut self, response: &etcd_client::WatchResponse) {
        if response.compact_revision() > 0 {
            self.fail(RegistryError::Compacted {
                requested: self.next_revision,
                compact_revision: response.compact_revision(),
            });
            return;
        }
        if response.canceled() {
            self.fail(RegistryError::Unavailable(format!("etcd canceled the watch: {}", response.cancel_reason())));
            return;
        }
        let mut batch: Vec<WatchEvent> = Vec::new();
        for event in response.events() {
            let converted = match convert_event(event) {
                Ok(converted) => converted,
                Err(error) => {
                    self.fail(error);
                    return;
                }
            };
            if batch.last().is_some_and(|last| last.revision() != converted.revision()) {
                self.push_batch(std::mem::take(&mut batch));
            }
            batch.push(converted);
        }
        if !batch.is_empty() {
            self.push_batch(batch);
        } else if self.progress.is_some() && !response.created() {
            // A progress notification: everything up to its revision was delivered.
            self.pending.push_back(Ok(Vec::new()));
        }
    }

    fn push_batch(&mut self, batch: Vec<WatchEvent>) {
        if let Some(last) = batch.last() {
            self.next_revision = last.revision() + 1;
        }
        self.pending.push_back(Ok(batch));
    }
}

fn convert_event(event: &etcd_client::Event) -> Result<WatchEvent> {
    let kv = event.kv().ok_or_else(|| RegistryError::Other("etcd watch event without a key".into()))?;
    Ok(match event.event_type() {
        etcd_client::EventType::Put => WatchEvent::Put(convert::key_value(kv)?),
        etcd_client::EventType::Delete => {
            WatchEvent::Delete { key: convert::key_string(kv.key())?, mod_revision: kv.mod_revision() }
        }
    })
}
