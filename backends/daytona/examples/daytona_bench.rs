//! `cargo run -p berth-backend-daytona --example daytona_bench [ROUNDS]`: times, against the
//! Daytona emulator (labelled "emulated": no real Daytona is reachable here), provision,
//! `exec true` and a 1 MiB write + read through this backend, and the same calls through
//! the official Python SDK (the floor a client of Daytona pays anyway: `process.exec`,
//! `fs.upload_file`, `fs.download_file`). Prints one JSON object.
//!
//! The SDK half needs the venv of `.ci/venv daytona`; the lead's bench can call [`run`] the
//! same way this `main` does.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use serde_json::{Value, json};

use berth_backend_daytona::{DaytonaConfig, DaytonaDriver};
use berth_daytona_emulator::{Emulator, EmulatorConfig};
use berth_workspace::backend::ExecSpec;
use berth_workspace::driver::{BackendDriver, Placement, ProvisionContext};
use berth_workspace::id::WorkspaceId;
use berth_workspace::path::RelPath;
use berth_workspace::spec::WorkspaceSpec;

const API_KEY: &str = "daytona_bench";

fn median_ms(samples: &mut [Duration]) -> f64 {
    samples.sort();
    samples.get(samples.len() / 2).map_or(0.0, |sample| sample.as_secs_f64() * 1000.0)
}

/// Times `rounds` of each call through the backend and through the SDK (when `python` is
/// given), medians in milliseconds.
pub async fn run(rounds: usize, python: Option<&Path>) -> Result<Value> {
    let emulator = Emulator::start(EmulatorConfig::for_test(API_KEY)).await?;
    let dir = tempfile::tempdir()?;
    let key_file = dir.path().join("daytona.key");
    std::fs::write(&key_file, API_KEY)?;
    let mut config = DaytonaConfig::new(&key_file, "/berth-bench");
    config.api_url = emulator.api_url.clone();
    let driver = DaytonaDriver::new(config)?;
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
        "provider": "daytona (emulated)",
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
from daytona import Daytona, DaytonaConfig
rounds = int(sys.argv[1])
daytona = Daytona(DaytonaConfig(api_key=sys.argv[2], api_url=sys.argv[3]))
times = {"provision": [], "exec_true": [], "write_1mib": [], "read_1mib": []}
data = b"\x07" * (1024 * 1024)
for _ in range(rounds):
    started = time.perf_counter(); sandbox = daytona.create(); times["provision"].append(time.perf_counter() - started)
    started = time.perf_counter(); sandbox.process.exec("true"); times["exec_true"].append(time.perf_counter() - started)
    home = sandbox.get_user_home_dir()
    started = time.perf_counter(); sandbox.fs.upload_file(data, home + "/bench.bin"); times["write_1mib"].append(time.perf_counter() - started)
    started = time.perf_counter(); back = sandbox.fs.download_file(home + "/bench.bin"); times["read_1mib"].append(time.perf_counter() - started)
    assert len(back) == len(data)
    daytona.delete(sandbox)
print(json.dumps({name: statistics.median(values) * 1000 for name, values in times.items()}))
"#;
    let output = tokio::process::Command::new(python)
        .args(["-c", script, &rounds.to_string(), API_KEY, &emulator.api_url])
        .current_dir(std::env::temp_dir())
        .output()
        .await
        .context("run the SDK bench")?;
    anyhow::ensure!(output.status.success(), "SDK bench failed: {}", String::from_utf8_lossy(&output.stderr));
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// The `daytona` venv's Python, when `.ci/venv daytona` can make it.
fn venv_python() -> Option<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let output = std::process::Command::new(root.join(".ci/venv")).arg("daytona").current_dir(&root).output().ok()?;
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
