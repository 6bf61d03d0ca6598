//! Giving a workspace root to the sandbox user.
//!
//! Sandboxes run as an unprivileged host uid (see the module docs of `bubblewrap`), so
//! that uid must own the workspace's files: files the API writes later are created with
//! that owner by [`berth_backend_host::hostfs::HostFs::with_owner`]; what exists at provision (created by
//! the node agent as root, restored from a snapshot…) is handed over here. And bwrap,
//! running as that uid, must be able to reach the root to bind it.
//!
//! Blocking: run on the blocking pool.

use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt as _};
use nix::fcntl::{AtFlags, OFlag, openat};
use nix::sys::stat::Mode;
use nix::unistd::{Gid, Uid, fchownat};

use berth_workspace::error::{Result, WorkspaceError};

/// Deepest directory nesting walked; deeper trees are left as they are (and logged).
const MAX_WALK_DEPTH: usize = 256;

/// Checks that `uid`/`gid` may search every directory above `root` (bwrap resolves the
/// bind source as that user). Looks at permission bits only, not ACLs.
pub fn check_reachable(root: &Path, uid: u32, gid: u32) -> Result<()> {
    for ancestor in root.ancestors().skip(1) {
        let metadata = std::fs::metadata(ancestor)
            .map_err(|error| WorkspaceError::from_io("stat", &ancestor.display().to_string(), error))?;
        let mode = metadata.mode();
        let searchable = mode & 0o001 != 0
            || (metadata.uid() == uid && mode & 0o100 != 0)
            || (metadata.gid() == gid && mode & 0o010 != 0);
        if !searchable {
            return Err(WorkspaceError::BackendUnavailable {
                backend: "bubblewrap",
                reason: format!(
                    "the sandbox user {uid}:{gid} cannot reach the workspace root {}: \
                     {} is mode {:o} (make the directories above workspace roots \
                     searchable, e.g. chmod o+x)",
                    root.display(),
                    ancestor.display(),
                    mode & 0o7777
                ),
            });
        }
    }
    Ok(())
}

/// Makes `uid:gid` own `root` and everything below it, without following symlinks
/// (links themselves are re-owned, never their targets). Returns how many entries changed.
pub fn hand_over(root: &Path, uid: u32, gid: u32) -> Result<usize> {
    let display = root.display().to_string();
    let dir = Dir::open_ambient_dir(root, ambient_authority())
        .map_err(|error| WorkspaceError::from_io("open workspace root", &display, error))?;
    let metadata = dir.dir_metadata().map_err(|error| WorkspaceError::from_io("stat", &display, error))?;
    let mut changed = 0;
    if metadata.uid() != uid || metadata.gid() != gid {
        // `.` through the handle: the root may be opened O_PATH, which fchown refuses.
        fchownat(dir.as_fd(), ".", Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)), AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|errno| WorkspaceError::from_io("chown", &display, io::Error::from(errno)))?;
        changed += 1;
    }
    changed += walk(&dir, &display, uid, gid, 0)?;
    Ok(changed)
}

fn walk(dir: &Dir, location: &str, uid: u32, gid: u32, depth: usize) -> Result<usize> {
    if depth >= MAX_WALK_DEPTH {
        tracing::warn!(
            path = %location,
            "workspace tree too deep; not re-owned below here"
        );
        return Ok(0);
    }
    let failed = |op, error| WorkspaceError::from_io(op, location, error);
    let mut changed = 0;
    for entry in dir.entries().map_err(|error| failed("list", error))? {
        let entry = entry.map_err(|error| failed("list", error))?;
        let name = entry.file_name();
        // lstat: a symlink is reported as a symlink.
        let metadata = match entry.metadata() {
            Ok(metadata) => metadata,
            // Removed meanwhile (a sandbox may be running): nothing to hand over.
            Err(error) if error.kind() == io::ErrorKind::NotFound => continue,
            Err(error) => return Err(failed("stat", error)),
        };
        if metadata.uid() != uid || metadata.gid() != gid {
            match fchownat(
                dir.as_fd(),
                name.as_os_str(),
                Some(Uid::from_raw(uid)),
                Some(Gid::from_raw(gid)),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(()) => changed += 1,
                Err(nix::errno::Errno::ENOENT) => continue,
                Err(errno) => return Err(failed("chown", io::Error::from(errno))),
            }
        }
        if metadata.file_type().is_dir() {
            // O_NOFOLLOW on a single name: if the directory was swapped for a symlink since
            // the lstat, the open fails instead of leading anywhere else.
            let child = match openat(
                dir.as_fd(),
                name.as_os_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => Dir::from_std_file(std::fs::File::from(fd)),
                Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR) => continue,
                Err(errno) => return Err(failed("open", io::Error::from(errno))),
            };
            let child_location = format!("{location}/{}", name.to_string_lossy());
            changed += walk(&child, &child_location, uid, gid, depth + 1)?;
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_over_without_following_links() {
        let outside = tempfile::tempdir().unwrap();
        let victim = outside.path().join("victim");
        std::fs::write(&victim, b"v").unwrap();
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("a/b")).unwrap();
        std::fs::write(root.path().join("a/b/file"), b"x").unwrap();
        std::os::unix::fs::symlink(&victim, root.path().join("a/link")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dirlink")).unwrap();
        let (uid, gid) = (54321, 54322);
        let changed = hand_over(root.path(), uid, gid).unwrap();
        assert_eq!(changed, 6, "root, a, a/b, a/b/file, a/link, dirlink");
        for path in ["", "a", "a/b", "a/b/file", "a/link", "dirlink"] {
            let metadata = std::fs::symlink_metadata(root.path().join(path)).unwrap();
            assert_eq!((metadata.uid(), metadata.gid()), (uid, gid), "{path}");
        }
        // Link targets outside keep their owner.
        let metadata = std::fs::metadata(&victim).unwrap();
        assert_ne!(metadata.uid(), uid);
        assert_ne!(std::fs::metadata(outside.path()).unwrap().uid(), uid);
        // A second pass changes nothing.
        assert_eq!(hand_over(root.path(), uid, gid).unwrap(), 0);
    }

    #[test]
    fn unreachable_roots_are_named() {
        let base = tempfile::tempdir().unwrap();
        let root = base.path().join("ws");
        std::fs::create_dir(&root).unwrap();
        std::fs::set_permissions(base.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700)).unwrap();
        let error = check_reachable(&root, 54321, 54321).unwrap_err();
        assert!(error.to_string().contains("cannot reach"), "{error}");
        std::fs::set_permissions(base.path(), std::os::unix::fs::PermissionsExt::from_mode(0o711)).unwrap();
        check_reachable(&root, 54321, 54321).unwrap();
    }
}
