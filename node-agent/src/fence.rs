//! Self-fencing: a node whose lease may have expired stops serving workspace calls until it
//! has registered again (docs/design.md §4.3). Separate from "a call failed": this is "the node
//! must stop".
//!
//! Two things fence: the flag (set at start, by the watchdog, or when a replica says the
//! lease is gone; cleared only by a registration) and the deadline (the last acknowledged
//! renewal plus the TTL etcd answered, minus a margin). The deadline is checked by every
//! caller itself, so a node that was stopped (SIGSTOP, a long pause) and runs again refuses
//! the first call it sees, before any watchdog task has had a chance to run.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::time::Instant;

#[derive(Debug, Default)]
pub struct Fence {
    fenced: AtomicBool,
    /// Serving stops at this instant unless a renewal moves it; `None`: no lease yet.
    serve_until: Mutex<Option<Instant>>,
}

impl Fence {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_fenced(&self) -> bool {
        if self.fenced.load(Ordering::Acquire) {
            return true;
        }
        let serve_until = *self.serve_until.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if serve_until.is_some_and(|until| Instant::now() >= until) {
            // Sticky like the watchdog's fence: a renewal that arrives late no longer lifts
            // it; a registration does (and removes superseded copies first).
            self.fenced.store(true, Ordering::Release);
            return true;
        }
        false
    }

    /// Stops serving. Returns true if the node was serving until now.
    pub fn fence(&self) -> bool {
        !self.fenced.swap(true, Ordering::AcqRel)
    }

    /// Serves again (after a fresh registration).
    pub fn lift(&self) -> bool {
        self.fenced.swap(false, Ordering::AcqRel)
    }

    /// Sets when serving stops without a further renewal (the lease's own deadline with its
    /// margin); `None` after a fence, when only a registration sets one again.
    pub fn serve_until(&self, until: Option<Instant>) {
        *self.serve_until.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = until;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_passed_deadline_fences_without_the_watchdog() {
        let fence = Fence::new();
        assert!(!fence.is_fenced(), "no lease yet and no flag: serving (the server sets the start fence)");
        fence.serve_until(Some(Instant::now() + Duration::from_secs(60)));
        assert!(!fence.is_fenced());
        fence.serve_until(Some(Instant::now() - Duration::from_millis(1)));
        assert!(fence.is_fenced(), "a deadline in the past fences at once");
        fence.serve_until(Some(Instant::now() + Duration::from_secs(60)));
        assert!(fence.is_fenced(), "a late renewal does not lift it");
        assert!(fence.lift(), "a registration does");
        assert!(!fence.is_fenced());
    }
}
