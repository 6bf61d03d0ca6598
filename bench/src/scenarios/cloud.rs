//! `cloud`: the cloud backends (E2B, Daytona, Kubernetes, OpenSandbox) driven the way a
//! gateway drives them — provision, `exec true`, a 1 MiB write and its read back — each with
//! the provider's official client doing the same calls against the same provider as the
//! floor (`bench/cloud/<backend>_floor.py`, in the venv `.ci/venv <backend>` makes).
//!
//! No real E2B, Daytona or kube-apiserver can be reached here: those rows run against the
//! emulators under `tests/` and say so (`fidelity`); OpenSandbox is the real server with its
//! Docker runtime, its in-sandbox daemon the stand-in. Emulated numbers measure Berth's
//! client side and the protocol, not a provider's data centre.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use berth_tests::cloud::{CloudProvider, DaytonaProvider, E2bProvider, KubernetesProvider, OpenSandboxProvider};
use berth_workspace::backend::ExecSpec;
use berth_workspace::driver::{BackendDriver, Placement, ProvisionContext};
use berth_workspace::id::WorkspaceId;
use berth_workspace::path::RelPath;
use berth_workspace::spec::WorkspaceSpec;
use bytes::Bytes;

use super::common;
use crate::env::{Ctx, progress};
use crate::report::{Floor, ScenarioResult};
use crate::stats::Summary;

pub const NAME: &str = "cloud";

/// The rows, in the order each round makes the calls.
const ROWS: [&str; 4] = ["provision", "exec true", "write 1 MiB", "read 1 MiB"];
const PAYLOAD: usize = 1024 * 1024;
/// One round of four calls; a provider that hangs fails its rows instead of the run.
const ROUND_DEADLINE: Duration = Duration::from_secs(120);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<ScenarioResult>> {
    let rounds = if ctx.settings.quick { 3 } else { 10 };
    let mut results = Vec::new();
    for backend in ["e2b", "daytona", "kubernetes", "opensandbox"] {
        progress!("{NAME}: {backend}: starting the provider");
        let provider: anyhow::Result<Box<dyn CloudProvider>> = match backend {
            "e2b" => E2bProvider::start().await.map(|provider| Box::new(provider) as Box<dyn CloudProvider>),
            "daytona" => DaytonaProvider::start().await.map(|provider| Box::new(provider) as Box<dyn CloudProvider>),
            "kubernetes" => {
                KubernetesProvider::start().await.map(|provider| Box::new(provider) as Box<dyn CloudProvider>)
            }
            _ => OpenSandboxProvider::start().await.map(|provider| Box::new(provider) as Box<dyn CloudProvider>),
        };
        let provider = match provider {
            Ok(provider) => provider,
            Err(error) => {
                let case = format!("{backend} ({}): provision", label(backend));
                results.push(common::error_row(NAME, &case, &ctx.machine, &error));
                continue;
            }
        };
        results.extend(measure(ctx, backend, &*provider, rounds).await);
    }
    Ok(results)
}

/// One provider's rows: Berth's driver, then the official client, `rounds` rounds each.
async fn measure(ctx: &Ctx, backend: &str, provider: &dyn CloudProvider, rounds: usize) -> Vec<ScenarioResult> {
    let started = Instant::now();
    progress!("{NAME}: {backend}: {rounds} rounds through Berth's backend");
    let ours = match through_berth(provider, rounds).await {
        Ok(samples) => samples,
        Err(error) => {
            let case = format!("{backend} ({}): provision", label(backend));
            return vec![common::row_or_error(NAME, &case, &ctx.machine, Err(error))];
        }
    };
    let wall = started.elapsed();
    progress!("{NAME}: {backend}: {rounds} rounds through the official client (the floor)");
    let floor = through_sdk(provider, rounds).await;
    ROWS.iter()
        .map(|row| {
            let mut result = ScenarioResult::new(NAME, format!("{backend} ({}): {row}", label(backend)), &ctx.machine)
                .param("backend", backend)
                .param("rounds", rounds as u64)
                .param("fidelity", provider.fidelity());
            result.latency_ms = Summary::of(&ours[*row]);
            result.wall_s = wall.as_secs_f64();
            match &floor {
                Ok(samples) => match samples.get(*row) {
                    Some(samples) => result.set_floor(Floor {
                        name: format!("{} client, same call", provider.sdk().venv_area),
                        latency_ms: Summary::of(samples),
                        throughput: None,
                    }),
                    None => result.fail(format!("the official client's script measured no {row:?} row")),
                },
                Err(error) => result.fail(format!("floor (official client): {error:#}")),
            }
            result
        })
        .collect()
}

/// What answers, short, in the row's name (the `fidelity` parameter says it in full).
fn label(backend: &str) -> &'static str {
    match backend {
        "opensandbox" => "real server, stand-in execd",
        _ => "emulated",
    }
}

