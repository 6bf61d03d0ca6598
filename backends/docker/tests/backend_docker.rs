//! The docker backend against the real Docker engine: the conformance suite, plus what only
//! containers have (isolation, limits, lifecycle, adoption, file ownership).
//!
//! Needs a running Docker daemon and a static busybox (`/bin/busybox`, Debian
//! `busybox-static`): the base image is built locally with `deploy/images/build-base.sh`
//! on first use; nothing is pulled. A test that cannot reach Docker fails, it never skips.
//! Every test labels its containers with its own random node id and removes them when it
//! ends, pass or fail (`NodeGuard`).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use berth_backend_docker::{
    DEFAULT_IMAGE, DEFAULT_SUPERVISOR_DIR, DockerConfig, DockerDriver, NODE_LABEL, POOL_LABEL, WarmPoolConfig,
};
use berth_testkit::{Fixture, assert_eventually, rel, sh, sh_ok};
use berth_workspace::{
    BackendDriver, BackendRef, ExecSpec, PoolLevel, ProvisionContext, SpawnSpec, WorkspaceError, WorkspaceId,
    WorkspaceSpec,
};
use bytes::Bytes;
use tempfile::TempDir;
use tokio::io::AsyncReadExt;

/// Mount point of the suite's workspaces: the escape corpus plants a victim file in `..` of
/// the workspace root, which must be writable and private to the test. `/tmp` of a
/// test's own container is; `/` (the parent of the default `/workspace`) is root's.
const SUITE_MOUNT_POINT: &str = "/tmp/ws";

fn docker_cli(args: &[&str]) -> std::process::Output {
    Command::new("docker")
        .args(args)
        .output()
        .unwrap_or_else(|error| panic!("cannot run the docker CLI ({args:?}): {error}"))
}

/// Builds the base image once per test binary (blocking: before any container exists).
fn base_image() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/images/build-base.sh");
        let built = Command::new("bash").arg(&script).arg(DEFAULT_IMAGE).output().expect("run build-base.sh");
        assert!(
            built.status.success(),
            "deploy/images/build-base.sh failed (is docker running? is busybox-static installed?): {}",
            String::from_utf8_lossy(&built.stderr)
        );
    });
}

/// Removes every container of a test's node id when the test ends.
struct NodeGuard {
    node_id: String,
}

impl Drop for NodeGuard {
    fn drop(&mut self) {
        let filter = format!("label={NODE_LABEL}={}", self.node_id);
        let listed = docker_cli(&["ps", "-a", "--filter", &filter, "--format", "{{.ID}} {{.Names}}"]);
        for line in String::from_utf8_lossy(&listed.stdout).lines() {
            let mut words = line.split_whitespace();
            let (Some(id), Some(name)) = (words.next(), words.next()) else { continue };
            let _ = docker_cli(&["rm", "-f", "-v", id]);
            // The container's supervisor socket directory (destroy removes it; a test that
            // only drops its containers leaves it).
            let _ = std::fs::remove_dir_all(Path::new(DEFAULT_SUPERVISOR_DIR).join("run").join(name));
        }
    }
}

/// One test's node: a fresh node id, a driver, and a private data directory.
struct Node {
    driver: DockerDriver,
    data: TempDir,
    // Declared last: containers go after the driver, before the data directory.
    _guard: NodeGuard,
}

impl Node {
    async fn new() -> Self {
        Self::with_config(|_| {}).await
    }

    async fn with_config(adjust: impl FnOnce(&mut DockerConfig)) -> Self {
        Self::with_data_config(|config, _| adjust(config)).await
    }

    /// A node with a warm pool in its data directory.
    async fn with_pool(adjust: impl FnOnce(&mut DockerConfig)) -> Self {
        Self::with_data_config(|config, data| {
            config.warm_pool = Some(WarmPoolConfig { dir: data.join("pool"), spec: WorkspaceSpec::default() });
            adjust(config);
        })
        .await
    }

