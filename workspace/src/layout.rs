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
/// `None` for a portable driver): the layout is read, and a fresh root's made, on the host in
/// one blocking call ([`complete_on_host`]); the backend is called only when something
/// else is in the way (it reports what). On Docker that saves an exec per part; on every
/// host driver, the seed's own write (a temp file, two fsyncs and a rename).
pub async fn ensure_at<B: Backend + ?Sized>(backend: &B, host_root: Option<&std::path::Path>) -> Result<()> {
    if let Some(root) = host_root.map(std::path::Path::to_path_buf)
        && tokio::task::spawn_blocking(move || complete_on_host(&root)).await.unwrap_or(false)
    {
        return Ok(());
    }
    ensure(backend).await
}

/// Makes the missing parts of a host root's layout on the host: a directory (mode 0755) or
/// a `.mcp` holding `[]` (created exclusively, never replacing anything), each given the
/// root's owner, which is the sandbox user's. Returns whether the layout is complete then;
/// `false` when a part is something else (a tenant's link or file), when the root cannot be
/// read, or when an entry could not be made or handed over (what was made is removed):
/// [`ensure`] through the backend decides and reports those.
///
/// Not fsynced, on purpose: the root's own creation is not either, and every provision
/// runs this again, so a seed lost to a crash is made anew; a `.mcp` left empty by one is
/// re-seeded by the MCP loader.
pub fn complete_on_host(root: &std::path::Path) -> bool {
    layout_on_host(root, true)
}

/// Whether a host directory holds the whole layout, read without following a link (a link
/// named `skills` is not the directory) and without making anything.
#[cfg(test)]
fn is_complete_on_host(root: &std::path::Path) -> bool {
    layout_on_host(root, false)
}

/// The host-side layout rule, in one place: each directory a real directory, `.mcp`
/// anything but a link; with `make_missing`, a missing part is made (see
/// [`complete_on_host`]).
fn layout_on_host(root: &std::path::Path, make_missing: bool) -> bool {
    use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _};

    let Ok(owner) = std::fs::metadata(root).map(|meta| (meta.uid(), meta.gid())) else {
        return false;
    };
    for dir in [SKILLS_DIR, DATA_DIR, SESSIONS_DIR] {
        let path = root.join(dir);
        let complete = match std::fs::symlink_metadata(&path) {
            Ok(meta) => meta.file_type().is_dir(),
            // mkdir never follows a link that appeared meanwhile: it fails instead.
            Err(error) if make_missing && error.kind() == std::io::ErrorKind::NotFound => {
                std::fs::DirBuilder::new().mode(0o755).create(&path).is_ok() && hand_over(&path, owner, true)
            }
            Err(_) => false,
        };
        if !complete {
            return false;
        }
    }
    let path = root.join(MCP_FILE);
    match std::fs::symlink_metadata(&path) {
        Ok(meta) => !meta.file_type().is_symlink(),
        Err(error) if make_missing && error.kind() == std::io::ErrorKind::NotFound => {
            seed_mcp(&path) && hand_over(&path, owner, false)
        }
        Err(_) => false,
    }
}

/// Creates `.mcp` holding `[]` with `O_EXCL | O_NOFOLLOW`: nothing that exists by then (a
/// link included) is opened or replaced. A failed write leaves nothing behind.
fn seed_mcp(path: &std::path::Path) -> bool {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;

    let Ok(mut file) = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)
    else {
        // Something is there (or the root refuses): not ours to remove.
        return false;
    };
    if file.write_all(EMPTY_MCP).is_ok() {
        return true;
    }
    drop(file);
    let _ = std::fs::remove_file(path);
    false
}

/// Gives an entry this process just made to the root's `owner`; one that cannot be handed
/// over is taken back.
fn hand_over(path: &std::path::Path, owner: (u32, u32), is_dir: bool) -> bool {
    use std::os::unix::fs::MetadataExt as _;

    let made = std::fs::symlink_metadata(path).map(|meta| (meta.uid(), meta.gid()));
    if made.as_ref().is_ok_and(|made| *made == owner)
        || std::os::unix::fs::lchown(path, Some(owner.0), Some(owner.1)).is_ok()
    {
        return true;
    }
    let _ = if is_dir { std::fs::remove_dir(path) } else { std::fs::remove_file(path) };
    false
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

    #[test]
    fn an_empty_root_is_seeded_on_the_host() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().expect("temp dir");
        assert!(complete_on_host(root.path()));
        assert!(is_complete_on_host(root.path()));
        assert_eq!(std::fs::read(root.path().join(MCP_FILE)).expect("read .mcp"), EMPTY_MCP);
        for dir in [SKILLS_DIR, DATA_DIR, SESSIONS_DIR] {
            let mode = std::fs::metadata(root.path().join(dir)).expect("stat").permissions().mode();
            assert_eq!(mode & 0o7777 & !0o022, 0o755 & !0o022, "{dir}: mode {mode:o}");
        }
        // Parts a tenant removed come back; what it wrote stays.
        std::fs::remove_dir(root.path().join(DATA_DIR)).expect("rmdir");
        std::fs::write(root.path().join(MCP_FILE), b"[{\"name\":\"mine\"}]").expect("write");
        assert!(complete_on_host(root.path()));
        assert!(root.path().join(DATA_DIR).is_dir());
        assert_eq!(std::fs::read(root.path().join(MCP_FILE)).expect("read"), b"[{\"name\":\"mine\"}]");
        assert!(!complete_on_host(&root.path().join("no-such-root")));
    }

    /// Something in the way is left for the backend's `ensure` to report: never replaced,
    /// never followed.
    #[test]
    fn links_and_files_in_the_way_are_not_seeded_over() {
        let elsewhere = tempfile::tempdir().expect("temp dir");
        let root = tempfile::tempdir().expect("temp dir");
        symlink(elsewhere.path(), root.path().join(DATA_DIR)).expect("symlink");
        assert!(!complete_on_host(root.path()));
        let root = tempfile::tempdir().expect("temp dir");
        std::fs::write(root.path().join(SESSIONS_DIR), b"x").expect("write");
        assert!(!complete_on_host(root.path()));
        assert_eq!(std::fs::read(root.path().join(SESSIONS_DIR)).expect("read"), b"x");
        let root = tempfile::tempdir().expect("temp dir");
        symlink(elsewhere.path().join("planted"), root.path().join(MCP_FILE)).expect("symlink");
        assert!(!complete_on_host(root.path()));
        assert!(!elsewhere.path().join("planted").exists(), "the seed followed a link out of the root");
        assert_eq!(std::fs::read_dir(elsewhere.path()).expect("list").count(), 0);
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
