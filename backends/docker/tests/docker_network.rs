//! Networked Docker workspaces: no Docker network, pasta and the node's address policy in
//! the container's namespace. Stand-in hosts ([`StandIns`]) record every connection they
//! accept; a blocked destination must record none. Needs root, Docker, pasta, iproute2
//! and the locally built base image (`deploy/images/build-base.sh`, run here on first use).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use berth_backend_docker::network::netns_name;
use berth_backend_docker::{DEFAULT_IMAGE, DockerConfig, DockerDriver, NODE_LABEL};
use berth_backend_host::netns::is_live_pasta;
use berth_testkit::netns::{NamespaceGuard, StandIns, Target};
use berth_testkit::{assert_eventually, sh};
use berth_workspace::{Backend, BackendDriver, BackendRef, ProvisionContext, WorkspaceId, WorkspaceSpec};
use tempfile::TempDir;

/// One test's node: its own node id, a driver, a data dir; containers and the
/// namespace removed when the test ends, pass or fail.
struct Node {
    driver: DockerDriver,
    data: TempDir,
    _namespace: NamespaceGuard,
    _containers: Containers,
}

struct Containers(String);

impl Drop for Containers {
    fn drop(&mut self) {
        let listed = docker(&["ps", "-aq", "--filter", &format!("label={NODE_LABEL}={}", self.0)]);
        for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
            docker(&["rm", "-f", "-v", id]);
        }
    }
}

const WORKSPACE: &str = "ws-net";

impl Node {
    async fn new(adjust: impl FnOnce(&mut DockerConfig)) -> Self {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/images/build-base.sh");
        let built = Command::new("bash").arg(&script).arg(DEFAULT_IMAGE).output().expect("run build-base.sh");
        assert!(built.status.success(), "build-base.sh: {}", String::from_utf8_lossy(&built.stderr));
        let node_id = format!("test-{}", rand::random::<u32>());
        let mut config = DockerConfig::new(&node_id);
        adjust(&mut config);
        let namespace = NamespaceGuard {
            name: netns_name(&node_id, &WorkspaceId::new(WORKSPACE).unwrap()),
            state_dir: config.network.state_dir.clone(),
        };
        let driver = DockerDriver::connect(config).await.expect("the docker daemon must be reachable");
        let data = tempfile::Builder::new().prefix("berth-docker-net-").tempdir().expect("data dir");
        Self { driver, data, _namespace: namespace, _containers: Containers(node_id) }
    }

    fn name(&self) -> String {
        netns_name(&self.driver.config().node_id, &WorkspaceId::new(WORKSPACE).unwrap())
    }

    fn root(&self) -> PathBuf {
        let root = self.data.path().join(WORKSPACE);
        std::fs::create_dir_all(&root).expect("workspace root");
        root
    }

    async fn provision(&self) -> BackendRef {
        let id = WorkspaceId::new(WORKSPACE).unwrap();
        let root = self.root();
        let spec = WorkspaceSpec { network: true, ..WorkspaceSpec::default() };
        self.driver.provision(ProvisionContext::unplaced(&id, &root, &spec)).await.expect("provision")
    }
}

fn docker(args: &[&str]) -> std::process::Output {
    Command::new("docker").args(args).output().expect("run the docker CLI")
}

/// Tries every target from inside with busybox nc (3 s each); `open` / `closed` per target.
async fn try_connect(backend: &dyn Backend, targets: &[Target]) -> String {
    let script = r#"while [ $# -gt 0 ]; do
  if nc -w 3 "$1" "$2" </dev/null >/dev/null 2>&1; then echo "open $1"; else echo "closed $1"; fi
  shift 2
done"#;
    let words: Vec<String> = targets.iter().flat_map(Target::words).collect();
    let args: Vec<&str> = words.iter().map(String::as_str).collect();
    String::from_utf8_lossy(&sh(backend, script, &args).await.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaches_the_internet_but_not_the_host_nor_private_ranges() {
    let stand_ins = StandIns::create();
    let node = Node::new(|_| {}).await;
    let backend = node.provision().await;
    let blocked = stand_ins.blocked_targets();
    let public = stand_ins.public_target();
    let mut targets = blocked.clone();
    targets.push(public.clone());
    let report = try_connect(&*backend, &targets).await;
    assert_eventually("the public stand-in records the container", Duration::from_secs(5), || async {
        stand_ins.hits(&public) == 1
    })
    .await;
    stand_ins.assert_none_reached(&blocked);
    assert_eq!(report.matches("open").count(), 1, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn allowed_cidr_rules_that_cannot_be_changed_and_a_namespace_that_follows_the_container() {
    let stand_ins = StandIns::create();
    let private_cidr = format!("{}/32", stand_ins.private).parse().unwrap();
    let node = Node::new(|config| config.network.allow = vec![private_cidr]).await;
    let backend = node.provision().await;
    let name = node.name();
    let private = stand_ins.private_target();
    let public = stand_ins.public_target();

    // The container cannot loosen its rules (no CAP_NET_ADMIN).
    let changed =
        sh(&*backend, "ip rule del priority 200; echo del=$?; ip rule add lookup main priority 5; echo add=$?", &[])
            .await;
    let shown = String::from_utf8_lossy(&changed.stdout);
    assert!(shown.contains("del=") && !shown.contains("del=0") && !shown.contains("add=0"), "{shown}");
    let metadata = stand_ins.blocked_targets().into_iter().find(|target| target.what == "cloud metadata").unwrap();
    try_connect(&*backend, &[metadata.clone(), private.clone()]).await;
    assert_eventually("the allowed private stand-in records the container", Duration::from_secs(5), || async {
        stand_ins.hits(&private) == 1
    })
    .await;
    stand_ins.assert_none_reached(&[metadata]);

    // Release stops the container and removes its namespace and pasta.
    let first = node.driver.networks().pasta_pid(&name).expect("pasta serves the container");
    let id = WorkspaceId::new(WORKSPACE).unwrap();
    node.driver.release(&id).await.expect("release");
    assert!(!Path::new("/run/netns").join(&name).exists(), "namespace left after release");
    assert_eventually("pasta exits at release", Duration::from_secs(5), || async { !is_live_pasta(first) }).await;

    // Provision restarts it in a new namespace with pasta again.
    let restarted = node.provision().await;
    let second = node.driver.networks().pasta_pid(&name).expect("pasta after restart");
    assert_ne!(first, second);
    try_connect(&*restarted, std::slice::from_ref(&public)).await;
    assert_eventually("the restarted container reaches the public stand-in", Duration::from_secs(5), || async {
        stand_ins.hits(&public) == 1
    })
    .await;

    // Destroy leaves nothing.
    node.driver.destroy(&id).await.expect("destroy");
    assert!(!Path::new("/run/netns").join(&name).exists(), "namespace left after destroy");
    assert_eventually("pasta exits at destroy", Duration::from_secs(5), || async { !is_live_pasta(second) }).await;
}
