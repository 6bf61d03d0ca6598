//! The attack corpus: one case per way a hostile tenant (or a careless operator) could
//! break isolation, each run against real node agents and sandboxes. Every case plants a
//! host-side marker path the attack would create or read if it worked, runs the attack,
//! and asserts the refusal (a typed error) or the containment (the marker never appears,
//! the secret never shows in the output).
//!
//! One module per area; each module's doc names the attacks and entry points it covers.

mod bwrap;
mod mcp;
mod network;
mod policy;
mod tenants;

use std::path::{Path, PathBuf};

/// The workspace root named `name` below `base` (a node's data dir holds the roots a few
/// levels down): the first directory of that name holding the fixed layout's `.mcp`.
pub fn find_dir(base: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(base).ok()?.flatten() {
        let path = entry.path();
        if !entry.file_type().ok()?.is_dir() {
            continue;
        }
        if entry.file_name() == name && path.join(".mcp").exists() {
            return Some(path);
        }
        if let Some(found) = find_dir(&path, name) {
            return Some(found);
        }
    }
    None
}
