//! `cargo run -p berth-backend-e2b --example e2b_bench [ROUNDS]`: times, against the E2B
//! emulator (labelled "emulated": no real E2B is reachable here), provision, `exec true`
//! and a 1 MiB write + read through this backend, and the same calls through the official
//! Python SDK (the floor a client of E2B pays anyway). Prints one JSON object.
//!
//! The SDK half needs the venv of `.ci/venv e2b`; the lead's bench can call [`run`] the same
//! way this `main` does.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use serde_json::{Value, json};

use berth_backend_e2b::{E2bConfig, E2bDriver};
use berth_e2b_emulator::{Emulator, EmulatorConfig};
use berth_workspace::backend::ExecSpec;
use berth_workspace::driver::{BackendDriver, Placement, ProvisionContext};
use berth_workspace::id::WorkspaceId;
use berth_workspace::path::RelPath;
use berth_workspace::spec::WorkspaceSpec;

const API_KEY: &str = "e2b_bench";

fn median_ms(samples: &mut [Duration]) -> f64 {
    samples.sort();
    samples.get(samples.len() / 2).map_or(0.0, |sample| sample.as_secs_f64() * 1000.0)
}

/// Times `rounds` of each call through the backend and through the SDK (when `python` is
/// given), medians in milliseconds.
pub async fn run(rounds: usize, python: Option<&Path>) -> Result<Value> {
    let emulator = Emulator::start(EmulatorConfig::for_test(API_KEY)).await?;
    let dir = tempfile::tempdir()?;
    let key_file = dir.path().join("e2b.key");
    std::fs::write(&key_file, API_KEY)?;
    let mut config = E2bConfig::new(&key_file, "/berth-bench");
    config.api_url = emulator.api_url.clone();
    config.sandbox_url = Some(emulator.sandbox_url.clone());
    let driver = E2bDriver::new(config)?;
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
        "provider": "e2b (emulated)",
        "rounds": rounds,
        "backend_ms": {
            "provision": median_ms(&mut provision),
            "exec_true": median_ms(&mut exec),
            "write_1mib": median_ms(&mut write),
            "read_1mib": median_ms(&mut read),
        },
    });
    if let Some(python) = python {
        result["sdk_ms"] = sdk_floor(python, &emulator, rounds).await?;
    }
    Ok(result)
}

/// The same calls through the official SDK (a small script on stdin).
async fn sdk_floor(python: &Path, emulator: &Emulator, rounds: usize) -> Result<Value> {
    let script = r#"
import json, statistics, sys, time
from e2b import Sandbox
rounds = int(sys.argv[1])
times = {"provision": [], "exec_true": [], "write_1mib": [], "read_1mib": []}
data = b"\x07" * (1024 * 1024)
for _ in range(rounds):
    started = time.perf_counter(); sandbox = Sandbox.create(template="base"); times["provision"].append(time.perf_counter() - started)
    started = time.perf_counter(); sandbox.commands.run("true"); times["exec_true"].append(time.perf_counter() - started)
    started = time.perf_counter(); sandbox.files.write("/home/user/bench.bin", data); times["write_1mib"].append(time.perf_counter() - started)
    started = time.perf_counter(); back = sandbox.files.read("/home/user/bench.bin", format="bytes"); times["read_1mib"].append(time.perf_counter() - started)
    assert len(back) == len(data)
    sandbox.kill()
print(json.dumps({name: statistics.median(values) * 1000 for name, values in times.items()}))
"#;
    let output = tokio::process::Command::new(python)
        .args(["-c", script, &rounds.to_string()])
        .env("E2B_API_URL", &emulator.api_url)
        .env("E2B_SANDBOX_URL", &emulator.sandbox_url)
        .env("E2B_API_KEY", API_KEY)
        .output()
        .await
        .context("run the SDK bench")?;
    anyhow::ensure!(output.status.success(), "SDK bench failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// The `e2b` venv's Python, when `.ci/venv e2b` can make it.
fn venv_python() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = std::process::Command::new(root.join(".ci/venv")).arg("e2b").current_dir(&root).output().ok()?;
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
