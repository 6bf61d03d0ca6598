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

/// [`ensure`] for a workspace whose root is the host directory `host_root` (host drivers;
/// `None` for a portable driver): the layout is read on the host first (a few `lstat`s), and
/// the backend is called only for a part that is missing. On Docker that saves an exec.
pub async fn ensure_at<B: Backend + ?Sized>(backend: &B, host_root: Option<&std::path::Path>) -> Result<()> {
    if let Some(root) = host_root.map(std::path::Path::to_path_buf)
        && tokio::task::spawn_blocking(move || is_complete_on_host(&root)).await.unwrap_or(false)
    {
        return Ok(());
    }
    ensure(backend).await
}

/// Whether a host directory holds the whole layout, read from the host without following a
/// link (a link named `skills` is not the directory): for drivers whose root is a host
/// directory, one local listing instead of a call into the sandbox on every provision.
/// `false` when it cannot be read; the caller then runs [`ensure`] through the backend.
pub fn is_complete_on_host(root: &std::path::Path) -> bool {
    let kind = |name: &str| std::fs::symlink_metadata(root.join(name)).ok().map(|meta| meta.file_type());
    [SKILLS_DIR, DATA_DIR, SESSIONS_DIR].into_iter().all(|dir| kind(dir).is_some_and(|kind| kind.is_dir()))
        && kind(MCP_FILE).is_some_and(|kind| !kind.is_symlink())
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

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use super::*;

    fn seeded() -> tempfile::TempDir {
        let root = tempfile::tempdir().expect("temp dir");
        for dir in [SKILLS_DIR, DATA_DIR, SESSIONS_DIR] {
            std::fs::create_dir(root.path().join(dir)).expect("mkdir");
        }
        std::fs::write(root.path().join(MCP_FILE), EMPTY_MCP).expect("write .mcp");
        root
    }

    #[test]
    fn a_seeded_host_root_is_complete() {
        assert!(is_complete_on_host(seeded().path()));
    }

    #[test]
    fn a_missing_part_or_an_unreadable_root_is_not_complete() {
        for missing in [SKILLS_DIR, DATA_DIR, SESSIONS_DIR] {
            let root = seeded();
            std::fs::remove_dir(root.path().join(missing)).expect("rmdir");
            assert!(!is_complete_on_host(root.path()), "{missing} removed");
        }
        let root = seeded();
        std::fs::remove_file(root.path().join(MCP_FILE)).expect("rm .mcp");
        assert!(!is_complete_on_host(root.path()));
        assert!(!is_complete_on_host(&root.path().join("no-such-root")));
        // A file where a directory belongs.
        let root = seeded();
        std::fs::remove_dir(root.path().join(DATA_DIR)).expect("rmdir");
        std::fs::write(root.path().join(DATA_DIR), b"x").expect("write");
        assert!(!is_complete_on_host(root.path()));
    }

    /// A tenant's link in place of a layout entry is never taken for it from the host:
    /// the backend's own `ensure` (inside the sandbox) decides then.
    #[test]
    fn links_in_place_of_layout_entries_are_not_complete() {
        let elsewhere = tempfile::tempdir().expect("temp dir");
        let root = seeded();
        std::fs::remove_dir(root.path().join(SKILLS_DIR)).expect("rmdir");
        symlink(elsewhere.path(), root.path().join(SKILLS_DIR)).expect("symlink");
        assert!(!is_complete_on_host(root.path()));
        let root = seeded();
        std::fs::remove_file(root.path().join(MCP_FILE)).expect("rm");
        symlink("/etc/passwd", root.path().join(MCP_FILE)).expect("symlink");
        assert!(!is_complete_on_host(root.path()));
    }
}
