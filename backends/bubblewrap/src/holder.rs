//! [`SpawnRole::SecretHolder`] on bubblewrap: a process holding secrets (an MCP server
//! started with a `secret_ref` in its env) that the workspace's own processes must not
//! read, signal or alter.
//!
//! - **Identity:** the workspace's *holder* uid ([`super::identity`]), not its agent uid:
//!   an agent process cannot signal or ptrace it nor read its `/proc/<pid>/environ`, even
//!   from the host. Inside, its own pid namespace hides it from agent sandboxes anyway.
//! - **Files:** the workspace is **not mounted**. `HOME` and the cwd are a tmpfs at
//!   [`HOLDER_HOME`], private to the process; the system dirs are read-only as usual.
//! - **Program:** without a pin, argv[0] must lie outside the workspace (a system path;
//!   a workspace path is refused). With [`SpawnSpec::program_sha256`], argv[0] names a
//!   workspace file: it is copied into a fresh root-owned directory (`0711`, the copy
//!   `0555`) that no workspace uid can write, the *copy* is hashed and compared with the
//!   pin (a mismatch is `InvalidArgument`), bound read-only at
//!   `/holder-program/<name>` and run from there. A swap after the check changes nothing:
//!   the sandbox only ever sees the checked copy.
//! - **Env:** the defaults (`PATH`, `HOME`, `LANG`) and the spawn's env only — not the
//!   workspace spec's, which the agent side controls — through the same `--args` memfd as
//!   every sandbox ([`super::launch`]).
//!
//! Needs the node agent to be root (it is what makes a second uid possible); otherwise the
//! spawn is refused with `BackendUnavailable`, never run as an agent.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use futures::StreamExt as _;
use sha2::{Digest as _, Sha256};
use tempfile::TempDir;

use super::config::BubblewrapConfig;
use super::launch::DEFAULT_PATH;
use super::sandbox::{MountTable, WorkspaceMounts, bwrap_args};
use berth_backend_host::hostfs::HostFs;
use berth_workspace::backend::{ByteStream, SpawnSpec};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

/// `HOME` and cwd of a secret holder: a tmpfs private to the process.
pub const HOLDER_HOME: &str = "/holder";
/// Where a pinned program's checked copy is bound read-only.
pub const PINNED_PROGRAM_DIR: &str = "/holder-program";
/// Largest workspace program copied for a pin.
pub const MAX_PINNED_PROGRAM_BYTES: u64 = 256 * 1024 * 1024;

/// Prefix of the private directories holding program copies (in the host's temp dir).
const COPY_DIR_PREFIX: &str = "berth-holder-";
/// Age after which a program copy directory is someone's leftover: a sandbox binds the
/// copy when it starts, so removing the host file later does not affect it.
const STALE_COPY_AFTER: std::time::Duration = std::time::Duration::from_secs(600);

/// Removes program copy directories left behind by a process handle that never dropped (an
/// agent that died). Blocking.
pub fn sweep_stale_copies() {
    let now = std::time::SystemTime::now();
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else { return };
    for entry in entries.flatten() {
        let is_copy_dir = entry.file_name().to_string_lossy().starts_with(COPY_DIR_PREFIX)
            && entry.file_type().is_ok_and(|kind| kind.is_dir())
            && entry.metadata().is_ok_and(|metadata| metadata.uid() == nix::unistd::geteuid().as_raw());
        let stale = entry
            .metadata()
            .and_then(|metadata| metadata.modified())
            .is_ok_and(|modified| now.duration_since(modified).is_ok_and(|age| age > STALE_COPY_AFTER));
        if is_copy_dir && stale && std::fs::remove_dir_all(entry.path()).is_ok() {
            tracing::debug!(path = %entry.path().display(), "removed a stale holder program copy");
        }
    }
}

/// The bwrap command line (after the host chain) and env of one secret holder, and the
/// directory of its program copy, kept until the sandbox is gone.
pub(super) struct HolderLaunch {
    pub bwrap_line: Vec<OsString>,
    pub env: BTreeMap<String, String>,
    pub program_copy: Option<TempDir>,
}

/// What a holder launch needs of its workspace.
pub(super) struct HolderContext<'a> {
    pub config: &'a BubblewrapConfig,
    pub table: &'a MountTable,
    pub files: &'a HostFs,
    pub network: bool,
    pub prlimit_path: &'a Path,
    pub limit_args: &'a [String],
}

