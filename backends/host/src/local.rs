//! The `local` backend: a host directory and plain host processes, no sandbox.
//!
//! Files go through [`HostFs`] (confined by cap-std). Processes run as the node agent's
//! user in their own process group, with a cleared environment; the group is what `kill`
//! and a dropped [`ProcessControl`] take down, so grandchildren die with the command. A
//! process that leaves the group on purpose (`setsid`, `setpgid`) escapes that — the
//! sandboxed backends (bubblewrap, docker) use a pid namespace instead.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::hostfs::HostFs;
use berth_workspace::backend::{
    Backend, BackendRef, ByteStream, ExitInfo, FileInfo, ProcessControl, SpawnSpec, Spawned, WriteOptions,
};
use berth_workspace::driver::{BackendDriver, ProvisionContext};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;
use berth_workspace::path::RelPath;

/// `PATH` of every local process unless the workspace or the exec sets its own.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One workspace on the local backend.
#[derive(Debug)]
pub struct LocalBackend {
    files: HostFs,
    /// The workspace spec's env: between the defaults and an exec's own env.
    base_env: BTreeMap<String, String>,
}

impl LocalBackend {
    /// Opens an existing root directory. Blocking (see [`HostFs::open`]).
    pub fn open(root: &Path) -> Result<Self> {
        Ok(Self::from_host_fs(HostFs::open(root)?))
    }

    pub fn from_host_fs(files: HostFs) -> Self {
        Self { files, base_env: BTreeMap::new() }
    }

    /// Sets the env every process of this workspace starts with (an exec's env wins).
    pub fn with_env(mut self, env: BTreeMap<String, String>) -> Self {
        self.base_env = env;
        self
    }

    pub fn host_fs(&self) -> &HostFs {
        &self.files
    }

    /// The workspace root's physical host path.
    pub fn root(&self) -> &Path {
        self.files.host_root()
    }
}

/// Where `execvp` would find `program` with `path` as PATH in a child whose working directory
/// is `cwd`: the first executable regular file (an empty or relative entry is relative to
/// `cwd`). `None` for a name with a slash (the exec resolves it as it is) or when nothing
/// matches (the spawn then reports the program missing as before).
fn find_program(program: &str, path: &str, cwd: &Path) -> Option<PathBuf> {
    if program.contains('/') || program.is_empty() {
        return None;
    }
    path.split(':').map(|dir| cwd.join(dir).join(program)).find(|candidate| {
        std::fs::metadata(candidate).is_ok_and(|meta| meta.is_file())
            && nix::unistd::access(candidate.as_path(), nix::unistd::AccessFlags::X_OK).is_ok()
    })
}

#[async_trait]
impl Backend for LocalBackend {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned> {
        spec.validate()?;
        let cwd = self.files.resolve_dir(&spec.cwd).await?;
        let program = &spec.argv[0];
        let path = spec.env.get("PATH").or_else(|| self.base_env.get("PATH")).map_or(DEFAULT_PATH, String::as_str);
        // Found here as the child's exec would find it: a program named by path spawns
        // without copying this process (`posix_spawn`), where a bare name searched in a PATH
        // of the child's own makes the standard library fork the whole node agent.
        let mut command = Command::new(find_program(program, path, &cwd).as_deref().unwrap_or(Path::new(program)));
        command
            .arg0(program)
            .args(&spec.argv[1..])
            .env_clear()
            .env("PATH", DEFAULT_PATH)
            .env("HOME", self.files.host_root())
            .env("LANG", "C.UTF-8")
            .envs(&self.base_env)
            .envs(&spec.env)
            .current_dir(&cwd)
            // A new process group led by the child: the unit `kill` signals.
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // LocalProcess kills the whole group itself; tokio's kill_on_drop would only
            // reach the leader.
            .kill_on_drop(false);
        let mut child = command
            .spawn()
            .map_err(|error| WorkspaceError::SpawnFailed { program: program.clone(), reason: error.to_string() })?;
        let missing_pipe =
            || WorkspaceError::Backend { backend: "local", message: "spawned process has no piped stdio".into() };
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
            control: Box::new(LocalProcess { child, group, reaped: false }),
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

/// A local process and its process group.
struct LocalProcess {
    child: Child,
    /// The group id, equal to the leader's pid (`process_group(0)`).
    group: Pid,
    /// Set once `wait` returned: from then on dropping does not kill.
    reaped: bool,
}

#[async_trait]
impl ProcessControl for LocalProcess {
    async fn wait(&mut self) -> Result<ExitInfo> {
        // Cancel-safe: tokio's Child::wait keeps its state in the child.
        let status = self.child.wait().await.map_err(|source| WorkspaceError::Io {
            op: "wait for process",
            path: self.group.to_string(),
            source,
        })?;
        self.reaped = true;
        Ok(ExitInfo { code: status.code(), signal: status.signal() })
    }

