//! Seed skills: a host directory of skill directories (`--skills-seed DIR`) copied into a
//! workspace once. The marker `skills/.seeded` records that seeding ran, so a skill the
//! user removed is not brought back by a restart or a re-provision. A seed skill whose
//! name already exists in the workspace is left alone (the workspace's copy wins).
//!
//! Host side: read on the blocking pool, symlinks and special files in the seed directory
//! are skipped (never followed); the copy goes through the backend's primitives into
//! `skills/.tmp-<random>` and is renamed into place.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::StreamExt;

use crate::tree::TreeLimits;
use berth_workspace::backend::{Backend, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::layout::SKILLS_DIR;
use berth_workspace::path::RelPath;
use berth_workspace::skills::{SKILL_FILE, TEMP_PREFIX, skill_dir, validate_skill_name};

/// The marker file.
pub const SEEDED_MARKER: &str = ".seeded";

/// What seeding did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SeedOutcome {
    /// False when the marker said seeding had run before.
    pub ran: bool,
    pub copied: Vec<String>,
    pub skipped: Vec<String>,
}

/// One file of a seed skill.
struct SeedFile {
    relative: String,
    host: PathBuf,
    mode: u32,
}

/// Copies the skills of `seed_dir` into the workspace unless the marker exists, then
/// writes the marker.
pub async fn seed<B: Backend + ?Sized>(backend: &B, seed_dir: &Path, limits: TreeLimits) -> Result<SeedOutcome> {
    let marker = RelPath::parse(SKILLS_DIR)?.join(SEEDED_MARKER)?;
    if backend.exists(&marker).await? {
        return Ok(SeedOutcome::default());
    }
    let dir = seed_dir.to_path_buf();
    let skills = tokio::task::spawn_blocking(move || scan(&dir, limits))
        .await
        .map_err(|error| WorkspaceError::Backend { backend: "seed", message: error.to_string() })??;
    let mut outcome = SeedOutcome { ran: true, ..SeedOutcome::default() };
    for (name, files) in skills {
        let target = skill_dir(&name)?;
        if backend.exists(&target).await? {
            outcome.skipped.push(name);
            continue;
        }
        let temp = RelPath::parse(SKILLS_DIR)?.join(&format!("{TEMP_PREFIX}{:016x}", rand::random::<u64>()))?;
        let copied = copy_skill(backend, &temp, &files).await;
        let placed = match copied {
            Ok(()) => backend.rename(&temp, &target).await,
            Err(error) => Err(error),
        };
        if let Err(error) = placed {
            let _ = backend.remove(&temp, true).await;
            return Err(error);
        }
        outcome.copied.push(name);
    }
    let record = serde_json::json!({
        "seeded_from": seed_dir.display().to_string(),
        "skills": outcome.copied,
        "skipped": outcome.skipped,
    });
    backend.write_bytes(&marker, Bytes::from(record.to_string()), 0o644).await?;
    Ok(outcome)
}

async fn copy_skill<B: Backend + ?Sized>(backend: &B, temp: &RelPath, files: &[SeedFile]) -> Result<()> {
    backend.mkdir(temp, false).await?;
    for file in files {
        let target = temp.join(&file.relative)?;
        let reader = tokio::fs::File::open(&file.host)
            .await
            .map_err(|error| WorkspaceError::from_io("open", &file.host.display().to_string(), error))?;
        let display = file.host.display().to_string();
        let stream = tokio_util::io::ReaderStream::new(reader)
            .map(move |chunk| chunk.map_err(|error| WorkspaceError::from_io("read", &display, error)))
            .boxed();
        backend.write_file(&target, stream, WriteOptions { mode: file.mode, ..WriteOptions::default() }).await?;
    }
    Ok(())
}

/// The seed directory's skills (directories holding a SKILL.md), sorted by name, with
/// their files. Blocking.
fn scan(seed_dir: &Path, limits: TreeLimits) -> Result<Vec<(String, Vec<SeedFile>)>> {
    use std::os::unix::fs::PermissionsExt as _;
    let display = seed_dir.display().to_string();
    let entries = std::fs::read_dir(seed_dir).map_err(|error| WorkspaceError::from_io("list", &display, error))?;
    let mut skills = Vec::new();
    let (mut total_bytes, mut total_files) = (0u64, 0u64);
    for entry in entries {
        let entry = entry.map_err(|error| WorkspaceError::from_io("list", &display, error))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else { continue };
        let Ok(file_type) = entry.file_type() else { continue };
        if !file_type.is_dir() || validate_skill_name(&name).is_err() || !entry.path().join(SKILL_FILE).is_file() {
            continue;
        }
        let mut files = Vec::new();
        let mut stack = vec![(entry.path(), String::new())];
        while let Some((dir, prefix)) = stack.pop() {
            let listing = std::fs::read_dir(&dir)
                .map_err(|error| WorkspaceError::from_io("list", &dir.display().to_string(), error))?;
            for child in listing {
                let child =
                    child.map_err(|error| WorkspaceError::from_io("list", &dir.display().to_string(), error))?;
                let Some(child_name) = child.file_name().to_str().map(str::to_owned) else { continue };
                let relative = if prefix.is_empty() { child_name } else { format!("{prefix}/{child_name}") };
                // lstat: symlinks are skipped, never followed.
                let metadata = std::fs::symlink_metadata(child.path())
                    .map_err(|error| WorkspaceError::from_io("stat", &child.path().display().to_string(), error))?;
                if metadata.is_dir() {
                    stack.push((child.path(), relative));
                } else if metadata.is_file() {
                    total_files += 1;
                    total_bytes += metadata.len();
                    if total_files > limits.max_files || total_bytes > limits.max_bytes {
                        return Err(WorkspaceError::LimitExceeded {
                            limit: "seed skills size",
                            size: total_bytes,
                            max: limits.max_bytes,
                        });
                    }
                    files.push(SeedFile { relative, host: child.path(), mode: metadata.permissions().mode() & 0o755 });
                }
            }
        }
        skills.push((name, files));
    }
    skills.sort_by(|left, right| left.0.cmp(&right.0));
    Ok(skills)
}
