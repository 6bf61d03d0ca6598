//! Starting a sandbox from the host: the fixed chain of host programs in front of the
//! sandbox, and how the caller's environment gets past them without touching them.
//!
//! Everything that runs before the sandbox exists runs on the host, outside every
//! namespace: whatever the caller controls must not reach it. So the host chain starts
//! with a fixed environment (only `PATH`), and the sandbox's environment travels as
//! bwrap options (`--clearenv`, `--setenv NAME VALUE`) in a sealed memfd that bwrap reads
//! with `--args 3`: the values are neither in a host process's environment (no
//! `LD_PRELOAD` for `setsid` or `bwrap`) nor in any argv (`/proc/*/cmdline` is
//! world-readable). The memfd is created close-on-exec and placed at fd 3 only in the
//! child, between fork and exec, so a process spawned concurrently by another thread
//! never inherits it.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{Seek as _, SeekFrom, Write as _};
use std::os::unix::ffi::OsStrExt as _;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use command_fds::{CommandFdExt as _, FdMapping};
use nix::sys::memfd::{MFdFlags, memfd_create};
use tokio::process::{Child, Command};

use super::cgroup::WorkspaceCgroup;
use super::identity::HostUser;
use super::sandbox::MountTable;
use berth_workspace::error::{Result, WorkspaceError};

/// `PATH` of every sandboxed process unless the workspace or the exec sets its own, and
/// the only variable of the host chain's environment.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The fd at which bwrap reads its `--args`.
const ARGS_FD: i32 = 3;
/// The shell that joins a cgroup at the head of the chain: writes its own pid into each
/// `cgroup.procs` named before `--`, then execs the rest (same pid).
const JOIN_CGROUP_SCRIPT: &str =
    r#"while [ "$1" != -- ]; do echo $$ > "$1" || exit 126; shift; done; shift; exec "$@""#;
/// Where that shell is.
const SHELL: &str = "/bin/sh";

/// How to start the sandboxes of one driver; shared by its backends.
#[derive(Debug)]
pub(super) struct Launcher {
    pub setsid_path: PathBuf,
    pub setpriv_path: PathBuf,
    pub bwrap_path: PathBuf,
    pub prlimit_path: PathBuf,
    pub table: Arc<MountTable>,
    pub workspace_dir: String,
}

impl Launcher {
    /// The host programs that run before the sandbox exists, in order, ending with
    /// `bwrap --args 3`; the caller appends bwrap's other options and the command.
    ///
    /// ```text
    /// [/bin/sh -c <join> berth-join <cgroup.procs…> --] setsid [<netns: nsenter --net=… -->]
    ///     [setpriv --reuid U --regid G --clear-groups --] bwrap --args 3 …
    /// ```
    ///
    /// Each program execs the next in the same process (none forks: `setsid` is not a
    /// group leader when it starts), so the spawned pid is bwrap's and leads the new
    /// process group that [`super::process`] kills. Every step before the `setpriv` runs as
    /// the node agent's user (root when `user` is given); a step that needs privilege
    /// (joining a network namespace) goes before it, after `setsid`. The cgroup is joined
    /// first, so nothing of the sandbox ever runs outside it.
    pub(super) fn host_chain(
        &self,
        user: Option<HostUser>,
        cgroup: Option<&WorkspaceCgroup>,
        netns: &[OsString],
    ) -> Vec<OsString> {
        let mut chain: Vec<OsString> = Vec::new();
        if let Some(cgroup) = cgroup {
            chain.extend([SHELL.into(), "-c".into(), JOIN_CGROUP_SCRIPT.into(), "berth-join".into()]);
            chain.extend(cgroup.procs_files().into_iter().map(OsString::from));
            chain.push("--".into());
        }
        chain.push(self.setsid_path.clone().into());
        // Joining the workspace's network namespace ([`super::network`]) needs root.
        chain.extend(netns.iter().cloned());
        if let Some(user) = user {
            chain.push(self.setpriv_path.clone().into());
            chain.push(format!("--reuid={}", user.uid).into());
            chain.push(format!("--regid={}", user.gid).into());
            chain.push("--clear-groups".into());
            chain.push("--".into());
        }
        chain.push(self.bwrap_path.clone().into());
        chain.push("--args".into());
        chain.push(ARGS_FD.to_string().into());
        chain
    }

    /// Runs `line` (a [`Self::host_chain`] followed by the rest of bwrap's command line)
    /// with a fixed environment, bwrap reading `sandbox_env` from fd 3, stdio piped.
    pub(super) fn start(&self, line: Vec<OsString>, sandbox_env: &BTreeMap<String, String>) -> Result<Child> {
        self.start_with(line, sandbox_env, [Stdio::piped(), Stdio::piped(), Stdio::piped()], Vec::new())
    }

