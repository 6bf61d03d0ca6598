//! The clients' side of the nemesis test: each worker owns a few users' workspaces (so the
//! operations on one workspace are sequential), writes numbered records into files, reads
//! them back, now and then deletes a workspace and creates it again, and checks every answer
//! against what it knows.
//!
//! What is checked (the promises of docs/design.md §8):
//! - An acknowledged write is readable later, unless the files' lineage changed in between.
//!   A write counts only when etcd's lineage of the workspace (`origin_generation`) read
//!   just before and just after it agree; a read checks it only when the lineage read just
//!   before and just after the read is that same one. A lineage that changed without a
//!   delete must say so: its origin is RECREATED_EMPTY or RESTORED, never FRESH, and the
//!   replicas' Workspace answers come to name it.
//! - No file of a deleted workspace is ever served again, whatever the same id becomes.
//! - (at the end, `super::verify_copies`) no workspace exists on two nodes.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use berth_control_plane::records::Origin;
use rand::Rng;
use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use tokio::sync::Mutex;

use super::client::{Clients, Lineage};

/// One violation of a promise, with what the worker saw.
#[derive(Clone, Debug)]
pub struct Violation {
    pub workspace: String,
    pub what: String,
}

/// Counters shared by the workers.
#[derive(Debug, Default)]
pub struct Counters {
    pub operations: AtomicU64,
    pub writes_acked: AtomicU64,
    pub writes_counted: AtomicU64,
    pub reads_checked: AtomicU64,
    pub deleted_reads_checked: AtomicU64,
    pub deletes: AtomicU64,
    pub lineage_changes: AtomicU64,
    pub failed_calls: AtomicU64,
}

/// A write the client attempted: the record and, when acknowledged inside one lineage, that
/// lineage.
#[derive(Clone, Debug)]
struct Written {
    content: Vec<u8>,
    lineage: Lineage,
}

/// What one worker knows of one workspace.
pub struct Model {
    pub user: String,
    pub workspace_id: Option<String>,
    next_seq: u64,
    /// Acknowledged writes inside a known lineage, by path.
    counted: BTreeMap<String, Written>,
    /// Every write attempted in the current incarnation (until a delete), by path.
    attempted: BTreeMap<String, Vec<u8>>,
    /// Files of deleted incarnations: never to be served again.
    deleted: Vec<(String, Vec<u8>)>,
    /// The lineage this worker last saw (to notice changes).
    last_lineage: Lineage,
}

impl Model {
    pub fn new(user: String) -> Self {
        Self {
            user,
            workspace_id: None,
            next_seq: 0,
            counted: BTreeMap::new(),
            attempted: BTreeMap::new(),
            deleted: Vec::new(),
            last_lineage: None,
        }
    }
}

/// One worker: its workspaces, its random stream, and where it reports.
pub struct Worker {
    pub index: usize,
    pub models: Vec<Model>,
    pub clients: Clients,
    pub counters: Arc<Counters>,
    pub violations: Arc<Mutex<Vec<Violation>>>,
    rng: StdRng,
}

impl Worker {
    pub fn new(
        index: usize,
        seed: u64,
        users: Vec<String>,
        clients: Clients,
        counters: Arc<Counters>,
        violations: Arc<Mutex<Vec<Violation>>>,
    ) -> Self {
        Self {
            index,
            models: users.into_iter().map(Model::new).collect(),
            clients,
            counters,
            violations,
            rng: StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
        }
    }

