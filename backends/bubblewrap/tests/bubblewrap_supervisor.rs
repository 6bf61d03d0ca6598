//! The resident supervisor of the bubblewrap backend (`src/supervised.rs`): a command it
//! starts sees exactly the sandbox a per-exec bwrap builds; it is small when idle; it
//! dies cleanly (a typed error for the running exec, a fresh supervisor next time); its
//! socket is out of every command's reach; it leaves nothing behind.
//!
//! Needs `bwrap` and user namespaces, like every test of this backend (never skips).

mod bwrap_support;

use std::time::Duration;

use berth_backend_bubblewrap::BubblewrapConfig;
use berth_testkit::{assert_eventually, sh};
use berth_workspace::{WorkspaceError, WorkspaceSpec};
use bwrap_support::{host_processes_with, marker, sandbox, sandbox_with, shell, sleepers};

fn per_exec() -> BubblewrapConfig {
    BubblewrapConfig { supervisor: false, ..BubblewrapConfig::default() }
}

/// What a command can learn about its own confinement: who it is, its capabilities and
/// privileges, its limits, its mounts (points, options), its env, host name, the /tmp it
/// starts with, its session. Namespace ids and pids differ between sandboxes by nature and
/// are left out.
const CONFINEMENT_PROBE: &str = r#"
id
grep -E '^(Cap|NoNewPrivs|Seccomp|SigIgn|SigBlk)' /proc/self/status
cat /proc/self/uid_map /proc/self/gid_map
ulimit -a
env | sort
hostname
ls -A /tmp /dev/shm
awk '{print $5, $6}' /proc/self/mountinfo | sort
awk '{ for (i = 1; i <= NF; i++) if ($i == "-") print $(i+1), $(i+3) }' /proc/self/mountinfo | sed 's/size=[0-9]*k/size=N/' | sort
cat /proc/sys/user/max_user_namespaces
test "$(ps -o sid= -p $$ 2>/dev/null || cut -d' ' -f6 /proc/self/stat)" && echo has-session
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_supervised_command_sees_the_same_sandbox_as_a_per_exec_one() {
    let spec = WorkspaceSpec { pids: 77, file_size_bytes: 5 << 20, cpu_time_secs: 30, ..WorkspaceSpec::default() };
    let supervised = sandbox(spec.clone()).await;
    assert!(supervised.bubblewrap.supervised());
    let fresh = sandbox_with(per_exec(), spec).await;
    assert!(!fresh.bubblewrap.supervised());
    let env = [("PROBE_VALUE", "x y")];
    let mut probe = shell(CONFINEMENT_PROBE);
    probe.spawn.env = env.iter().map(|(name, value)| ((*name).to_owned(), (*value).to_owned())).collect();
    let seen_supervised = supervised.backend.exec(&probe).await.unwrap();
    let seen_fresh = fresh.backend.exec(&probe).await.unwrap();
    assert_eq!(seen_supervised.exit_code, 0, "{}", String::from_utf8_lossy(&seen_supervised.stderr));
    let (supervised_text, fresh_text) =
        (String::from_utf8_lossy(&seen_supervised.stdout), String::from_utf8_lossy(&seen_fresh.stdout));
    assert_eq!(supervised_text, fresh_text, "the supervised sandbox differs from a per-exec one");
    // And it is the confinement we expect, not two equal wrong ones.
    assert!(supervised_text.contains("uid=1000"), "{supervised_text}");
    assert!(supervised_text.contains("CapEff:\t0000000000000000"), "{supervised_text}");
    assert!(supervised_text.contains("CapBnd:\t0000000000000000"), "{supervised_text}");
    assert!(supervised_text.contains("NoNewPrivs:\t1"), "{supervised_text}");
    assert!(supervised_text.contains("PROBE_VALUE=x y"), "{supervised_text}");
    // SIGPIPE at its default (the supervisor's runtime ignores it) and nothing blocked.
    let mask = |name: &str| {
        let line = supervised_text.lines().find_map(|line| line.strip_prefix(name)).expect(name);
        u64::from_str_radix(line.trim(), 16).expect(name)
    };
    assert_eq!(mask("SigIgn:") & (1 << (13 - 1)), 0, "SIGPIPE ignored: {supervised_text}");
    assert_eq!(mask("SigBlk:"), 0, "{supervised_text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_supervisor_is_small() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let output = sh(&*sandbox.backend, "true", &[]).await;
    assert_eq!(output.exit_code, 0);
    let pid = sandbox.bubblewrap.supervisor_pid().await.expect("a supervisor runs after an exec");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read the supervisor's status");
    let rss_kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status");
    eprintln!("idle supervisor VmRSS: {rss_kib} KiB");
    assert!(rss_kib <= 2048, "idle supervisor RSS {rss_kib} KiB > 2 MiB");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_supervisor_fails_its_exec_cleanly_and_is_replaced() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let seconds = marker("");
    let backend = sandbox.backend.clone();
    let script = format!("sleep 3{seconds}");
    let running = tokio::spawn(async move { backend.exec(&shell(&script)).await });
    assert_eventually("the sleep to run", Duration::from_secs(20), || {
        let count = sleepers(&seconds).len();
        async move { count == 1 }
    })
    .await;
    let first = sandbox.bubblewrap.supervisor_pid().await.expect("a supervisor runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(20), running).await.expect("the exec did not end").unwrap();
    match outcome {
        Err(WorkspaceError::Backend { backend: "bubblewrap", message }) => {
            assert!(message.contains("supervisor died"), "{message}");
        }
        other => panic!("expected a typed supervisor error, got {other:?}"),
    }
    assert_eventually("the killed sandbox's processes to be gone", Duration::from_secs(10), || {
        let left = host_processes_with(&seconds);
        async move { left.is_empty() }
    })
    .await;
    assert_eq!(sandbox.bubblewrap.running(), 0);
    let next = sh(&*sandbox.backend, "echo again", &[]).await;
    assert_eq!(String::from_utf8_lossy(&next.stdout), "again\n");
    let second = sandbox.bubblewrap.supervisor_pid().await.expect("a fresh supervisor runs");
    assert_ne!(first, second);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_command_can_reach_a_supervisor_socket() {
    let other = sandbox(WorkspaceSpec::default()).await;
    let seconds = marker("");
    let backend = other.backend.clone();
    let script = format!("sleep 3{seconds}");
    let running = tokio::spawn(async move { backend.exec(&shell(&script)).await });
    assert_eventually("the other workspace's sleep to run", Duration::from_secs(20), || {
        let count = sleepers(&seconds).len();
        async move { count == 1 }
    })
    .await;
    let other_supervisor = other.bubblewrap.supervisor_pid().await.expect("the other workspace's supervisor");

    let hostile = sandbox(WorkspaceSpec::default()).await;
    // Every fd this sandbox's processes can open, every socket file anywhere in its view.
    let output = sh(
        &*hostile.backend,
        "for fd in /proc/[0-9]*/fd/*; do readlink \"$fd\"; done 2>/dev/null | grep -c socket; \
         find / -xdev -type s 2>/dev/null | wc -l; \
         ls /proc/2/fd 2>&1 | head -1; \
         cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
        &[],
    )
    .await;
    let shown = String::from_utf8_lossy(&output.stdout);
    let mut lines = shown.lines();
    assert_eq!(lines.next(), Some("0"), "a command can reach a socket: {shown}");
    assert_eq!(lines.next(), Some("0"), "a socket file is visible: {shown}");
    // pid 2 is its own supervisor: undumpable, so even its fd directory is closed.
    assert!(lines.next().is_some_and(|line| line.contains("Permission denied")), "{shown}");
    assert!(!shown.contains(&seconds), "the other workspace's processes are visible: {shown}");
    // The other workspace's supervisor has no socket file either: its control socket is
    // an anonymous socketpair.
    let links: Vec<String> = std::fs::read_dir(format!("/proc/{other_supervisor}/fd"))
        .unwrap()
        .filter_map(|entry| std::fs::read_link(entry.ok()?.path()).ok())
        .map(|target| target.display().to_string())
        .collect();
    assert!(links.iter().any(|target| target.starts_with("socket:")), "{links:?}");
    let unix = std::fs::read_to_string(format!("/proc/{other_supervisor}/net/unix")).unwrap();
    assert!(unix.lines().skip(1).all(|line| line.split_whitespace().nth(7).is_none()), "a named socket: {unix}");
    other.bubblewrap.kill_all();
    let killed = tokio::time::timeout(Duration::from_secs(20), running).await.expect("the killed exec did not end");
    let output = killed.unwrap().expect("a killed exec is a result, not an error");
    assert_eq!(output.signal, Some(9), "{output:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn background_processes_die_with_their_exec_and_tmp_stays_per_exec() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let seconds = marker("");
    let output = sh(
        &*sandbox.backend,
        &format!("sleep 3{seconds} & setsid sleep 4{seconds} & (setsid sh -c 'sleep 5{seconds}' &); echo t > /tmp/t; echo started"),
        &[],
    )
    .await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "started\n");
    assert_eventually("every background process of the exec to be gone", Duration::from_secs(10), || {
        let left = host_processes_with(&seconds);
        async move { left.is_empty() }
    })
    .await;
    let next = sh(&*sandbox.backend, "ls -A /tmp", &[]).await;
    assert!(next.stdout.is_empty(), "/tmp carried over: {:?}", String::from_utf8_lossy(&next.stdout));
    // Two concurrent execs do not share /tmp either.
    let (first, second) = tokio::join!(
        sh(&*sandbox.backend, "echo a > /tmp/mine; sleep 1; ls -A /tmp", &[]),
        sh(&*sandbox.backend, "echo b > /tmp/other; sleep 1; ls -A /tmp", &[]),
    );
    assert_eq!((&first.stdout[..], &second.stdout[..]), (&b"mine\n"[..], &b"other\n"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_supervisor_exits_and_the_next_exec_starts_one() {
    let config = BubblewrapConfig { supervisor_idle: Duration::from_millis(300), ..BubblewrapConfig::default() };
    let sandbox = sandbox_with(config, WorkspaceSpec::default()).await;
    assert_eq!(sh(&*sandbox.backend, "true", &[]).await.exit_code, 0);
    let first = sandbox.bubblewrap.supervisor_pid().await.expect("a supervisor runs");
    assert_eventually("the idle supervisor to exit", Duration::from_secs(20), || {
        let alive = std::path::Path::new(&format!("/proc/{first}")).exists()
            && std::fs::read_to_string(format!("/proc/{first}/status")).is_ok_and(|status| !status.contains("zombie"));
        async move { !alive }
    })
    .await;
    for round in 0..5 {
        let output = sh(&*sandbox.backend, "echo $0", &[]).await;
        assert_eq!(String::from_utf8_lossy(&output.stdout), "sh\n", "round {round}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn spawn_failures_are_typed_like_before() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    for argv in [vec!["no-such-program-anywhere"], vec!["/no/such/file"], vec!["/workspace"]] {
        let spec = berth_workspace::ExecSpec::new(argv.iter().map(|arg| (*arg).to_owned()).collect());
        match sandbox.backend.exec(&spec).await {
            Err(WorkspaceError::SpawnFailed { program, .. }) => assert_eq!(program, argv[0]),
            other => panic!("{argv:?}: expected SpawnFailed, got {other:?}"),
        }
    }
}

/// The supervisor starts the command from a child that shares its shim's memory until the
/// `execve`, and follows `execvp`'s rules on the way: a file without a `#!` line runs
/// under `/bin/sh` with its arguments, a PATH entry whose file is not executable is passed
/// over for a later one, and with no executable candidate at all the spawn fails typed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_is_found_and_started_by_execvps_rules() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let setup = sh(
        &*sandbox.backend,
        "mkdir -p /workspace/a /workspace/b && printf 'echo \"$0|$1|$2\"\\n' > /workspace/b/tool \
         && chmod 755 /workspace/b/tool && printf 'echo wrong\\n' > /workspace/a/tool && chmod 644 /workspace/a/tool",
        &[],
    )
    .await;
    assert_eq!(setup.exit_code, 0, "{setup:?}");
    let run = |path: &str| {
        let mut spec = berth_workspace::ExecSpec::new(vec!["tool".into(), "one".into(), "two words".into()]);
        spec.spawn.env.insert("PATH".into(), path.into());
        spec
    };
    for _ in 0..3 {
        let output = sandbox.backend.exec(&run("/workspace/a:/workspace/b")).await.expect("the second candidate runs");
        assert_eq!(String::from_utf8_lossy(&output.stdout), "/workspace/b/tool|one|two words\n", "{output:?}");
        assert_eq!(output.exit_code, 0);
    }
    match sandbox.backend.exec(&run("/workspace/a")).await {
        Err(WorkspaceError::SpawnFailed { program, reason }) => {
            assert_eq!(program, "tool");
            assert!(reason.to_lowercase().contains("permission denied"), "{reason}");
        }
        other => panic!("a PATH with only a non-executable candidate: expected SpawnFailed, got {other:?}"),
    }
    // A failed start leaves the supervisor serving, with no child of it left behind.
    assert_eq!(&sh(&*sandbox.backend, "echo $0", &[]).await.stdout[..], b"sh\n");
}
