//! Skills as data: names, the `skills/<name>/SKILL.md` convention and what a listing
//! reports. Adding, indexing and seeding skills is in `berth-features`.

pub mod frontmatter;

use sha2::{Digest, Sha256};

use crate::error::Result;
use crate::id::validate_id;
use crate::layout::SKILLS_DIR;
use crate::path::RelPath;

/// The file that makes a directory a skill.
pub const SKILL_FILE: &str = "SKILL.md";
/// Largest SKILL.md read.
pub const MAX_SKILL_FILE_BYTES: u64 = 1024 * 1024;
/// Prefix of in-flight skill directories (never listed as skills).
pub const TEMP_PREFIX: &str = ".tmp-";

/// Checks a skill name: an id (`[A-Za-z0-9._@:-]`, not starting with `.` or `-`).
pub fn validate_skill_name(name: &str) -> Result<()> {
    validate_id("skill name", name)
}

pub fn skill_dir(name: &str) -> Result<RelPath> {
    validate_skill_name(name)?;
    RelPath::parse(SKILLS_DIR)?.join(name)
}

/// One skill as listed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkillInfo {
    /// The directory name under `skills/` (what AddSkill named it).
    pub name: String,
    pub description: String,
    /// SHA-256 of SKILL.md, hex.
    pub sha256: String,
    /// `skills/<name>`.
    pub path: RelPath,
}

impl SkillInfo {
    pub fn from_text(name: &str, path: &RelPath, text: &str) -> Self {
        let (front, _) = frontmatter::parse(text);
        SkillInfo {
            name: name.to_owned(),
            description: front.description.unwrap_or_default(),
            sha256: hex::encode(Sha256::digest(text.as_bytes())),
            path: path.clone(),
        }
    }
}
