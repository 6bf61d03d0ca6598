//! What a sandbox sees: the mount table, and the bwrap command line that builds it.
//!
//! The host is inspected once per driver ([`MountTable::inspect`]): which system dirs and
//! `/etc` entries exist, and which are symlinks (merged /usr). The table then serves twice:
//! as bwrap options, and as the map [`super::program`] uses to tell whether a program can
//! exist inside before spawning it.

use std::ffi::OsString;
use std::io;
use std::path::{Path, PathBuf};

use super::config::BubblewrapConfig;
use berth_workspace::error::{Result, WorkspaceError};

/// One entry of the sandbox's file system, in mount order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mount {
    /// A host path at `sandbox`, read-only unless `writable`.
    Bind { host: PathBuf, sandbox: String, writable: bool },
    /// A symlink at `sandbox` pointing at `target` (as written, possibly relative).
    Symlink { target: PathBuf, sandbox: String },
}

impl Mount {
    pub fn sandbox_path(&self) -> &str {
        match self {
            Mount::Bind { sandbox, .. } | Mount::Symlink { sandbox, .. } => sandbox,
        }
    }
}

/// The host-derived part of every sandbox of a driver: system dirs, `/etc` entries and
/// extra binds. The workspace itself is added per workspace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MountTable {
    pub mounts: Vec<Mount>,
}

impl MountTable {
    /// Looks at the host (blocking: a few `lstat`s). Missing system dirs and `/etc` entries
    /// are skipped; a missing extra bind is a configuration error.
    pub fn inspect(config: &BubblewrapConfig) -> Result<Self> {
        let mut mounts = Vec::new();
        for dir in &config.system_dirs {
            let Some(sandbox) = dir.to_str().map(str::to_owned) else {
                return Err(not_utf8(dir));
            };
            match std::fs::symlink_metadata(dir) {
                Ok(metadata) if metadata.file_type().is_symlink() => {
                    let target = std::fs::read_link(dir)
                        .map_err(|error| WorkspaceError::from_io("readlink", &sandbox, error))?;
                    mounts.push(Mount::Symlink { target, sandbox });
                }
                Ok(metadata) if metadata.is_dir() => {
                    mounts.push(Mount::Bind { host: dir.clone(), sandbox, writable: false })
                }
                Ok(_) => {
                    tracing::warn!(path = %dir.display(), "system dir is not a directory; not mounted");
                }
                Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                Err(error) => return Err(WorkspaceError::from_io("stat", &sandbox, error)),
            }
        }
        for entry in &config.etc_entries {
            let host = Path::new("/etc").join(entry);
            // `exists` follows symlinks: /etc/os-release -> ../usr/lib/os-release is bound
            // as the file it names (bwrap resolves the source), a dangling link is skipped.
            if host.exists() {
                mounts.push(Mount::Bind { host, sandbox: format!("/etc/{entry}"), writable: false });
            }
        }
        for bind in &config.extra_binds {
            if !bind.host_path.exists() {
                return Err(WorkspaceError::BackendUnavailable {
                    backend: "bubblewrap",
                    reason: format!("extra bind source {} does not exist", bind.host_path.display()),
                });
            }
            mounts.push(Mount::Bind {
                host: bind.host_path.clone(),
                sandbox: bind.sandbox_path.clone(),
                writable: bind.writable,
            });
        }
        Ok(Self { mounts })
    }

    /// Whether `sandbox_path` is a mount point or a directory above one (`/`, `/etc`): it
    /// exists inside although nothing binds it.
    pub fn leads_to_mount(&self, sandbox_path: &str) -> bool {
        self.mounts.iter().any(|mount| is_under(mount.sandbox_path(), sandbox_path))
    }
}

fn not_utf8(path: &Path) -> WorkspaceError {
    WorkspaceError::InvalidArgument(format!("bubblewrap config: path {path:?} is not UTF-8"))
}

/// Whether `path` is `prefix` or below it (`/usr` holds `/usr/bin`, not `/usrx`).
pub fn is_under(path: &str, prefix: &str) -> bool {
    prefix == "/" || path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}

/// What varies between workspaces of one driver (and between a workspace's agent
/// processes and its secret holders).
pub struct WorkspaceMounts<'a> {
    /// Host directory of the workspace, bound read-write at `dir`; `None` puts an empty
    /// tmpfs private to the exec there (the start-up probe, a secret holder's `HOME`).
    pub root: Option<&'a Path>,
    /// Where `root` (or the tmpfs) is mounted: `config.workspace_dir` for the workspace.
    pub dir: &'a str,
    /// Host files bound read-only at a sandbox path (a secret holder's checked program).
    pub read_only_files: &'a [(PathBuf, String)],
    pub network: bool,
    /// The sandbox of a resident supervisor: no tmpfs at `/tmp` and `/dev/shm`, only the
    /// directories; the supervisor mounts fresh ones there for each exec.
    pub tmp_per_exec: bool,
}

