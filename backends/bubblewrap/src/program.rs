//! Whether argv[0] can exist inside a sandbox, checked before spawning it.
//!
//! Inside the sandbox a missing program is only an exit status (`prlimit: failed to
//! execute …`, 127) after the sandbox was built. The contract asks for `SpawnFailed`, as a
//! host process would give, so the lookup `execvp` will do is replayed on the host through
//! the mount table: system paths are checked at their host path, workspace paths through
//! [`HostFs`] (confined to the root).
//!
//! The answer is conservative: "absent" only when every candidate is certainly missing.
//! Anything the host cannot judge exactly — a symlink on the way (its target resolves in
//! the sandbox's namespace, not the host's), `/tmp`, `/dev`, `/proc`, a `..` — counts as
//! "may exist", and the spawn goes ahead; the program then fails inside with status 127.

use std::io;
use std::path::{Path, PathBuf};

use super::sandbox::{Mount, MountTable, is_under};
use berth_backend_host::hostfs::HostFs;
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

/// Symlink mounts followed while mapping one path (`/bin -> usr/bin` needs one).
const MAX_MOUNT_HOPS: usize = 8;
/// Mounted by bwrap itself, with content the host cannot predict.
const OPAQUE_MOUNTS: &[&str] = &["/tmp", "/dev", "/proc"];

/// What a lookup needs to know about one workspace's sandbox.
pub struct SandboxView<'a> {
    pub table: &'a MountTable,
    pub workspace_dir: &'a str,
    pub files: &'a HostFs,
}

/// Where a sandbox path lives.
#[derive(Debug, PartialEq, Eq)]
enum Location {
    /// Under a host bind: the host path, and the bind's host root (lookups stop there).
    Host { path: PathBuf, mount_root: PathBuf },
    /// Under the workspace root: the relative part.
    Workspace(String),
    /// A directory bwrap created on the way to a mount point (`/`, `/etc`).
    MountParent,
    /// Content the host cannot judge.
    Unknown,
    /// Nothing is mounted there: it does not exist inside.
    Absent,
}

/// Fails with `SpawnFailed` when `program` certainly cannot be found inside the sandbox,
/// searching `search_path` (the sandbox's `PATH`) like `execvp` for a bare name.
pub async fn ensure_exists(view: &SandboxView<'_>, program: &str, search_path: &str, cwd: &RelPath) -> Result<()> {
    let sandbox_cwd = cwd.under(view.workspace_dir);
    let candidates: Vec<String> = if program.contains('/') {
        vec![absolute(&sandbox_cwd, program)]
    } else {
        // POSIX: an empty PATH entry is the current directory.
        search_path
            .split(':')
            .map(|dir| absolute(&sandbox_cwd, if dir.is_empty() { "." } else { dir }))
            .map(|dir| format!("{}/{program}", dir.trim_end_matches('/')))
            .collect()
    };
    let mut host_checks = Vec::new();
    let mut workspace_checks = Vec::new();
    for candidate in &candidates {
        match locate(view, candidate) {
            Location::Host { path, mount_root } => host_checks.push((path, mount_root)),
            Location::Workspace(relative) => workspace_checks.push(relative),
            Location::MountParent | Location::Unknown => return Ok(()),
            Location::Absent => {}
        }
    }
    if !host_checks.is_empty() {
        let any_host = tokio::task::spawn_blocking(move || {
            host_checks.iter().any(|(path, mount_root)| may_exist_on_host(path, mount_root))
        })
        .await
        .map_err(|error| WorkspaceError::Backend {
            backend: "bubblewrap",
            message: format!("program lookup task failed: {error}"),
        })?;
        if any_host {
            return Ok(());
        }
    }
    for relative in workspace_checks {
        let Ok(path) = RelPath::parse(&relative) else {
            return Ok(());
        };
        match view.files.stat(&path).await {
            Err(WorkspaceError::NotFound { .. } | WorkspaceError::NotADirectory { .. }) => {}
            // Found, or resolved through a symlink the host cannot follow: may exist.
            _ => return Ok(()),
        }
    }
    let reason = if program.contains('/') {
        "no such file in the sandbox".to_owned()
    } else {
        format!("not found in the sandbox's PATH ({search_path})")
    };
    Err(WorkspaceError::SpawnFailed { program: program.to_owned(), reason })
}

/// `path` made absolute against `base`, both sandbox paths.
fn absolute(base: &str, path: &str) -> String {
    if path.starts_with('/') { path.to_owned() } else { format!("{}/{path}", base.trim_end_matches('/')) }
}

/// Normalises an absolute sandbox path (`//a/./b/` is `/a/b`); `None` when it has `..`
/// (resolving that needs the symlinks along the way).
fn normalise(path: &str) -> Option<String> {
    let mut normal = String::new();
    for component in path.split('/') {
        match component {
            "" | "." => continue,
            ".." => return None,
            _ => {
                normal.push('/');
                normal.push_str(component);
            }
        }
    }
    Some(if normal.is_empty() { "/".to_owned() } else { normal })
}

