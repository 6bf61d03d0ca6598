//! The backend conformance suite: one set of behaviours every [`Backend`] must show.
//!
//! Instantiate it once per backend (in an integration test file of this crate, or any crate
//! depending on it with `tokio` features `macros` + `rt-multi-thread`):
//!
//! ```text
//! berth_testkit::backend_suite!(local, async {
//!     // Anything implementing `BackendFixture`: a `BackendRef`, or a `Fixture` that keeps
//!     // temp dirs / containers alive for the duration of one test.
//!     my_fixture().await
//! });
//! ```
//!
//! This expands to `mod local { ... }` with one `#[tokio::test]` per behaviour; the async
//! block runs once per test, so every test gets a fresh workspace. Names in the calling
//! module are visible inside the block (`use super::*`).
//!
//! The suite talks to the backend only through the [`Backend`] trait: symlinks and other
//! setup are created with `exec` (`ln -s /etc esc`), never through the host, so a backend
//! whose files live in a container runs it unchanged.
//!
//! Requirements on a fixture's workspace:
//! - a POSIX `sh` with `ln`, `mkdir`, `cat`, `ls`, `sleep`, `kill`, `head`, `pwd` inside;
//! - `..` of the workspace root (as the sandbox sees it) exists and is writable, and is
//!   private to this test: the escape corpus plants a victim file there and checks that
//!   nothing else appears in it;
//! - `/etc/passwd` exists inside the sandbox.

use std::collections::BTreeMap;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;

use berth_workspace::backend::{
    Backend, BackendRef, ByteStream, ExecOutput, ExecSpec, SpawnSpec, Spawned, WriteOptions,
};
use berth_workspace::error::Result;
use berth_workspace::path::RelPath;

pub mod contract;
pub mod escape;
pub mod exec;
pub mod files;
pub mod mcp_fixture;
pub mod netns;
pub mod opensandbox_server;
pub mod store_servers;
pub mod tar_corpus;
pub mod wait;

/// The venv of `.ci/requirements/AREA.txt` (a provider's SDK or server, moto_server), made
/// or updated by `.ci/venv`, which takes a lock per venv (test processes run in parallel and
/// would race on one). Panics with `.ci/venv`'s error when it cannot be made.
pub fn venv(area: &str) -> std::path::PathBuf {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.ci/venv");
    let output = std::process::Command::new("bash").arg(script).arg(area).output().expect("run .ci/venv");
    assert!(
        output.status.success(),
        ".ci/venv {area} failed (PyPI reachable?): {}",
        String::from_utf8_lossy(&output.stderr)
    );
    std::path::PathBuf::from(String::from_utf8_lossy(&output.stdout).trim())
}

pub use wait::{assert_eventually, eventually_ok, wait_for, wait_for_every, wait_until, wait_until_every};

/// Deterministic bytes from `seed` (xorshift): incompressible, so a test's data costs what its
/// size says in a snapshot or on the wire.
pub fn noise(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(length + 8);
    while out.len() < length {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(length);
    out
}

/// A `cargo` command for a build nested in a process that cargo started (a test, `cargo
/// run`): without the variables cargo set for *that* package. Build scripts that track
/// one of them (ring tracks `CARGO_MANIFEST_DIR`) would otherwise see it change and rebuild
/// — and so would every crate above them, twice: once here, once in the next plain build.
pub fn nested_cargo() -> std::process::Command {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut command = std::process::Command::new(cargo);
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let per_package = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_MANIFEST_")
            || name.starts_with("CARGO_BIN_")
            || matches!(name, "CARGO_CRATE_NAME" | "CARGO_PRIMARY_PACKAGE" | "CARGO_TARGET_TMPDIR" | "OUT_DIR");
        if per_package {
            command.env_remove(name);
        }
    }
    command
}

/// What one suite test gets: a backend, plus whatever must live as long as the test.
pub trait BackendFixture: Send + Sync {
    fn backend(&self) -> BackendRef;
}

impl BackendFixture for BackendRef {
    fn backend(&self) -> BackendRef {
        self.clone()
    }
}

