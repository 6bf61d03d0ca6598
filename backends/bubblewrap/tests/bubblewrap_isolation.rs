//! Isolation of the host side of a sandbox and of workspaces from each other: what a
//! caller sends (exec env, workspace env) never reaches a host process, each workspace has
//! a host uid of its own, and a secret holder runs as yet another uid without the
//! workspace. Each test proves containment with a host-side marker or a secret string.

mod bwrap_support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use berth_workspace::{ExecSpec, WorkspaceSpec};
use bwrap_support::{marker, sandbox};

/// Compiles a shared library whose constructor creates `marker_path` (wherever it is
/// loaded: on the host it lands in the host's `/tmp`, in a sandbox in its private `/tmp`).
fn planted_library(dir: &Path, marker_path: &Path) -> PathBuf {
    let source = dir.join("planted.c");
    std::fs::write(
        &source,
        format!(
            "#include <stdio.h>\n\
             __attribute__((constructor)) static void planted(void) {{\n\
               FILE *file = fopen(\"{}\", \"w\");\n\
               if (file) {{ fputs(\"host code ran\", file); fclose(file); }}\n\
             }}\n",
            marker_path.display()
        ),
    )
    .expect("write the library source");
    let library = dir.join("planted.so");
    let built = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .output()
        .expect("run gcc (installed on the test machine)");
    assert!(built.status.success(), "gcc failed: {}", String::from_utf8_lossy(&built.stderr));
    std::fs::set_permissions(&library, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    library
}

/// The library is first shown to work: loaded by a host process it creates the marker.
fn assert_library_plants(library: &Path, marker_path: &Path) {
    let ran = Command::new("true").env("LD_PRELOAD", library).status().expect("run true");
    assert!(ran.success());
    assert!(marker_path.exists(), "the planted library does not work on the host; the test proves nothing");
    std::fs::remove_file(marker_path).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ld_preload_in_the_exec_env_never_runs_on_the_host() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let marker_path = std::env::temp_dir().join(marker("berth-preload-exec-"));
    // In the workspace root, like a file the tenant uploaded; its host path is what the
    // attack names.
    let library = planted_library(&sandbox.root, &marker_path);
    assert_library_plants(&library, &marker_path);
    let mut spec = ExecSpec::new(vec!["true".into()]);
    spec.spawn.env = BTreeMap::from([("LD_PRELOAD".to_owned(), library.display().to_string())]);
    let output = sandbox.backend.exec(&spec).await.unwrap();
    assert_eq!(output.exit_code, 0, "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!marker_path.exists(), "LD_PRELOAD from the exec env ran code on the host");
    // The value still reaches the sandboxed process (where the host path does not exist).
    let mut spec = ExecSpec::new(vec!["sh".into(), "-c".into(), "printf %s \"$LD_PRELOAD\"".into()]);
    spec.spawn.env = BTreeMap::from([("LD_PRELOAD".to_owned(), library.display().to_string())]);
    let output = sandbox.backend.exec(&spec).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), library.display().to_string());
    assert!(!marker_path.exists(), "LD_PRELOAD from the exec env ran code on the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ld_preload_in_the_spec_env_never_runs_on_the_host() {
    let dir = tempfile::Builder::new().prefix("berth-bwrap-").tempdir().unwrap();
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).unwrap();
    let marker_path = std::env::temp_dir().join(marker("berth-preload-spec-"));
    let library = planted_library(dir.path(), &marker_path);
    assert_library_plants(&library, &marker_path);
    let spec = WorkspaceSpec {
        env: BTreeMap::from([("LD_PRELOAD".to_owned(), library.display().to_string())]),
        ..WorkspaceSpec::default()
    };
    let sandbox = bwrap_support::sandbox_at(&root, spec).await;
    let output = sandbox.backend.exec(&ExecSpec::new(vec!["true".into()])).await.unwrap();
    assert_eq!(output.exit_code, 0, "{}", String::from_utf8_lossy(&output.stderr));
    assert!(!marker_path.exists(), "LD_PRELOAD from the workspace env ran code on the host");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_values_are_not_in_any_host_command_line() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let secret = marker("envsecret");
    let seconds = marker("");
    let mut spec = ExecSpec::new(vec!["sleep".into(), format!("4{seconds}")]);
    spec.spawn.env = BTreeMap::from([("TOKEN".to_owned(), secret.clone())]);
    spec.timeout = std::time::Duration::from_secs(60);
    let backend = sandbox.backend.clone();
    let running = tokio::spawn(async move { backend.exec(&spec).await });
    let needle = format!("4{seconds}");
    berth_testkit::assert_eventually("the sleep to show on the host", std::time::Duration::from_secs(20), || {
        let found = !bwrap_support::host_processes_with(&needle).is_empty();
        async move { found }
    })
    .await;
    for (pid, args) in bwrap_support::host_processes_with(&needle) {
        assert!(!args.iter().any(|arg| arg.contains(&secret)), "secret in the command line of {pid}: {args:?}");
        // Host-side processes of the chain (setsid, setpriv, bwrap) carry no caller env.
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let is_host_side = args.first().is_some_and(|program| program.contains("bwrap") || program.contains("setsid"));
        if is_host_side {
            assert!(!String::from_utf8_lossy(&environ).contains(&secret), "secret in the environ of {pid}: {args:?}");
        }
    }
    running.abort();
}