    async fn with_data_config(adjust: impl FnOnce(&mut DockerConfig, &Path)) -> Self {
        base_image();
        let node_id = format!("test-{}", hex::encode(rand::random::<[u8; 6]>()));
        let guard = NodeGuard { node_id: node_id.clone() };
        let data = tempfile::Builder::new().prefix("berth-docker-").tempdir().expect("create a data dir");
        let mut config = DockerConfig::new(node_id);
        adjust(&mut config, data.path());
        let driver = DockerDriver::connect(config).await.expect("the docker daemon must be reachable for these tests");
        Self { driver, data, _guard: guard }
    }

    fn node_id(&self) -> &str {
        &self.driver.config().node_id
    }

    fn root(&self, workspace: &str) -> PathBuf {
        let root = self.data.path().join(workspace);
        std::fs::create_dir_all(&root).expect("create the workspace root");
        root
    }

    async fn provision(&self, workspace: &str, spec: &WorkspaceSpec) -> BackendRef {
        self.try_provision(workspace, spec).await.unwrap_or_else(|error| panic!("provision {workspace}: {error}"))
    }

    async fn try_provision(&self, workspace: &str, spec: &WorkspaceSpec) -> berth_workspace::Result<BackendRef> {
        let id = WorkspaceId::new(workspace).unwrap();
        let root = self.root(workspace);
        self.driver.provision(ProvisionContext::unplaced(&id, &root, spec)).await
    }

