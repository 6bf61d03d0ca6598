//! How many provisions of one host driver do their host work at once
//! (`--max-concurrent-provisions`), and how many wait for their turn.

use std::collections::HashMap;

use tokio::sync::{Semaphore, SemaphorePermit};

/// The default of `--max-concurrent-provisions`: four per core. Bounds how many provisions
/// of one host driver (local, bubblewrap, docker) do their host work at once: making the
/// root, the driver's own provision, the layout and the state file. Each of those steps is
/// a trip to the blocking pool, and every root is made in the same `workspaces/` directory,
/// whose lock the kernel takes for each: unbounded, a storm of 1000 distinct first sessions
/// had a node start 515 threads, all contending for that lock; with eight at a time it
/// starts about 50. The others wait their turn, in order.
pub fn default_provision_slots() -> usize {
    4 * std::thread::available_parallelism().map_or(1, usize::from)
}

/// One FIFO semaphore per host driver, so a wedged Docker daemon holds up Docker's
/// provisions only. Portable drivers (a provider's API call, no host work) have none.
pub(super) struct ProvisionSlots {
    by_backend: HashMap<String, Semaphore>,
}

impl ProvisionSlots {
    /// `slots` per backend of `host_backends` (clamped to what a semaphore can count).
    pub(super) fn new<'a>(host_backends: impl IntoIterator<Item = &'a String>, slots: usize) -> Self {
        let slots = slots.min(Semaphore::MAX_PERMITS);
        Self { by_backend: host_backends.into_iter().map(|name| (name.clone(), Semaphore::new(slots))).collect() }
    }

    /// Waits for a slot of `backend` (none for a portable one), counted in
    /// `berth_node_agent_provisions_waiting` while it waits — also when the provision is
    /// dropped before its turn (the replica gave up on it). The semaphores are never closed.
    pub(super) async fn enter(&self, backend: &str) -> Option<SemaphorePermit<'_>> {
        let slots = self.by_backend.get(backend)?;
        if let Ok(permit) = slots.try_acquire() {
            return Some(permit);
        }
        let _waiting = Waiting::start(backend);
        slots.acquire().await.ok()
    }
}

/// One provision in `berth_node_agent_provisions_waiting`, until dropped.
struct Waiting<'a> {
    backend: &'a str,
}

impl<'a> Waiting<'a> {
    fn start(backend: &'a str) -> Self {
        crate::metrics::provision_waiting(backend, 1.0);
        Self { backend }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        crate::metrics::provision_waiting(self.backend, -1.0);
    }
}