/// The bwrap options that build a workspace's sandbox, up to (not including) `--chdir`
/// and the command. Same for every exec of the workspace, so built once at provision.
///
/// Choices (see the module docs of `bubblewrap` for the why):
/// - every namespace unshared, the network too unless the spec asks for it; user
///   namespaces explicit (fail loudly rather than run without one), and none allowed
///   further down (`--disable-userns`: nested user namespaces are kernel attack surface);
/// - no `--new-session`: the sandbox's pid 1 must stay in the process group that
///   `setsid` created in front of bwrap, so killing that group reaches it without a race;
/// - `/` is bwrap's tmpfs, remounted read-only at the end; `/dev` read-only with a
///   size-capped `/dev/shm`; `/tmp` a size-capped tmpfs private to the exec.
pub fn bwrap_args(config: &BubblewrapConfig, table: &MountTable, workspace: &WorkspaceMounts<'_>) -> Vec<OsString> {
    let mut args: Vec<OsString> = Vec::new();
    push(&mut args, &["--unshare-all", "--unshare-user", "--disable-userns"]);
    if workspace.network {
        push(&mut args, &["--share-net"]);
    }
    let inner_id = super::config::SANDBOX_INNER_ID.to_string();
    let tmp_size = config.tmp_size_bytes.to_string();
    push(
        &mut args,
        &[
            "--die-with-parent",
            "--cap-drop",
            "ALL",
            "--uid",
            &inner_id,
            "--gid",
            &inner_id,
            "--hostname",
            &config.hostname,
        ],
    );
    for mount in &table.mounts {
        match mount {
            Mount::Bind { host, sandbox, writable } => {
                args.push(if *writable { "--bind" } else { "--ro-bind" }.into());
                args.push(host.clone().into_os_string());
                args.push(sandbox.into());
            }
            Mount::Symlink { target, sandbox } => {
                args.push("--symlink".into());
                args.push(target.clone().into_os_string());
                args.push(sandbox.into());
            }
        }
    }
    push(&mut args, &["--proc", "/proc", "--dev", "/dev"]);
    if workspace.tmp_per_exec {
        // bwrap's --dev has a /dev/shm directory already.
        push(&mut args, &["--remount-ro", "/dev", "--dir", "/tmp"]);
    } else {
        push(&mut args, &["--size", &tmp_size, "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]);
        push(&mut args, &["--size", &tmp_size, "--tmpfs", "/tmp"]);
    }
    match workspace.root {
        Some(root) => {
            args.push("--bind".into());
            args.push(root.as_os_str().to_owned());
        }
        // Size-capped like /tmp: a holder's HOME is memory too.
        None => push(&mut args, &["--size", &tmp_size, "--tmpfs"]),
    }
    args.push(workspace.dir.into());
    for (host, sandbox) in workspace.read_only_files {
        args.push("--ro-bind".into());
        args.push(host.clone().into_os_string());
        args.push(sandbox.into());
    }
    push(&mut args, &["--remount-ro", "/"]);
    args
}

fn push(args: &mut Vec<OsString>, items: &[&str]) {
    args.extend(items.iter().map(OsString::from));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert!(is_under("/usr/bin", "/usr"));
        assert!(is_under("/usr", "/usr"));
        assert!(!is_under("/usrx", "/usr"));
        assert!(is_under("/anything", "/"));
    }

    #[test]
    fn args_mount_in_order_and_hide_the_net() {
        let config = BubblewrapConfig::default();
        let table = MountTable {
            mounts: vec![
                Mount::Bind { host: "/usr".into(), sandbox: "/usr".into(), writable: false },
                Mount::Symlink { target: "usr/bin".into(), sandbox: "/bin".into() },
            ],
        };
        let root = Path::new("/data/ws-1");
        let mounts = |network| WorkspaceMounts {
            root: Some(root),
            dir: "/workspace",
            read_only_files: &[],
            network,
            tmp_per_exec: false,
        };
        let args = bwrap_args(&config, &table, &mounts(false));
        let joined = args.iter().map(|arg| arg.to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
        assert!(joined.starts_with("--unshare-all --unshare-user --disable-userns --die-with-parent"), "{joined}");
        assert!(!joined.contains("--share-net"));
        assert!(!joined.contains("--new-session"));
        assert!(joined.contains("--ro-bind /usr /usr --symlink usr/bin /bin"), "{joined}");
        assert!(joined.ends_with("--bind /data/ws-1 /workspace --remount-ro /"), "{joined}");
        let with_net = bwrap_args(&config, &table, &mounts(true));
        assert!(with_net.iter().any(|arg| arg == "--share-net"));
    }
}
