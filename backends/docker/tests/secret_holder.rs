//! `SpawnRole::SecretHolder` on Docker against the real engine: another user than the
//! workspace's, a private HOME and cwd, a pinned copy of a workspace program or a root-owned
//! system program, none of the workspace's env; and what a workspace process can (not) do
//! to it. Needs Docker and the base image (built by `deploy/images/build-base.sh`).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use berth_backend_docker::{DEFAULT_IMAGE, DockerConfig, DockerDriver, NODE_LABEL};
use berth_testkit::{assert_eventually, sh, sh_ok};
use berth_workspace::backend::SpawnRole;
use berth_workspace::{
    BackendDriver, BackendRef, ExecSpec, ProvisionContext, WorkspaceError, WorkspaceId, WorkspaceSpec,
};
use bytes::Bytes;
use sha2::Digest as _;

const SECRET: &str = "secret-holder-test-value";

fn base_image() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/images/build-base.sh");
        let built = Command::new("bash").arg(&script).arg(DEFAULT_IMAGE).output().expect("run build-base.sh");
        assert!(built.status.success(), "build-base.sh failed: {}", String::from_utf8_lossy(&built.stderr));
    });
}

/// One workspace container of a fresh node id, removed with the guard.
struct Workspace {
    backend: BackendRef,
    node_id: String,
    _data: tempfile::TempDir,
}

impl Drop for Workspace {
    fn drop(&mut self) {
        let filter = format!("label={NODE_LABEL}={}", self.node_id);
        let listed = Command::new("docker").args(["ps", "-aq", "--filter", &filter]).output();
        for id in
            listed.map(|out| String::from_utf8_lossy(&out.stdout).into_owned()).unwrap_or_default().split_whitespace()
        {
            let _ = Command::new("docker").args(["rm", "-f", "-v", id]).output();
        }
    }
}

async fn workspace(spec: &WorkspaceSpec) -> Workspace {
    base_image();
    let node_id = format!("test-{}", hex::encode(rand::random::<[u8; 6]>()));
    let driver = DockerDriver::connect(DockerConfig::new(node_id.clone())).await.expect("docker daemon");
    let data = tempfile::Builder::new().prefix("berth-docker-secret-").tempdir().unwrap();
    let root = data.path().join("ws");
    std::fs::create_dir_all(&root).unwrap();
    let id = WorkspaceId::new("ws-secret").unwrap();
    let backend = driver.provision(ProvisionContext::unplaced(&id, &root, spec)).await.expect("provision");
    Workspace { backend, node_id, _data: data }
}

fn secret_exec(argv: &[&str], pin: Option<[u8; 32]>) -> ExecSpec {
    let mut spec = ExecSpec::new(argv.iter().map(|arg| (*arg).to_owned()).collect());
    spec.spawn.role = SpawnRole::SecretHolder;
    spec.spawn.program_sha256 = pin;
    spec.spawn.env = BTreeMap::from([("TOKEN".to_owned(), SECRET.to_owned())]);
    spec.timeout = Duration::from_secs(30);
    spec
}

const TOOL: &[u8] = b"#!/bin/sh\nid -u\necho \"$HOME\"\npwd\necho \"$TOKEN\"\necho \"${FROM_SPEC:-unset}\"\n";

#[tokio::test]
async fn secret_holders_run_apart_from_the_workspace() {
    let spec = WorkspaceSpec { env: BTreeMap::from([("FROM_SPEC".to_owned(), "x".to_owned())]), ..Default::default() };
    let ws = workspace(&spec).await;
    let backend = &*ws.backend;
    backend.write_bytes(&berth_testkit::rel("bin/tool"), Bytes::from_static(TOOL), 0o755).await.unwrap();
    let pin: [u8; 32] = sha2::Sha256::digest(TOOL).into();

    // The pinned copy runs as the secret-holder user, in a private HOME and cwd, with the
    // secret and without the workspace's env.
    let out = backend.exec(&secret_exec(&["bin/tool"], Some(pin))).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(out.exit_code, 0, "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(lines[0], "64000", "{text}");
    assert!(lines[1].starts_with("/tmp/berth-secret."), "{text}");
    assert_eq!(lines[1], lines[2], "cwd is not HOME: {text}");
    assert_eq!(&lines[3..], [SECRET, "unset"], "{text}");
    // The agent is another user (and not root).
    assert_eq!(String::from_utf8_lossy(&sh_ok(backend, "id -u", &[]).await.stdout).trim(), "1000");

    // Swapped program: refused, never run.
    let swapped = b"#!/bin/sh\necho \"$TOKEN\" > /workspace/stolen\n";
    backend.write_bytes(&berth_testkit::rel("bin/tool"), Bytes::from_static(swapped), 0o755).await.unwrap();
    match backend.exec(&secret_exec(&["bin/tool"], Some(pin))).await {
        Err(WorkspaceError::InvalidArgument(message)) => assert!(message.contains("pin"), "{message}"),
        other => panic!("a swapped program was not refused: {other:?}"),
    }
    assert_eq!(sh(backend, "cat stolen", &[]).await.exit_code, 1, "the swapped program ran");
    // Unpinned workspace programs, by relative or absolute path: refused.
    for program in ["bin/tool", "/workspace/bin/tool"] {
        let refused = backend.exec(&secret_exec(&[program], None)).await;
        assert!(matches!(refused, Err(WorkspaceError::SpawnFailed { .. })), "{program}: {refused:?}");
    }
    // An unpinned program the agent owns outside the workspace: refused too.
    sh_ok(backend, "cp bin/tool /tmp/evil && chmod 0755 /tmp/evil", &[]).await;
    let refused = backend.exec(&secret_exec(&["/tmp/evil"], None)).await;
    assert!(matches!(refused, Err(WorkspaceError::SpawnFailed { .. })), "{refused:?}");
    // Directories of servers that are gone do not pile up: each start removes them.
    let listed = backend.exec(&secret_exec(&["sh", "-c", "ls -d /tmp/berth-secret.*"], None)).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&listed.stdout).lines().count(), 1, "{listed:?}");
    // A root-owned system program runs, by path or by name.
    for program in ["/bin/sh", "sh"] {
        let out = backend.exec(&secret_exec(&[program, "-c", "id -u; echo $TOKEN"], None)).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), format!("64000\n{SECRET}\n"), "{program}");
    }
}

