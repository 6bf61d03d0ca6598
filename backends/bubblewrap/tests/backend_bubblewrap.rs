//! The bubblewrap backend: the conformance suite, then what only a sandbox must show —
//! isolation from the host (files, processes, network, other workspaces, who it runs as)
//! — and the driver. Limits and process trees: `bubblewrap_limits.rs`.
//!
//! Needs `bwrap` (bubblewrap ≥ 0.8) and user namespaces; a missing bwrap fails every test
//! here with the driver's `BackendUnavailable` message, it never skips.

mod bwrap_support;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use berth_backend_bubblewrap::{BubblewrapConfig, BubblewrapDriver, ExtraBind};
use berth_testkit::{BackendFixture, Fixture, assert_eventually, rel, sh};
use berth_workspace::{
    Backend as _, BackendDriver, ExecSpec, ProvisionContext, WorkspaceError, WorkspaceId, WorkspaceSpec,
};
use bwrap_support::{host_processes_with, marker, sandbox, shell, sleepers};
use tempfile::TempDir;

/// Suite fixture: the root at `<tmp>/ws`, seen inside as `/sandbox/ws` with `<tmp>`
/// bound read-write at `/sandbox`, so the root's parent exists, is writable and is private
/// to the test (the escape corpus plants its victim file there). Production sandboxes
/// mount nothing above `/workspace`. Agent processes come from the workspace's resident
/// supervisor (the default).
async fn suite_fixture() -> Fixture<(TempDir, Arc<BubblewrapDriver>)> {
    suite_fixture_with(true).await
}

/// The same with a fresh sandbox per spawn (`--no-supervisor`).
async fn per_exec_suite_fixture() -> Fixture<(TempDir, Arc<BubblewrapDriver>)> {
    suite_fixture_with(false).await
}

async fn suite_fixture_with(supervisor: bool) -> Fixture<(TempDir, Arc<BubblewrapDriver>)> {
    let dir = tempfile::Builder::new().prefix("berth-bwrap-suite-").tempdir().expect("create a temp dir");
    let root = dir.path().join("ws");
    std::fs::create_dir(&root).expect("create the workspace root");
    let config = BubblewrapConfig {
        workspace_dir: "/sandbox/ws".into(),
        extra_binds: vec![ExtraBind {
            host_path: dir.path().to_path_buf(),
            sandbox_path: "/sandbox".into(),
            writable: true,
        }],
        supervisor,
        ..BubblewrapConfig::default()
    };
    let driver = Arc::new(bwrap_support::driver(config).await);
    let id = WorkspaceId::new("ws-suite").unwrap();
    let spec = WorkspaceSpec::default();
    let backend = driver
        .provision_bubblewrap(ProvisionContext::unplaced(&id, &root, &spec))
        .await
        .expect("provision a bubblewrap workspace");
    if let Some(users) = backend.users() {
        // The parent is the workspace user's too, like the root: the suite writes there.
        std::os::unix::fs::chown(dir.path(), Some(users.agent.uid), Some(users.agent.gid)).expect("chown the temp dir");
    }
    let backend: berth_workspace::BackendRef = backend;
    Fixture::new(backend, (dir, driver))
}

berth_testkit::backend_suite!(bubblewrap, suite_fixture());
berth_testkit::contract_suite!(bubblewrap_contract, suite_fixture());
berth_testkit::backend_suite!(bubblewrap_per_exec, per_exec_suite_fixture());
berth_testkit::contract_suite!(bubblewrap_per_exec_contract, per_exec_suite_fixture());

