//! The etcd harness itself, and `EtcdRegistry`'s deadlines and retries against dead members.

use std::time::{Duration, Instant};

use berth_control_plane::registry::Registry;
use berth_control_plane::registry::etcd::{EtcdConfig, EtcdRegistry};
use berth_tests::etcd::{EtcdCluster, EtcdProcess};
use bytes::Bytes;

fn key(test: &str) -> String {
    format!("/berth-harness/{test}/{:016x}", rand::random::<u64>())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_etcd_fails_calls_within_the_deadline() {
    let etcd = EtcdProcess::start();
    let call_timeout = Duration::from_secs(2);
    let registry = EtcdRegistry::connect(EtcdConfig { call_timeout, ..EtcdConfig::new([etcd.endpoint()]) })
        .await
        .expect("connect");
    let key = key("killed");
    registry.put(&key, Bytes::from_static(b"v")).await.expect("put while alive");

    etcd.kill();
    assert!(!etcd.is_running(), "kill waits until etcd is gone");
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(etcd.pid()).expect("pid")), None).is_err(),
        "no process with etcd's pid remains"
    );
    for operation in ["get", "put"] {
        let started = Instant::now();
        let result = match operation {
            "get" => registry.get(&key).await.map(|_| ()),
            _ => registry.put(&key, Bytes::new()).await.map(|_| ()),
        };
        let elapsed = started.elapsed();
        match result {
            Err(error) => assert!(error.is_retryable(), "{operation}: {error} is retryable"),
            Ok(()) => panic!("{operation} succeeded against a dead etcd"),
        }
        assert!(
            elapsed < call_timeout + Duration::from_secs(1),
            "{operation} took {elapsed:?}, past its {call_timeout:?} deadline"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_nothing_fails_fast() {
    let port = berth_tests::etcd::free_port().expect("port");
    let started = Instant::now();
    let result = EtcdRegistry::connect(EtcdConfig {
        call_timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        ..EtcdConfig::new([format!("http://127.0.0.1:{port}")])
    })
    .await;
    match result {
        Err(error) => assert!(error.is_retryable(), "{error}"),
        Ok(_) => panic!("connected to a closed port"),
    }
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
}

/// Writes that start after a follower died must all succeed: the client keeps trying the
/// dead endpoint, and the registry retries those undelivered calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_keeps_serving_after_a_follower_dies() {
    let cluster = EtcdCluster::start(3);
    let registry = berth_tests::etcd::connect(cluster.endpoints()).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10));
    let follower = (leader + 1) % cluster.members().len();
    let lease = registry.grant_lease(Duration::from_secs(5)).await.expect("grant");

    cluster.kill_member(follower);
    let prefix = key("follower-down");
    for index in 0..200 {
        let key = format!("{prefix}/{index}");
        let outcome = registry
            .create_if_absent(&key, Bytes::from(format!("{index}")), 0)
            .await
            .unwrap_or_else(|error| panic!("write {index} with a follower down: {error}"));
        assert!(outcome.is_ok(), "write {index} created its key");
        registry.get(&key).await.expect("read with a follower down");
    }
    registry.keep_alive(lease).await.expect("keep-alive with a follower down");
    let listed = registry.range(&prefix).await.expect("range");
    assert_eq!(listed.kvs.len(), 200);
}

/// Killing the leader may fail calls during the election, but only with retryable errors,
/// never past the call deadline, and the cluster serves again soon after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_recovers_after_the_leader_dies() {
    let cluster = EtcdCluster::start(3);
    let call_timeout = Duration::from_secs(3);
    let registry = EtcdRegistry::connect(EtcdConfig { call_timeout, ..EtcdConfig::new(cluster.endpoints()) })
        .await
        .expect("connect");
    let leader = cluster.wait_for_leader(Duration::from_secs(10));
    cluster.kill_member(leader);

    let prefix = key("leader-down");
    let recovered_by = Instant::now() + Duration::from_secs(20);
    let mut consecutive_successes = 0;
    let mut failures = Vec::new();
    let mut index = 0;
    while consecutive_successes < 20 {
        assert!(Instant::now() < recovered_by, "no recovery 20 s after the leader died; failures: {failures:?}");
        index += 1;
        let started = Instant::now();
        let result = registry.put(&format!("{prefix}/{index}"), Bytes::new()).await;
        let elapsed = started.elapsed();
        assert!(elapsed < call_timeout + Duration::from_secs(1), "put took {elapsed:?}");
        match result {
            Ok(_) => consecutive_successes += 1,
            Err(error) => {
                assert!(error.is_retryable(), "{error}");
                failures.push(format!("{error} after {elapsed:?}"));
                consecutive_successes = 0;
            }
        }
    }
    eprintln!("leader down: retryable failures before recovery: {failures:?}");
}

/// A cluster start that fails once and succeeds on the retry leaves nothing of the failed
/// try behind (`.ci/leftovers` once found three `berth-etcd-*` directories, every member
/// of a retried start, each kept for its log). The wrapper fails the first try's last
/// member (the other two still make a quorum, so all three have run before the try is
/// given up); each member's directory is known from the `--data-dir` it was given.
#[test]
fn a_retried_cluster_start_leaves_no_directory_of_the_failed_try() {
    let state = tempfile::Builder::new().prefix("berth-harness-").tempdir().expect("state dir");
    let wrapper = state.path().join("etcd");
    let script = format!(
        "#!/bin/sh\nstate='{state}'\nfor arg in \"$@\"; do case \"$arg\" in --data-dir=*) \
         echo \"${{arg#--data-dir=}}\" >>\"$state/data-dirs\";; esac; done\n\
         case \" $* \" in *' --name=member2 '*) mkdir \"$state/failed-once\" 2>/dev/null && \
         {{ echo 'failing this start on purpose' >&2; exit 3; }};; esac\n\
         exec '{etcd}' \"$@\"\n",
        state = state.path().display(),
        etcd = berth_tests::etcd::etcd_binary().display()
    );
    std::fs::write(&wrapper, script).expect("write wrapper");
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");

    let cluster = EtcdCluster::try_start_with(3, &wrapper).expect("the second try starts");
    assert!(state.path().join("failed-once").exists(), "the first try was failed");
    let data_dirs = std::fs::read_to_string(state.path().join("data-dirs")).expect("data dirs");
    let member_dirs: Vec<std::path::PathBuf> =
        data_dirs.lines().map(|line| std::path::Path::new(line).parent().expect("member dir").to_path_buf()).collect();
    // The serving try's three members started last; every line before them is a failed
    // try's (two tries here, more if a port was taken meanwhile).
    assert!(member_dirs.len() >= 6, "at least two tries of three members: {member_dirs:?}");
    let (failed_tries, serving) = member_dirs.split_at(member_dirs.len() - 3);
    for dir in failed_tries {
        assert!(!dir.exists(), "{} of the failed try is left behind", dir.display());
    }
    for dir in serving {
        assert!(dir.join("log.txt").exists(), "{} of the serving try has its log", dir.display());
    }
    drop(cluster);
    for dir in serving {
        assert!(!dir.exists(), "{} outlives the cluster", dir.display());
    }
}
