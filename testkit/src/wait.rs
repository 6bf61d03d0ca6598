//! The one way Berth's tests wait: poll a condition until it holds or a deadline passes.
//! Never sleep and hope — every wait names what it waits for and gives up loudly.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Mutex;
use std::time::Duration;

/// How often a condition is polled unless the caller says otherwise.
pub const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Polls `probe` every `every` until it returns `Some` or `timeout` passes; returns the
/// value. Every other wait here is this loop.
pub async fn wait_for_every<T, F, Fut>(timeout: Duration, every: Duration, mut probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(value) = probe().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// Polls `probe` every 50 ms until it returns `Some` or `timeout` passes.
pub async fn wait_for<T, F, Fut>(timeout: Duration, probe: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    wait_for_every(timeout, POLL_INTERVAL, probe).await
}

/// Polls `condition` every `every` until it holds or `timeout` passes; returns whether it
/// held.
pub async fn wait_until_every<F, Fut>(timeout: Duration, every: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_for_every(timeout, every, || {
        let check = condition();
        async move { check.await.then_some(()) }
    })
    .await
    .is_some()
}

/// Polls `condition` every 50 ms until it holds or `timeout` passes; returns whether it held.
pub async fn wait_until<F, Fut>(timeout: Duration, condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_every(timeout, POLL_INTERVAL, condition).await
}

/// Polls `condition` until it holds; fails the test naming `what` after `timeout`.
pub async fn assert_eventually<F, Fut>(what: &str, timeout: Duration, condition: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    assert!(wait_until(timeout, condition).await, "timed out after {timeout:?} waiting for: {what}");
}

/// Calls `call` every 50 ms until it returns `Ok`, and returns the value; fails the test
/// naming `what` and the last error after `timeout` (a service still starting, a node not
/// registered yet).
pub async fn eventually_ok<T, E, F, Fut>(what: &str, timeout: Duration, mut call: F) -> T
where
    E: Debug,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
{
    let last_error = Mutex::new(None);
    let value = wait_for(timeout, || {
        let attempt = call();
        let last_error = &last_error;
        async move {
            match attempt.await {
                Ok(value) => Some(value),
                Err(error) => {
                    *last_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(error);
                    None
                }
            }
        }
    })
    .await;
    match value {
        Some(value) => value,
        None => panic!(
            "timed out after {timeout:?} waiting for: {what}; last error: {:?}",
            last_error.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
        ),
    }
}
