//! What can fail in a snapshot store or the snapshot engine. Every variant says what the
//! caller can do: `NotFound` (nothing there, try another snapshot), `Corrupt` (the stored
//! data is wrong: fall back to an older snapshot, never retry the same one), `Store` (the
//! store is unreachable or refused: retry later), `Io` (the local tree), `InvalidUrl` /
//! `InvalidName` / `UnsafePath` (the input is wrong: never retry).

use std::io;

/// Errors of snapshot stores and of `snapshot` / `restore` / retention.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// A blob, a manifest or a workspace's snapshots do not exist in the store.
    #[error("{kind} {name:?} not found in the snapshot store")]
    NotFound { kind: &'static str, name: String },

    /// Stored data does not match its address or does not decode: a blob whose content hash
    /// differs, a file whose reassembled content differs from the manifest, a manifest that
    /// is not one. `path` names the workspace file it breaks (empty for a manifest).
    #[error("corrupt snapshot {snapshot_id}: {what}{}: {reason}", if path.is_empty() { String::new() } else { format!(" of file {path:?}") })]
    Corrupt { snapshot_id: String, what: String, path: String, reason: String },

    /// The store failed or refused an operation (connection, auth, server error).
    #[error("snapshot store {store}: {operation} failed: {reason}")]
    Store { store: String, operation: &'static str, reason: String },

    /// A local file operation failed while snapshotting or restoring.
    #[error("{op} {path:?}: {source}")]
    Io {
        op: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },

    /// A `--snapshot-store` URL is malformed or names an unknown scheme.
    #[error("invalid snapshot store url {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },

    /// A workspace id, snapshot id or blob hash is not of the accepted form (they become
    /// file names and keys, so they are checked before any store call).
    #[error("invalid {kind} {value:?}: {reason}")]
    InvalidName { kind: &'static str, value: String, reason: &'static str },

    /// A manifest entry would write outside the restore target (absolute, `..`, through a
    /// symlink of the manifest, a duplicate). The whole restore is refused.
    #[error("snapshot {snapshot_id}: unsafe path {path:?} refused: {reason}")]
    UnsafePath { snapshot_id: String, path: String, reason: &'static str },

    /// The tree to snapshot or the restore target is not usable (root not a directory,
    /// target's parent missing, a limit exceeded).
    #[error("invalid snapshot input: {0}")]
    InvalidInput(String),

    /// `restore_latest` tried every candidate and none restored.
    #[error("workspace {workspace_id}: no snapshot restored ({tried} tried){}", match last { Some(error) => format!("; newest failure: {error}"), None => String::new() })]
    NoRestorableSnapshot { workspace_id: String, tried: usize, last: Option<Box<SnapshotError>> },
}

impl SnapshotError {
    pub(crate) fn io(op: &'static str, path: impl AsRef<std::path::Path>, source: io::Error) -> Self {
        SnapshotError::Io { op, path: path.as_ref().display().to_string(), source }
    }

    pub(crate) fn not_found(kind: &'static str, name: impl Into<String>) -> Self {
        SnapshotError::NotFound { kind, name: name.into() }
    }

    /// Whether the error means the stored snapshot itself is unusable (a restore should fall
    /// back to an older one) rather than the store or the local disk failing.
    pub fn is_snapshot_damaged(&self) -> bool {
        matches!(
            self,
            SnapshotError::NotFound { .. } | SnapshotError::Corrupt { .. } | SnapshotError::UnsafePath { .. }
        )
    }
}
