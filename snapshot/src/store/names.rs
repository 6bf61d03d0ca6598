//! Names that become file names and keys in every store: checked once, here.

use crate::error::SnapshotError;

/// A blob address: 64 lowercase hex characters (BLAKE3-256).
pub fn validate_hash(hash: &str) -> Result<(), SnapshotError> {
    let invalid = |reason| SnapshotError::InvalidName { kind: "blob hash", value: shorten(hash), reason };
    if hash.len() != 64 {
        return Err(invalid("must be 64 hex characters"));
    }
    if !hash.bytes().all(|byte| matches!(byte, b'0'..=b'9' | b'a'..=b'f')) {
        return Err(invalid("must be lowercase hex"));
    }
    Ok(())
}

/// A workspace id as a store key: 1–128 characters of `[A-Za-z0-9._-]`, not starting with a
/// dot (so never `.` or `..`, never a hidden temp name of the dir store).
pub fn validate_workspace_id(workspace_id: &str) -> Result<(), SnapshotError> {
    validate_component("workspace id", workspace_id, 128)
}

/// A snapshot id: 1–96 characters of `[A-Za-z0-9._-]`, not starting with a dot. The engine
/// makes `{created_unix_ms:013}-{generation:020}-{random:016x}`, sortable by time.
pub fn validate_snapshot_id(snapshot_id: &str) -> Result<(), SnapshotError> {
    validate_component("snapshot id", snapshot_id, 96)
}

fn validate_component(kind: &'static str, value: &str, max: usize) -> Result<(), SnapshotError> {
    let invalid = |reason| SnapshotError::InvalidName { kind, value: shorten(value), reason };
    if value.is_empty() {
        return Err(invalid("must not be empty"));
    }
    if value.len() > max {
        return Err(invalid("too long"));
    }
    if value.starts_with('.') {
        return Err(invalid("must not start with a dot"));
    }
    if !value.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-')) {
        return Err(invalid("only A-Z a-z 0-9 . _ - are allowed"));
    }
    Ok(())
}

fn shorten(value: &str) -> String {
    value.chars().take(80).collect()
}

/// A URL with any password replaced, for errors and logs.
pub(crate) fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) => {
            if parsed.password().is_some() {
                let _ = parsed.set_password(Some("***"));
            }
            parsed.to_string()
        }
        Err(_) => "<unparsable url>".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_hash(&"a".repeat(64)).is_ok());
        assert!(validate_hash(&"A".repeat(64)).is_err());
        assert!(validate_hash("../../etc/passwd").is_err());
        assert!(validate_workspace_id("ws-1.a_b").is_ok());
        for bad in ["", ".", "..", ".hidden", "a/b", "a\0b", "a b"] {
            assert!(validate_workspace_id(bad).is_err(), "{bad:?}");
            assert!(validate_snapshot_id(bad).is_err(), "{bad:?}");
        }
        assert!(validate_workspace_id(&"x".repeat(129)).is_err());
    }
}