    /// Container ids carrying this node's label (and the workspace's, when given).
    fn containers(&self, workspace: Option<&str>) -> Vec<String> {
        let mut args = vec![
            "ps".to_owned(),
            "-aq".to_owned(),
            "--filter".to_owned(),
            format!("label={NODE_LABEL}={}", self.node_id()),
        ];
        if let Some(workspace) = workspace {
            args.push("--filter".to_owned());
            args.push(format!("label=berth.workspace.id={workspace}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let listed = docker_cli(&args);
        String::from_utf8_lossy(&listed.stdout).split_whitespace().map(str::to_owned).collect()
    }
}

fn id(workspace: &str) -> WorkspaceId {
    WorkspaceId::new(workspace).unwrap()
}

async fn suite_fixture() -> Fixture<Node> {
    let node = Node::with_config(|config| config.mount_point = SUITE_MOUNT_POINT.to_owned()).await;
    let backend = node.provision("ws-suite", &WorkspaceSpec::default()).await;
    Fixture::new(backend, node)
}

berth_testkit::backend_suite!(docker, suite_fixture());
berth_testkit::contract_suite!(docker_contract, suite_fixture());

/// The same suites with every command a Docker exec (`--no-supervisor`, a container of an
/// older agent, a remote engine).
async fn exec_suite_fixture() -> Fixture<Node> {
    let node = Node::with_config(|config| {
        config.mount_point = SUITE_MOUNT_POINT.to_owned();
        config.supervisor = None;
    })
    .await;
    let backend = node.provision("ws-suite", &WorkspaceSpec::default()).await;
    let found = stdout_text(&sh_ok(&*backend, "ls -a /", &[]).await);
    assert!(!found.lines().any(|name| name == ".berth"), "a container without the supervisor has its mounts: {found}");
    Fixture::new(backend, node)
}

berth_testkit::backend_suite!(docker_exec, exec_suite_fixture());
berth_testkit::contract_suite!(docker_exec_contract, exec_suite_fixture());

/// The same suites on a workspace claimed from the warm pool.
async fn pool_suite_fixture() -> Fixture<Node> {
    let node = Node::with_pool(|config| config.mount_point = SUITE_MOUNT_POINT.to_owned()).await;
    node.driver.fill_pool(1).await.expect("fill the warm pool");
    let backend = node.provision("ws-suite", &WorkspaceSpec::default()).await;
    let level = node.driver.fill_pool(0).await.expect("empty the warm pool");
    assert_eq!(level, PoolLevel { ready: 0, claimed: 1 }, "the suite's workspace is not the pool's");
    // A slot comes with the workspace layout the node makes in every root; the suites
    // start from an empty one.
    sh_ok(&*backend, "rm -r .mcp skills data sessions", &[]).await;
    Fixture::new(backend, node)
}

berth_testkit::backend_suite!(docker_pool, pool_suite_fixture());
berth_testkit::contract_suite!(docker_pool_contract, pool_suite_fixture());

fn stdout_text(output: &berth_workspace::ExecOutput) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

// ---- isolation ---------------------------------------------------------------------------

#[tokio::test]
async fn no_network_unless_asked() {
    let node = Node::new().await;
    let isolated = node.provision("ws-isolated", &WorkspaceSpec::default()).await;
    let links = sh_ok(&*isolated, "ip -o link", &[]).await;
    let links = stdout_text(&links);
    assert!(links.lines().all(|line| line.contains(": lo:")), "interfaces besides lo: {links}");
    assert_eq!(stdout_text(&sh_ok(&*isolated, "ip route", &[]).await), "");
    let connect = sh(&*isolated, "nc -w 2 192.0.2.1 80 </dev/null", &[]).await;
    assert_ne!(connect.exit_code, 0, "a connection succeeded without a network");

    let networked = node.provision("ws-networked", &WorkspaceSpec { network: true, ..Default::default() }).await;
    let routes = stdout_text(&sh_ok(&*networked, "ip route", &[]).await);
    assert!(routes.contains("default"), "no default route: {routes:?}");
    // Its network namespace and pasta live until destroy (what it reaches: docker_network.rs).
    node.driver.destroy(&id("ws-networked")).await.expect("destroy the networked workspace");
}

#[tokio::test]
async fn unprivileged_without_capabilities() {
    let node = Node::new().await;
    let backend = node.provision("ws-caps", &WorkspaceSpec::default()).await;
    let status = stdout_text(&sh_ok(&*backend, "cat /proc/self/status; id -u; id -g", &[]).await);
    for expected in
        ["CapEff:\t0000000000000000", "CapPrm:\t0000000000000000", "CapBnd:\t0000000000000000", "NoNewPrivs:\t1"]
    {
        assert!(status.contains(expected), "{expected:?} missing in {status}");
    }
    let (uid, gid) = node.driver.container_user();
    assert!(status.ends_with(&format!("{uid}\n{gid}\n")), "{status}");
    assert_ne!(uid, 0);
    // Signals as a fresh process has them: SIGPIPE not ignored (the supervisor's runtime
    // ignores it for itself), nothing blocked.
    let mask = |name: &str| {
        let line = status.lines().find_map(|line| line.strip_prefix(name)).expect(name);
        u64::from_str_radix(line.trim(), 16).expect(name)
    };
    assert_eq!(mask("SigIgn:") & (1 << (13 - 1)), 0, "SIGPIPE ignored: {status}");
    assert_eq!(mask("SigBlk:"), 0, "{status}");
}

#[tokio::test]
async fn read_only_root_keeps_tmp_and_workspace_writable() {
    let node = Node::new().await;
    let spec = WorkspaceSpec { read_only_root: true, ..Default::default() };
    let backend = node.provision("ws-ro", &spec).await;
    let system = sh(&*backend, "touch /berth-probe", &[]).await;
    assert_ne!(system.exit_code, 0, "the root is writable");
    assert!(String::from_utf8_lossy(&system.stderr).contains("Read-only"));
    sh_ok(&*backend, "echo x > /tmp/probe && echo y > probe", &[]).await;
    let writable = node.provision("ws-rw", &WorkspaceSpec::default()).await;
    sh_ok(&*writable, "touch /tmp/probe", &[]).await;
}

// ---- limits ------------------------------------------------------------------------------

#[tokio::test]
async fn fork_bomb_hits_the_pids_limit_and_is_killed() {
    let node = Node::new().await;
    let spec = WorkspaceSpec { pids: 64, ..Default::default() };
    let backend = node.provision("ws-forkbomb", &spec).await;
    // Every process that manages to fork twice then blocks (a builtin read on a FIFO, no
    // fork needed), so the tree holds on to every pid it gets; a failed fork ends only
    // the process that tried. The exec itself stays until its timeout kills the tree.
    let mut bomb = ExecSpec::new(vec![
        "sh".into(),
        "-c".into(),
        "mkfifo /tmp/bomb && b() { b & b & read x <>/tmp/bomb; }; b".into(),
    ]);
    bomb.timeout = Duration::from_secs(4);
    bomb.max_output_bytes = 4096;
    let output = backend.exec(&bomb).await.expect("the bomb exec");
    assert!(output.timed_out);
    let errors = String::from_utf8_lossy(&output.stderr);
    assert!(
        errors.contains("can't fork") || errors.contains("Resource temporarily unavailable"),
        "the pids limit was not hit: {errors:?}"
    );
    // The container survived, and the bomb's processes are gone.
    assert_eq!(sh_ok(&*backend, "true", &[]).await.exit_code, 0);
    // Left, once the killed processes are reaped (they die, and are reaped by the
    // supervisor they were orphaned to, a moment after the kill): the header, init, sleep,
    // the supervisor and this exec's shim (both run its binary), and ps.
    let mut processes = String::new();
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            processes = stdout_text(&sh_ok(&*backend, "ps -o pid,stat,args", &[]).await);
            let others =
                processes.lines().filter(|line| !line.contains(berth_backend_docker::CONTAINER_BINARY)).count();
            if others <= 4 && !processes.contains("mkfifo") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    assert!(gone.is_ok(), "bomb processes left: {processes}");
    assert!(node.driver.is_running(&id("ws-forkbomb")).await);
    // A kill that had to lift the limit to start its sweep has set it back.
    let container = node.containers(Some("ws-forkbomb")).remove(0);
    let limit = docker_cli(&["inspect", "-f", "{{.HostConfig.PidsLimit}}", &container]);
    assert_eq!(String::from_utf8_lossy(&limit.stdout).trim(), "64");
}

#[tokio::test]
async fn memory_hog_is_oom_killed() {
    let node = Node::new().await;
    let spec = WorkspaceSpec { memory_bytes: 32 * 1024 * 1024, ..Default::default() };
    let backend = node.provision("ws-oom", &spec).await;
    // dd allocates (and fills) one 256 MiB block; the shell reports its SIGKILL as 137.
    let output = sh(&*backend, "dd if=/dev/zero of=/dev/null bs=256M count=1; echo $?", &[]).await;
    assert_eq!(stdout_text(&output), "137\n", "stderr: {:?}", String::from_utf8_lossy(&output.stderr));
    let direct = backend
        .exec(&ExecSpec::new(vec![
            "dd".into(),
            "if=/dev/zero".into(),
            "of=/dev/null".into(),
            "bs=256M".into(),
            "count=1".into(),
        ]))
        .await
        .unwrap();
    assert_eq!((direct.exit_code, direct.signal), (-1, Some(9)));
    assert_eq!(sh_ok(&*backend, "true", &[]).await.exit_code, 0);
}

// ---- kill --------------------------------------------------------------------------------

#[tokio::test]
async fn timeout_kills_setsid_and_env_cleared_descendants() {
    let node = Node::new().await;
    let backend = node.provision("ws-kill", &WorkspaceSpec::default()).await;
    // One child leaves the session (keeps the marker), one clears its env (stays in the
    // session); both must die with the exec.
    let mut spec = ExecSpec::new(vec![
        "sh".into(),
        "-c".into(),
        "setsid sleep 301 & env -i sleep 302 & echo started; wait".into(),
    ]);
    spec.timeout = Duration::from_secs(2);
    let output = backend.exec(&spec).await.unwrap();
    assert!(output.timed_out);
    assert_eq!(stdout_text(&output), "started\n");
    assert_eventually("the descendants to die", Duration::from_secs(10), || {
        let backend = backend.clone();
        async move {
            let listed = sh(&*backend, "ps -o args | grep -c '^sleep 30[12]'", &[]).await;
            stdout_text(&listed).trim() == "0"
        }
    })
    .await;
}

#[tokio::test]
async fn dropping_a_spawned_process_kills_it() {
    let node = Node::new().await;
    let backend = node.provision("ws-drop", &WorkspaceSpec::default()).await;
    let mut spawned = backend
        .spawn(&SpawnSpec::new(vec!["sh".into(), "-c".into(), "sleep 303 & echo started; wait".into()]))
        .await
        .unwrap();
    let mut line = [0u8; 8];
    spawned.stdout.read_exact(&mut line).await.unwrap();
    assert_eq!(&line, b"started\n");
    drop(spawned);
    assert_eventually("the dropped process tree to die", Duration::from_secs(10), || {
        let backend = backend.clone();
        async move {
            let listed = sh(&*backend, "ps -o args | grep -c '^sleep 303'", &[]).await;
            stdout_text(&listed).trim() == "0"
        }
    })
    .await;
}

// ---- lifecycle ---------------------------------------------------------------------------

#[tokio::test]
async fn provision_is_idempotent() {
    let node = Node::new().await;
    let first = node.provision("ws-idem", &WorkspaceSpec::default()).await;
    let second = node.provision("ws-idem", &WorkspaceSpec::default()).await;
    assert_eq!(node.containers(Some("ws-idem")).len(), 1);
    sh_ok(&*first, "echo shared > f", &[]).await;
    assert_eq!(stdout_text(&sh_ok(&*second, "cat f", &[]).await), "shared\n");
    // Both handles share the container's one supervisor (and the node's one socket).
    assert_eq!(supervisor_pid(&first).await, supervisor_pid(&second).await);
    // Concurrent provisions of a new workspace race on the container name; one wins.
    let spec = WorkspaceSpec::default();
    let (left, right) = tokio::join!(node.try_provision("ws-race", &spec), node.try_provision("ws-race", &spec),);
    left.unwrap();
    right.unwrap();
    assert_eq!(node.containers(Some("ws-race")).len(), 1);
}

#[tokio::test]
async fn restarted_agent_adopts_its_containers() {
    let node = Node::new().await;
    let backend = node.provision("ws-adopt", &WorkspaceSpec::default()).await;
    sh_ok(&*backend, "echo kept > f", &[]).await;
    let other_node = Node::new().await;
    other_node.provision("ws-other", &WorkspaceSpec::default()).await;

    // A new driver instance with the same node id, as after an agent restart.
    let config = node.driver.config().clone();
    let restarted = DockerDriver::connect(config).await.unwrap();
    assert_eq!(restarted.adopt().await.unwrap(), vec![id("ws-adopt")]);
    let root = node.root("ws-adopt");
    let again = restarted
        .provision(ProvisionContext::unplaced(&id("ws-adopt"), &root, &WorkspaceSpec::default()))
        .await
        .unwrap();
    assert_eq!(stdout_text(&sh_ok(&*again, "cat f", &[]).await), "kept\n");
    assert_eq!(node.containers(None).len(), 1);
}

#[tokio::test]
async fn release_stops_and_provision_restarts_with_files_intact() {
    let node = Node::new().await;
    let workspace = id("ws-release");
    let backend = node.provision("ws-release", &WorkspaceSpec::default()).await;
    berth_testkit::write(&*backend, "notes/a.txt", b"persisted").await;
    node.driver.release(&workspace).await.unwrap();
    assert!(!node.driver.is_running(&workspace).await);
    assert_eq!(node.containers(Some("ws-release")).len(), 1);
    let stopped = backend.exec(&ExecSpec::new(vec!["true".into()])).await;
    assert!(
        matches!(stopped, Err(WorkspaceError::BackendUnavailable { .. })),
        "exec on a released workspace: {stopped:?}"
    );
    // Release is idempotent and so is destroy of an unknown workspace.
    node.driver.release(&workspace).await.unwrap();
    node.driver.destroy(&id("ws-never")).await.unwrap();

    let again = node.provision("ws-release", &WorkspaceSpec::default()).await;
    assert!(node.driver.is_running(&workspace).await);
    assert_eq!(berth_testkit::read(&*again, "notes/a.txt").await.unwrap(), b"persisted");
    assert_eq!(node.containers(Some("ws-release")).len(), 1);
}

#[tokio::test]
async fn destroy_leaves_only_workspace_owned_files() {
    let node = Node::new().await;
    let workspace = id("ws-destroy");
    let backend = node.provision("ws-destroy", &WorkspaceSpec::default()).await;
    berth_testkit::write(&*backend, "deep/dir/file", b"x").await;
    backend.mkdir(&rel("made/by/mkdir"), true).await.unwrap();
    sh_ok(&*backend, "mkdir -p sub && echo y > sub/f && ln -s f sub/link", &[]).await;
    let root = node.root("ws-destroy");
    let (uid, gid) = node.driver.container_user();
    node.driver.destroy(&workspace).await.unwrap();
    assert!(node.containers(Some("ws-destroy")).is_empty());

    let mut seen = 0;
    let mut pending = vec![root.clone()];
    while let Some(path) = pending.pop() {
        let metadata = std::fs::symlink_metadata(&path).unwrap();
        // The root's group is the secret holders' (they read the workspace through it).
        let group = if path == root { berth_backend_docker::SECRET_HOLDER_USER.1 } else { gid };
        assert_eq!(
            (metadata.uid(), metadata.gid()),
            (uid, group),
            "{} is not owned by the workspace user",
            path.display()
        );
        seen += 1;
        if metadata.is_dir() {
            for entry in std::fs::read_dir(&path).unwrap() {
                pending.push(entry.unwrap().path());
            }
        }
    }
    assert!(seen >= 10, "only {seen} entries");
    std::fs::remove_dir_all(&root).unwrap();
    assert!(!root.exists());
}

#[tokio::test]
async fn missing_image_is_a_typed_error_naming_it() {
    let node = Node::with_config(|config| {
        config.default_image = "berth/not-built-here:never".to_owned();
    })
    .await;
    let missing_default = node.try_provision("ws-noimage", &WorkspaceSpec::default()).await;
    match missing_default {
        Err(WorkspaceError::BackendUnavailable { backend, reason }) => {
            assert_eq!(backend, "docker");
            assert!(reason.contains("berth/not-built-here:never"), "{reason}");
            assert!(reason.contains("deploy/images/build-base.sh"), "{reason}");
        }
        other => panic!("expected BackendUnavailable, got {:?}", other.map(|_| ())),
    }
    let spec = WorkspaceSpec { image: Some("berth/another-missing:1".to_owned()), ..Default::default() };
    match node.try_provision("ws-noimage", &spec).await {
        Err(WorkspaceError::BackendUnavailable { reason, .. }) => {
            assert!(reason.contains("berth/another-missing:1"), "{reason}")
        }
        other => panic!("expected BackendUnavailable, got {:?}", other.map(|_| ())),
    }
    assert!(node.containers(None).is_empty());
}

#[tokio::test]
async fn spec_env_reaches_processes_and_exec_env_wins() {
    let node = Node::new().await;
    let spec = WorkspaceSpec {
        env: [("FROM_SPEC", "1"), ("BOTH", "spec")]
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value.to_owned()))
            .collect(),
        ..Default::default()
    };
    let backend = node.provision("ws-env", &spec).await;
    let mut exec = ExecSpec::new(vec!["sh".into(), "-c".into(), "echo $FROM_SPEC $BOTH $PWD".into()]);
    exec.spawn.env.insert("BOTH".into(), "exec".into());
    let output = backend.exec(&exec).await.unwrap();
    assert_eq!(stdout_text(&output), "1 exec /workspace\n");
    let written = backend.write_bytes(&rel("big.bin"), Bytes::from(vec![5u8; 3 << 20]), 0o600).await.unwrap();
    assert_eq!(written, 3 << 20);
}

// ---- measurements (printed, never asserted) ------------------------------------------------

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[tokio::test]
async fn measure_latencies() {
    let node = Node::new().await;
    let mut provision = Vec::new();
    for index in 0..5 {
        let started = Instant::now();
        node.provision(&format!("ws-measure-{index}"), &WorkspaceSpec::default()).await;
        provision.push(started.elapsed());
    }
    let backend = node.provision("ws-measure-0", &WorkspaceSpec::default()).await;
    let mut via_backend = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        let output = backend.exec(&ExecSpec::new(vec!["true".into()])).await.unwrap();
        assert_eq!(output.exit_code, 0);
        via_backend.push(started.elapsed());
    }
    let container = node.containers(Some("ws-measure-0")).remove(0);
    let mut via_cli = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        assert!(docker_cli(&["exec", &container, "true"]).status.success());
        via_cli.push(started.elapsed());
    }
    let (via_backend, via_cli) = (median(via_backend), median(via_cli));
    println!(
        "docker latencies (median): provision (create+start) {:?}, exec `true` via backend {:?}, `docker exec true` via CLI {:?}",
        median(provision),
        via_backend,
        via_cli
    );
    // Through the container's supervisor an exec is a fork, not a Docker exec (whose
    // round trips through the daemon cost tens of milliseconds on any machine).
    assert!(via_backend * 4 < via_cli, "exec via the backend {via_backend:?} is not far below docker exec {via_cli:?}");
}

