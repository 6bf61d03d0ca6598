//! What a workspace's sandbox looks like: the domain form of `berth.v1.WorkspaceSpec`.
//! Stored inside registry records (JSON), so fields only ever get added with defaults.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::{Result, WorkspaceError};

/// Most env entries a spec or an exec may carry.
pub const MAX_ENV_ENTRIES: usize = 256;
/// Largest total size of env names + values, in bytes.
pub const MAX_ENV_BYTES: usize = 64 * 1024;

/// Resource and isolation settings of one workspace. Zero / `None` means "node default".
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkspaceSpec {
    pub image: Option<String>,
    pub cpu_millis: u32,
    pub memory_bytes: u64,
    pub pids: u32,
    pub network: bool,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub read_only_root: bool,
    pub file_size_bytes: u64,
    pub cpu_time_secs: u32,
}

impl WorkspaceSpec {
    /// Checks what a client may send: env names, sizes, image reference.
    pub fn validate(&self) -> Result<()> {
        validate_env(&self.env)?;
        if self.labels.len() > 64 {
            return Err(WorkspaceError::LimitExceeded {
                limit: "label count",
                size: self.labels.len() as u64,
                max: 64,
            });
        }
        for (key, value) in &self.labels {
            if key.is_empty() || key.len() > 128 || value.len() > 256 {
                return Err(WorkspaceError::InvalidArgument(format!(
                    "label {key:?}: keys are 1-128 bytes, values at most 256 bytes"
                )));
            }
        }
        if let Some(image) = &self.image {
            let ok = !image.is_empty() && image.len() <= 256 && image.bytes().all(|byte| byte.is_ascii_graphic());
            if !ok {
                return Err(WorkspaceError::InvalidArgument(format!("image reference {image:?} is not valid")));
            }
        }
        Ok(())
    }
}

/// Checks env names (`[A-Za-z_][A-Za-z0-9_]*`), no NUL in values, and the size limits.
pub fn validate_env(env: &BTreeMap<String, String>) -> Result<()> {
    if env.len() > MAX_ENV_ENTRIES {
        return Err(WorkspaceError::LimitExceeded {
            limit: "env entries",
            size: env.len() as u64,
            max: MAX_ENV_ENTRIES as u64,
        });
    }
    let mut total = 0usize;
    for (name, value) in env {
        let valid_name =
            name.bytes().enumerate().all(|(index, byte)| {
                byte == b'_' || byte.is_ascii_alphabetic() || (index > 0 && byte.is_ascii_digit())
            }) && !name.is_empty();
        if !valid_name {
            return Err(WorkspaceError::InvalidArgument(format!("env name {name:?} is not valid")));
        }
        if value.contains('\0') {
            return Err(WorkspaceError::InvalidArgument(format!("env value of {name} contains a NUL byte")));
        }
        total += name.len() + value.len();
    }
    if total > MAX_ENV_BYTES {
        return Err(WorkspaceError::LimitExceeded { limit: "env size", size: total as u64, max: MAX_ENV_BYTES as u64 });
    }
    Ok(())
}