fn locate(view: &SandboxView<'_>, path: &str) -> Location {
    let mut current = path.to_owned();
    for _ in 0..MAX_MOUNT_HOPS {
        let Some(normal) = normalise(&current) else {
            return Location::Unknown;
        };
        // The innermost mount wins, as in the kernel: the workspace may sit below a bind.
        let mut best: Option<(&str, Option<&Mount>)> = None;
        let prefixes = view
            .table
            .mounts
            .iter()
            .map(|mount| (mount.sandbox_path(), Some(mount)))
            .chain(std::iter::once((view.workspace_dir, None)))
            .chain(OPAQUE_MOUNTS.iter().map(|opaque| (*opaque, None)));
        for (prefix, mount) in prefixes {
            let longer = best.is_none_or(|(found, _)| prefix.len() > found.len());
            if is_under(&normal, prefix) && longer {
                best = Some((prefix, mount));
            }
        }
        let Some((prefix, mount)) = best else {
            let on_the_way = view.table.leads_to_mount(&normal)
                || is_under(view.workspace_dir, &normal)
                || OPAQUE_MOUNTS.iter().any(|opaque| is_under(opaque, &normal));
            return if on_the_way { Location::MountParent } else { Location::Absent };
        };
        let rest = normal[prefix.len()..].trim_start_matches('/');
        match mount {
            None if prefix == view.workspace_dir => return Location::Workspace(rest.to_owned()),
            None => return Location::Unknown,
            Some(Mount::Bind { host, .. }) => {
                let path = if rest.is_empty() { host.clone() } else { host.join(rest) };
                return Location::Host { path, mount_root: host.clone() };
            }
            Some(Mount::Symlink { target, sandbox }) => {
                let target = target.to_string_lossy();
                let parent = Path::new(sandbox).parent().and_then(Path::to_str).unwrap_or("/");
                let resolved = absolute(parent, &target);
                current = if rest.is_empty() { resolved } else { format!("{resolved}/{rest}") };
            }
        }
    }
    Location::Unknown
}

/// False only when `path` is certainly missing: it is absent and no directory between it
/// and `mount_root` is a symlink (whose target the sandbox would resolve differently).
fn may_exist_on_host(path: &Path, mount_root: &Path) -> bool {
    match std::fs::symlink_metadata(path) {
        Ok(_) => return true,
        Err(error) if is_missing(&error) => {}
        Err(_) => return true,
    }
    for ancestor in path.ancestors().skip(1) {
        if !ancestor.starts_with(mount_root) || ancestor == mount_root {
            break;
        }
        match std::fs::symlink_metadata(ancestor) {
            Ok(metadata) if metadata.file_type().is_symlink() => return true,
            Ok(_) => {}
            Err(error) if is_missing(&error) => {}
            Err(_) => return true,
        }
    }
    false
}

fn is_missing(error: &io::Error) -> bool {
    matches!(error.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> MountTable {
        MountTable {
            mounts: vec![
                Mount::Bind { host: "/usr".into(), sandbox: "/usr".into(), writable: false },
                Mount::Symlink { target: "usr/bin".into(), sandbox: "/bin".into() },
                Mount::Bind { host: "/etc/passwd".into(), sandbox: "/etc/passwd".into(), writable: false },
                Mount::Bind { host: "/srv/t".into(), sandbox: "/sandbox".into(), writable: true },
            ],
        }
    }

    fn locate_in(workspace_dir: &str, path: &str) -> Location {
        // The HostFs is not consulted by `locate`; any directory will do.
        let files = HostFs::open(Path::new("/")).unwrap();
        let table = table();
        let view = SandboxView { table: &table, workspace_dir, files: &files };
        locate(&view, path)
    }

    #[test]
    fn maps_sandbox_paths() {
        let host = |path: &str, root: &str| Location::Host { path: path.into(), mount_root: root.into() };
        assert_eq!(locate_in("/workspace", "/usr/bin/sh"), host("/usr/bin/sh", "/usr"));
        assert_eq!(locate_in("/workspace", "/bin/sh"), host("/usr/bin/sh", "/usr"));
        assert_eq!(locate_in("/workspace", "//bin/./sh"), host("/usr/bin/sh", "/usr"));
        assert_eq!(locate_in("/workspace", "/workspace/a/b"), Location::Workspace("a/b".into()));
        assert_eq!(locate_in("/workspace", "/workspace"), Location::Workspace(String::new()));
        assert_eq!(locate_in("/workspace", "/opt/tool"), Location::Absent);
        assert_eq!(locate_in("/workspace", "/etc/shadow"), Location::Absent);
        assert_eq!(locate_in("/workspace", "/etc"), Location::MountParent);
        assert_eq!(locate_in("/workspace", "/tmp/x"), Location::Unknown);
        assert_eq!(locate_in("/workspace", "/usr/../opt"), Location::Unknown);
        // The workspace below a bind: the innermost mount wins.
        assert_eq!(locate_in("/sandbox/ws", "/sandbox/ws/x"), Location::Workspace("x".into()));
        assert_eq!(locate_in("/sandbox/ws", "/sandbox/x"), host("/srv/t/x", "/srv/t"));
    }

    #[test]
    fn host_misses_are_certain_only_without_symlinks() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("real")).unwrap();
        std::os::unix::fs::symlink("/nowhere", dir.path().join("link")).unwrap();
        assert!(!may_exist_on_host(&dir.path().join("real/prog"), dir.path()));
        assert!(!may_exist_on_host(&dir.path().join("missing/prog"), dir.path()));
        assert!(may_exist_on_host(&dir.path().join("real"), dir.path()));
        assert!(may_exist_on_host(&dir.path().join("link/prog"), dir.path()));
    }
}