/// A backend with a value kept alive beside it (a `TempDir`, a container guard…).
pub struct Fixture<G = ()> {
    backend: BackendRef,
    _keep_alive: G,
}

impl<G: Send + Sync> Fixture<G> {
    pub fn new(backend: BackendRef, keep_alive: G) -> Self {
        Self { backend, _keep_alive: keep_alive }
    }
}

impl<G: Send + Sync> BackendFixture for Fixture<G> {
    fn backend(&self) -> BackendRef {
        self.backend.clone()
    }
}

/// Forwards only the three primitives of another backend, so every derived operation
/// (`stat`, `list_dir`, `remove`, `mkdir`, `exec`) runs its default — the `posix.rs` path
/// that sandboxed backends without a host view rely on.
pub struct PrimitivesOnly {
    inner: BackendRef,
    /// Env given to every process unless the spawn sets the name itself (e.g. a `PATH`
    /// pointing at busybox applets, to run the suite against busybox tools).
    env: BTreeMap<String, String>,
}

impl PrimitivesOnly {
    pub fn new(inner: BackendRef) -> Self {
        Self { inner, env: BTreeMap::new() }
    }

    pub fn with_env(mut self, env: BTreeMap<String, String>) -> Self {
        self.env = env;
        self
    }
}

#[async_trait]
impl Backend for PrimitivesOnly {
    fn name(&self) -> &'static str {
        "primitives-only"
    }

    async fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned> {
        let mut spec = spec.clone();
        for (name, value) in &self.env {
            spec.env.entry(name.clone()).or_insert_with(|| value.clone());
        }
        self.inner.spawn(&spec).await
    }

    async fn read_file(&self, path: &RelPath) -> Result<ByteStream> {
        self.inner.read_file(path).await
    }

    async fn write_file(&self, path: &RelPath, data: ByteStream, options: WriteOptions) -> Result<u64> {
        self.inner.write_file(path, data, options).await
    }
}

// ---- helpers shared by the cases -------------------------------------------------------

/// Provisions `workspace_id` through a portable driver the way the cloud driver suites do:
/// owner `alice`, no host root (a cloud sandbox has none), `spec` as given.
pub async fn provision_as_alice<D: berth_workspace::driver::BackendDriver + ?Sized>(
    driver: &D,
    workspace_id: &berth_workspace::id::WorkspaceId,
    generation: u64,
    fresh: bool,
    spec: &berth_workspace::spec::WorkspaceSpec,
) -> Result<berth_workspace::backend::BackendRef> {
    let context = berth_workspace::driver::ProvisionContext {
        workspace_id,
        root: std::path::Path::new("/nonexistent"),
        spec,
        placement: berth_workspace::driver::Placement { generation, owner: "alice", fresh },
    };
    driver.provision(context).await
}

/// Parses a path the test knows to be valid.
pub fn rel(path: &str) -> RelPath {
    RelPath::parse(path).unwrap_or_else(|error| panic!("test path {path:?}: {error}"))
}

/// Runs `sh -c script` in the workspace root with `args` as `$1…`.
pub async fn sh(backend: &dyn Backend, script: &str, args: &[&str]) -> ExecOutput {
    let mut argv = vec!["sh".to_owned(), "-c".to_owned(), script.to_owned(), "sh".to_owned()];
    argv.extend(args.iter().map(|arg| (*arg).to_owned()));
    let mut spec = ExecSpec::new(argv);
    spec.timeout = Duration::from_secs(30);
    backend.exec(&spec).await.unwrap_or_else(|error| panic!("exec of {script:?} failed: {error}"))
}

