//! Self-fencing: a node whose lease may have expired stops serving workspace calls until it
//! has registered again (docs/design.md §4.3). Separate from "a call failed": this is "the node
//! must stop".

use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Debug, Default)]
pub struct Fence {
    fenced: AtomicBool,
}

impl Fence {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// Stops serving. Returns true if the node was serving until now.
    pub fn fence(&self) -> bool {
        !self.fenced.swap(true, Ordering::AcqRel)
    }

    /// Serves again (after a fresh registration).
    pub fn lift(&self) -> bool {
        self.fenced.swap(false, Ordering::AcqRel)
    }
}
