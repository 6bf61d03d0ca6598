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

/// Runs `argv` on the host as `uid` (what code of that workspace could do had it escaped
/// its namespaces): `(succeeded, stdout + stderr)`.
fn on_host_as(uid: u32, argv: &[&str]) -> (bool, String) {
    let output = Command::new("setpriv")
        .args([format!("--reuid={uid}"), format!("--regid={uid}"), "--clear-groups".into(), "--".into()])
        .args(argv)
        .env_clear()
        .env("PATH", berth_backend_bubblewrap::DEFAULT_PATH)
        .output()
        .expect("run setpriv");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    (output.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workspaces_on_one_driver_cannot_reach_each_other() {
    use berth_workspace::{Backend as _, ProvisionContext, WorkspaceId};
    use std::os::unix::fs::MetadataExt as _;
    if !nix::unistd::geteuid().is_root() {
        panic!("this test needs root: per-workspace uids are given by a root node agent");
    }
    let parent = tempfile::Builder::new().prefix("berth-bwrap-tenants-").tempdir().unwrap();
    let driver = bwrap_support::driver(berth_backend_bubblewrap::BubblewrapConfig::default()).await;
    let spec = WorkspaceSpec::default();
    let mut tenants = Vec::new();
    for name in ["ws-tenant-a", "ws-tenant-b"] {
        let root = parent.path().join(name);
        std::fs::create_dir(&root).unwrap();
        let id = WorkspaceId::new(name).unwrap();
        let backend = driver.provision_bubblewrap(ProvisionContext::unplaced(&id, &root, &spec)).await.unwrap();
        tenants.push((root, backend));
    }
    let [(root_a, a), (root_b, b)] = <[_; 2]>::try_from(tenants).ok().unwrap();
    let users_a = a.users().expect("root gives uids");
    let users_b = b.users().expect("root gives uids");
    let all = [users_a.agent.uid, users_a.holder.uid, users_b.agent.uid, users_b.holder.uid];
    assert!(all.iter().collect::<std::collections::BTreeSet<_>>().len() == 4, "uids shared: {all:?}");
    for (root, users) in [(&root_a, users_a), (&root_b, users_b)] {
        let metadata = std::fs::metadata(root).unwrap();
        assert_eq!((metadata.uid(), metadata.mode() & 0o7777), (users.agent.uid, 0o700));
    }

    // B's secret, world-readable as a file: only B's root keeps it.
    let secret = marker("tenant-b-secret");
    b.write_bytes(&berth_testkit::rel("secret.txt"), bytes::Bytes::from(secret.clone()), 0o644).await.unwrap();
    let secret_path = root_b.join("secret.txt");
    let marker_path = root_b.join(marker("written-by-a-"));

    // From A's sandbox: B's host path, A's own mount source, /proc of others.
    let script = "cat \"$1\"; ls -la \"$2\"; echo x > \"$3\"; cat /proc/*/root\"$1\"; \
                  grep -h workspace /proc/self/mountinfo | head -3; \
                  for path in $(awk '{print $4}' /proc/self/mountinfo); do ls \"$path/../$4\" 2>/dev/null; done; \
                  echo done";
    let argv: Vec<String> = ["sh", "-c", script, "sh"]
        .iter()
        .map(|arg| (*arg).to_owned())
        .chain([
            secret_path.display().to_string(),
            root_b.display().to_string(),
            marker_path.display().to_string(),
            "ws-tenant-b".to_owned(),
        ])
        .collect();
    let output = a.exec(&ExecSpec::new(argv)).await.unwrap();
    let shown = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!shown.contains(&secret), "A's sandbox read B's secret: {shown}");
    assert!(!marker_path.exists(), "A's sandbox wrote into B's root");

    // On the host, as A's uid (an escaped process of A): B's root stays shut.
    let root_b_text = root_b.display().to_string();
    let secret_text = secret_path.display().to_string();
    let marker_text = marker_path.display().to_string();
    for attempt in
        [vec!["cat", secret_text.as_str()], vec!["ls", root_b_text.as_str()], vec!["touch", marker_text.as_str()]]
    {
        for uid in [users_a.agent.uid, users_a.holder.uid] {
            let (succeeded, text) = on_host_as(uid, &attempt);
            assert!(!succeeded && !text.contains(&secret), "uid {uid} ran {attempt:?}: {text}");
        }
    }
    assert!(!marker_path.exists(), "A's uid wrote into B's root");
    // The same command as B's uid works: the check above is not vacuous.
    let (succeeded, text) = on_host_as(users_b.agent.uid, &["cat", secret_text.as_str()]);
    assert!(succeeded && text.contains(&secret), "{text}");
}

// ---- secret holders ---------------------------------------------------------------------

fn holder_exec(argv: &[&str], env: &[(&str, &str)]) -> ExecSpec {
    let mut spec = ExecSpec::new(argv.iter().map(|arg| (*arg).to_owned()).collect());
    spec.spawn.role = berth_workspace::SpawnRole::SecretHolder;
    spec.spawn.env = env.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect();
    spec.timeout = std::time::Duration::from_secs(60);
    spec
}

/// Host pid and real uid of the process that is exactly `sleep <seconds>`.
fn sleeper_uid(seconds: &str) -> Option<(u32, u32)> {
    let pid = *bwrap_support::sleepers(seconds).first()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let uid = status.lines().find(|line| line.starts_with("Uid:"))?.split_whitespace().nth(1)?.parse().ok()?;
    Some((pid, uid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_holder_is_out_of_the_agents_reach() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let users = sandbox.bubblewrap.users().expect("root gives uids");
    let secret = marker("holder-secret");
    let seconds = marker("");
    let script = format!("echo \"home=$HOME pwd=$(pwd)\"; ls /workspace 2>&1; exec sleep 5{seconds}");
    let spec = holder_exec(&["sh", "-c", &script], &[("API_TOKEN", &secret)]);
    let backend = sandbox.backend.clone();
    let holder = tokio::spawn(async move { backend.exec(&spec).await });
    let running = berth_testkit::wait::wait_for(std::time::Duration::from_secs(20), || {
        let found = sleeper_uid(&format!("5{seconds}"));
        async move { found }
    })
    .await;
    let (pid, uid) = running.expect("the holder's sleep to show on the host");
    assert_eq!(uid, users.holder.uid, "the holder runs as the workspace's holder uid");

    // An agent exec of the same workspace: no such process, no secret anywhere it can read.
    let pid_text = pid.to_string();
    let probe = "cat /proc/*/environ 2>/dev/null | tr '\\0' '\\n' | grep -c API_TOKEN; \
                 kill -9 \"$1\" 2>&1; ls /proc | grep -c '^[0-9]'; echo done";
    let argv = ["sh", "-c", probe, "sh", pid_text.as_str()].map(str::to_owned).to_vec();
    let output = sandbox.backend.exec(&ExecSpec::new(argv)).await.unwrap();
    let shown = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(!shown.contains(&secret), "the agent read the holder's env: {shown}");
    assert!(shown.starts_with("0\n"), "{shown}");
    // On the host, as the agent's uid: the holder's environ is closed and it cannot be
    // signalled.
    let environ = format!("/proc/{pid}/environ");
    let (read, text) = on_host_as(users.agent.uid, &["cat", &environ]);
    assert!(!read && !text.contains(&secret), "{text}");
    let (signalled, text) = on_host_as(users.agent.uid, &["kill", "-9", &pid_text]);
    assert!(!signalled, "{text}");
    assert!(sleeper_uid(&format!("5{seconds}")).is_some(), "the holder died");

    holder.abort();
    berth_testkit::assert_eventually("the holder to be killed", std::time::Duration::from_secs(20), || {
        let gone = sleeper_uid(&format!("5{seconds}")).is_none();
        async move { gone }
    })
    .await;
    // What the holder saw: a private HOME and cwd, no workspace.
    let spec = holder_exec(
        &["sh", "-c", "echo \"home=$HOME pwd=$(pwd) token=$API_TOKEN\"; ls /workspace 2>&1"],
        &[("API_TOKEN", "t")],
    );
    let output = sandbox.backend.exec(&spec).await.unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.starts_with("home=/holder pwd=/holder token=t\n"), "{shown}");
    // HOME is memory: capped like /tmp.
    let spec = holder_exec(&["sh", "-c", "df -k /holder | tail -1 | awk '{print $2}'"], &[]);
    let output = sandbox.backend.exec(&spec).await.unwrap();
    let expected_kib = berth_backend_bubblewrap::config::DEFAULT_TMP_SIZE_BYTES / 1024;
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), expected_kib.to_string(), "{output:?}");
    assert!(shown.contains("No such file or directory"), "the workspace is mounted for a holder: {shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_holder_program_runs_as_checked_and_a_swap_is_refused() {
    use sha2::Digest as _;
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let users = sandbox.bubblewrap.users().expect("root gives uids");
    let good = b"#!/bin/sh\necho pinned-server-ok\n".to_vec();
    let pin: [u8; 32] = sha2::Sha256::digest(&good).into();
    let path = berth_testkit::rel("bin/server.sh");
    sandbox.backend.mkdir(&berth_testkit::rel("bin"), true).await.unwrap();
    sandbox.backend.write_bytes(&path, bytes::Bytes::from(good), 0o755).await.unwrap();

    let mut spec = holder_exec(&["bin/server.sh"], &[]);
    spec.spawn.program_sha256 = Some(pin);
    let output = sandbox.backend.exec(&spec).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "pinned-server-ok\n", "{output:?}");
    let mut by_sandbox_path = holder_exec(&["/workspace/bin/server.sh"], &[]);
    by_sandbox_path.spawn.program_sha256 = Some(pin);
    let output = sandbox.backend.exec(&by_sandbox_path).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&output.stdout), "pinned-server-ok\n", "{output:?}");

    // While a pinned holder runs, its copy is not the agent's to change.
    let seconds = marker("");
    let slow = format!("#!/bin/sh\nsleep 6{seconds}\n").into_bytes();
    let slow_pin: [u8; 32] = sha2::Sha256::digest(&slow).into();
    sandbox.backend.write_bytes(&berth_testkit::rel("bin/slow.sh"), bytes::Bytes::from(slow), 0o755).await.unwrap();
    let mut slow_spec = holder_exec(&["bin/slow.sh"], &[]);
    slow_spec.spawn.program_sha256 = Some(slow_pin);
    let backend = sandbox.backend.clone();
    let slow_holder = tokio::spawn(async move { backend.exec(&slow_spec).await });
    berth_testkit::assert_eventually("the pinned holder to run", std::time::Duration::from_secs(20), || {
        let found = sleeper_uid(&format!("6{seconds}")).is_some();
        async move { found }
    })
    .await;
    let copies: Vec<PathBuf> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .filter(|path| path.file_name().is_some_and(|name| name.to_string_lossy().starts_with("berth-holder-")))
        .map(|dir| dir.join("program"))
        .filter(|copy| std::fs::read(copy).is_ok_and(|bytes| String::from_utf8_lossy(&bytes).contains(&seconds)))
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");
    let copy = copies[0].display().to_string();
    let (written, text) = on_host_as(users.agent.uid, &["sh", "-c", "echo 'echo swapped' >> \"$1\"", "sh", &copy]);
    assert!(!written, "the agent's uid changed the checked copy: {text}");
    slow_holder.abort();

    // The agent swaps the workspace file: the pin refuses it.
    sandbox.backend.write_bytes(&path, bytes::Bytes::from_static(b"#!/bin/sh\necho swapped\n"), 0o755).await.unwrap();
    let error = sandbox.backend.exec(&spec).await.unwrap_err();
    assert!(matches!(error, berth_workspace::WorkspaceError::InvalidArgument(_)), "{error}");
    assert!(error.to_string().contains("sha256"), "{error}");
    // Unpinned, a workspace program is not run for a holder at all.
    let unpinned = holder_exec(&["/workspace/bin/server.sh"], &[]);
    let error = sandbox.backend.exec(&unpinned).await.unwrap_err();
    assert!(matches!(error, berth_workspace::WorkspaceError::SpawnFailed { .. }), "{error}");
}
