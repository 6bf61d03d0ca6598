//! Real clients against the API-server emulator, through the kubeconfig it writes: kubectl
//! 1.37 (`create -f`, `get`, `get -l`, `exec` over websockets, `delete`) and the official
//! Python client (`clients/validate.py`: CRUD, label selectors, exec with stdin, stderr
//! and exit codes, optimistic concurrency) — proof that the emulator speaks the published
//! protocol. Needs the venv of `.ci/venv kubernetes`; fails loudly without.

use std::path::{Path, PathBuf};
use std::time::Duration;

use berth_kubernetes_emulator::{Emulator, EmulatorConfig};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The venv of `.ci/venv kubernetes` (kubectl and the Python client).
fn venv() -> PathBuf {
    let output = std::process::Command::new(repo_root().join(".ci/venv"))
        .arg("kubernetes")
        .current_dir(repo_root())
        .output()
        .expect("run .ci/venv kubernetes");
    assert!(output.status.success(), ".ci/venv kubernetes failed: {}", String::from_utf8_lossy(&output.stderr));
    let venv = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    assert!(venv.join("bin/kubectl").exists(), "no kubectl in the venv at {}", venv.display());
    venv
}

async fn kubectl(venv: &Path, kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    use tokio::io::AsyncWriteExt;
    let mut command = tokio::process::Command::new(venv.join("bin/kubectl"));
    command
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("HOME", kubeconfig.parent().unwrap_or(Path::new("/tmp")))
        .stdin(if stdin.is_some() { std::process::Stdio::piped() } else { std::process::Stdio::null() })
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let mut child = command.spawn().expect("start kubectl");
    if let Some(text) = stdin {
        let mut pipe = child.stdin.take().expect("kubectl stdin");
        pipe.write_all(text.as_bytes()).await.expect("feed kubectl");
        drop(pipe);
    }
    let output = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("kubectl {args:?} did not finish in 60 s"))
        .expect("run kubectl");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

const MANIFESTS: &str = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: kc-data
  labels: {app: kc}
spec:
  accessModes: [ReadWriteOnce]
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: Pod
metadata:
  name: kc-pod
  labels: {app: kc, tier: one}
spec:
  automountServiceAccountToken: false
  containers:
  - name: main
    image: busybox
    command: [sh, -c, "sleep 3600"]
    securityContext: {runAsNonRoot: true, runAsUser: 1000, readOnlyRootFilesystem: true}
    volumeMounts: [{name: data, mountPath: /data}]
  volumes:
  - name: data
    persistentVolumeClaim: {claimName: kc-data}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_drives_the_emulator() {
    let venv = venv();
    let emulator = Emulator::start(EmulatorConfig::for_test()).await.expect("start the emulator");
    let config = &emulator.kubeconfig;
    let run = |args: Vec<&'static str>| {
        let venv = venv.clone();
        let config = config.clone();
        async move { kubectl(&venv, &config, &args, None).await }
    };
    let (ok, out, err) = kubectl(&venv, config, &["create", "--validate=false", "-f", "-"], Some(MANIFESTS)).await;
    assert!(ok, "kubectl create: {out} {err}");
    assert!(out.contains("kc-pod") && out.contains("kc-data"), "{out}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut running = false;
    while !running && tokio::time::Instant::now() < deadline {
        running = run(vec!["get", "pod", "kc-pod", "-o", "jsonpath={.status.phase}"]).await.1 == "Running";
        if !running {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    assert!(running, "kc-pod did not become Running");
    let (ok, out, err) = run(vec!["get", "pods"]).await;
    assert!(ok && out.contains("kc-pod") && out.contains("Running"), "kubectl get pods: {out} {err}");
    let (ok, out, err) = run(vec!["get", "po,pvc", "-l", "app=kc", "-o", "name"]).await;
    assert!(ok, "kubectl get -l: {err}");
    assert_eq!(out.lines().collect::<Vec<_>>(), ["pod/kc-pod", "persistentvolumeclaim/kc-data"], "{out}");
    let (ok, out, _) = run(vec!["get", "pods", "-l", "tier=two", "-o", "name"]).await;
    assert!(ok && out.trim().is_empty(), "a selector matching nothing listed {out}");
    let (ok, out, err) =
        run(vec!["exec", "kc-pod", "--", "sh", "-c", "echo hi > /data/f && cat /data/f && id -u && echo e >&2"]).await;
    assert!(ok, "kubectl exec: {out} {err}");
    assert_eq!(out, "hi\n1000\n");
    assert!(err.contains("e\n"), "{err}");
    let (ok, _, err) = run(vec!["exec", "kc-pod", "--", "sh", "-c", "exit 7"]).await;
    assert!(!ok && err.contains("exit code 7"), "a failing exec: {err}");
    let (ok, out, err) = kubectl(&venv, config, &["exec", "-i", "kc-pod", "--", "cat"], Some("piped\n")).await;
    assert!(ok && out == "piped\n", "kubectl exec -i: {out:?} {err}");
    let (ok, _, err) = run(vec!["delete", "pod", "kc-pod", "--grace-period=0", "--wait=false"]).await;
    assert!(ok, "kubectl delete pod: {err}");
    let (ok, _, err) = run(vec!["delete", "pvc", "kc-data", "--wait=false"]).await;
    assert!(ok, "kubectl delete pvc: {err}");
    let (ok, out, _) = run(vec!["get", "po,pvc", "-o", "name"]).await;
    assert!(ok && out.trim().is_empty(), "objects left: {out}");
    assert_eq!(emulator.count(berth_kubernetes_emulator::PODS), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_client_drives_the_emulator() {
    let venv = venv();
    let emulator = Emulator::start(EmulatorConfig::for_test()).await.expect("start the emulator");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("clients/validate.py");
    let mut command = tokio::process::Command::new(venv.join("bin/python"));
    command.arg(script).arg("default").env("KUBECONFIG", &emulator.kubeconfig).kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the client flows did not finish in 120 s")
        .expect("run the client script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "client flows failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    for step in [
        "version",
        "pvc.create",
        "pod.create_running",
        "list.label_selector",
        "exec.output",
        "exec.stdin_stderr_exit",
        "pvc.patch_conflict",
        "delete",
    ] {
        assert!(stdout.lines().any(|line| line == format!("ok {step}")), "step {step} missing:\n{stdout}");
    }
    assert!(stdout.lines().any(|line| line == "ALL OK"), "{stdout}");
    assert_eq!(emulator.count(berth_kubernetes_emulator::PODS), 0);
}