// ---- the resident supervisor -------------------------------------------------------------

/// The pid (in the container) of the supervisor that runs this exec: the parent of the
/// exec's shim, which is the parent of the command. A Docker exec's parent is outside the
/// container: its $PPID is 0.
const SUPERVISOR_PID: &str = "if [ \"$PPID\" = 0 ]; then echo 'a docker exec'; else cut -d' ' -f4 /proc/$PPID/stat; fi";

async fn supervisor_pid(backend: &BackendRef) -> String {
    let pid = stdout_text(&sh_ok(&**backend, SUPERVISOR_PID, &[]).await).trim().to_owned();
    assert!(
        pid.parse::<u32>().is_ok_and(|pid| pid > 1),
        "the exec did not run under a supervisor: {pid:?} (a start that failed logs a warning)"
    );
    pid
}

#[tokio::test]
async fn workspaces_with_ids_of_real_length_get_a_supervisor() {
    // Real workspace ids are `ws-` and 64 hex digits: the container name, and with it the
    // socket directory's path, is longer than a socket path may be.
    let node = Node::new().await;
    let workspace = format!("ws-{}", "0123456789abcdef".repeat(4));
    let backend = node.provision(&workspace, &WorkspaceSpec::default()).await;
    supervisor_pid(&backend).await;
}

