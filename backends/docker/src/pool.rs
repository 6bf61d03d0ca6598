//! The host side of the warm pool: ready slots, slot directories and claim records.
//!
//! A slot is a container made ahead of time for no workspace: labelled [`POOL_LABEL`]
//! `=<slot>` instead of a workspace id, started, with its supervisor running, its
//! `/workspace` bound to `<pool>/slots/<slot>` (an empty directory the workspace user owns,
//! as a workspace root). A provision of a fresh workspace (an empty root) with the default
//! spec claims one: it writes the claim record `<pool>/claims/<hash of the id>` (workspace
//! id, slot, container id; made with `O_EXCL`, synced), renames the slot's directory onto
//! the workspace's root, and leaves a link at the slot's path to the root, so that Docker
//! finds the bind source when it starts the container again after a release. A claimed
//! container is the workspace's from then on: found by its record, stopped by release,
//! removed with record and link by destroy. Every step is idempotent and redone by the next
//! provision after a crash (a record without the rename, a rename without the link).
//!
//! [`POOL_LABEL`]: super::config::POOL_LABEL

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;

/// A ready slot: its name and its container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub name: String,
    pub container_id: String,
    /// Its pids limit and the host pid of its init, read when it started (a claim needs
    /// no inspect of its own).
    pub started: Option<(Option<i64>, i64)>,
}

/// A workspace's claim of a slot, as recorded on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Claim {
    pub workspace_id: WorkspaceId,
    pub slot: String,
    pub container_id: String,
}

impl Claim {
    fn encode(&self) -> String {
        format!("{}\n{}\n{}\n", self.workspace_id, self.slot, self.container_id)
    }

    fn decode(text: &str) -> Option<Self> {
        let mut lines = text.lines();
        let workspace_id = WorkspaceId::new(lines.next()?).ok()?;
        let slot = lines.next().filter(|slot| valid_slot(slot))?.to_owned();
        let container_id = lines.next().filter(|id| !id.is_empty())?.to_owned();
        Some(Self { workspace_id, slot, container_id })
    }
}

/// A slot name: 16 lowercase hex digits.
pub(crate) fn valid_slot(slot: &str) -> bool {
    slot.len() == 16 && slot.bytes().all(|byte| byte.is_ascii_digit() || (b'a'..=b'f').contains(&byte))
}

pub(crate) fn new_slot_name() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The pool of one driver.
#[derive(Debug)]
pub(crate) struct Pool {
    dir: PathBuf,
    ready: Mutex<VecDeque<Slot>>,
    /// Serialises fills; `true` once this driver swept what an earlier one left.
    pub filling: tokio::sync::Mutex<bool>,
    claimed: AtomicU64,
}

