//! Keeps each backend's warm pool filled (within the node's capacity) and empties it when
//! the agent stops: pool runtimes are anonymous, nothing of them is worth keeping.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::state::Workspaces;

/// How often a pool is checked (a claim is refilled within this, plus the making).
const CHECK_EVERY: Duration = Duration::from_millis(250);
/// How long a pool that failed to fill waits before it tries again.
const RETRY_AFTER: Duration = Duration::from_secs(30);

/// How many runtimes a pool of `size` keeps ready: no more than the room left under the
/// capacity (0: unlimited) by the workspaces the node holds.
pub fn target(size: usize, capacity: u32, held: usize) -> usize {
    if capacity == 0 { size } else { size.min((capacity as usize).saturating_sub(held)) }
}

/// Runs until `cancel`, then empties every pool before it returns.
pub async fn keep_warm(
    workspaces: Arc<Workspaces>,
    sizes: BTreeMap<String, usize>,
    capacity: u32,
    cancel: CancellationToken,
) {
    let mut failed_until: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    let mut ready: BTreeMap<String, usize> = BTreeMap::new();
    while !cancel.is_cancelled() {
        for (backend, size) in &sizes {
            if cancel.is_cancelled() {
                break;
            }
            if failed_until.get(backend).is_some_and(|until| tokio::time::Instant::now() < *until) {
                continue;
            }
            // One runtime more at a time: a fill is never cut short (a runtime half made
            // would be left behind), and a stop waits for one making at most.
            let have = ready.get(backend).copied().unwrap_or_default();
            let wanted = target(*size, capacity, workspaces.held()).min(have + 1);
            match workspaces.fill_pool(backend, wanted).await {
                Ok(level) => {
                    crate::metrics::warm_pool(backend, level);
                    ready.insert(backend.clone(), level.ready);
                    failed_until.remove(backend);
                }
                Err(error) => {
                    tracing::warn!(%backend, %error, "cannot fill the warm pool; trying again in {RETRY_AFTER:?}");
                    failed_until.insert(backend.clone(), tokio::time::Instant::now() + RETRY_AFTER);
                }
            }
        }
        if sizes.values().all(|size| *size == 0) && failed_until.is_empty() {
            // No pool asked for: the first fill removed what an earlier agent left.
            cancel.cancelled().await;
            break;
        }
        let filling = sizes.iter().any(|(backend, size)| {
            ready.get(backend).copied().unwrap_or_default() < target(*size, capacity, workspaces.held())
                && !failed_until.contains_key(backend)
        });
        let pause = if filling { Duration::ZERO } else { CHECK_EVERY };
        tokio::select! {
            _ = cancel.cancelled() => break,
            _ = tokio::time::sleep(pause) => {}
        }
    }
    for backend in sizes.keys() {
        match workspaces.fill_pool(backend, 0).await {
            Ok(level) => crate::metrics::warm_pool(backend, level),
            Err(error) => tracing::warn!(%backend, %error, "could not empty the warm pool"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::target;

    #[test]
    fn the_pool_stays_within_the_capacity() {
        assert_eq!(target(4, 0, 100), 4);
        assert_eq!(target(4, 10, 3), 4);
        assert_eq!(target(4, 10, 8), 2);
        assert_eq!(target(4, 10, 12), 0);
    }
}