#[tokio::test]
async fn a_killed_supervisor_spares_running_execs_and_is_started_again() {
    let node = Node::new().await;
    let backend = node.provision("ws-supkill", &WorkspaceSpec::default()).await;
    let first = supervisor_pid(&backend).await;
    let args = stdout_text(&sh_ok(&*backend, &format!("tr '\\0' ' ' < /proc/{first}/cmdline"), &[]).await);
    assert!(args.starts_with(berth_backend_docker::CONTAINER_BINARY), "pid {first} runs {args:?}");
    // A command runs while its supervisor is SIGKILLed (by a command of the workspace: same
    // user). The command's shim outlives the supervisor and reports the exit.
    let mut running =
        backend.spawn(&SpawnSpec::new(vec!["sh".into(), "-c".into(), "read go; echo survived".into()])).await.unwrap();
    sh_ok(&*backend, &format!("kill -9 {first}"), &[]).await;
    assert_eventually("the supervisor to be gone", Duration::from_secs(10), || {
        let backend = backend.clone();
        let first = first.clone();
        async move { sh(&*backend, &format!("test -d /proc/{first}"), &[]).await.exit_code != 0 }
    })
    .await;
    use tokio::io::AsyncWriteExt;
    running.stdin.write_all(b"go\n").await.unwrap();
    let mut out = String::new();
    running.stdout.read_to_string(&mut out).await.unwrap();
    assert_eq!(out, "survived\n");
    assert_eq!(running.control.wait().await.unwrap().code, Some(0));
    // The next exec starts a fresh supervisor.
    let second = supervisor_pid(&backend).await;
    assert_ne!(first, second);
}

