//! The skill index of one workspace, cached in the node agent's memory.
//!
//! Listing stats each `skills/<name>/SKILL.md` (cheap) and reuses the cached entry when
//! its size and modification time are unchanged; only a changed file is read and hashed
//! (SHA-256), and re-parsed only when its content really differs. [`SkillIndex::hashes`]
//! counts the hashing, so a test can show that a second listing hashes nothing.
//!
//! Limitation (git's "racily clean" problem): a SKILL.md rewritten with the same size
//! within the timestamp granularity keeps its (mtime, size) and is not noticed until it
//! changes again. Host backends report nanosecond mtimes, which makes that practically
//! impossible; the POSIX fallback (`stat -c %Y`, used by backends without a host view)
//! has whole seconds.
//!
//! Rebuilt at start: everything (the first listing after a restart hashes every skill).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use berth_workspace::backend::{Backend, FileKind};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::layout::SKILLS_DIR;
use berth_workspace::path::RelPath;
use berth_workspace::skills::{MAX_SKILL_FILE_BYTES, SKILL_FILE, SkillInfo};

#[derive(Clone)]
struct Cached {
    modified: Option<SystemTime>,
    size: u64,
    info: SkillInfo,
}

/// Cached index of one workspace's skills.
#[derive(Default)]
pub struct SkillIndex {
    entries: Mutex<HashMap<String, Cached>>,
    hashes: AtomicU64,
}

impl SkillIndex {
    pub fn new() -> Self {
        Self::default()
    }

    /// How many SKILL.md files were hashed so far.
    pub fn hashes(&self) -> u64 {
        self.hashes.load(Ordering::Relaxed)
    }

    fn cached(&self, name: &str) -> Option<Cached> {
        self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get(name).cloned()
    }

    /// The skills, sorted by name. Directories without a SKILL.md, and dot-directories
    /// (in-flight adds), are not skills.
    pub async fn list<B: Backend + ?Sized>(&self, backend: &B) -> Result<Vec<SkillInfo>> {
        let skills = RelPath::parse(SKILLS_DIR)?;
        let entries = match backend.list_dir(&skills).await {
            Ok(entries) => entries,
            Err(WorkspaceError::NotFound { .. }) => Vec::new(),
            Err(error) => return Err(error),
        };
        let mut listed = Vec::new();
        let mut fresh = HashMap::new();
        for entry in entries {
            let name = entry.name().to_owned();
            if name.starts_with('.') || !matches!(entry.kind, FileKind::Directory | FileKind::Symlink) {
                continue;
            }
            let file = entry.path.join(SKILL_FILE)?;
            let stat = match backend.stat(&file).await {
                Ok(stat) if stat.kind == FileKind::File => stat,
                // Not a skill (yet): no SKILL.md, or a SKILL.md that is not a file.
                Ok(_) | Err(WorkspaceError::NotFound { .. } | WorkspaceError::NotADirectory { .. }) => continue,
                Err(error) => return Err(error),
            };
            let cached = self.cached(&name);
            let trusted =
                cached.as_ref().is_some_and(|cached| cached.modified == stat.modified && cached.size == stat.size);
            let entry = match (cached, trusted) {
                (Some(cached), true) => cached,
                (cached, _) => {
                    let bytes = match backend.read_to_bytes(&file, MAX_SKILL_FILE_BYTES).await {
                        Ok(bytes) => bytes,
                        Err(WorkspaceError::NotFound { .. }) => continue,
                        Err(error) => return Err(error),
                    };
                    self.hashes.fetch_add(1, Ordering::Relaxed);
                    let digest = hex::encode(Sha256::digest(&bytes));
                    let info = match cached {
                        // Same content (touched, or copied back): keep the parsed fields.
                        Some(cached) if cached.info.sha256 == digest => cached.info,
                        _ => SkillInfo::from_text(&name, &entry.path, &String::from_utf8_lossy(&bytes)),
                    };
                    Cached { modified: stat.modified, size: stat.size, info }
                }
            };
            listed.push(entry.info.clone());
            fresh.insert(name, entry);
        }
        // Skills that vanished leave the cache.
        *self.entries.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = fresh;
        listed.sort_by(|left, right| left.name.cmp(&right.name));
        Ok(listed)
    }
}