    /// Runs operations until `stop` is set.
    pub async fn run(&mut self, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
        while !stop.load(Ordering::Relaxed) {
            let model = self.rng.random_range(0..self.models.len());
            self.step(model).await?;
            self.counters.operations.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    fn replica(&mut self) -> usize {
        self.rng.random_range(0..self.clients.replica_count())
    }

    async fn violation(&self, workspace: &str, what: String) {
        tracing_line(&format!("VIOLATION {workspace}: {what}"));
        self.violations.lock().await.push(Violation { workspace: workspace.to_owned(), what });
    }

    fn failed(&self) {
        self.counters.failed_calls.fetch_add(1, Ordering::Relaxed);
    }

    async fn step(&mut self, index: usize) -> anyhow::Result<()> {
        let Some(workspace_id) = self.models[index].workspace_id.clone() else {
            let replica = self.replica();
            match self.clients.create_session(replica, &self.models[index].user).await {
                Ok(workspace_id) => self.models[index].workspace_id = Some(workspace_id),
                Err(_) => self.failed(),
            }
            return Ok(());
        };
        self.observe_lineage(index, &workspace_id).await?;
        let roll = self.rng.random_range(0..100);
        let has_counted = !self.models[index].counted.is_empty();
        let has_deleted = !self.models[index].deleted.is_empty();
        match roll {
            0..=2 => self.delete(index, &workspace_id).await,
            3..=12 if has_deleted => self.read_deleted(index, &workspace_id).await,
            13..=52 if has_counted => self.read(index, &workspace_id).await,
            _ => self.write(index, &workspace_id).await,
        }
    }

    /// Notices a lineage change that no delete of ours made and checks that it says so.
    async fn observe_lineage(&mut self, index: usize, workspace_id: &str) -> anyhow::Result<()> {
        let truth = self.clients.truth(workspace_id).await?;
        let model = &mut self.models[index];
        if truth.lineage == model.last_lineage {
            return Ok(());
        }
        let previous = model.last_lineage;
        model.last_lineage = truth.lineage;
        let (Some(previous), Some(current)) = (previous, truth.lineage) else { return Ok(()) };
        if current <= previous {
            self.violation(workspace_id, format!("lineage went back from {previous} to {current}")).await;
            return Ok(());
        }
        self.counters.lineage_changes.fetch_add(1, Ordering::Relaxed);
        match &truth.origin {
            Some(Origin::RecreatedEmpty { .. } | Origin::Restored { .. }) => {}
            other => {
                self.violation(
                    workspace_id,
                    format!("its files were replaced (lineage {previous} -> {current}) but its origin says {other:?}"),
                )
                .await;
            }
        }
        // The replicas' answers must come to say it too.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let replica = self.replica();
            if let Ok(answer) = self.clients.get_workspace(replica, workspace_id).await
                && answer.origin_generation >= current
            {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                self.violation(workspace_id, format!("no replica answered lineage {current} within 15 s")).await;
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn write(&mut self, index: usize, workspace_id: &str) -> anyhow::Result<()> {
        let model = &mut self.models[index];
        model.next_seq += 1;
        let path = format!("rec/{}-{}", model.user, model.next_seq);
        let content = format!("{workspace_id} {} {:016x}\n", model.next_seq, self.rng.random::<u64>()).into_bytes();
        self.models[index].attempted.insert(path.clone(), content.clone());
        let before = self.clients.truth(workspace_id).await?.lineage;
        let replica = self.replica();
        let written = self.clients.write(replica, workspace_id, &path, &content).await;
        let after = self.clients.truth(workspace_id).await?.lineage;
        match written {
            Ok(()) => {
                self.counters.writes_acked.fetch_add(1, Ordering::Relaxed);
                if before == after && before.is_some() {
                    self.counters.writes_counted.fetch_add(1, Ordering::Relaxed);
                    self.models[index].counted.insert(path, Written { content, lineage: before });
                }
            }
            Err(_) => self.failed(),
        }
        Ok(())
    }

    async fn read(&mut self, index: usize, workspace_id: &str) -> anyhow::Result<()> {
        let candidates: Vec<(String, Written)> =
            self.models[index].counted.iter().map(|(path, written)| (path.clone(), written.clone())).collect();
        let Some((path, written)) = candidates.choose(&mut self.rng).cloned() else { return Ok(()) };
        let before = self.clients.truth(workspace_id).await?.lineage;
        let replica = self.replica();
        let read = self.clients.read(replica, workspace_id, &path).await;
        let after = self.clients.truth(workspace_id).await?.lineage;
        let same_lineage = before == after && before == written.lineage;
        if !same_lineage {
            // The files were replaced (the origin check above covers saying so): the record
            // may be gone legitimately.
            self.models[index].counted.remove(&path);
            return Ok(());
        }
        match read {
            Ok(data) if data == written.content => {
                self.counters.reads_checked.fetch_add(1, Ordering::Relaxed);
            }
            Ok(data) => {
                let seen = String::from_utf8_lossy(&data).into_owned();
                self.violation(
                    workspace_id,
                    format!("{path}: read {seen:?}, acknowledged {:?}", lossy(&written.content)),
                )
                .await;
            }
            Err(status) if super::client::is_missing_file(&status) => {
                self.violation(
                    workspace_id,
                    format!("{path}: acknowledged in lineage {:?}, now missing: {}", written.lineage, status.message()),
                )
                .await;
            }
            Err(_) => self.failed(),
        }
        Ok(())
    }

    async fn read_deleted(&mut self, index: usize, workspace_id: &str) -> anyhow::Result<()> {
        let Some((path, content)) = self.models[index].deleted.choose(&mut self.rng).cloned() else { return Ok(()) };
        let replica = self.replica();
        match self.clients.read(replica, workspace_id, &path).await {
            Ok(data) => {
                let what = if data == content { "its deleted content" } else { "content" };
                self.violation(
                    workspace_id,
                    format!("{path} of a deleted incarnation served {what}: {:?}", lossy(&data)),
                )
                .await;
            }
            Err(status) if super::client::is_missing_file(&status) => {
                self.counters.deleted_reads_checked.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => self.failed(),
        }
        Ok(())
    }

    async fn delete(&mut self, index: usize, workspace_id: &str) -> anyhow::Result<()> {
        let replica = self.replica();
        let outcome = self.clients.destroy(replica, workspace_id).await;
        // An answer lost in a fault may hide a delete that happened: etcd tells.
        let gone = match outcome {
            Ok(()) => true,
            Err(_) => {
                self.failed();
                self.clients.truth(workspace_id).await?.lineage.is_none()
            }
        };
        if gone {
            self.counters.deletes.fetch_add(1, Ordering::Relaxed);
            let model = &mut self.models[index];
            let attempted = std::mem::take(&mut model.attempted);
            model.deleted.extend(attempted);
            model.counted.clear();
            model.last_lineage = None;
            // The next step creates the same id again (the isolation policy's id).
            model.workspace_id = None;
        }
        Ok(())
    }

    /// After the faults: every counted record of the current lineage is there, every deleted
    /// one is not. Calls are retried while they fail transiently (the cluster settles).
    pub async fn verify_final(&mut self) -> anyhow::Result<()> {
        for index in 0..self.models.len() {
            let Some(workspace_id) = self.models[index].workspace_id.clone() else { continue };
            self.observe_lineage(index, &workspace_id).await?;
            let paths: Vec<String> = self.models[index].counted.keys().cloned().collect();
            // One deadline for the whole workspace: the cluster settles once, not per file.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
            let mut unserved = Vec::new();
            for path in paths {
                while !self.read_once(index, &workspace_id, &path).await? {
                    if tokio::time::Instant::now() >= deadline {
                        unserved.push(path.clone());
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
            if !unserved.is_empty() {
                let what =
                    format!("{} record(s) not served within 60 s after the faults: {unserved:?}", unserved.len());
                self.violation(&workspace_id, what).await;
            }
            let deleted = self.models[index].deleted.clone();
            for (path, _) in deleted {
                let replica = self.replica();
                if let Ok(data) = self.clients.read(replica, &workspace_id, &path).await {
                    self.violation(&workspace_id, format!("{path} of a deleted incarnation served {:?}", lossy(&data)))
                        .await;
                }
            }
        }
        Ok(())
    }

    /// One final read of a counted record: `Ok(true)` when checked (or no longer checkable).
    async fn read_once(&mut self, index: usize, workspace_id: &str, path: &str) -> anyhow::Result<bool> {
        let Some(written) = self.models[index].counted.get(path).cloned() else { return Ok(true) };
        let before = self.clients.truth(workspace_id).await?.lineage;
        let replica = self.replica();
        let read = self.clients.read(replica, workspace_id, path).await;
        let after = self.clients.truth(workspace_id).await?.lineage;
        if before != after || before != written.lineage {
            self.observe_lineage(index, workspace_id).await?;
            return Ok(true);
        }
        match read {
            Ok(data) if data == written.content => {
                self.counters.reads_checked.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Ok(data) => {
                self.violation(workspace_id, format!("{path}: read {:?} at the end", lossy(&data))).await;
                Ok(true)
            }
            Err(status) if super::client::is_missing_file(&status) => {
                self.violation(workspace_id, format!("{path}: missing at the end: {}", status.message())).await;
                Ok(true)
            }
            Err(_) => Ok(false),
        }
    }
}

fn lossy(data: &[u8]) -> String {
    String::from_utf8_lossy(data).into_owned()
}

fn tracing_line(line: &str) {
    eprintln!("[nemesis] {line}");
}