#[tokio::test]
async fn workspace_processes_cannot_reach_a_running_secret_holder() {
    let ws = workspace(&WorkspaceSpec::default()).await;
    let backend = &*ws.backend;
    let mut spawn = secret_exec(&["sleep", "300"], None).spawn;
    spawn.argv = vec!["/bin/sleep".into(), "300".into()];
    let mut server = backend.spawn(&spawn).await.expect("spawn the secret holder");
    assert_eventually("the secret holder runs", Duration::from_secs(10), || async {
        let out = sh(backend, "ps -o args | grep -c '/bin/sleep 300$'", &[]).await;
        String::from_utf8_lossy(&out.stdout).trim() == "1"
    })
    .await;
    let attack = sh(
        backend,
        "for f in /proc/[0-9]*/environ; do cat \"$f\"; done 2>&1; \
         pid=$(ps -o pid,args | awk '$2 ~ /\\/bin\\/sleep$/ {print $1; exit}'); \
         kill -9 \"$pid\" && echo killed; ls /tmp/berth-secret.* 2>&1; touch /tmp/berth-secret.*/x && echo planted",
        &[],
    )
    .await;
    let text = format!("{}{}", String::from_utf8_lossy(&attack.stdout), String::from_utf8_lossy(&attack.stderr));
    assert!(!text.contains(SECRET), "the agent read the secret: {text}");
    assert!(!text.contains("killed") && !text.contains("planted"), "{text}");
    let owner = sh(backend, "ps -o user,args | grep '/bin/sleep 300' | grep -v grep", &[]).await;
    assert!(String::from_utf8_lossy(&owner.stdout).starts_with("64000 "), "{owner:?}");
    // Our kill (as the secret-holder user) still works.
    server.control.kill().await.unwrap();
    server.control.wait().await.unwrap();
    let gone = sh(backend, "ps -o user,args | grep -c '^64000 .*sleep 300'", &[]).await;
    assert_eq!(String::from_utf8_lossy(&gone.stdout).trim(), "0");
}

#[tokio::test]
async fn secret_holders_run_on_a_read_only_root() {
    let ws = workspace(&WorkspaceSpec { read_only_root: true, ..Default::default() }).await;
    let backend = &*ws.backend;
    backend.write_bytes(&berth_testkit::rel("bin/tool"), Bytes::from_static(TOOL), 0o755).await.unwrap();
    let pin: [u8; 32] = sha2::Sha256::digest(TOOL).into();
    let out = backend.exec(&secret_exec(&["bin/tool"], Some(pin))).await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.exit_code, 0, "{text} {}", String::from_utf8_lossy(&out.stderr));
    assert!(text.starts_with("64000\n/tmp/berth-secret."), "{text}");
}

/// The agent re-points a symlink between a system program (passes the check) and its own
/// script (would run with the secret) while secret holders start: what runs must be what
/// was checked, every time.
#[tokio::test]
async fn a_symlink_repointed_after_the_check_never_runs_the_agents_program() {
    let ws = workspace(&WorkspaceSpec::default()).await;
    let backend = &*ws.backend;
    sh_ok(
        backend,
        "printf '#!/bin/sh\\nenv > /tmp/leak.txt; chmod 644 /tmp/leak.txt\\n' > /tmp/mine.sh && chmod 755 /tmp/mine.sh",
        &[],
    )
    .await;
    let swapping = "while :; do ln -sf /bin/busybox /tmp/evil.a; mv -f /tmp/evil.a /tmp/evil; \
                    ln -sf /tmp/mine.sh /tmp/evil.b; mv -f /tmp/evil.b /tmp/evil; done";
    let mut swapper = backend
        .spawn(&berth_workspace::SpawnSpec::new(vec!["sh".into(), "-c".into(), swapping.into()]))
        .await
        .expect("start the swapper");
    let mut started = 0;
    for _ in 0..80 {
        if backend.exec(&secret_exec(&["/tmp/evil"], None)).await.is_ok() {
            started += 1;
        }
    }
    swapper.control.kill().await.unwrap();
    let leak = sh(backend, "cat /tmp/leak.txt", &[]).await;
    assert!(
        !String::from_utf8_lossy(&leak.stdout).contains(SECRET),
        "the agent's program ran as the secret holder ({started} of 80 starts got past the check)"
    );
}
