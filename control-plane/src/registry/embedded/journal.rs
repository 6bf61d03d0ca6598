//! Optional durability for the embedded registry (`berth up`): an append-only journal of the
//! keys that outlive a process — those without a lease (workspace and session records).
//! Leased keys (nodes, locks, replicas, leadership) are ephemeral by definition and are
//! never written: after a restart they are re-created by their owners.
//!
//! Format: one JSON object per line — `{"k": key, "v": utf8 value}`, `{"k": key, "x": hex
//! value}`, `{"d": key}` or `{"r": revision}`. Every batch ends with the store's revision, also
//! a batch of leased keys only: bind generations derive from lock revisions, so the revision
//! must never go back across a restart (a node would refuse the next workspace of an id as
//! older than one it has seen). On open the journal is replayed, then rewritten compactly (temp
//! file + rename) and appended to by a dedicated writer thread, so the registry's mutex
//! never waits for the disk. Lines are flushed per batch (no fsync): a process crash loses
//! nothing the kernel has, a power loss may lose the last writes.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, BufWriter, Write};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::registry::WatchEvent;

#[derive(Debug, Serialize, Deserialize)]
struct Line {
    #[serde(skip_serializing_if = "Option::is_none")]
    k: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    v: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    x: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    d: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    r: Option<i64>,
}

impl Line {
    fn put(key: &str, value: &[u8]) -> Self {
        match std::str::from_utf8(value) {
            Ok(text) => Self { k: Some(key.to_owned()), v: Some(text.to_owned()), x: None, d: None, r: None },
            Err(_) => Self { k: Some(key.to_owned()), v: None, x: Some(hex::encode(value)), d: None, r: None },
        }
    }

    fn delete(key: &str) -> Self {
        Self { k: None, v: None, x: None, d: Some(key.to_owned()), r: None }
    }

    fn revision(revision: i64) -> Self {
        Self { k: None, v: None, x: None, d: None, r: Some(revision) }
    }
}

pub(super) struct Journal {
    sender: Mutex<Option<mpsc::Sender<Vec<Line>>>>,
    writer: Mutex<Option<JoinHandle<()>>>,
}

impl Journal {
    /// Replays `path` (if it exists), rewrites it compactly and starts the writer. Returns
    /// the durable keys to seed the store with and the last revision the store reached.
    pub fn open(path: &Path) -> io::Result<(Self, BTreeMap<String, Bytes>, i64)> {
        let (durable, revision) = replay(path)?;
        rewrite(path, &durable, revision)?;
        let file = OpenOptions::new().append(true).open(path)?;
        let (sender, receiver) = mpsc::channel::<Vec<Line>>();
        let shown = path.display().to_string();
        let writer = std::thread::Builder::new().name("berth-journal".into()).spawn(move || {
            let mut output = BufWriter::new(file);
            for batch in receiver {
                let written = batch.iter().try_for_each(|line| {
                    serde_json::to_writer(&mut output, line).map_err(io::Error::other)?;
                    output.write_all(b"\n")
                });
                if let Err(error) = written.and_then(|()| output.flush()) {
                    tracing::error!(path = %shown, %error, "writing the registry journal failed");
                }
            }
        })?;
        Ok((Self { sender: Mutex::new(Some(sender)), writer: Mutex::new(Some(writer)) }, durable, revision))
    }

    /// Queues the durable part of a write batch.
    pub fn record(&self, events: &[WatchEvent]) {
        let mut lines: Vec<Line> = events
            .iter()
            .map(|event| match event {
                WatchEvent::Put(kv) if kv.lease == 0 => Line::put(&kv.key, &kv.value),
                // A key moved onto a lease is no longer durable.
                WatchEvent::Put(kv) => Line::delete(&kv.key),
                WatchEvent::Delete { key, .. } => Line::delete(key),
            })
            .collect();
        let Some(revision) = events.iter().map(|event| event.revision()).max() else { return };
        lines.push(Line::revision(revision));
        if let Some(sender) = self.sender.lock().unwrap_or_else(PoisonError::into_inner).as_ref() {
            // The writer only stops when we drop the sender.
            let _ = sender.send(lines);
        }
    }

    /// Stops the writer after it has written everything queued.
    pub fn close(&self) {
        drop(self.sender.lock().unwrap_or_else(PoisonError::into_inner).take());
        if let Some(writer) = self.writer.lock().unwrap_or_else(PoisonError::into_inner).take() {
            let _ = writer.join();
        }
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close();
    }
}

fn replay(path: &Path) -> io::Result<(BTreeMap<String, Bytes>, i64)> {
    let mut durable = BTreeMap::new();
    let mut revision = 0;
    let file = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok((durable, revision)),
        Err(error) => return Err(error),
    };
    for (number, line) in BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        // A torn last line (crash mid-append) is expected; anything else is corruption.
        let Ok(parsed) = serde_json::from_str::<Line>(&line) else {
            tracing::warn!(path = %path.display(), line = number + 1, "ignoring an unreadable journal line");
            continue;
        };
        match parsed {
            Line { r: Some(seen), .. } => revision = revision.max(seen),
            Line { d: Some(key), .. } => {
                durable.remove(&key);
            }
            Line { k: Some(key), v: Some(value), .. } => {
                durable.insert(key, Bytes::from(value));
            }
            Line { k: Some(key), x: Some(value), .. } => match hex::decode(&value) {
                Ok(bytes) => {
                    durable.insert(key, Bytes::from(bytes));
                }
                Err(_) => tracing::warn!(path = %path.display(), line = number + 1, "ignoring a bad hex value"),
            },
            _ => tracing::warn!(path = %path.display(), line = number + 1, "ignoring an empty journal line"),
        }
    }
    Ok((durable, revision))
}

fn rewrite(path: &Path, durable: &BTreeMap<String, Bytes>, revision: i64) -> io::Result<()> {
    let temporary = temporary_path(path);
    {
        // 0600: the journal holds every record, workspace specs (their env) included.
        let file = OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&temporary)?;
        let mut output = BufWriter::new(file);
        for (key, value) in durable {
            serde_json::to_writer(&mut output, &Line::put(key, value)).map_err(io::Error::other)?;
            output.write_all(b"\n")?;
        }
        serde_json::to_writer(&mut output, &Line::revision(revision)).map_err(io::Error::other)?;
        output.write_all(b"\n")?;
        output.flush()?;
        output.get_ref().sync_all()?;
    }
    std::fs::rename(&temporary, path)
}

fn temporary_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|name| name.to_os_string()).unwrap_or_default();
    name.push(".tmp");
    path.with_file_name(name)
}
