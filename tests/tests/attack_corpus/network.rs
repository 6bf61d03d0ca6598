//! Network from a networked sandbox (`spec.network: true`), through a real node agent
//! (`berth up`), on bubblewrap and on Docker. Entry point: any exec in the workspace.
//! Attacks: connect to host loopback (the replica's own port, a loopback-only listener),
//! to an etcd-like listener on every host address (v4 and v6), to a private (10/8) service
//! and to cloud metadata (169.254.169.254) on stand-in hosts in a test network namespace.
//! Containment: every stand-in records the connections it accepts; the blocked ones record
//! none, while the public stand-in (203.0.113.x) does record the sandbox — so the sandbox
//! had a network, and it was the policy that stopped it. An operator's
//! `--sandbox-allow-cidr` opens exactly the range it names.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use berth_proto::v1;
use berth_testkit::assert_eventually;
use berth_testkit::netns::{NamespaceSweep, StandIns, Target};
use berth_tests::berth::{BerthProcess, retry_transient, start_up};

/// Connects to each `address port` pair (3 s each), `open` / `closed` per pair, with bash's
/// /dev/tcp (bubblewrap: host tools) or busybox nc (the Docker base image).
const CONNECT: &str = r#"while [ $# -gt 0 ]; do
  if command -v bash >/dev/null; then
    timeout 3 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null
  else
    nc -w 3 "$1" "$2" </dev/null >/dev/null 2>&1
  fi
  if [ $? -eq 0 ]; then echo "open $1 $2"; else echo "closed $1 $2"; fi
  shift 2
done"#;

/// Docker containers of workspaces a test made (by workspace label), removed at the end.
struct Containers(Vec<String>);

impl Drop for Containers {
    fn drop(&mut self) {
        for workspace in &self.0 {
            let listed = Command::new("docker")
                .args(["ps", "-aq", "--filter", &format!("label=berth.workspace.id={workspace}")])
                .output();
            let Ok(listed) = listed else { continue };
            for id in String::from_utf8_lossy(&listed.stdout).split_whitespace() {
                let _ = Command::new("docker").args(["rm", "-f", "-v", id]).output();
            }
        }
    }
}

async fn networked_workspace(up: &BerthProcess, backend: &str) -> String {
    let request = v1::CreateSessionRequest {
        user_id: format!("tenant-{}", rand::random::<u32>()),
        agent_id: "coder".into(),
        backend: backend.into(),
        spec: Some(v1::WorkspaceSpec { network: true, ..Default::default() }),
        ..Default::default()
    };
    // The embedded node may register a moment after the replica serves.
    let (session, _) = retry_transient(Duration::from_secs(30), || {
        let request = request.clone();
        async move { Ok(up.workspace_client().create_session(request).await?.into_inner()) }
    })
    .await;
    session.expect("create a networked session").workspace_id
}

async fn try_connect(up: &BerthProcess, workspace: &str, targets: &[Target], extra: &[(String, u16)]) -> String {
    let mut argv = vec!["sh".to_owned(), "-c".to_owned(), CONNECT.to_owned(), "sh".to_owned()];
    argv.extend(targets.iter().flat_map(Target::words));
    for (address, port) in extra {
        argv.push(address.clone());
        argv.push(port.to_string());
    }
    let request = v1::ExecRequest { workspace_id: workspace.into(), argv, timeout_ms: 120_000, ..Default::default() };
    let result = up.workspace_client().exec(request).await.expect("exec in the workspace").into_inner();
    String::from_utf8_lossy(&result.stdout).into_owned()
}

/// The replica's own port (host loopback), from `http://127.0.0.1:<port>`.
fn replica_port(up: &BerthProcess) -> u16 {
    up.endpoint.rsplit(':').next().and_then(|port| port.trim_end_matches('/').parse().ok()).expect("endpoint port")
}

async fn attack(backend: &str) {
    let stand_ins = StandIns::create();
    let data_dir = tempfile::tempdir().unwrap();
    let _sweep = NamespaceSweep { state_dir: data_dir.path().join("node/netns") };
    let up = start_up(data_dir.path(), &["--backend", "bubblewrap,docker"]).await.expect("berth up");
    let workspace = networked_workspace(&up, backend).await;
    let _containers = Containers(vec![workspace.clone()]);
    let blocked = stand_ins.blocked_targets();
    let public = stand_ins.public_target();
    let mut targets = blocked.clone();
    targets.push(public.clone());
    let replica = ("127.0.0.1".to_owned(), replica_port(&up));
    let report = try_connect(&up, &workspace, &targets, std::slice::from_ref(&replica)).await;
    assert_eventually("the public stand-in records the sandbox", Duration::from_secs(5), || async {
        stand_ins.hits(&public) == 1
    })
    .await;
    stand_ins.assert_none_reached(&blocked);
    assert!(report.contains(&format!("closed 127.0.0.1 {}", replica.1)), "the replica's port answered: {report}");
    assert_eq!(report.matches("open").count(), 1, "{report}");
    assert!(Path::new(&format!("{}/node/netns", data_dir.path().display())).is_dir());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bubblewrap_sandbox_reaches_neither_host_nor_private_nor_metadata() {
    attack("bubblewrap").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docker_sandbox_reaches_neither_host_nor_private_nor_metadata() {
    attack("docker").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_allow_cidr_opens_exactly_its_range() {
    let stand_ins = StandIns::create();
    let data_dir = tempfile::tempdir().unwrap();
    let _sweep = NamespaceSweep { state_dir: data_dir.path().join("node/netns") };
    let allowed = format!("{}/32", stand_ins.private);
    let up = start_up(data_dir.path(), &["--backend", "bubblewrap", "--sandbox-allow-cidr", &allowed])
        .await
        .expect("berth up");
    let workspace = networked_workspace(&up, "bubblewrap").await;
    let private = stand_ins.private_target();
    let others: Vec<Target> =
        stand_ins.blocked_targets().into_iter().filter(|target| target.address != private.address).collect();
    let mut targets = others.clone();
    targets.push(private.clone());
    try_connect(&up, &workspace, &targets, &[]).await;
    assert_eventually("the allowed private stand-in records the sandbox", Duration::from_secs(5), || async {
        stand_ins.hits(&private) == 1
    })
    .await;
    stand_ins.assert_none_reached(&others);
}