#[tokio::test]
async fn a_workspace_can_neither_touch_the_node_socket_nor_pose_as_its_supervisor() {
    let node = Node::new().await;
    let backend = node.provision("ws-impostor", &WorkspaceSpec::default()).await;
    let socket = berth_backend_docker::CONTAINER_SOCKET;
    let run_dir = berth_backend_docker::CONTAINER_RUN_DIR;
    let real = supervisor_pid(&backend).await;
    // The node's socket directory is read-only in the container: nothing planted, nothing
    // removed, nothing written to the host's /run.
    for attempt in [format!("touch {run_dir}/x"), format!("rm -f {socket}"), format!("ln -s /etc {run_dir}/l")] {
        assert_ne!(sh(&*backend, &attempt, &[]).await.exit_code, 0, "{attempt} worked");
    }
    // A command runs its own copy of the supervisor against the node's socket: it connects
    // (and waits, queued) before the node next starts a supervisor.
    let program = berth_backend_docker::CONTAINER_BINARY;
    let mut impostor = backend
        .spawn(&SpawnSpec::new(vec![
            "sh".into(),
            "-c".into(),
            format!("{program} --connect {socket} --idle-ms 60000 & echo $!; wait $!; echo ended $?"),
        ]))
        .await
        .unwrap();
    let mut pid_line = Vec::new();
    let mut byte = [0u8; 1];
    while impostor.stdout.read(&mut byte).await.unwrap() == 1 && byte[0] != b'\n' {
        pid_line.push(byte[0]);
    }
    let impostor_pid = String::from_utf8(pid_line).unwrap();
    // Connected: once it has, it puts /dev/null on its stdout. Looked at from the host (as
    // root: the supervisor binary makes itself undumpable, so its own user cannot).
    let container = node.containers(Some("ws-impostor")).remove(0);
    assert_eventually("the impostor to connect", Duration::from_secs(10), || {
        let container = container.clone();
        async move {
            let listed = docker_cli(&["top", &container, "-eo", "pid,args"]);
            let host_pid = String::from_utf8_lossy(&listed.stdout)
                .lines()
                .find(|line| line.contains(&format!(" {program} --connect")) && line.ends_with("--idle-ms 60000"))
                .and_then(|line| line.split_whitespace().next().map(str::to_owned));
            host_pid.and_then(|pid| std::fs::read_link(format!("/proc/{pid}/fd/1")).ok())
                == Some(PathBuf::from("/dev/null"))
        }
    })
    .await;
    // The real supervisor goes; the next exec makes the node start another, and the
    // impostor's connection, queued first, is refused.
    sh_ok(&*backend, &format!("kill -9 {real}"), &[]).await;
    let fresh = supervisor_pid(&backend).await;
    assert_ne!(fresh, impostor_pid, "the node served the workspace's own process as its supervisor");
    assert_ne!(fresh, real);
    let mut rest = String::new();
    impostor.stdout.read_to_string(&mut rest).await.unwrap();
    assert_eq!(rest, "ended 0\n", "the refused impostor saw its connection closed");
}

