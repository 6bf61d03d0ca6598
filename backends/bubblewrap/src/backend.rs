//! [`BubblewrapBackend`]: one workspace, its files on the host, its processes in bwrap.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use nix::unistd::Pid;
use tokio::process::Command;

use super::network::{ENV_PATH, SETPRIV_PATH, SandboxNetns};
use super::process::{LiveProcesses, SandboxProcess};
use super::program::{self, SandboxView};
use super::sandbox::MountTable;
use berth_backend_host::hostfs::HostFs;
use berth_workspace::backend::{Backend, ByteStream, FileInfo, SpawnSpec, Spawned, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

/// `PATH` of every sandboxed process unless the workspace or the exec sets its own.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How to start the sandboxes of one workspace; shared by the driver's backends.
#[derive(Debug)]
pub(super) struct Launcher {
    pub setsid_path: PathBuf,
    pub bwrap_path: PathBuf,
    pub prlimit_path: PathBuf,
    /// Host uid/gid to switch to before exec (`None`: stay the agent's user).
    pub run_as: Option<(u32, u32)>,
    pub table: Arc<MountTable>,
    pub workspace_dir: String,
}

/// One workspace on the bubblewrap backend.
///
/// Files go through [`HostFs`] on the host directory (owned by the sandbox user). Each
/// spawn is a fresh sandbox: own pid, mount, network, ipc, uts and user namespaces; the
/// workspace read-write at `workspace_dir`, system dirs read-only, a private `/tmp`. What a
/// process leaves running in the background dies with the exec's main process, and
/// nothing but the workspace's files carries over from one exec to the next.
#[derive(Debug)]
pub struct BubblewrapBackend {
    files: HostFs,
    launcher: Arc<Launcher>,
    /// bwrap options of this workspace up to `--chdir` (built once at provision).
    sandbox_args: Vec<OsString>,
    /// prlimit options of this workspace (empty: prlimit is not run).
    limit_args: Vec<String>,
    /// The workspace spec's env: between the defaults and an exec's own env.
    base_env: BTreeMap<String, String>,
    live: Arc<LiveProcesses>,
    /// The workspace's own network namespace (`spec.network`); `None`: no network at all.
    network: Option<SandboxNetns>,
}

impl BubblewrapBackend {
    pub(super) fn new(
        files: HostFs,
        launcher: Arc<Launcher>,
        sandbox_args: Vec<OsString>,
        limit_args: Vec<String>,
        base_env: BTreeMap<String, String>,
    ) -> Self {
        Self {
            files,
            launcher,
            sandbox_args,
            limit_args,
            base_env,
            live: Arc::new(LiveProcesses::default()),
            network: None,
        }
    }

    /// Runs every sandbox of this workspace in `network` (see [`super::network`]).
    pub(super) fn with_network(mut self, network: Option<SandboxNetns>) -> Self {
        self.network = network;
        self
    }

    /// Host programs that go first in the launch chain, before any switch of user: joining
    /// the workspace's network namespace needs root. Empty without network.
    fn host_prefix(&self) -> Vec<OsString> {
        self.network.as_ref().map(SandboxNetns::host_prefix).unwrap_or_default()
    }

    pub fn host_fs(&self) -> &HostFs {
        &self.files
    }

    /// The workspace root's physical host path.
    pub fn root(&self) -> &Path {
        self.files.host_root()
    }

    /// Sandboxes of this workspace still running.
    pub fn running(&self) -> usize {
        self.live.count()
    }

    /// Kills every sandbox of this workspace still running; returns how many there were.
    pub fn kill_all(&self) -> usize {
        self.live.kill_all()
    }

    /// The env a process starts with: defaults, then the workspace's, then the exec's.
    fn env_for(&self, spec: &SpawnSpec) -> BTreeMap<String, String> {
        let mut env = BTreeMap::from([
            ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
            ("HOME".to_owned(), self.launcher.workspace_dir.clone()),
            ("LANG".to_owned(), "C.UTF-8".to_owned()),
        ]);
        env.extend(self.base_env.iter().map(|(name, value)| (name.clone(), value.clone())));
        env.extend(spec.env.iter().map(|(name, value)| (name.clone(), value.clone())));
        env
    }

    /// The full command line after `setsid`: bwrap, its options, prlimit, argv.
    fn command_line(&self, spec: &SpawnSpec) -> Vec<OsString> {
        let launcher = &self.launcher;
        let mut line = Vec::with_capacity(self.sandbox_args.len() + spec.argv.len() + 12);
        line.push(launcher.bwrap_path.clone().into_os_string());
        line.extend(self.sandbox_args.iter().cloned());
        line.push("--chdir".into());
        line.push(spec.cwd.under(&launcher.workspace_dir).into());
        line.push("--".into());
        if !self.limit_args.is_empty() {
            line.push(launcher.prlimit_path.clone().into_os_string());
            line.extend(self.limit_args.iter().map(OsString::from));
            line.push("--".into());
        }
        line.extend(spec.argv.iter().map(OsString::from));
        line
    }
}

#[async_trait]
impl Backend for BubblewrapBackend {
    fn name(&self) -> &'static str {
        "bubblewrap"
    }

    /// Starts `argv` in a fresh sandbox of this workspace.
    ///
    /// Must be called from a thread that outlives the process (any runtime worker does):
    /// bwrap's `--die-with-parent` is `PR_SET_PDEATHSIG`, which fires when the *thread*
    /// that spawned it exits — e.g. an idle `spawn_blocking` thread.
    async fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned> {
        spec.validate()?;
        // Refuses a cwd that is missing, not a directory or leads out of the root with the
        // same errors as every host backend. The sandbox then resolves the same path in its
        // own view, where a symlink swapped in meanwhile can only reach sandbox paths.
        self.files.resolve_dir(&spec.cwd).await?;
        let env = self.env_for(spec);
        let program = &spec.argv[0];
        let view = SandboxView {
            table: &self.launcher.table,
            workspace_dir: &self.launcher.workspace_dir,
            files: &self.files,
        };
        let search_path = env.get("PATH").map(String::as_str).unwrap_or_default();
        program::ensure_exists(&view, program, search_path, &spec.cwd).await?;

        let mut chain = self.host_prefix();
        let joins_netns = !chain.is_empty();
        if joins_netns {
            // nsenter runs as root with a fixed env (the loader of a root process obeys
            // LD_PRELOAD and friends); setpriv drops to the sandbox user and no
            // supplementary groups, and only then `env -i` sets the sandbox's env. Its
            // values are in env's argv for the moment until it execs setsid: a stopgap
            // until the env travels to bwrap by file descriptor.
            if let Some((uid, gid)) = self.launcher.run_as {
                chain.extend(
                    [
                        SETPRIV_PATH.to_owned(),
                        format!("--reuid={uid}"),
                        format!("--regid={gid}"),
                        "--clear-groups".into(),
                    ]
                    .map(OsString::from),
                );
                chain.push("--".into());
            }
            chain.extend([OsString::from(ENV_PATH), "-i".into(), "--".into()]);
            chain.extend(env.iter().map(|(name, value)| OsString::from(format!("{name}={value}"))));
        }
        chain.push(self.launcher.setsid_path.clone().into_os_string());
        chain.extend(self.command_line(spec));
        let host_env =
            if joins_netns { BTreeMap::from([("PATH".to_owned(), DEFAULT_PATH.to_owned())]) } else { env.clone() };
        let mut command = Command::new(&chain[0]);
        command
            .args(&chain[1..])
            // The env goes to bwrap, which passes it on: not `--setenv`, so values stay out
            // of the command line that every host user can read in /proc.
            .env_clear()
            .envs(&host_env)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // SandboxProcess kills the whole group itself; tokio would only reach bwrap.
            .kill_on_drop(false);
        if let (false, Some((uid, gid))) = (joins_netns, self.launcher.run_as) {
            // std drops supplementary groups too when root switches uid.
            command.uid(uid).gid(gid);
        }
        let mut child = command.spawn().map_err(|error| WorkspaceError::BackendUnavailable {
            backend: "bubblewrap",
            reason: format!("cannot start {}: {error}", chain[0].to_string_lossy()),
        })?;
        let missing_pipe =
            || WorkspaceError::Backend { backend: "bubblewrap", message: "spawned sandbox has no piped stdio".into() };
        let (Some(pid), Some(stdin), Some(stdout), Some(stderr)) =
            (child.id(), child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Err(missing_pipe());
        };
        let group = Pid::from_raw(i32::try_from(pid).map_err(|_| missing_pipe())?);
        Ok(Spawned {
            stdin: Box::pin(stdin),
            stdout: Box::pin(stdout),
            stderr: Box::pin(stderr),
            control: Box::new(SandboxProcess::new(child, group, self.live.clone())),
        })
    }

    async fn read_file(&self, path: &RelPath) -> Result<ByteStream> {
        self.files.read_file(path).await
    }

    async fn write_file(&self, path: &RelPath, data: ByteStream, options: WriteOptions) -> Result<u64> {
        self.files.write_file(path, data, options).await
    }

    async fn stat(&self, path: &RelPath) -> Result<FileInfo> {
        self.files.stat(path).await
    }

    async fn list_dir(&self, path: &RelPath) -> Result<Vec<FileInfo>> {
        self.files.list_dir(path).await
    }

    async fn remove(&self, path: &RelPath, recursive: bool) -> Result<bool> {
        self.files.remove(path, recursive).await
    }

    async fn mkdir(&self, path: &RelPath, parents: bool) -> Result<()> {
        self.files.mkdir(path, parents).await
    }

    async fn append_file(&self, path: &RelPath, data: Bytes) -> Result<u64> {
        self.files.append_file(path, data).await
    }

    async fn rename(&self, from: &RelPath, to: &RelPath) -> Result<()> {
        self.files.rename(from, to).await
    }

    async fn symlink(&self, target: &str, link: &RelPath) -> Result<()> {
        self.files.symlink(target, link).await
    }
}
