//! Helpers of the bubblewrap tests: drivers, sandboxes in temp dirs, and looking at the
//! host's /proc.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use berth_backend_bubblewrap::{BubblewrapBackend, BubblewrapConfig, BubblewrapDriver};
use berth_workspace::{BackendRef, ExecSpec, ProvisionContext, WorkspaceId, WorkspaceSpec};
use tempfile::TempDir;

/// A driver, or a failed test naming what is missing (never a skip).
pub async fn driver(config: BubblewrapConfig) -> BubblewrapDriver {
    match BubblewrapDriver::new(config).await {
        Ok(driver) => driver,
        Err(error) => panic!("the bubblewrap backend is required for these tests: {error}"),
    }
}

/// One provisioned workspace and everything it needs alive.
pub struct Sandbox {
    pub driver: BubblewrapDriver,
    pub bubblewrap: Arc<BubblewrapBackend>,
    pub backend: BackendRef,
    pub root: PathBuf,
    pub id: WorkspaceId,
    _dir: Option<TempDir>,
}

/// A workspace with the default config in a fresh temp dir.
pub async fn sandbox(spec: WorkspaceSpec) -> Sandbox {
    sandbox_with(BubblewrapConfig::default(), spec).await
}

/// A workspace with `config` in a fresh temp dir.
pub async fn sandbox_with(config: BubblewrapConfig, spec: WorkspaceSpec) -> Sandbox {
    let dir = tempfile::Builder::new().prefix("berth-bwrap-").tempdir().expect("create a temp dir");
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).expect("create the workspace root");
    let mut sandbox = sandbox_at_with(config, &root, spec).await;
    sandbox._dir = Some(dir);
    sandbox
}

/// A workspace at an existing root (its parents must be searchable by the sandbox user).
pub async fn sandbox_at(root: &Path, spec: WorkspaceSpec) -> Sandbox {
    sandbox_at_with(BubblewrapConfig::default(), root, spec).await
}

async fn sandbox_at_with(config: BubblewrapConfig, root: &Path, spec: WorkspaceSpec) -> Sandbox {
    let driver = driver(config).await;
    let id = WorkspaceId::new(format!("ws-{}", rand::random::<u32>())).unwrap();
    let bubblewrap = driver
        .provision_bubblewrap(ProvisionContext::unplaced(&id, root, &spec))
        .await
        .expect("provision a bubblewrap workspace");
    let backend: BackendRef = bubblewrap.clone();
    Sandbox { driver, bubblewrap, backend, root: root.to_path_buf(), id, _dir: None }
}

/// `sh -c script` with a 30 s timeout.
pub fn shell(script: &str) -> ExecSpec {
    let mut spec = ExecSpec::new(vec!["sh".into(), "-c".into(), script.into()]);
    spec.timeout = Duration::from_secs(30);
    spec
}

/// A unique token: `prefix` and random digits (digits only, so it can be a sleep length).
pub fn marker(prefix: &str) -> String {
    format!("{prefix}{}", rand::random::<u64>() % 1_000_000_000_000 + 1_000_000_000_000)
}

/// Argument lists of every host process, by pid (processes that vanish meanwhile are
/// skipped). Read from the host's /proc, which sees into every pid namespace.
fn host_processes() -> Vec<(u32, Vec<String>)> {
    let own = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            if pid == own {
                return None;
            }
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args = cmdline
                .split(|byte| *byte == 0)
                .filter(|arg| !arg.is_empty())
                .map(|arg| String::from_utf8_lossy(arg).into_owned())
                .collect();
            Some((pid, args))
        })
        .collect()
}

/// Host processes with `needle` anywhere in their arguments (a sandbox's bwrap, its shell,
/// its sleeps…).
pub fn host_processes_with(needle: &str) -> Vec<(u32, Vec<String>)> {
    host_processes().into_iter().filter(|(_, args)| args.iter().any(|arg| arg.contains(needle))).collect()
}

/// Host processes that are exactly `sleep <n><digits>`.
pub fn sleepers(digits: &str) -> Vec<u32> {
    host_processes()
        .into_iter()
        .filter(|(_, args)| args.len() == 2 && args[0].ends_with("sleep") && args[1].ends_with(digits))
        .map(|(pid, _)| pid)
        .collect()
}