/// Like [`sh`], and the script must exit 0.
pub async fn sh_ok(backend: &dyn Backend, script: &str, args: &[&str]) -> ExecOutput {
    let output = sh(backend, script, args).await;
    assert_eq!(
        output.exit_code,
        0,
        "{script:?} failed: stdout {:?} stderr {:?}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

pub async fn write(backend: &dyn Backend, path: &str, data: &[u8]) {
    backend
        .write_bytes(&rel(path), Bytes::copy_from_slice(data), 0o644)
        .await
        .unwrap_or_else(|error| panic!("write {path:?}: {error}"));
}

pub async fn read(backend: &dyn Backend, path: &str) -> Result<Vec<u8>> {
    backend.read_to_bytes(&rel(path), 256 * 1024 * 1024).await.map(|bytes| bytes.to_vec())
}

/// Names of a directory's entries, in the order `list_dir` returned them.
pub async fn names(backend: &dyn Backend, path: &str) -> Vec<String> {
    backend
        .list_dir(&rel(path))
        .await
        .unwrap_or_else(|error| panic!("list {path:?}: {error}"))
        .iter()
        .map(|info| info.name().to_owned())
        .collect()
}

/// A chunk stream from fixed chunks.
pub fn chunks(parts: Vec<Result<Bytes>>) -> ByteStream {
    futures::stream::iter(parts).boxed()
}

/// Whether a process id is alive inside the sandbox (a zombie counts as dead: it is only
/// waiting for a parent to reap it).
pub async fn process_alive(backend: &dyn Backend, pid: &str) -> bool {
    let script = r#"kill -0 "$1" 2>/dev/null || exit 1
case $(cat "/proc/$1/stat" 2>/dev/null) in *") Z "*|*") X "*) exit 1 ;; esac
exit 0"#;
    sh(backend, script, &[pid]).await.exit_code == 0
}

/// Asserts an error variant, printing the actual result otherwise.
#[macro_export]
#[doc(hidden)]
macro_rules! assert_err {
    ($result:expr, $pattern:pat $(,)?) => {
        match $result {
            Err($pattern) => {}
            other => panic!("expected Err({}), got {:?}", stringify!($pattern), other),
        }
    };
}

/// Generates the conformance suite for one backend; see the [module docs](self).
///
/// Expands to `mod $suite { mod files {..} mod exec {..} mod escape {..} }`, one
/// `#[tokio::test]` per case, so a failure reads `local::escape::symlink_to_etc`.
#[macro_export]
macro_rules! backend_suite {
    ($suite:ident, $fixture:expr $(,)?) => {
        mod $suite {
            #[allow(unused_imports)]
            use super::*;

            async fn __berth_fixture() -> impl $crate::BackendFixture {
                $fixture.await
            }

            $crate::__backend_suite_group!(files:
                write_read_small,
                write_read_large_streamed,
                sizes_around_block_boundaries,
                write_creates_parents,
                overwrite_is_atomic,
                failing_stream_leaves_nothing,
                max_bytes_leaves_nothing,
                read_errors,
                write_mode,
                stat_kinds,
                list_dir_sorted,
                remove_semantics,
                remove_recursive_keeps_link_targets,
                mkdir_semantics,
                symlinks_inside_work,
                layout_ensure_idempotent,
            );
            $crate::__backend_suite_group!(exec:
                exit_code,
                killed_by_signal,
                stdin_passthrough,
                env_passthrough,
                cwd,
                cwd_refused,
                timeout_kills_grandchildren,
                output_truncation,
                orphan_holding_pipe_does_not_hang,
                missing_program,
                stream_order,
                stream_caps,
                stream_drop_kills,
            );
            $crate::__backend_suite_group!(escape:
                dotdot,
                dotdot_twice_through_dir,
                dotdot_inside,
                absolute_etc_passwd,
                absolute_root,
                nul_byte,
                dot_slash_dotdot,
                too_long,
                too_deep,
                symlink_to_etc,
                symlink_to_parent,
                absolute_symlink_to_parent,
                symlink_chain,
                dangling_symlink_outside,
                symlink_dir_inside_pointing_out,
                out_and_back_in,
                symlink_loop,
            );
        }
    };
}

/// One module of tests, one `#[tokio::test]` per case of `testing::$group`; each test
/// builds a fresh fixture.
#[doc(hidden)]
#[macro_export]
macro_rules! __backend_suite_group {
    ($group:ident : $($case:ident),* $(,)?) => {
        mod $group {
            $(
                #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $case() {
                    let fixture = super::__berth_fixture().await;
                    $crate::$group::$case(&fixture).await;
                }
            )*
        }
    };
}