    /// [`Self::start`] with the given stdio and further fds placed at fixed numbers in the
    /// child (a supervisor's control socket and binary, [`super::supervised`]).
    pub(super) fn start_with(
        &self,
        line: Vec<OsString>,
        sandbox_env: &BTreeMap<String, String>,
        stdio: [Stdio; 3],
        extra_fds: Vec<(std::os::fd::OwnedFd, i32)>,
    ) -> Result<Child> {
        let (program, args) = line.split_first().ok_or_else(|| WorkspaceError::Backend {
            backend: "bubblewrap",
            message: "empty host command line".into(),
        })?;
        let env_fd = env_memfd(sandbox_env)?;
        let [stdin, stdout, stderr] = stdio;
        let mut command = Command::new(program);
        command
            .args(args)
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr)
            // SandboxProcess kills the whole group itself; tokio would only reach bwrap.
            .kill_on_drop(false);
        let mut mappings = vec![FdMapping { parent_fd: env_fd, child_fd: ARGS_FD }];
        mappings.extend(extra_fds.into_iter().map(|(parent_fd, child_fd)| FdMapping { parent_fd, child_fd }));
        command.fd_mappings(mappings).map_err(|error| WorkspaceError::Backend {
            backend: "bubblewrap",
            message: format!("cannot pass fds to the sandbox: {error}"),
        })?;
        command.spawn().map_err(|error| WorkspaceError::BackendUnavailable {
            backend: "bubblewrap",
            reason: format!("cannot start {}: {error}", program.to_string_lossy()),
        })
    }
}

/// bwrap options that give the sandbox exactly `env`.
pub fn env_args(env: &BTreeMap<String, String>) -> Vec<&str> {
    let mut args = Vec::with_capacity(1 + 3 * env.len());
    args.push("--clearenv");
    for (name, value) in env {
        args.extend(["--setenv", name.as_str(), value.as_str()]);
    }
    args
}

/// A close-on-exec memfd holding `env` as NUL-terminated bwrap options, read from the
/// start. Names and values hold no NUL (`validate_env` refuses them).
fn env_memfd(env: &BTreeMap<String, String>) -> Result<std::os::fd::OwnedFd> {
    let failed = |source: std::io::Error| WorkspaceError::Io { op: "write sandbox env", path: "memfd".into(), source };
    let fd = memfd_create(c"berth-bwrap-env", MFdFlags::MFD_CLOEXEC).map_err(|errno| failed(errno.into()))?;
    let mut file = std::fs::File::from(fd);
    let mut bytes = Vec::new();
    for arg in env_args(env) {
        bytes.extend_from_slice(std::ffi::OsStr::new(arg).as_bytes());
        bytes.push(0);
    }
    file.write_all(&bytes).map_err(failed)?;
    file.seek(SeekFrom::Start(0)).map_err(failed)?;
    Ok(file.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launcher() -> Launcher {
        Launcher {
            setsid_path: "/usr/bin/setsid".into(),
            setpriv_path: "/usr/bin/setpriv".into(),
            bwrap_path: "/usr/bin/bwrap".into(),
            prlimit_path: "/usr/bin/prlimit".into(),
            table: Arc::new(MountTable::default()),
            workspace_dir: "/workspace".into(),
        }
    }

    #[test]
    fn the_chain_drops_to_the_user_right_before_bwrap() {
        let chain = launcher().host_chain(Some(HostUser { uid: 200000, gid: 200000 }), None, &[]);
        let joined: Vec<&str> = chain.iter().map(|arg| arg.to_str().unwrap()).collect();
        assert_eq!(
            joined,
            [
                "/usr/bin/setsid",
                "/usr/bin/setpriv",
                "--reuid=200000",
                "--regid=200000",
                "--clear-groups",
                "--",
                "/usr/bin/bwrap",
                "--args",
                "3"
            ]
        );
        let unprivileged = launcher().host_chain(None, None, &[]);
        assert_eq!(unprivileged, ["/usr/bin/setsid", "/usr/bin/bwrap", "--args", "3"]);
        let networked = launcher().host_chain(
            Some(HostUser { uid: 200000, gid: 200000 }),
            None,
            &["/usr/bin/nsenter".into(), "--net=/run/netns/x".into(), "--".into()],
        );
        let joined: Vec<&str> = networked.iter().map(|arg| arg.to_str().unwrap()).collect();
        assert_eq!(
            joined[..5],
            ["/usr/bin/setsid", "/usr/bin/nsenter", "--net=/run/netns/x", "--", "/usr/bin/setpriv"]
        );
    }

    #[test]
    fn env_becomes_bwrap_options() {
        let env = BTreeMap::from([("A".to_owned(), "x y".to_owned()), ("B".to_owned(), String::new())]);
        assert_eq!(env_args(&env), ["--clearenv", "--setenv", "A", "x y", "--setenv", "B", ""]);
    }
}
