//! Networked bubblewrap workspaces: their own network namespace behind pasta. Each test
//! stands up stand-in hosts ([`StandIns`]: a public and a private service and cloud
//! metadata in a namespace of their own, listeners on the host) and proves containment by
//! what those listeners recorded. Needs root, bwrap, pasta and iproute2.

mod bwrap_support;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use berth_backend_bubblewrap::BubblewrapConfig;
use berth_backend_bubblewrap::network::netns_name;
use berth_backend_host::netns::is_live_pasta;
use berth_testkit::netns::{NamespaceGuard, StandIns, Target};
use berth_testkit::{assert_eventually, sh};
use berth_workspace::{Backend, BackendDriver, ProvisionContext, WorkspaceSpec};
use bwrap_support::{Sandbox, driver, sandbox, sandbox_with};

fn networked() -> WorkspaceSpec {
    WorkspaceSpec { network: true, ..WorkspaceSpec::default() }
}

/// Removes the sandbox's namespace when the test ends, however it ends.
fn guard(sandbox: &Sandbox) -> NamespaceGuard {
    NamespaceGuard { name: netns_name(&sandbox.root), state_dir: sandbox.driver.config().network.state_dir.clone() }
}

/// Tries every target from inside (3 s each) and prints `open` / `closed` per target.
async fn try_connect(backend: &dyn Backend, targets: &[Target]) -> String {
    let script = r#"while [ $# -gt 0 ]; do
  if timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null; then echo "open $1"; else echo "closed $1"; fi
  shift 2
done"#;
    let words: Vec<String> = targets.iter().flat_map(Target::words).collect();
    let args: Vec<&str> = words.iter().map(String::as_str).collect();
    let output = sh(backend, script, &args).await;
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reaches_the_internet_but_not_the_host_nor_private_ranges() {
    let stand_ins = StandIns::create();
    let sandbox = sandbox(networked()).await;
    let _guard = guard(&sandbox);
    let blocked = stand_ins.blocked_targets();
    let public = stand_ins.public_target();
    let mut targets = blocked.clone();
    targets.push(public.clone());
    let report = try_connect(&*sandbox.backend, &targets).await;
    assert_eventually("the public stand-in records the sandbox", Duration::from_secs(5), || async {
        stand_ins.hits(&public) == 1
    })
    .await;
    stand_ins.assert_none_reached(&blocked);
    assert!(report.ends_with(&format!("open {}\n", public.address)), "{report}");
    assert_eq!(report.matches("open").count(), 1, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_cidr_is_reachable_and_nothing_else_is() {
    let stand_ins = StandIns::create();
    let mut config = BubblewrapConfig::default();
    config.network.allow = vec![format!("{}/32", stand_ins.private).parse().unwrap()];
    let sandbox = sandbox_with(config, networked()).await;
    let _guard = guard(&sandbox);
    let private = stand_ins.private_target();
    let others: Vec<Target> =
        stand_ins.blocked_targets().into_iter().filter(|target| target.address != private.address).collect();
    let mut targets = others.clone();
    targets.push(private.clone());
    try_connect(&*sandbox.backend, &targets).await;
    assert_eventually("the allowed private stand-in records the sandbox", Duration::from_secs(5), || async {
        stand_ins.hits(&private) == 1
    })
    .await;
    stand_ins.assert_none_reached(&others);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sandbox_cannot_change_the_rules() {
    let stand_ins = StandIns::create();
    let sandbox = sandbox(networked()).await;
    let _guard = guard(&sandbox);
    let name = netns_name(&sandbox.root);
    let rules_before = host_rules(&name);
    assert!(rules_before.contains("prohibit"), "{rules_before}");
    let output = sh(
        &*sandbox.backend,
        "ip rule del priority 200; echo del=$?; ip rule add to 0.0.0.0/0 lookup main priority 5; echo add=$?; \
         ip route add blackhole 1.2.3.4; echo route=$?",
        &[],
    )
    .await;
    let shown = String::from_utf8_lossy(&output.stdout);
    for changed in ["del=0", "add=0", "route=0"] {
        assert!(!shown.contains(changed), "the sandbox changed its network ({changed}): {shown}");
    }
    assert_eq!(host_rules(&name), rules_before);
    let private = stand_ins.private_target();
    try_connect(&*sandbox.backend, std::slice::from_ref(&private)).await;
    stand_ins.assert_none_reached(&[private]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_namespace_lives_with_the_workspace_and_survives_agent_restarts() {
    let stand_ins = StandIns::create();
    let sandbox = sandbox(networked()).await;
    let _guard = guard(&sandbox);
    let name = netns_name(&sandbox.root);
    let netns = Path::new("/run/netns").join(&name);
    let spec = networked();
    let context = ProvisionContext::unplaced(&sandbox.id, &sandbox.root, &spec);
    let first = sandbox.driver.networks().pasta_pid(&name).expect("pasta serves the namespace");
    assert!(netns.exists());

    // A restarted agent provisions again: the running pasta and namespace are kept.
    let restarted = driver(BubblewrapConfig::default()).await;
    restarted.provision(context).await.expect("provision after a restart");
    assert_eq!(restarted.networks().pasta_pid(&name), Some(first));

    // pasta died (killed, crashed): the next provision builds the namespace again.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(first as i32), nix::sys::signal::Signal::SIGKILL).unwrap();
    assert_eventually("pasta is gone", Duration::from_secs(5), || async { !is_live_pasta(first) }).await;
    let rebuilt = driver(BubblewrapConfig::default()).await;
    let backend = rebuilt.provision(context).await.expect("provision rebuilds the network");
    let second = rebuilt.networks().pasta_pid(&name).expect("a new pasta");
    assert_ne!(second, first);
    let public = stand_ins.public_target();
    try_connect(&*backend, std::slice::from_ref(&public)).await;
    assert_eventually("the rebuilt network reaches the public stand-in", Duration::from_secs(5), || async {
        stand_ins.hits(&public) == 1
    })
    .await;

    // Destroy from an agent that never provisioned it (restarted once more): nothing left.
    let last = driver(BubblewrapConfig::default()).await;
    last.destroy(&sandbox.id).await.expect("destroy");
    assert!(!netns.exists(), "namespace left behind");
    assert_eventually("pasta exits", Duration::from_secs(5), || async { !is_live_pasta(second) }).await;
    let state = &last.config().network.state_dir;
    assert!(!state.join(format!("{name}.pid")).exists() && !state.join(format!("{name}.owner")).exists());
}

/// The policy rules of namespace `name`, as the host sees them.
fn host_rules(name: &str) -> String {
    let output = Command::new("ip").args(["-n", name, "rule", "show"]).output().expect("ip rule");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn root_run_host_programs_never_see_the_exec_env() {
    // nsenter must run as root to join the namespace. Were the exec's env on it, the
    // dynamic loader would obey it as root: LD_DEBUG_OUTPUT makes it write files anywhere
    // (LD_PRELOAD would run code). The marker dir is root's 0700: only root can write there.
    let sandbox = sandbox(networked()).await;
    let _guard = guard(&sandbox);
    let markers = tempfile::tempdir().unwrap();
    let mut spec = berth_workspace::ExecSpec::new(vec!["sh".into(), "-c".into(), "echo $GREETING".into()]);
    spec.spawn.env.insert("GREETING".into(), "hello".into());
    spec.spawn.env.insert("LD_DEBUG".into(), "files".into());
    spec.spawn.env.insert("LD_DEBUG_OUTPUT".into(), markers.path().join("marker").display().to_string());
    let output = sandbox.backend.exec(&spec).await.unwrap();
    let written: Vec<_> = std::fs::read_dir(markers.path()).unwrap().flatten().map(|entry| entry.path()).collect();
    assert!(written.is_empty(), "a root host program obeyed the exec env: {written:?}");
    // The sandbox still gets the env (its loaders, unable to open the file, may print
    // their debug lines instead).
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.lines().any(|line| line == "hello"), "the env does not reach the sandbox: {stdout}");
}