impl Pool {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir, ready: Mutex::default(), filling: tokio::sync::Mutex::new(false), claimed: AtomicU64::new(0) }
    }

    fn ready(&self) -> std::sync::MutexGuard<'_, VecDeque<Slot>> {
        // Single pushes and pops: a panic cannot leave the queue half-updated.
        self.ready.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn slot_root(&self, slot: &str) -> PathBuf {
        self.dir.join("slots").join(slot)
    }

    pub fn slots_dir(&self) -> PathBuf {
        self.dir.join("slots")
    }

    fn claims_dir(&self) -> PathBuf {
        self.dir.join("claims")
    }

    fn claim_path(&self, workspace_id: &WorkspaceId) -> PathBuf {
        let digest = hex::encode(Sha256::digest(workspace_id.as_str().as_bytes()));
        self.claims_dir().join(&digest[..32])
    }

    pub fn take(&self) -> Option<Slot> {
        self.ready().pop_front()
    }

    pub fn put_back(&self, slot: Slot) {
        self.ready().push_front(slot);
    }

    pub fn push_ready(&self, slot: Slot) {
        self.ready().push_back(slot);
    }

    pub fn ready_slots(&self) -> Vec<Slot> {
        self.ready().iter().cloned().collect()
    }

    pub fn ready_count(&self) -> usize {
        self.ready().len()
    }

    pub fn count_claim(&self) {
        self.claimed.fetch_add(1, Ordering::Relaxed);
    }

    pub fn claimed(&self) -> u64 {
        self.claimed.load(Ordering::Relaxed)
    }

    /// The workspace's claim record, if it has one.
    pub fn claim_of(&self, workspace_id: &WorkspaceId) -> Result<Option<Claim>> {
        let path = self.claim_path(workspace_id);
        match std::fs::read_to_string(&path) {
            Ok(text) => match Claim::decode(&text) {
                Some(claim) if claim.workspace_id == *workspace_id => Ok(Some(claim)),
                _ => Err(WorkspaceError::Backend {
                    backend: super::config::BACKEND_NAME,
                    message: format!("warm pool claim record {} is damaged", path.display()),
                }),
            },
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(WorkspaceError::from_io("read a warm pool claim", &path.display().to_string(), error)),
        }
    }

    /// Every claim record (damaged ones are skipped with a warning).
    pub fn claims(&self) -> Result<Vec<Claim>> {
        let dir = self.claims_dir();
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(error) => {
                return Err(WorkspaceError::from_io("list warm pool claims", &dir.display().to_string(), error));
            }
        };
        let mut claims = Vec::new();
        for entry in entries.flatten() {
            match std::fs::read_to_string(entry.path()).ok().as_deref().and_then(Claim::decode) {
                Some(claim) => claims.push(claim),
                None => tracing::warn!(path = %entry.path().display(), "skipping a damaged warm pool claim record"),
            }
        }
        Ok(claims)
    }

    /// Writes the claim record; `false` when the workspace already has one (a concurrent
    /// provision claimed first). Synced before it counts: after a crash the record is what
    /// says whose the container is.
    pub fn record_claim(&self, claim: &Claim) -> Result<bool> {
        let dir = self.claims_dir();
        let path = self.claim_path(&claim.workspace_id);
        let shown = path.display().to_string();
        std::fs::create_dir_all(&dir)
            .map_err(|error| WorkspaceError::from_io("create the warm pool claims directory", &shown, error))?;
        let temp = dir.join(format!(".{}.{:x}", std::process::id(), rand::random::<u64>()));
        let written = std::fs::File::create(&temp).and_then(|mut file| {
            file.write_all(claim.encode().as_bytes())?;
            file.sync_all()
        });
        if let Err(error) = written {
            let _ = std::fs::remove_file(&temp);
            return Err(WorkspaceError::from_io("write a warm pool claim", &shown, error));
        }
        // A hard link never replaces: the first claim wins.
        let linked = std::fs::hard_link(&temp, &path);
        let _ = std::fs::remove_file(&temp);
        match linked {
            Ok(()) => {
                sync_dir(&dir).map_err(|error| WorkspaceError::from_io("sync the warm pool claims", &shown, error))?;
                Ok(true)
            }
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
            Err(error) => Err(WorkspaceError::from_io("record a warm pool claim", &shown, error)),
        }
    }

    /// Puts the slot's directory in place of the workspace's root (which must be empty),
    /// and a link to the root where it was. Idempotent: done steps are skipped.
    pub fn finish_claim(&self, claim: &Claim, root: &Path) -> Result<()> {
        let slot_root = self.slot_root(&claim.slot);
        let shown = slot_root.display().to_string();
        match std::fs::symlink_metadata(&slot_root) {
            Ok(metadata) if metadata.file_type().is_symlink() => return Ok(()),
            Ok(metadata) if metadata.is_dir() => {
                // rename(2) replaces an empty directory and refuses one with files: a
                // workspace that has files is never given the slot's.
                std::fs::rename(&slot_root, root).map_err(|error| {
                    WorkspaceError::from_io("move a warm pool slot to the workspace root", &shown, error)
                })?;
            }
            Ok(_) => {
                return Err(WorkspaceError::Backend {
                    backend: super::config::BACKEND_NAME,
                    message: format!("warm pool slot {shown} is neither a directory nor a link"),
                });
            }
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
            Err(error) => return Err(WorkspaceError::from_io("stat a warm pool slot", &shown, error)),
        }
        // Not synced: the record is what survives a crash, and this redoes whatever of the
        // rename and the link was lost.
        std::os::unix::fs::symlink(root, &slot_root)
            .map_err(|error| WorkspaceError::from_io("link a claimed warm pool slot to its root", &shown, error))
    }

    /// Removes a claim's record and its slot's link (its container is gone).
    pub fn forget_claim(&self, claim: &Claim) {
        let slot_root = self.slot_root(&claim.slot);
        if std::fs::symlink_metadata(&slot_root).is_ok_and(|metadata| metadata.file_type().is_symlink()) {
            let _ = std::fs::remove_file(&slot_root);
        }
        let _ = std::fs::remove_file(self.claim_path(&claim.workspace_id));
    }
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(workspace: &str, slot: &str) -> Claim {
        Claim { workspace_id: WorkspaceId::new(workspace).unwrap(), slot: slot.to_owned(), container_id: "c1".into() }
    }

    #[test]
    fn the_first_claim_wins_and_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new(dir.path().to_path_buf());
        let first = claim("ws-1", "0123456789abcdef");
        assert!(pool.record_claim(&first).unwrap());
        assert!(!pool.record_claim(&claim("ws-1", "fedcba9876543210")).unwrap());
        assert_eq!(pool.claim_of(&first.workspace_id).unwrap(), Some(first.clone()));
        assert_eq!(pool.claims().unwrap(), vec![first.clone()]);
        pool.forget_claim(&first);
        assert_eq!(pool.claim_of(&first.workspace_id).unwrap(), None);
    }

    #[test]
    fn a_claim_moves_the_slot_onto_an_empty_root_only_and_can_be_finished_again() {
        let dir = tempfile::tempdir().unwrap();
        let pool = Pool::new(dir.path().join("pool"));
        let taken = claim("ws-1", "0123456789abcdef");
        std::fs::create_dir_all(pool.slot_root(&taken.slot)).unwrap();
        let full = dir.path().join("full");
        std::fs::create_dir_all(full.join("kept")).unwrap();
        assert!(pool.finish_claim(&taken, &full).is_err(), "a root with files was replaced");
        assert!(full.join("kept").exists());
        let root = dir.path().join("root");
        std::fs::create_dir(&root).unwrap();
        pool.finish_claim(&taken, &root).unwrap();
        pool.finish_claim(&taken, &root).unwrap();
        assert_eq!(std::fs::read_link(pool.slot_root(&taken.slot)).unwrap(), root);
        // After a crash between the rename and the link: the link is made.
        std::fs::remove_file(pool.slot_root(&taken.slot)).unwrap();
        pool.finish_claim(&taken, &root).unwrap();
        assert_eq!(std::fs::read_link(pool.slot_root(&taken.slot)).unwrap(), root);
        assert!(root.is_dir());
    }

    #[test]
    fn damaged_records_are_refused() {
        assert_eq!(Claim::decode("ws-1\nnot-a-slot\nc1\n"), None);
        assert_eq!(Claim::decode("ws-1\n0123456789abcdef\n"), None);
        assert_eq!(Claim::decode("../x\n0123456789abcdef\nc1\n"), None);
        let good = claim("ws-1", "0123456789abcdef");
        assert_eq!(Claim::decode(&good.encode()), Some(good));
    }
}
