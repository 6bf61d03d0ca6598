//! Validated identifiers. Every id that arrives from a client goes through [`validate_id`]
//! before it names a key in the registry or a directory on a node.

use crate::error::{Result, WorkspaceError};

/// Longest id accepted (workspace, session, user, agent, node…).
pub const MAX_ID_BYTES: usize = 128;

/// Checks an identifier: 1 to [`MAX_ID_BYTES`] bytes of `[A-Za-z0-9._@:-]`, not starting
/// with `.` or `-` (so it is safe as a file name, an etcd key segment and a CLI argument).
pub fn validate_id(kind: &'static str, value: &str) -> Result<()> {
    let invalid = |reason| WorkspaceError::InvalidId { kind, value: truncate(value), reason };
    if value.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(invalid("longer than 128 bytes"));
    }
    if value.starts_with('.') || value.starts_with('-') {
        return Err(invalid("must not start with '.' or '-'"));
    }
    let allowed = |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-' | b'@' | b':');
    if !value.bytes().all(allowed) {
        return Err(invalid("allowed characters are A-Z a-z 0-9 . _ - @ :"));
    }
    Ok(())
}

fn truncate(value: &str) -> String {
    value.chars().take(64).collect()
}

/// A workspace id (validated).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct WorkspaceId(String);

impl WorkspaceId {
    pub fn new(value: impl Into<String>) -> Result<Self> {
        let value = value.into();
        validate_id("workspace id", &value)?;
        Ok(Self(value))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for WorkspaceId {
    type Error = WorkspaceError;
    fn try_from(value: String) -> Result<Self> {
        Self::new(value)
    }
}

impl From<WorkspaceId> for String {
    fn from(id: WorkspaceId) -> String {
        id.0
    }
}

impl std::fmt::Display for WorkspaceId {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_and_refuses() {
        for good in ["ws-abc", "alice@example.com", "a", "node:1", "A_b.c"] {
            validate_id("id", good).unwrap();
        }
        for bad in ["", ".hidden", "-flag", "a/b", "a b", "é", "a\0", &"x".repeat(129)] {
            assert!(validate_id("id", bad).is_err(), "{bad:?} accepted");
        }
    }
}