// ---- isolation --------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_files_outside_the_mounts_are_invisible() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    // World-readable on purpose: only the mount namespace may hide it, not permissions.
    let secret_dir = tempfile::tempdir().unwrap();
    let token = marker("secret");
    let secret = secret_dir.path().join("secret.txt");
    std::fs::write(&secret, &token).unwrap();
    std::fs::set_permissions(secret_dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let path = secret.display().to_string();
    let output = sh(&*sandbox.backend, "cat \"$1\"", &[&path]).await;
    assert_ne!(output.exit_code, 0, "cat of a host file outside the mounts worked");
    assert!(!String::from_utf8_lossy(&output.stdout).contains(&token));
    // Nowhere in the sandbox either (the read-only host /usr is left out of the search:
    // it is the host's own, and the secret is not in it).
    let search =
        sh(&*sandbox.backend, "grep -rlsF \"$1\" / --exclude-dir=proc --exclude-dir=usr; echo searched", &[&token])
            .await;
    assert_eq!(String::from_utf8_lossy(&search.stdout), "searched\n");
    // The host's private places are not there at all.
    let listing =
        sh(&*sandbox.backend, "ls -a / && ls -d /root /home /run /var /sys /srv /opt /mnt 2>&1; true", &[]).await;
    let listing = String::from_utf8_lossy(&listing.stdout);
    for gone in ["/root", "/home", "/run", "/var", "/sys", "/srv", "/opt", "/mnt"] {
        assert!(listing.contains(&format!("ls: cannot access '{gone}'")), "{gone} is visible: {listing}");
    }
    // /etc holds only the allowlist: no shadow, no ssh keys, no machine id.
    let etc = sh(&*sandbox.backend, "ls -a /etc", &[]).await;
    let etc = String::from_utf8_lossy(&etc.stdout);
    for hidden in ["shadow", "ssh", "machine-id", "hostname", "sudoers"] {
        assert!(!etc.lines().any(|line| line == hidden), "/etc/{hidden} is visible: {etc}");
    }
    assert!(etc.lines().any(|line| line == "passwd"), "{etc}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_processes_are_invisible() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let seconds = marker("");
    let mut host_sleep =
        std::process::Command::new("sleep").arg(format!("3{seconds}")).spawn().expect("start a host sleep");
    let host_pid = host_sleep.id();
    let output = sh(
        &*sandbox.backend,
        "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; echo pid1=$(tr '\\0' ' ' < /proc/1/cmdline); ls /proc | grep -c '^[0-9]'",
        &[],
    )
    .await;
    let _ = host_sleep.kill();
    let _ = host_sleep.wait();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(!shown.contains(&seconds), "a host process is visible: {shown}");
    assert!(shown.contains("pid1=/usr/bin/bwrap "), "pid 1 is not the sandbox's init: {shown}");
    let count: usize = shown.lines().last().unwrap_or("").trim().parse().unwrap_or(usize::MAX);
    assert!(count < 10, "{count} processes visible: {shown}");
    let probe = sh(&*sandbox.backend, "kill -0 \"$1\"", &[&host_pid.to_string()]).await;
    assert_ne!(probe.exit_code, 0, "host pid {host_pid} is reachable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn network_is_off_unless_the_spec_asks() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let connect = "exec 3<>/dev/tcp/127.0.0.1/$1 && printf sandbox-was-here >&3";

    let offline = sandbox(WorkspaceSpec::default()).await;
    let output = offline.backend.exec(&bash(connect, &[&port])).await.unwrap();
    assert_ne!(output.exit_code, 0, "connected without network");
    let interfaces = sh(&*offline.backend, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", &[]).await;
    assert_eq!(String::from_utf8_lossy(&interfaces.stdout), "lo\n");

    // With network the sandbox has an interface of its own, and still not the host's
    // loopback (what it may reach: bubblewrap_network.rs).
    let online = sandbox(WorkspaceSpec { network: true, ..WorkspaceSpec::default() }).await;
    let _guard = berth_testkit::netns::NamespaceGuard {
        name: berth_backend_bubblewrap::network::netns_name(&online.root),
        state_dir: online.driver.config().network.state_dir.clone(),
    };
    let interfaces = sh(&*online.backend, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' ' | sort", &[]).await;
    assert_ne!(String::from_utf8_lossy(&interfaces.stdout), "lo\n");
    let output = online.backend.exec(&bash(connect, &[&port])).await.unwrap();
    assert_ne!(output.exit_code, 0, "a networked sandbox reached host loopback");
    listener.set_nonblocking(true).unwrap();
    assert!(listener.accept().is_err(), "host loopback accepted a connection");
    online.driver.destroy(&online.id).await.unwrap();
}

fn bash(script: &str, args: &[&str]) -> ExecSpec {
    let mut argv = vec!["bash".to_owned(), "-c".to_owned(), script.to_owned(), "bash".to_owned()];
    argv.extend(args.iter().map(|arg| (*arg).to_owned()));
    let mut spec = ExecSpec::new(argv);
    spec.timeout = Duration::from_secs(30);
    spec
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_workspace_and_tmp_are_writable() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    for target in ["/etc/x", "/usr/x", "/x", "/dev/x", "/proc/x", "/bin/x"] {
        let output = sh(&*sandbox.backend, "echo x > \"$1\"", &[target]).await;
        assert_ne!(output.exit_code, 0, "wrote {target}");
    }
    let output = sh(
        &*sandbox.backend,
        "echo w > /workspace/w && echo t > /tmp/t && echo s > /dev/shm/s && pwd && cat /tmp/t",
        &[],
    )
    .await;
    assert_eq!(output.exit_code, 0, "{}", String::from_utf8_lossy(&output.stderr));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "/workspace\nt\n");
    assert_eq!(std::fs::read(sandbox.root.join("w")).unwrap(), b"w\n");
    // Files the sandbox makes belong to the sandbox user on the host, ready for HostFs.
    use std::os::unix::fs::MetadataExt as _;
    let owner = std::fs::metadata(sandbox.root.join("w")).unwrap().uid();
    if let Some(users) = sandbox.bubblewrap.users() {
        assert_eq!(owner, users.agent.uid);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tmp_is_private_and_per_exec() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let name = marker("berth-host-tmp-");
    let host_file = std::env::temp_dir().join(&name);
    std::fs::write(&host_file, b"host").unwrap();
    let output =
        sh(&*sandbox.backend, "ls -A /tmp; test ! -e \"/tmp/$1\" && echo mine > /tmp/sandbox-only", &[&name]).await;
    std::fs::remove_file(&host_file).unwrap();
    assert_eq!(output.exit_code, 0, "the host /tmp is visible: {:?}", output.stdout);
    assert!(output.stdout.is_empty(), "/tmp is not empty: {:?}", String::from_utf8_lossy(&output.stdout));
    assert!(!std::env::temp_dir().join("sandbox-only").exists());
    let next = sh(&*sandbox.backend, "ls -A /tmp", &[]).await;
    assert!(next.stdout.is_empty(), "/tmp carried over between execs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_data_and_other_workspaces_are_invisible() {
    // The node agent's layout: <data>/workspaces/<id>, plus its own state beside them.
    let data = tempfile::tempdir().unwrap();
    let workspaces = data.path().join("workspaces");
    for dir in ["ws-a", "ws-b"] {
        std::fs::create_dir_all(workspaces.join(dir)).unwrap();
    }
    let other_marker = marker("other-ws-");
    std::fs::write(workspaces.join("ws-b").join(&other_marker), b"b").unwrap();
    std::fs::write(data.path().join("node-state.json"), b"{}").unwrap();
    let sandbox = bwrap_support::sandbox_at(&workspaces.join("ws-a"), WorkspaceSpec::default()).await;
    let data_path = data.path().display().to_string();
    let output = sh(
        &*sandbox.backend,
        "ls \"$1\" 2>&1; find / -xdev \\( -name \"$2\" -o -name node-state.json -o -name ws-b \\) -print 2>/dev/null; ls -A /workspace/..; echo end",
        &[&data_path, &other_marker],
    )
    .await;
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("No such file or directory"), "{shown}");
    assert!(!shown.contains(&other_marker) && !shown.contains("node-state") && !shown.contains("ws-b"), "{shown}");
    assert!(shown.ends_with("end\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_unprivileged_with_a_minimal_env() {
    let sandbox = sandbox(WorkspaceSpec {
        env: BTreeMap::from([("FROM_SPEC".to_owned(), "1".to_owned())]),
        ..WorkspaceSpec::default()
    })
    .await;
    let mut spec = ExecSpec::new(vec!["env".into()]);
    spec.spawn.env = BTreeMap::from([("FROM_EXEC".to_owned(), "2".to_owned())]);
    let output = sandbox.backend.exec(&spec).await.unwrap();
    let mut lines: Vec<String> = String::from_utf8_lossy(&output.stdout).lines().map(str::to_owned).collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "FROM_EXEC=2".to_owned(),
            "FROM_SPEC=1".to_owned(),
            "HOME=/workspace".to_owned(),
            "LANG=C.UTF-8".to_owned(),
            format!("PATH={}", berth_backend_bubblewrap::DEFAULT_PATH),
            // Set by bwrap after --chdir.
            "PWD=/workspace".to_owned(),
        ]
    );
    let output = sh(&*sandbox.backend, "id -u; id -g; grep CapEff /proc/self/status; hostname", &[]).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "1000\n1000\nCapEff:\t0000000000000000\nworkspace\n");
    // On the host the sandbox is the unprivileged sandbox user, not root.
    let seconds = marker("");
    let mut spec = shell(&format!("sleep 3{seconds}"));
    spec.timeout = Duration::from_secs(60);
    let backend = sandbox.backend.clone();
    let running = tokio::spawn(async move { backend.exec(&spec).await });
    let needle = format!("3{seconds}");
    assert_eventually("the marker sleep to show on the host", Duration::from_secs(20), || {
        let found = !sleepers(&seconds).is_empty();
        async move { found }
    })
    .await;
    let expected_uid =
        sandbox.bubblewrap.users().map_or_else(|| nix::unistd::geteuid().as_raw(), |users| users.agent.uid);
    for (pid, _) in host_processes_with(&needle) {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let uid_line = status.lines().find(|line| line.starts_with("Uid:")).unwrap_or("");
        let real_uid: u32 = uid_line.split_whitespace().nth(1).and_then(|uid| uid.parse().ok()).unwrap_or(0);
        assert_eq!(real_uid, expected_uid, "{uid_line}");
        assert_ne!(real_uid, 0);
    }
    running.abort();
    assert_eventually("the aborted exec's sandbox to die", Duration::from_secs(20), || {
        let gone = host_processes_with(&needle).is_empty();
        async move { gone }
    })
    .await;
}

// ---- driver -----------------------------------------------------------------------------

#[tokio::test]
async fn a_missing_bwrap_is_named() {
    let error = BubblewrapDriver::new(BubblewrapConfig {
        bwrap_path: "/nonexistent/bwrap".into(),
        ..BubblewrapConfig::default()
    })
    .await
    .unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, WorkspaceError::BackendUnavailable { .. }), "{error:?}");
    assert!(message.contains("/nonexistent/bwrap") && message.contains("install bubblewrap"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provision_is_idempotent_and_hands_the_root_over() {
    use std::os::unix::fs::MetadataExt as _;
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("ws");
    std::fs::create_dir_all(root.join("pre/existing")).unwrap();
    std::fs::write(root.join("pre/existing/file"), b"root's").unwrap();
    let driver = bwrap_support::driver(BubblewrapConfig::default()).await;
    assert_eq!(driver.name(), "bubblewrap");
    let id = WorkspaceId::new("ws-idem").unwrap();
    let spec = WorkspaceSpec::default();
    let context = ProvisionContext::unplaced(&id, &root, &spec);
    let first = driver.provision_bubblewrap(context).await.unwrap();
    let second = driver.provision_bubblewrap(context).await.unwrap();
    assert!(Arc::ptr_eq(&first, &second));
    if let Some(users) = first.users() {
        let (uid, gid) = (users.agent.uid, users.agent.gid);
        for path in ["", "pre", "pre/existing", "pre/existing/file"] {
            let metadata = std::fs::metadata(root.join(path)).unwrap();
            assert_eq!((metadata.uid(), metadata.gid()), (uid, gid), "{path}");
        }
    }
    // What existed before is the sandbox's to change now.
    let output = sh(&*first, "echo mine >> pre/existing/file && cat pre/existing/file", &[]).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "root'smine\n");
    // An API write lands with the sandbox user as owner, so the sandbox can append to it.
    first.write_bytes(&rel("api/new.txt"), bytes::Bytes::from_static(b"api\n"), 0o644).await.unwrap();
    let output = sh(&*first, "echo sandbox >> api/new.txt && cat api/new.txt", &[]).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "api\nsandbox\n");
    driver.release(&id).await.unwrap();
    driver.destroy(&id).await.unwrap();
    // Handles outlive release.
    assert_eq!(sh(&*first, "true", &[]).await.exit_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_programs_fail_before_spawning_and_present_ones_run() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    for program in ["berth-no-such-program", "/opt/nothing", "/usr/bin/berth-nope", "./nope", "/etc/shadow"] {
        let result = sandbox.backend.exec(&ExecSpec::new(vec![program.into()])).await;
        assert!(matches!(result, Err(WorkspaceError::SpawnFailed { .. })), "{program}: {result:?}");
    }
    // Found through /bin -> usr/bin, through a workspace-relative path, and in a PATH
    // entry inside the workspace.
    sandbox
        .backend
        .write_bytes(&rel("bin/tool"), bytes::Bytes::from_static(b"#!/bin/sh\necho tool\n"), 0o755)
        .await
        .unwrap();
    for (argv0, path) in [("/bin/true", None), ("./bin/tool", None), ("tool", Some("/workspace/bin:/usr/bin"))] {
        let mut spec = ExecSpec::new(vec![argv0.into()]);
        if let Some(path) = path {
            spec.spawn.env.insert("PATH".into(), path.into());
        }
        let output = sandbox.backend.exec(&spec).await.unwrap();
        assert_eq!(output.exit_code, 0, "{argv0}: {}", String::from_utf8_lossy(&output.stderr));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_suite_fixture_hides_nothing_it_should_not() {
    // The suite's fixture binds the test's temp dir above the root; make sure that is the
    // only difference from a production sandbox.
    let fixture = suite_fixture().await;
    let backend = fixture.backend();
    let output = sh(&*backend, "pwd; ls -A /sandbox", &[]).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "/sandbox/ws\nws\n");
}
