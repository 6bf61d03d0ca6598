//! The bubblewrap backend's resource limits and process trees, checked from the host:
//! each spec limit is enforced inside the sandbox, and a timed-out, dropped or destroyed
//! exec leaves no process behind in the host's /proc. Plus the exec latency report.
//!
//! Needs `bwrap` (bubblewrap ≥ 0.8) and user namespaces; a missing bwrap fails every test
//! here with the driver's `BackendUnavailable` message, it never skips.

mod bwrap_support;

use std::time::Duration;

use berth_testkit::{assert_eventually, rel, sh};
use berth_workspace::{BackendDriver, ExecSpec, WorkspaceSpec};
use bwrap_support::{host_processes_with, marker, sandbox, shell, sleepers};

// ---- limits -----------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_limit_is_enforced() {
    let sandbox = sandbox(WorkspaceSpec { memory_bytes: 64 * 1024 * 1024, ..WorkspaceSpec::default() }).await;
    let hog = sh(&*sandbox.backend, "dd if=/dev/zero of=/dev/null bs=256M count=1", &[]).await;
    assert_ne!(hog.exit_code, 0);
    // With a cgroup the kernel's OOM killer ends it (the shell reports "Killed"); with
    // RLIMIT_AS only, the allocation itself fails.
    let expected = if sandbox.driver.cgroup_version().is_some() { "Killed" } else { "memory exhausted" };
    assert!(String::from_utf8_lossy(&hog.stderr).contains(expected), "{:?}", String::from_utf8_lossy(&hog.stderr));
    let modest = sh(&*sandbox.backend, "dd if=/dev/zero of=/dev/null bs=8M count=1", &[]).await;
    assert_eq!(modest.exit_code, 0, "{}", String::from_utf8_lossy(&modest.stderr));
}

/// Six processes that each hold 16 MB for two seconds, then say they survived: 96 MB in
/// all, but each one far below a 64 MiB per-process limit.
const SPREAD_BOMB: &str = "for i in 1 2 3 4 5 6; do (x=$(head -c 16000000 /dev/zero | tr '\\0' a); sleep 2; \
                           echo survived$i) & done; wait";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_memory_bomb_spread_over_processes_is_contained_by_the_workspace_cgroup() {
    use berth_backend_bubblewrap::{BubblewrapConfig, CgroupPolicy};
    const LIMIT: u64 = 64 * 1024 * 1024;
    let spec = WorkspaceSpec { memory_bytes: LIMIT, ..WorkspaceSpec::default() };
    // Per-process RLIMIT_AS alone: every process stays under it, so all six survive and the
    // workspace holds half again its limit.
    let rlimits_only = BubblewrapConfig { cgroups: CgroupPolicy::Off, ..BubblewrapConfig::default() };
    let uncontained = bwrap_support::sandbox_with(rlimits_only, spec.clone()).await;
    let output = sh(&*uncontained.backend, SPREAD_BOMB, &[]).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout).matches("survived").count(), 6, "{output:?}");

    // With the workspace cgroup the OOM killer keeps the total under the limit.
    let required = BubblewrapConfig { cgroups: CgroupPolicy::Required, ..BubblewrapConfig::default() };
    let sandbox = bwrap_support::sandbox_with(required, spec).await;
    let cgroup = sandbox.bubblewrap.cgroup().expect("a workspace cgroup").clone();
    let output = sh(&*sandbox.backend, SPREAD_BOMB, &[]).await;
    let survivors = String::from_utf8_lossy(&output.stdout).matches("survived").count();
    assert!(survivors < 6, "all six held their memory: {output:?}");
    let peak = cgroup.memory_peak_bytes().expect("the cgroup reports its peak");
    assert!(peak <= LIMIT, "peak {peak} over the limit {LIMIT}");
    eprintln!("spread bomb: {survivors} of 6 survived, cgroup peak {} MiB of {} MiB", peak >> 20, LIMIT >> 20);
    // A single runaway process is killed outright, and the workspace goes on working.
    let bomb = sh(&*sandbox.backend, "tail /dev/zero", &[]).await;
    assert_eq!(bomb.signal, Some(nix::libc::SIGKILL), "{bomb:?}");
    let after = sh(&*sandbox.backend, "echo fine", &[]).await;
    assert_eq!(String::from_utf8_lossy(&after.stdout), "fine\n");
    // Release removes the cgroup.
    sandbox.driver.release(&sandbox.id).await.unwrap();
    assert!(cgroup.procs_files().iter().all(|file| !file.exists()), "the cgroup outlived release");
}

