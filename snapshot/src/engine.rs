//! The snapshot engine over any `SnapshotStore`: take (`snapshot`), restore, and the
//! retention side (list, prune, delete, garbage collection).

pub mod gc;
pub mod restore;
pub mod retention;
pub mod snapshot;
mod walk;

use std::time::{SystemTime, UNIX_EPOCH};

use crate::error::SnapshotError;

pub(crate) fn now_unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |since| since.as_millis() as u64)
}

/// Runs blocking file work off the runtime.
pub(crate) async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, SnapshotError> + Send + 'static,
) -> Result<T, SnapshotError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|error| SnapshotError::InvalidInput(format!("blocking task failed: {error}")))?
}
