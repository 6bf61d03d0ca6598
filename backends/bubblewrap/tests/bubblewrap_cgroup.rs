//! Workspace cgroups on the real hierarchy of this host: a process started through the
//! join prefix is inside before it runs, the memory limit kills a bomb (and only the
//! bomb's cgroup), and removal kills what is left and deletes the directories.
//!
//! Needs root and a writable cgroup hierarchy (v1 or v2); without one every test fails
//! with the detection error, it never skips.

use std::process::{Command, Stdio};
use std::time::Duration;

use berth_backend_bubblewrap::cgroup::{CgroupLimits, CgroupMode, CgroupSettings, Cgroups, WorkspaceCgroup};
use berth_testkit::assert_eventually;

fn hierarchy() -> Cgroups {
    let settings = CgroupSettings {
        mode: CgroupMode::Required,
        name: format!("berth-test-{:08x}", rand::random::<u32>()),
        ..CgroupSettings::default()
    };
    Cgroups::detect(&settings).expect("a writable cgroup hierarchy").expect("mode required yields one")
}

/// Runs `script` under `sh` through the join prefix, as the launch chain does.
fn joined(group: &WorkspaceCgroup, script: &str) -> Command {
    let prefix = group.join_prefix();
    let mut command = Command::new(&prefix[0]);
    command.args(&prefix[1..]).args(["/bin/sh", "-c", script]).env_clear().env("PATH", "/usr/bin:/bin");
    command.stdout(Stdio::piped()).stderr(Stdio::piped());
    command
}

/// Removes the workspace cgroup and the test's own parent directories.
fn clean_up(group: &WorkspaceCgroup) {
    group.remove().expect("remove kills and deletes");
    for dir in group.dirs() {
        assert!(!dir.exists(), "{} left behind", dir.display());
        if let Some(parent) = dir.parent() {
            let _ = std::fs::remove_dir(parent);
        }
    }
}

#[tokio::test]
async fn a_joined_process_is_inside_before_it_runs_and_removal_kills_it() {
    let cgroups = hierarchy();
    let group = cgroups.create("ws-join", &CgroupLimits { pids: 64, ..CgroupLimits::default() }).unwrap();
    // The command reads its own membership: it must already be in the cgroup.
    let output = joined(&group, "cat /proc/self/cgroup").output().unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let membership = String::from_utf8_lossy(&output.stdout);
    assert!(membership.contains("/ws-join"), "not inside at start:\n{membership}");

    let mut sleeper = joined(&group, "sleep 300 & sleep 300; wait").spawn().unwrap();
    assert_eventually("two sleeps and their shell in the cgroup", Duration::from_secs(10), || {
        let pids = group.pids();
        async move { pids.is_ok_and(|pids| pids.len() >= 3) }
    })
    .await;
    clean_up(&group);
    let status = sleeper.wait().unwrap();
    assert!(!status.success(), "the sleeper survived removal: {status:?}");
}

#[test]
fn the_memory_limit_kills_a_bomb_and_counts_it() {
    let cgroups = hierarchy();
    let limit = 64 * 1024 * 1024;
    let group = cgroups.create("ws-bomb", &CgroupLimits { memory_bytes: limit, ..CgroupLimits::default() }).unwrap();
    // 512 MiB through a pipe that `tail` must hold in memory: 8 × the limit.
    let output = joined(&group, "head -c 536870912 /dev/zero | tail -c 536870912 | wc -c").output().unwrap();
    let counted = String::from_utf8_lossy(&output.stdout);
    assert_ne!(counted.trim(), "536870912", "the bomb held 512 MiB under a 64 MiB limit");
    assert!(group.oom_kills().is_some_and(|kills| kills >= 1), "no OOM kill recorded: {:?}", group.oom_kills());

    // The node itself is fine: the same command outside the cgroup completes.
    let outside =
        Command::new("/bin/sh").args(["-c", "head -c 1048576 /dev/zero | tail -c 1048576 | wc -c"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&outside.stdout).trim(), "1048576");
    clean_up(&group);
}

#[test]
fn limits_are_written_and_recreating_updates_them() {
    let cgroups = hierarchy();
    let first =
        cgroups.create("ws-limits", &CgroupLimits { memory_bytes: 128 << 20, cpu_millis: 500, pids: 32 }).unwrap();
    let read = |name: &str| {
        first
            .dirs()
            .iter()
            .find_map(|dir| std::fs::read_to_string(dir.join(name)).ok())
            .unwrap_or_else(|| panic!("{name} in none of {:?}", first.dirs()))
    };
    if cgroups.version() == "v1" {
        assert_eq!(read("memory.limit_in_bytes").trim(), (128u64 << 20).to_string());
        assert_eq!(read("cpu.cfs_quota_us").trim(), "50000");
    } else {
        assert_eq!(read("memory.max").trim(), (128u64 << 20).to_string());
        assert_eq!(read("cpu.max").trim(), "50000 100000");
    }
    assert_eq!(read("pids.max").trim(), "32");
    let again = cgroups.create("ws-limits", &CgroupLimits { pids: 16, ..CgroupLimits::default() }).unwrap();
    assert_eq!(again, first);
    assert_eq!(read("pids.max").trim(), "16");
    clean_up(&again);
}
