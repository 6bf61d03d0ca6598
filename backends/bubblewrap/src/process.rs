//! One sandboxed process as seen from the host, and the set of them per workspace.
//!
//! The process tree of an exec: `setsid` execs into `bwrap` (so bwrap leads a new session
//! and process group, id = its pid), bwrap clones the sandbox's pid 1 (its init, same
//! group), which forks the command. Killing the group kills bwrap and the init; when a pid
//! namespace's init dies the kernel kills everything else in it, including processes that
//! left the group with `setsid`. So one `killpg` takes down the whole tree. Once bwrap is
//! reaped there is nothing left to signal: when it exits on its own it has waited for its
//! init, which waited for the rest of its namespace; when it was killed, so was the init,
//! and the remaining processes are already dying with the namespace.

use std::collections::HashMap;
use std::os::unix::process::ExitStatusExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::Child;

use berth_workspace::backend::{ExitInfo, ProcessControl};
use berth_workspace::error::{Result, WorkspaceError};

/// One live process of a workspace.
#[derive(Debug)]
enum Live {
    /// A sandbox of its own: its process group id (= bwrap's pid).
    Sandbox(Pid),
    /// A command of the workspace's supervisor ([`super::supervised`]): killing the
    /// supervisor kills it; the flag tells its `wait` that this was a kill.
    Supervised(Arc<AtomicBool>),
}

/// The live sandboxes and supervised commands of one workspace, so release/destroy can
/// kill them.
#[derive(Debug, Default)]
pub struct LiveProcesses {
    /// Not yet reaped, by a per-spawn key.
    groups: Mutex<HashMap<u64, Live>>,
    next_key: AtomicU64,
}

impl LiveProcesses {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Live>> {
        // Single inserts and removals: a panic cannot leave the map half-updated.
        self.groups.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn register(&self, group: Pid) -> u64 {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(key, Live::Sandbox(group));
        key
    }

    pub(super) fn forget(&self, key: u64) {
        self.lock().remove(&key);
    }

    /// Kills every sandbox still running and marks every supervised command killed (the
    /// caller then kills the supervisor). A sandbox reaped concurrently may have left the
    /// map only after its reap; its pid could then in theory be reused within that window,
    /// which needs the whole pid space to wrap in microseconds.
    pub fn kill_all(&self) -> usize {
        let groups = self.lock();
        for live in groups.values() {
            match live {
                Live::Sandbox(group) => {
                    if let Err(error) = kill_tree(*group) {
                        tracing::warn!(group = %group, %error, "could not kill a sandbox");
                    }
                }
                Live::Supervised(killed) => killed.store(true, Ordering::SeqCst),
            }
        }
        groups.len()
    }

    pub fn count(&self) -> usize {
        self.lock().len()
    }
}

/// A running sandbox: the `setsid`/`bwrap` child and its process group.
pub struct SandboxProcess {
    child: Child,
    /// bwrap's pid, which is also its process group id once `setsid` ran.
    group: Pid,
    /// Set once `wait` returned: the tree is gone or dying and the pid may be reused, so
    /// nothing is signalled any more.
    reaped: Option<ExitInfo>,
    live: Arc<LiveProcesses>,
    key: u64,
    /// A host directory the sandbox binds (a secret holder's program copy), removed when
    /// this handle goes.
    _kept: Option<tempfile::TempDir>,
}

impl SandboxProcess {
    pub fn new(child: Child, group: Pid, live: Arc<LiveProcesses>) -> Self {
        let key = live.register(group);
        Self { child, group, reaped: None, live, key, _kept: None }
    }

    /// Keeps `dir` until this handle is dropped.
    pub fn keeping(mut self, dir: Option<tempfile::TempDir>) -> Self {
        self._kept = dir;
        self
    }
}

#[async_trait]
impl ProcessControl for SandboxProcess {
    async fn wait(&mut self) -> Result<ExitInfo> {
        if let Some(exit) = self.reaped {
            return Ok(exit);
        }
        // Cancel-safe: tokio's Child::wait keeps its state in the child.
        let status = self.child.wait().await.map_err(|source| WorkspaceError::Io {
            op: "wait for sandbox",
            path: self.group.to_string(),
            source,
        })?;
        let exit = unfold_exit(status.code(), status.signal());
        self.reaped = Some(exit);
        self.live.forget(self.key);
        Ok(exit)
    }

    async fn kill(&mut self) -> Result<()> {
        if self.reaped.is_some() {
            return Ok(());
        }
        kill_tree(self.group)
    }
}

impl Drop for SandboxProcess {
    fn drop(&mut self) {
        if self.reaped.is_none() {
            if let Err(error) = kill_tree(self.group) {
                tracing::warn!(group = %self.group, %error, "could not kill a dropped sandbox");
            }
            self.live.forget(self.key);
        }
        // The zombie is reaped by tokio's orphan queue once it dies.
    }
}

/// Kills bwrap and its process group. The pid itself first: until `setsid` has run, the
/// group does not exist yet, and then the pid is all there is (setsid does not fork when,
/// as here, it is not a group leader).
pub(super) fn kill_tree(group: Pid) -> Result<()> {
    let leader = kill(group, Signal::SIGKILL);
    let members = killpg(group, Signal::SIGKILL);
    for outcome in [leader, members] {
        match outcome {
            // ESRCH: already gone, which is what a kill wants.
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(errno) => {
                return Err(WorkspaceError::Io {
                    op: "kill sandbox",
                    path: group.to_string(),
                    source: std::io::Error::from(errno),
                });
            }
        }
    }
    Ok(())
}

/// Supervised commands are tracked with their kill flag.
impl berth_supervisor::node::ExecTracker for LiveProcesses {
    fn register(&self, killed: Arc<AtomicBool>) -> u64 {
        let key = self.next_key.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(key, Live::Supervised(killed));
        key
    }

    fn forget(&self, key: u64) {
        LiveProcesses::forget(self, key);
    }
}

pub use berth_supervisor::node::unfold_exit;