// ---- files -------------------------------------------------------------------------------

#[tokio::test]
async fn dropped_write_leaves_no_temp_file_or_parent() {
    use futures::StreamExt;
    let node = Node::new().await;
    let backend = node.provision("ws-dropwrite", &WorkspaceSpec::default()).await;
    let (consumed_sender, consumed) = tokio::sync::oneshot::channel::<()>();
    // One chunk, then a signal that it was taken, then a stream that never ends.
    let first = futures::stream::once(async { Ok(Bytes::from_static(b"partial")) });
    let signal = futures::stream::once(async move {
        let _ = consumed_sender.send(());
        std::future::pending::<berth_workspace::Result<Bytes>>().await
    });
    let stream = first.chain(signal).boxed();
    let target = rel("new-dir/f");
    let write = backend.write_file(&target, stream, berth_workspace::WriteOptions::default());
    tokio::select! {
        result = write => panic!("the write finished: {result:?}"),
        _ = consumed => {}
    }
    // The write future is dropped here, mid-stream: the script must clean up after itself.
    let root = node.root("ws-dropwrite");
    assert_eventually("the dropped write to clean up", Duration::from_secs(15), || {
        let root = root.clone();
        async move { std::fs::read_dir(&root).map(|entries| entries.count() == 0).unwrap_or(false) }
    })
    .await;
}

#[path = "backend_docker/pool.rs"]
mod pool;
