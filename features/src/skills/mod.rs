//! Skills of a workspace: `skills/<name>/SKILL.md` plus whatever files the skill carries.
//!
//! Added as a tar / tar.gz stream ([`add`]): extracted with the checks of [`crate::tree`]
//! into `skills/.tmp-<random>`, then renamed to `skills/<name>` — a skill appears whole or
//! not at all. Listed through a cached [`SkillIndex`]; seeded from a host directory once per
//! workspace ([`seed`]).

pub mod index;
pub mod seed;

use bytes::Bytes;

pub use self::index::SkillIndex;
use crate::tree::{self, ExtractStats, TreeLimits};
use berth_workspace::backend::{Backend, ByteStream, FileKind};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::layout::SKILLS_DIR;
use berth_workspace::path::RelPath;
pub use berth_workspace::skills::{
    MAX_SKILL_FILE_BYTES, SKILL_FILE, SkillInfo, TEMP_PREFIX, frontmatter, skill_dir, validate_skill_name,
};

fn temp_in_skills(prefix: &str) -> Result<RelPath> {
    RelPath::parse(SKILLS_DIR)?.join(&format!("{prefix}{:016x}", rand::random::<u64>()))
}

/// Adds a skill from a tar / tar.gz stream. The archive holds `SKILL.md` at its top, or
/// one top-level directory holding it. The name is `name` when given, else the front
/// matter's `name`. An existing skill of that name is replaced only with `replace`.
pub async fn add<B: Backend + ?Sized>(
    backend: &B,
    name: Option<&str>,
    input: ByteStream,
    limits: TreeLimits,
    replace: bool,
) -> Result<(SkillInfo, ExtractStats)> {
    if let Some(name) = name {
        validate_skill_name(name)?;
    }
    let temp = temp_in_skills(TEMP_PREFIX)?;
    let stats = tree::extract(backend, &temp, input, limits).await?;
    let placed = place(backend, &temp, name, replace).await;
    // Whatever is left of the temp dir (all of it on failure, the wrapper directory of a
    // nested skill on success) goes.
    if backend.exists(&temp).await.unwrap_or(true)
        && let Err(error) = backend.remove(&temp, true).await
    {
        tracing::warn!(dir = %temp, %error, "could not remove a skill's temp dir");
    }
    placed.map(|info| (info, stats))
}

async fn place<B: Backend + ?Sized>(
    backend: &B,
    temp: &RelPath,
    name: Option<&str>,
    replace: bool,
) -> Result<SkillInfo> {
    let root = find_root(backend, temp).await?;
    let text = read_skill_file(backend, &root.join(SKILL_FILE)?).await?;
    let (front, _) = frontmatter::parse(&text);
    let name = match name.map(str::to_owned).or(front.name.clone()) {
        Some(name) => name,
        None => {
            return Err(WorkspaceError::InvalidArgument(
                "the skill has no name: give one, or put `name:` in SKILL.md's front matter".into(),
            ));
        }
    };
    let target = skill_dir(&name)?;
    match backend.rename(&root, &target).await {
        Ok(()) => {}
        Err(WorkspaceError::AlreadyExists { .. }) if replace => {
            // Move the old one aside, the new one in, then drop the old one.
            let old = temp_in_skills(".old-")?;
            backend.rename(&target, &old).await?;
            if let Err(error) = backend.rename(&root, &target).await {
                let _ = backend.rename(&old, &target).await;
                return Err(error);
            }
            backend.remove(&old, true).await?;
        }
        Err(WorkspaceError::AlreadyExists { .. }) => {
            return Err(WorkspaceError::NameExists { kind: "skill", name });
        }
        Err(error) => return Err(error),
    }
    Ok(SkillInfo::from_text(&name, &target, &text))
}

/// `temp` itself when it holds SKILL.md, else its single top-level directory holding it.
async fn find_root<B: Backend + ?Sized>(backend: &B, temp: &RelPath) -> Result<RelPath> {
    let entries = backend.list_dir(temp).await?;
    if entries.iter().any(|entry| entry.name() == SKILL_FILE && entry.kind == FileKind::File) {
        return Ok(temp.clone());
    }
    if let [only] = entries.as_slice()
        && only.kind == FileKind::Directory
        && backend.stat(&only.path.join(SKILL_FILE)?).await.is_ok_and(|info| info.kind == FileKind::File)
    {
        return Ok(only.path.clone());
    }
    Err(WorkspaceError::InvalidArgument(format!(
        "the archive has no {SKILL_FILE} at its top or in its single top-level directory"
    )))
}

async fn read_skill_file<B: Backend + ?Sized>(backend: &B, path: &RelPath) -> Result<String> {
    let bytes: Bytes = backend.read_to_bytes(path, MAX_SKILL_FILE_BYTES).await?;
    String::from_utf8(bytes.to_vec()).map_err(|_| WorkspaceError::InvalidArgument(format!("{path} is not UTF-8 text")))
}

/// Removes a skill (its directory vanishes at once: renamed aside, then deleted).
/// Returns whether it existed.
pub async fn remove<B: Backend + ?Sized>(backend: &B, name: &str) -> Result<bool> {
    let dir = skill_dir(name)?;
    let trash = temp_in_skills(".trash-")?;
    match backend.rename(&dir, &trash).await {
        Ok(()) => {}
        Err(WorkspaceError::NotFound { .. }) => return Ok(false),
        Err(error) => return Err(error),
    }
    backend.remove(&trash, true).await?;
    Ok(true)
}

/// A skill's metadata and its SKILL.md body (front matter removed).
pub async fn get<B: Backend + ?Sized>(backend: &B, name: &str) -> Result<(SkillInfo, String)> {
    let dir = skill_dir(name)?;
    let text = match read_skill_file(backend, &dir.join(SKILL_FILE)?).await {
        Err(WorkspaceError::NotFound { .. }) => {
            return Err(WorkspaceError::NameNotFound { kind: "skill", name: name.to_owned() });
        }
        other => other?,
    };
    let (_, body) = frontmatter::parse(&text);
    Ok((SkillInfo::from_text(name, &dir, &text), body.to_owned()))
}
