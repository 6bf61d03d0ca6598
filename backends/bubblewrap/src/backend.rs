//! [`BubblewrapBackend`]: one workspace, its files on the host, its processes in bwrap.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use nix::unistd::Pid;

use super::cgroup::WorkspaceCgroup;
use super::config::BubblewrapConfig;
use super::holder::{self, HolderContext};
use super::identity::WorkspaceUsers;
use super::launch::{DEFAULT_PATH, Launcher};
use super::network::SandboxNetns;
use super::process::{LiveProcesses, SandboxProcess};
use super::program::{self, SandboxView};
use super::supervised::{self, StartLine, Supervisor, SupervisorImage};
use berth_backend_host::hostfs::HostFs;
use berth_workspace::backend::{Backend, ByteStream, FileInfo, SpawnRole, SpawnSpec, Spawned, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

/// One workspace on the bubblewrap backend.
///
/// Files go through [`HostFs`] on the host directory (owned by the workspace's agent uid).
/// Each spawn is a fresh sandbox: own pid, mount, network, ipc, uts and user namespaces;
/// the workspace read-write at `workspace_dir`, system dirs read-only, a private `/tmp`.
/// What a process leaves running in the background dies with the exec's main process, and
/// nothing but the workspace's files carries over from one exec to the next. Secret
/// holders run apart ([`super::holder`]).
#[derive(Debug)]
pub struct BubblewrapBackend {
    files: HostFs,
    launcher: Arc<Launcher>,
    config: Arc<BubblewrapConfig>,
    /// Host users of this workspace (`None`: the node agent is not root, everything runs
    /// as its user).
    users: Option<WorkspaceUsers>,
    /// bwrap options of this workspace up to `--chdir` (built once at provision).
    sandbox_args: Vec<OsString>,
    /// The same for the supervisor's sandbox: `/tmp` and `/dev/shm` left to the
    /// supervisor, which mounts fresh ones per exec.
    supervisor_sandbox_args: Vec<OsString>,
    network: bool,
    /// The workspace's own network namespace (`spec.network`), joined by every sandbox.
    netns: Option<SandboxNetns>,
    /// prlimit options of this workspace (empty: prlimit is not run).
    limit_args: Vec<String>,
    /// The workspace spec's env: between the defaults and an exec's own env.
    base_env: BTreeMap<String, String>,
    /// The workspace's cgroup (`None`: rlimits only), joined by every sandbox.
    cgroup: Option<WorkspaceCgroup>,
    live: Arc<LiveProcesses>,
    /// The resident supervisor agent processes start from (`None`: a sandbox per spawn).
    supervisor: Option<Supervisor>,
    /// The limits of `limit_args` as setrlimit calls, for the supervisor.
    rlimits: Vec<berth_supervisor::wire::Rlimit>,
}

/// What [`BubblewrapBackend::new`] is built from (provision's result).
pub(super) struct BackendParts {
    pub files: HostFs,
    pub launcher: Arc<Launcher>,
    pub config: Arc<BubblewrapConfig>,
    pub users: Option<WorkspaceUsers>,
    pub sandbox_args: Vec<OsString>,
    pub supervisor_sandbox_args: Vec<OsString>,
    pub network: bool,
    pub netns: Option<SandboxNetns>,
    pub limit_args: Vec<String>,
    pub base_env: BTreeMap<String, String>,
    pub cgroup: Option<WorkspaceCgroup>,
    pub rlimits: Vec<berth_supervisor::wire::Rlimit>,
    /// Set when agent processes go through a supervisor.
    pub supervisor_image: Option<Arc<SupervisorImage>>,
}

impl BubblewrapBackend {
    pub(super) fn new(parts: BackendParts) -> Self {
        let BackendParts {
            files,
            launcher,
            config,
            users,
            sandbox_args,
            supervisor_sandbox_args,
            network,
            netns,
            limit_args,
            base_env,
            cgroup,
            rlimits,
            supervisor_image,
        } = parts;
        let live = Arc::new(LiveProcesses::default());
        let supervisor = supervisor_image
            .map(|image| Supervisor::new(image, launcher.clone(), config.supervisor_idle, live.clone()));
        Self {
            files,
            launcher,
            config,
            users,
            sandbox_args,
            supervisor_sandbox_args,
            network,
            netns,
            limit_args,
            base_env,
            cgroup,
            live,
            supervisor,
            rlimits,
        }
    }

    pub fn host_fs(&self) -> &HostFs {
        &self.files
    }

    /// The workspace root's physical host path.
    pub fn root(&self) -> &Path {
        self.files.host_root()
    }

    /// The host users this workspace's sandboxes run as (`None`: the node agent's own).
    pub fn users(&self) -> Option<WorkspaceUsers> {
        self.users
    }

    /// The workspace's cgroup, when the driver uses cgroups.
    pub fn cgroup(&self) -> Option<&WorkspaceCgroup> {
        self.cgroup.as_ref()
    }

    /// The cgroup every sandbox joins, re-created if a release removed it while this
    /// handle lived on.
    fn joined_cgroup(&self) -> Result<Option<&WorkspaceCgroup>> {
        if let Some(cgroup) = &self.cgroup {
            cgroup.ensure()?;
        }
        Ok(self.cgroup.as_ref())
    }

    /// Sandboxes of this workspace still running.
    pub fn running(&self) -> usize {
        self.live.count()
    }

    /// Kills every sandbox of this workspace still running, and its supervisor with every
    /// command in it; returns how many processes there were.
    pub fn kill_all(&self) -> usize {
        let killed = self.live.kill_all();
        if let Some(supervisor) = &self.supervisor {
            supervisor.kill();
        }
        killed
    }

    /// Whether agent processes start from a resident supervisor.
    pub fn supervised(&self) -> bool {
        self.supervisor.is_some()
    }

    /// The host pid of the workspace's supervisor, when one runs.
    pub async fn supervisor_pid(&self) -> Option<u32> {
        self.supervisor.as_ref()?.pid().await
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

    /// bwrap's command line after its `--args`: its options, prlimit, argv.
    fn bwrap_line(&self, spec: &SpawnSpec) -> Vec<OsString> {
        let launcher = &self.launcher;
        let mut line = Vec::with_capacity(self.sandbox_args.len() + spec.argv.len() + 12);
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

    async fn spawn_agent(&self, spec: &SpawnSpec) -> Result<Spawned> {
        // Refuses a cwd that is missing, not a directory or leads out of the root with the
        // same errors as every host backend. The sandbox then resolves the same path in its
        // own view, where a symlink swapped in meanwhile can only reach sandbox paths.
        self.files.resolve_dir(&spec.cwd).await?;
        let env = self.env_for(spec);
        if let Some(supervisor) = &self.supervisor {
            // The supervisor reports a missing program exactly (execve's errno), so the
            // host-side lookup below is not needed.
            let cwd = spec.cwd.under(&self.launcher.workspace_dir);
            // bwrap sets PWD to its --chdir; so does the supervised path.
            let mut env = env;
            env.insert("PWD".to_owned(), cwd.clone());
            let request = berth_supervisor::wire::Request {
                argv: spec.argv.iter().map(|arg| arg.as_bytes().to_vec()).collect(),
                env: env.iter().map(|(name, value)| format!("{name}={value}").into_bytes()).collect(),
                cwd: supervised::path_bytes(&cwd),
                beneath: Vec::new(),
                search_path: env.get("PATH").map(|path| path.as_bytes().to_vec()).unwrap_or_default(),
                rlimits: self.rlimits.clone(),
                private_tmp_bytes: Some(self.config.tmp_size_bytes),
            };
            return supervisor.spawn(&request, || self.supervisor_line(supervisor)).await;
        }
        let program = &spec.argv[0];
        let view = SandboxView {
            table: &self.launcher.table,
            workspace_dir: &self.launcher.workspace_dir,
            files: &self.files,
        };
        let search_path = env.get("PATH").map(String::as_str).unwrap_or_default();
        program::ensure_exists(&view, program, search_path, &spec.cwd).await?;
        let mut line =
            self.launcher.host_chain(self.users.map(|users| users.agent), self.joined_cgroup()?, &self.net_prefix());
        line.extend(self.bwrap_line(spec));
        self.start(line, &env, None)
    }

    async fn spawn_holder(&self, spec: &SpawnSpec) -> Result<Spawned> {
        let Some(users) = self.users else {
            return Err(WorkspaceError::BackendUnavailable {
                backend: "bubblewrap",
                reason: "a secret holder needs a host uid of its own, which only a node agent running as root \
                         can give"
                    .into(),
            });
        };
        let context = HolderContext {
            config: &self.config,
            table: &self.launcher.table,
            files: &self.files,
            network: self.network,
            prlimit_path: &self.launcher.prlimit_path,
            limit_args: &self.limit_args,
        };
        let launch = holder::prepare(&context, spec).await?;
        let mut line = self.launcher.host_chain(Some(users.holder), self.joined_cgroup()?, &self.net_prefix());
        line.extend(launch.bwrap_line);
        self.start(line, &launch.env, launch.program_copy)
    }

    /// The host command line of the workspace's supervisor sandbox: the same chain and
    /// bwrap options as a per-spawn sandbox, plus the two capabilities the supervisor keeps
    /// inside it (see [`super::supervised`]), running the supervisor.
    fn supervisor_line(&self, supervisor: &Supervisor) -> Result<StartLine> {
        let mut line =
            self.launcher.host_chain(self.users.map(|users| users.agent), self.joined_cgroup()?, &self.net_prefix());
        line.extend(self.supervisor_sandbox_args.iter().cloned());
        for arg in ["--cap-add", "CAP_SYS_ADMIN", "--cap-add", "CAP_SETPCAP", "--chdir"] {
            line.push(arg.into());
        }
        line.push(self.launcher.workspace_dir.clone().into());
        line.push("--".into());
        line.extend(supervisor.program_args());
        Ok(StartLine { line })
    }

    /// The host programs that join the workspace's network namespace (empty without
    /// network); they need root, so the chain runs them before its `setpriv`.
    fn net_prefix(&self) -> Vec<OsString> {
        self.netns.as_ref().map(SandboxNetns::host_prefix).unwrap_or_default()
    }

    fn start(
        &self,
        line: Vec<OsString>,
        env: &BTreeMap<String, String>,
        program_copy: Option<tempfile::TempDir>,
    ) -> Result<Spawned> {
        let mut child = self.launcher.start(line, env)?;
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
            control: Box::new(SandboxProcess::new(child, group, self.live.clone()).keeping(program_copy)),
        })
    }
}

impl Drop for BubblewrapBackend {
    /// The last handle of a workspace that was never released (a test, a driver going
    /// away) takes its empty cgroup with it.
    fn drop(&mut self) {
        if let Some(cgroup) = &self.cgroup {
            cgroup.remove_if_empty();
        }
    }
}

#[async_trait]
impl Backend for BubblewrapBackend {
    fn name(&self) -> &'static str {
        "bubblewrap"
    }

    /// Starts `argv` in a fresh sandbox of this workspace, as its agent or as a secret
    /// holder ([`super::holder`]).
    ///
    /// Must be called from a thread that outlives the process (any runtime worker does):
    /// bwrap's `--die-with-parent` is `PR_SET_PDEATHSIG`, which fires when the *thread*
    /// that spawned it exits — e.g. an idle `spawn_blocking` thread.
    async fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned> {
        spec.validate()?;
        match spec.role {
            SpawnRole::Agent => self.spawn_agent(spec).await,
            SpawnRole::SecretHolder => self.spawn_holder(spec).await,
        }
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
