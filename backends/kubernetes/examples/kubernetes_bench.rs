//! `cargo run -p berth-backend-kubernetes --example kubernetes_bench [ROUNDS]`: times,
//! against the API-server emulator (labelled "emulated": no real cluster runs here),
//! provision (PVC + Pod, ready), `exec true` and a 1 MiB write + read through this backend,
//! and the same calls through the official Python client (create PVC + Pod and wait for
//! Running; `pods/exec` of `true`; `cat >` and `cat` of 1 MiB over exec — the floor any
//! client of the API pays). Prints one JSON object.
//!
//! The client half needs the venv of `.ci/venv kubernetes`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use serde_json::{Value, json};

use berth_backend_kubernetes::{KubernetesConfig, KubernetesDriver};
use berth_kubernetes_emulator::{Emulator, EmulatorConfig};
use berth_workspace::backend::ExecSpec;
use berth_workspace::driver::{BackendDriver, Placement, ProvisionContext};
use berth_workspace::id::WorkspaceId;
use berth_workspace::path::RelPath;
use berth_workspace::spec::WorkspaceSpec;

const NAMESPACE: &str = "berth-bench";

fn median_ms(samples: &mut [Duration]) -> f64 {
    samples.sort();
    samples.get(samples.len() / 2).map_or(0.0, |sample| sample.as_secs_f64() * 1000.0)
}

/// Times `rounds` of each call through the backend and through the Python client (when
/// `python` is given), medians in milliseconds.
pub async fn run(rounds: usize, python: Option<&Path>) -> Result<Value> {
    let emulator =
        Emulator::start(EmulatorConfig { namespace: NAMESPACE.to_owned(), ..EmulatorConfig::for_test() }).await?;
    let mut config = KubernetesConfig::new(Some(emulator.kubeconfig.clone()), NAMESPACE, "/berth-bench");
    config.storage_size = "1Gi".into();
    let driver = KubernetesDriver::connect(config).await?;
    let spec = WorkspaceSpec::default();
    let data = Bytes::from(vec![7u8; 1024 * 1024]);
    let (mut provision, mut exec, mut write, mut read) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let id = WorkspaceId::new(format!("ws-bench-{round}"))?;
        let started = Instant::now();
        let context = ProvisionContext {
            workspace_id: &id,
            root: Path::new("/nonexistent"),
            spec: &spec,
            placement: Placement { generation: 1, owner: "bench", fresh: true },
        };
        let backend = driver.provision(context).await?;
        provision.push(started.elapsed());
        let started = Instant::now();
        let output = backend.exec(&ExecSpec::new(vec!["true".into()])).await?;
        anyhow::ensure!(output.exit_code == 0, "exec true exited {}", output.exit_code);
        exec.push(started.elapsed());
        let path = RelPath::parse("bench.bin")?;
        let started = Instant::now();
        backend.write_bytes(&path, data.clone(), 0o644).await?;
        write.push(started.elapsed());
        let started = Instant::now();
        let back = backend.read_to_bytes(&path, 2 * 1024 * 1024).await?;
        anyhow::ensure!(back.len() == data.len(), "read back {} bytes", back.len());
        read.push(started.elapsed());
        driver.destroy(&id).await?;
    }
    let mut result = json!({
        "provider": "kubernetes (emulated)",
        "rounds": rounds,
        "backend_ms": {
            "provision": median_ms(&mut provision),
            "exec_true": median_ms(&mut exec),
            "write_1mib": median_ms(&mut write),
            "read_1mib": median_ms(&mut read),
        },
    });
    if let Some(python) = python {
        result["client_ms"] = client_floor(python, &emulator, rounds).await?;
    }
    Ok(result)
}

/// The same calls through the official Python client (a small script).
async fn client_floor(python: &Path, emulator: &Emulator, rounds: usize) -> Result<Value> {
    let script = r#"
import json, statistics, sys, time
from kubernetes import client, config
from kubernetes.stream import stream
from websocket import ABNF
config.load_kube_config()
core = client.CoreV1Api()
ns, rounds = sys.argv[1], int(sys.argv[2])
times = {"provision": [], "exec_true": [], "write_1mib": [], "read_1mib": []}
data = "x" * (1024 * 1024)
def run(name, command, stdin=None):
    ws = stream(core.connect_get_namespaced_pod_exec, name, ns, command=command, stderr=True,
                stdin=stdin is not None, stdout=True, tty=False, _preload_content=False)
    if stdin is not None:
        ws.write_stdin(stdin)
        ws.sock.send(bytes([255, 0]), opcode=ABNF.OPCODE_BINARY)
    out = ""
    while ws.is_open():
        ws.update(timeout=1)
        if ws.peek_stdout():
            out += ws.read_stdout(timeout=0)
    out += ws.read_stdout(timeout=0) if ws.peek_stdout() else ""
    ws.close()
    return out
for index in range(rounds):
    name = f"py-bench-{index}"
    started = time.perf_counter()
    core.create_namespaced_persistent_volume_claim(ns, {"metadata": {"name": name}, "spec": {
        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}})
    core.create_namespaced_pod(ns, {"metadata": {"name": name}, "spec": {
        "automountServiceAccountToken": False,
        "containers": [{"name": "main", "image": "busybox", "command": ["sh", "-c", "sleep 3600"],
                        "securityContext": {"runAsNonRoot": True, "runAsUser": 1000},
                        "volumeMounts": [{"name": "data", "mountPath": "/workspace"}]}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}]}})
    while core.read_namespaced_pod(name, ns).status.phase != "Running":
        time.sleep(0.02)
    times["provision"].append(time.perf_counter() - started)
    started = time.perf_counter(); run(name, ["true"]); times["exec_true"].append(time.perf_counter() - started)
    started = time.perf_counter(); run(name, ["sh", "-c", "cat > /workspace/bench.bin"], data); times["write_1mib"].append(time.perf_counter() - started)
    started = time.perf_counter(); back = run(name, ["cat", "/workspace/bench.bin"]); times["read_1mib"].append(time.perf_counter() - started)
    assert len(back) == len(data), len(back)
    core.delete_namespaced_pod(name, ns, grace_period_seconds=0)
    core.delete_namespaced_persistent_volume_claim(name, ns)
print(json.dumps({name: statistics.median(values) * 1000 for name, values in times.items()}))
"#;
    let output = tokio::process::Command::new(python)
        .args(["-c", script, NAMESPACE, &rounds.to_string()])
        .env("KUBECONFIG", &emulator.kubeconfig)
        .output()
        .await
        .context("run the client bench")?;
    anyhow::ensure!(output.status.success(), "client bench failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// The `kubernetes` venv's Python, when `.ci/venv kubernetes` can make it.
fn venv_python() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output =
        std::process::Command::new(root.join(".ci/venv")).arg("kubernetes").current_dir(&root).output().ok()?;
    output.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join("bin/python"))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let rounds = std::env::args().nth(1).map(|text| text.parse()).transpose()?.unwrap_or(5);
    let python = venv_python();
    let result = run(rounds, python.as_deref()).await?;
    println!("{}", serde_json::to_string_pretty(&result)?);
    Ok(())
}
