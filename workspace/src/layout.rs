//! The fixed layout of every workspace root (docs/design.md §3).
//!
//! ```text
//! .mcp        JSON array of MCP server declarations ("[]" when seeded)
//! skills/     per-workspace skill copies
//! data/       offloaded binary payloads
//! sessions/   offloaded conversations and tool results
//! ```

use bytes::Bytes;

use crate::backend::Backend;
use crate::error::{Result, WorkspaceError};
use crate::path::RelPath;

/// The MCP declarations file.
pub const MCP_FILE: &str = ".mcp";
/// Content of a freshly seeded `.mcp`: no servers.
pub const EMPTY_MCP: &[u8] = b"[]";
pub const SKILLS_DIR: &str = "skills";
pub const DATA_DIR: &str = "data";
pub const SESSIONS_DIR: &str = "sessions";

/// Creates whatever is missing of the layout; idempotent, and never overwrites an
/// existing `.mcp` (whatever it holds — validating it is the MCP loader's job). Uses only
/// [`Backend`] methods, so it works on every backend.
///
/// Not atomic against a concurrent writer of `.mcp`: the primitives have no
/// create-if-absent, so a writer landing between the check and the seed could be replaced
/// by `[]`. Callers run this at provision time, before the workspace serves requests.
pub async fn ensure<B: Backend + ?Sized>(backend: &B) -> Result<()> {
    // One listing when it is all there (every provision of a workspace that has it, a warm
    // pool's slot), instead of a call per entry.
    if let Ok(entries) = backend.list_dir(&RelPath::root()).await
        && is_complete(&entries)
    {
        return Ok(());
    }
    for dir in [SKILLS_DIR, DATA_DIR, SESSIONS_DIR] {
        backend.mkdir(&RelPath::parse(dir)?, true).await?;
    }
    let mcp = RelPath::parse(MCP_FILE)?;
    match backend.stat(&mcp).await {
        Ok(_) => Ok(()),
        Err(WorkspaceError::NotFound { .. }) => {
            backend.write_bytes(&mcp, Bytes::from_static(EMPTY_MCP), 0o644).await?;
            Ok(())
        }
        Err(error) => Err(error),
    }
}

/// Whether a root listing holds the whole layout (directories as directories, `.mcp`
/// whatever it is: it is never replaced).
fn is_complete(entries: &[crate::file::FileInfo]) -> bool {
    let has = |name: &str, directory: bool| {
        entries
            .iter()
            .any(|entry| entry.name() == name && (!directory || entry.kind == crate::file::FileKind::Directory))
    };
    [SKILLS_DIR, DATA_DIR, SESSIONS_DIR].into_iter().all(|dir| has(dir, true)) && has(MCP_FILE, false)
}