/// Tries to start 100 background processes; dash aborts with "Cannot fork" at the limit.
const FORK_100: &str = "i=0; while [ $i -lt 100 ]; do sleep 30 & i=$((i+1)); done; echo reached $i; kill $(jobs -p)";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pids_limit_stops_a_fork_bomb() {
    let limited = sandbox(WorkspaceSpec { pids: 32, ..WorkspaceSpec::default() }).await;
    let output = sh(&*limited.backend, FORK_100, &[]).await;
    assert_ne!(output.exit_code, 0);
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("Cannot fork"),
        "{:?}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.stdout.is_empty());
    // The same with room to spare works: the limit, not something else, stopped it.
    let roomy = sandbox(WorkspaceSpec { pids: 200, ..WorkspaceSpec::default() }).await;
    let output = sh(&*roomy.backend, FORK_100, &[]).await;
    assert_eq!(String::from_utf8_lossy(&output.stdout), "reached 100\n", "{}", String::from_utf8_lossy(&output.stderr));
    // The budget is per workspace, not per host: two limited workspaces at once both get
    // their share.
    let other = sandbox(WorkspaceSpec { pids: 32, ..WorkspaceSpec::default() }).await;
    const FORK_20: &str = "i=0; while [ $i -lt 20 ]; do sleep 2 & i=$((i+1)); done; wait; echo ok";
    let (first, second) = tokio::join!(sh(&*limited.backend, FORK_20, &[]), sh(&*other.backend, FORK_20, &[]));
    assert_eq!((&first.stdout[..], &second.stdout[..]), (&b"ok\n"[..], &b"ok\n"[..]));
    // With a cgroup, concurrent execs of one workspace share its budget (like one
    // container); so they do under one supervisor (one user namespace, one RLIMIT_NPROC
    // count); only per-exec sandboxes without a cgroup give each exec its own.
    let (first, second) = tokio::join!(sh(&*limited.backend, FORK_20, &[]), sh(&*limited.backend, FORK_20, &[]));
    let both = &first.stdout[..] == b"ok\n" && &second.stdout[..] == b"ok\n";
    let own_budgets = limited.driver.cgroup_version().is_none() && !limited.bubblewrap.supervised();
    assert_eq!(both, own_budgets, "{first:?} {second:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_size_limit_is_enforced() {
    let sandbox = sandbox(WorkspaceSpec { file_size_bytes: 1024 * 1024, ..WorkspaceSpec::default() }).await;
    let output = sh(&*sandbox.backend, "head -c 3000000 /dev/zero > big; echo status=$?", &[]).await;
    // SIGXFSZ (25) kills the writer; the shell reports 128+25.
    assert_eq!(String::from_utf8_lossy(&output.stdout), "status=153\n");
    assert_eq!(sandbox.backend.stat(&rel("big")).await.unwrap().size, 1024 * 1024);
    let small = sh(&*sandbox.backend, "head -c 500000 /dev/zero > small", &[]).await;
    assert_eq!(small.exit_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cpu_time_limit_kills_a_busy_loop() {
    let sandbox = sandbox(WorkspaceSpec { cpu_time_secs: 1, ..WorkspaceSpec::default() }).await;
    let mut spec = shell("while :; do :; done");
    spec.timeout = Duration::from_secs(120);
    let output = sandbox.backend.exec(&spec).await.unwrap();
    assert!(!output.timed_out, "the exec timeout ended it, not the CPU limit");
    assert_eq!(output.signal, Some(nix::libc::SIGXCPU), "{output:?}");
    assert_eq!(output.exit_code, -1);
}

// ---- process trees --------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_kills_the_whole_sandbox_seen_from_the_host() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let seconds = marker("");
    // A grandchild, one that left the process group, and the main process.
    let script = format!("sleep 3{seconds} & setsid sleep 4{seconds} & sleep 5{seconds}");
    let mut spec = shell(&script);
    spec.timeout = Duration::from_secs(3);
    let backend = sandbox.backend.clone();
    let running = tokio::spawn(async move { backend.exec(&spec).await });
    assert_eventually("all three sleeps to run", Duration::from_secs(20), || {
        let count = sleepers(&seconds).len();
        async move { count == 3 }
    })
    .await;
    let output = running.await.unwrap().unwrap();
    assert!(output.timed_out);
    assert_eventually("every process of the timed-out sandbox to be gone", Duration::from_secs(10), || {
        let left = host_processes_with(&seconds);
        async move { left.is_empty() }
    })
    .await;
    assert_eq!(sandbox.bubblewrap.running(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_stream_and_destroy_kill_sandboxes() {
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let seconds = marker("");
    let stream = sandbox.backend.exec_stream(&shell(&format!("sleep 3{seconds} & sleep 4{seconds}"))).await.unwrap();
    assert_eventually("the streamed sleeps to run", Duration::from_secs(20), || {
        let count = sleepers(&seconds).len();
        async move { count == 2 }
    })
    .await;
    drop(stream);
    assert_eventually("the dropped stream's sandbox to die", Duration::from_secs(10), || {
        let left = host_processes_with(&seconds);
        async move { left.is_empty() }
    })
    .await;

    // A raw spawn nobody waits for dies with destroy.
    let seconds = marker("");
    let mut spawned = sandbox
        .backend
        .spawn(&berth_workspace::SpawnSpec::new(vec!["sleep".into(), format!("3{seconds}")]))
        .await
        .unwrap();
    assert_eventually("the spawned sleep to run", Duration::from_secs(20), || {
        let count = sleepers(&seconds).len();
        async move { count == 1 }
    })
    .await;
    assert_eq!(sandbox.bubblewrap.running(), 1);
    sandbox.driver.destroy(&sandbox.id).await.unwrap();
    let exit = tokio::time::timeout(Duration::from_secs(10), spawned.control.wait())
        .await
        .expect("the destroyed sandbox did not exit")
        .unwrap();
    assert_eq!(exit.signal, Some(9));
    // bwrap is reaped; the namespace's own processes were killed with it and are gone
    // as soon as the kernel has torn the namespace down.
    assert_eventually("the destroyed sandbox's processes to be gone", Duration::from_secs(10), || {
        let left = host_processes_with(&seconds);
        async move { left.is_empty() }
    })
    .await;
}

// ---- cost ------------------------------------------------------------------------------

/// Prints the median time of `true` three ways (run with `--nocapture`); no assertion,
/// timings on a shared machine are not a test.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_latency_report() {
    use berth_backend_bubblewrap::sandbox::{MountTable, WorkspaceMounts, bwrap_args};
    const RUNS: usize = 50;
    let sandbox = sandbox(WorkspaceSpec::default()).await;
    let config = sandbox.driver.config().clone();
    let table = MountTable::inspect(&config).unwrap();
    let mut direct_args = bwrap_args(
        &config,
        &table,
        &WorkspaceMounts {
            root: Some(&sandbox.root),
            dir: &config.workspace_dir,
            read_only_files: &[],
            network: false,
            tmp_per_exec: false,
        },
    );
    direct_args.extend(["--chdir", "/workspace", "--", "true"].map(Into::into));

    let per_exec = bwrap_support::sandbox_with(
        berth_backend_bubblewrap::BubblewrapConfig { supervisor: false, ..config.clone() },
        WorkspaceSpec::default(),
    )
    .await;
    let mut via_backend = Vec::with_capacity(RUNS);
    let mut via_per_exec = Vec::with_capacity(RUNS);
    let mut direct_bwrap = Vec::with_capacity(RUNS);
    let mut direct_spawn = Vec::with_capacity(RUNS);
    for _ in 0..RUNS {
        let started = std::time::Instant::now();
        let output = sandbox.backend.exec(&ExecSpec::new(vec!["true".into()])).await.unwrap();
        via_backend.push(started.elapsed());
        assert_eq!(output.exit_code, 0);

        let started = std::time::Instant::now();
        let output = per_exec.backend.exec(&ExecSpec::new(vec!["true".into()])).await.unwrap();
        via_per_exec.push(started.elapsed());
        assert_eq!(output.exit_code, 0);

        let mut command = tokio::process::Command::new(&config.bwrap_path);
        command.args(&direct_args).env_clear().env("PATH", berth_backend_bubblewrap::DEFAULT_PATH);
        if let Some(users) = sandbox.bubblewrap.users() {
            command.uid(users.agent.uid).gid(users.agent.gid);
        }
        let started = std::time::Instant::now();
        let status = command.status().await.unwrap();
        direct_bwrap.push(started.elapsed());
        assert!(status.success());

        let started = std::time::Instant::now();
        let status = tokio::process::Command::new("/bin/true").status().await.unwrap();
        direct_spawn.push(started.elapsed());
        assert!(status.success());
    }
    let median = |samples: &mut Vec<Duration>| {
        samples.sort();
        samples[samples.len() / 2]
    };
    eprintln!(
        "median of {RUNS} runs of `true`: backend exec {:?} (supervised), {:?} (a sandbox per exec), direct bwrap \
         {:?}, direct spawn {:?}",
        median(&mut via_backend),
        median(&mut via_per_exec),
        median(&mut direct_bwrap),
        median(&mut direct_spawn)
    );
}

/// A workspace provisioned again (a node restart, a lowered ceiling) gets the new limits
/// in its existing cgroup, not those the cgroup was made with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provisioning_again_rewrites_the_cgroup_limits() {
    use berth_backend_bubblewrap::{BubblewrapConfig, CgroupPolicy};
    use berth_workspace::ProvisionContext;
    let memory_limit = |cgroup: &berth_backend_bubblewrap::cgroup::WorkspaceCgroup| {
        cgroup
            .procs_files()
            .iter()
            .filter_map(|procs| procs.parent())
            .find_map(|dir| {
                ["memory.limit_in_bytes", "memory.max"]
                    .iter()
                    .find_map(|file| std::fs::read_to_string(dir.join(file)).ok())
            })
            .expect("a memory limit file")
            .trim()
            .to_owned()
    };
    let required = BubblewrapConfig { cgroups: CgroupPolicy::Required, ..BubblewrapConfig::default() };
    let spec = WorkspaceSpec { memory_bytes: 64 << 20, ..Default::default() };
    let sandbox = bwrap_support::sandbox_with(required.clone(), spec).await;
    let cgroup = sandbox.bubblewrap.cgroup().expect("a workspace cgroup").clone();
    assert_eq!(memory_limit(&cgroup), (64u64 << 20).to_string());
    // A restarted node agent: a new driver provisions the same workspace again.
    for megabytes in [32u64, 96] {
        let restarted = bwrap_support::driver(required.clone()).await;
        let spec = WorkspaceSpec { memory_bytes: megabytes << 20, ..Default::default() };
        let again = restarted
            .provision_bubblewrap(ProvisionContext::unplaced(&sandbox.id, &sandbox.root, &spec))
            .await
            .expect("provision again");
        let same = again.cgroup().map(|again| again.procs_files());
        assert_eq!(same, Some(cgroup.procs_files()), "not the same cgroup");
        // 96 after 32: a raise must pass v1's memory <= memory+swap ordering.
        assert_eq!(memory_limit(&cgroup), (megabytes << 20).to_string(), "{megabytes} MiB was not applied");
    }
    sandbox.driver.release(&sandbox.id).await.unwrap();
}