    async fn kill(&mut self) -> Result<()> {
        // Also after the leader was reaped: members still alive keep the group id reserved
        // (Linux does not reuse a pid while it names a process group), so this reaches
        // exactly the leftovers of this command.
        kill_group(self.group)
    }
}

impl Drop for LocalProcess {
    fn drop(&mut self) {
        if !self.reaped
            && let Err(error) = kill_group(self.group)
        {
            tracing::warn!(group = %self.group, %error, "could not kill a dropped process group");
        }
        // The leader's zombie is reaped by tokio's orphan queue once it dies.
    }
}

fn kill_group(group: Pid) -> Result<()> {
    match killpg(group, Signal::SIGKILL) {
        // ESRCH: the group is already gone, which is what kill wants.
        Ok(()) | Err(Errno::ESRCH) => Ok(()),
        Err(errno) => Err(WorkspaceError::Io {
            op: "kill process group",
            path: group.to_string(),
            source: std::io::Error::from(errno),
        }),
    }
}

/// Hands out [`LocalBackend`]s. There is no runtime to start or stop: provisioning opens
/// the root, release and destroy only forget the handle (callers holding one keep working).
#[derive(Debug, Default)]
pub struct LocalDriver {
    /// Open backends by workspace id, with the root each was opened at.
    backends: Mutex<HashMap<WorkspaceId, (PathBuf, Arc<LocalBackend>)>>,
}

impl LocalDriver {
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<WorkspaceId, (PathBuf, Arc<LocalBackend>)>> {
        // A panic while holding this lock cannot leave the map inconsistent (single
        // insert/remove), so a poisoned lock is still usable.
        self.backends.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait]
impl BackendDriver for LocalDriver {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn provision(&self, context: ProvisionContext<'_>) -> Result<BackendRef> {
        context.spec.validate()?;
        if let Some((root, backend)) = self.lock().get(context.workspace_id)
            && root == context.root
        {
            return Ok(backend.clone());
        }
        if context.spec.memory_bytes > 0
            || context.spec.cpu_millis > 0
            || context.spec.pids > 0
            || context.spec.image.is_some()
        {
            tracing::warn!(
                ws_id = %context.workspace_id,
                "the local backend does not enforce resource limits or images; ignoring them"
            );
        }
        let root = context.root.to_path_buf();
        let env = context.spec.env.clone();
        let opened_root = root.clone();
        let backend = tokio::task::spawn_blocking(move || LocalBackend::open(&opened_root))
            .await
            .map_err(|error| WorkspaceError::Backend {
                backend: "local",
                message: format!("opening the workspace root failed: {error}"),
            })??
            .with_env(env);
        let backend = Arc::new(backend);
        // Two racing provisions both open the root; the later insert wins and both handles
        // serve the same directory, which keeps provision idempotent.
        self.lock().insert(context.workspace_id.clone(), (root, backend.clone()));
        Ok(backend)
    }

    async fn release(&self, workspace_id: &WorkspaceId) -> Result<()> {
        self.lock().remove(workspace_id);
        Ok(())
    }

    async fn destroy(&self, workspace_id: &WorkspaceId) -> Result<()> {
        self.lock().remove(workspace_id);
        Ok(())
    }
}