/// `rounds` rounds of provision → exec → write → read → destroy through Berth's driver,
/// on a cluster prefix of this run's own.
async fn through_berth(
    provider: &dyn CloudProvider,
    rounds: usize,
) -> anyhow::Result<BTreeMap<&'static str, Vec<Duration>>> {
    let prefix = format!("/berth-bench/{:016x}", rand::random::<u64>());
    let driver: Arc<dyn BackendDriver> = provider.driver(&prefix).await?;
    let spec = WorkspaceSpec::default();
    let root = std::env::temp_dir();
    let data = Bytes::from(vec![7u8; PAYLOAD]);
    let path = RelPath::parse("bench.bin")?;
    let mut samples: BTreeMap<&'static str, Vec<Duration>> = ROWS.iter().map(|row| (*row, Vec::new())).collect();
    for round in 0..rounds {
        let id = WorkspaceId::new(format!("ws-bench-{round}"))?;
        let calls = async {
            let started = Instant::now();
            let backend = provision(&*driver, &id, &root, &spec).await?;
            samples.get_mut("provision").expect("row").push(started.elapsed());

            let started = Instant::now();
            let output = backend.exec(&ExecSpec::new(vec!["true".into()])).await.context("exec true")?;
            ensure!(output.exit_code == 0, "exec true exited {}", output.exit_code);
            samples.get_mut("exec true").expect("row").push(started.elapsed());

            let started = Instant::now();
            backend.write_bytes(&path, data.clone(), 0o644).await.context("write 1 MiB")?;
            samples.get_mut("write 1 MiB").expect("row").push(started.elapsed());

            let started = Instant::now();
            let back = backend.read_to_bytes(&path, 2 * PAYLOAD as u64).await.context("read 1 MiB")?;
            ensure!(back == data, "read back {} bytes that are not the ones written", back.len());
            samples.get_mut("read 1 MiB").expect("row").push(started.elapsed());
            Ok(())
        };
        let outcome = match tokio::time::timeout(ROUND_DEADLINE, calls).await {
            Ok(outcome) => outcome,
            Err(_) => Err(anyhow::anyhow!("round {round} did not finish within {ROUND_DEADLINE:?}")),
        };
        // Nothing of the run stays at the provider, whatever failed.
        let destroyed = driver.destroy(&id).await;
        outcome?;
        destroyed.context("destroy")?;
    }
    Ok(samples)
}

/// Provisions, retried while the provider answers unavailable (a loaded machine can break a
/// fresh sandbox's first command stream) up to a deadline; a retried provision is timed
/// whole, retries included.
async fn provision(
    driver: &dyn BackendDriver,
    id: &WorkspaceId,
    root: &Path,
    spec: &WorkspaceSpec,
) -> anyhow::Result<berth_workspace::backend::BackendRef> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let placement = Placement { generation: 1, owner: "bench", fresh: true };
        let context = ProvisionContext { workspace_id: id, root, spec, placement };
        match driver.provision(context).await {
            Ok(backend) => return Ok(backend),
            Err(berth_workspace::WorkspaceError::BackendUnavailable { .. }) if Instant::now() < deadline => {
                progress!("{NAME}: provision of {id}: provider unavailable, retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(error) => return Err(anyhow::Error::from(error).context("provision")),
        }
    }
}

/// The same rounds through the provider's official client: `bench/cloud/<backend>_floor.py
/// ROUNDS` prints `{row: [milliseconds]}`.
async fn through_sdk(provider: &dyn CloudProvider, rounds: usize) -> anyhow::Result<BTreeMap<String, Vec<Duration>>> {
    let sdk = provider.sdk();
    let area = sdk.venv_area;
    let venv = common::testkit_call(&format!(".ci/venv {area}"), move || berth_testkit::venv(area)).await?;
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("cloud").join(format!("{}_floor.py", provider.backend()));
    let run = tokio::process::Command::new(venv.join("bin/python"))
        .arg(&script)
        .arg(rounds.to_string())
        .envs(sdk.env)
        .current_dir(std::env::temp_dir())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(Duration::from_secs(60 + 30 * rounds as u64), run)
        .await
        .with_context(|| format!("{} did not finish", script.display()))?
        .with_context(|| format!("run {}", script.display()))?;
    ensure!(
        output.status.success(),
        "{} failed ({}): {}",
        script.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).lines().rev().take(15).collect::<Vec<_>>().join(" | ")
    );
    // The rows are the last line (a client may print other lines of its own before).
    let stdout = String::from_utf8_lossy(&output.stdout);
    let last = stdout.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or_default();
    let rows: BTreeMap<String, Vec<f64>> = serde_json::from_str(last).with_context(|| {
        format!("{} printed no JSON rows: {}", script.display(), String::from_utf8_lossy(&output.stdout))
    })?;
    Ok(rows
        .into_iter()
        .map(|(row, millis)| (row, millis.into_iter().map(|ms| Duration::from_secs_f64(ms / 1000.0)).collect()))
        .collect())
}