pub(super) async fn prepare(context: &HolderContext<'_>, spec: &SpawnSpec) -> Result<HolderLaunch> {
    let workspace_dir = context.config.workspace_dir.as_str();
    let program = spec.argv[0].as_str();
    let mut argv: Vec<OsString> = spec.argv.iter().map(OsString::from).collect();
    let mut read_only_files = Vec::new();
    let mut program_copy = None;
    match spec.program_sha256 {
        Some(pin) => {
            let relative =
                program.strip_prefix(workspace_dir).and_then(|rest| rest.strip_prefix('/')).unwrap_or(program);
            let path = RelPath::parse(relative)?;
            let name = path.file_name().unwrap_or("program").to_owned();
            let (dir, copy) = copy_and_check(context.files, &path, pin).await?;
            let sandbox_path = format!("{PINNED_PROGRAM_DIR}/{name}");
            read_only_files.push((copy, sandbox_path.clone()));
            argv[0] = sandbox_path.into();
            program_copy = Some(dir);
        }
        None => {
            let in_workspace = program.starts_with(&format!("{workspace_dir}/")) || !program.starts_with('/');
            if in_workspace && program.contains('/') {
                return Err(WorkspaceError::SpawnFailed {
                    program: program.to_owned(),
                    reason: "a secret holder runs a system program or a workspace program pinned by SHA-256; \
                             the workspace is not mounted for it"
                        .into(),
                });
            }
        }
    }
    let mounts = WorkspaceMounts {
        root: None,
        dir: HOLDER_HOME,
        read_only_files: &read_only_files,
        network: context.network,
        tmp_per_exec: false,
    };
    let mut bwrap_line = bwrap_args(context.config, context.table, &mounts);
    bwrap_line.extend(["--chdir".into(), HOLDER_HOME.into(), "--".into()]);
    if !context.limit_args.is_empty() {
        bwrap_line.push(context.prlimit_path.as_os_str().to_owned());
        bwrap_line.extend(context.limit_args.iter().map(OsString::from));
        bwrap_line.push("--".into());
    }
    bwrap_line.extend(argv);
    let mut env = BTreeMap::from([
        ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
        ("HOME".to_owned(), HOLDER_HOME.to_owned()),
        ("LANG".to_owned(), "C.UTF-8".to_owned()),
    ]);
    env.extend(spec.env.iter().map(|(name, value)| (name.clone(), value.clone())));
    Ok(HolderLaunch { bwrap_line, env, program_copy })
}

/// Copies the workspace file `path` into a fresh private directory and checks the copy
/// against `pin`. Returns the directory (removed on drop) and the copy's host path.
async fn copy_and_check(files: &HostFs, path: &RelPath, pin: [u8; 32]) -> Result<(TempDir, PathBuf)> {
    let bytes = collect_capped(files.read_file(path).await?, MAX_PINNED_PROGRAM_BYTES).await?;
    let shown = path.as_str().to_owned();
    tokio::task::spawn_blocking(move || -> Result<(TempDir, PathBuf)> {
        let failed = |op: &'static str| {
            let shown = shown.clone();
            move |source: std::io::Error| WorkspaceError::Io { op, path: shown, source }
        };
        let dir = tempfile::Builder::new().prefix(COPY_DIR_PREFIX).tempdir().map_err(failed("create program dir"))?;
        // Searchable, not listable or writable, by anyone but the agent's user (root).
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o711))
            .map_err(failed("chmod program dir"))?;
        let copy = dir.path().join("program");
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o555)
            .open(&copy)
            .map_err(failed("copy program"))?;
        file.write_all(&bytes).map_err(failed("copy program"))?;
        file.sync_all().map_err(failed("copy program"))?;
        drop(file);
        // The copy, as the sandbox will see it, is what gets checked.
        let mut written = Vec::with_capacity(bytes.len());
        std::fs::File::open(&copy).and_then(|mut file| file.read_to_end(&mut written)).map_err(failed("hash copy"))?;
        let actual: [u8; 32] = Sha256::digest(&written).into();
        if actual != pin {
            return Err(WorkspaceError::InvalidArgument(format!(
                "program {shown:?} does not match its pinned sha256 (pinned {}, found {})",
                hex(&pin),
                hex(&actual)
            )));
        }
        Ok((dir, copy))
    })
    .await
    .map_err(|error| WorkspaceError::Backend { backend: "bubblewrap", message: format!("pin task failed: {error}") })?
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// A workspace file in memory, refused past `max` bytes.
async fn collect_capped(mut stream: ByteStream, max: u64) -> Result<Vec<u8>> {
    let mut bytes = Vec::new();
    while let Some(chunk) = stream.next().await {
        bytes.extend_from_slice(&chunk?);
        if bytes.len() as u64 > max {
            return Err(WorkspaceError::LimitExceeded { limit: "pinned program size", size: bytes.len() as u64, max });
        }
    }
    Ok(bytes)
}
