//! Bench rows of the opensandbox backend, for `berth-bench` and the lead's tables:
//! provision, exec `true`, 1 MiB write and 1 MiB read through Berth's backend, and the same
//! calls through the official Python SDK as the floor (`tests/sdk_bench.py`), against the
//! real `opensandbox-server` (Docker runtime) started as the tests start it.
//!
//! `cargo bench -p berth-backend-opensandbox --bench opensandbox [-- ITERATIONS]` (default
//! 10). Prints a Markdown table, then one JSON object per row. The sandboxes' execd is the
//! stand-in (`tests/opensandbox-execd-standin`), so every number but provision's is of an
//! emulated in-sandbox daemon, and the table says so.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use bytes::Bytes;

use berth_workspace::{BackendDriver, ExecSpec, Placement, ProvisionContext, RelPath, WorkspaceId, WorkspaceSpec};

fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

fn percentile(samples: &[f64], quantile: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * quantile).round() as usize]
}

async fn berth_rows(iterations: usize) -> Vec<(&'static str, Vec<f64>)> {
    let cluster = support::Cluster::new();
    let root = std::env::temp_dir();
    let spec = WorkspaceSpec::default();
    let mut provision = Vec::new();
    let mut backends = Vec::new();
    for index in 0..iterations {
        let id = WorkspaceId::new(format!("ws-bench-{index}")).unwrap();
        let context = ProvisionContext {
            workspace_id: &id,
            root: &root,
            spec: &spec,
            placement: Placement { generation: 1, owner: "bench", fresh: true },
        };
        let started = Instant::now();
        backends.push((id.clone(), cluster.driver.provision(context).await.expect("provision")));
        provision.push(millis(started.elapsed()));
    }
    let backend = backends[0].1.clone();
    let payload = Bytes::from((0..1 << 20).map(|index| index as u8).collect::<Vec<u8>>());
    let path = RelPath::parse("bench.bin").unwrap();
    let (mut exec, mut write, mut read) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..iterations {
        let started = Instant::now();
        let output = backend.exec(&ExecSpec::new(vec!["true".into()])).await.expect("exec true");
        exec.push(millis(started.elapsed()));
        assert_eq!(output.exit_code, 0);
        let started = Instant::now();
        backend.write_bytes(&path, payload.clone(), 0o644).await.expect("write 1 MiB");
        write.push(millis(started.elapsed()));
        let started = Instant::now();
        let back = backend.read_to_bytes(&path, 2 << 20).await.expect("read 1 MiB");
        read.push(millis(started.elapsed()));
        assert!(back == payload);
    }
    for (id, _) in &backends {
        cluster.driver.destroy(id).await.expect("destroy");
    }
    vec![("provision", provision), ("exec true", exec), ("write 1 MiB", write), ("read 1 MiB", read)]
}

fn sdk_rows(iterations: usize) -> Vec<(String, Vec<f64>)> {
    let server = support::server();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk_bench.py");
    let output = std::process::Command::new(server.venv.join("bin/python"))
        .arg(script)
        .args([server.port.to_string(), server.api_key.clone(), server.image.clone(), iterations.to_string()])
        .output()
        .expect("run the SDK bench");
    assert!(output.status.success(), "the SDK bench failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .map(|row| {
            let samples = row["samples_ms"]
                .as_array()
                .map(|samples| samples.iter().filter_map(|sample| sample.as_f64()).collect())
                .unwrap_or_default();
            (row["row"].as_str().unwrap_or_default().to_owned(), samples)
        })
        .collect()
}

fn main() {
    let iterations = std::env::args().skip(1).find_map(|arg| arg.parse::<usize>().ok()).unwrap_or(10).max(1);
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    let berth = runtime.block_on(berth_rows(iterations));
    let sdk = sdk_rows(iterations);
    println!("| row | via | p50 ms | p90 ms | n | note |");
    println!("| --- | --- | ---: | ---: | ---: | --- |");
    let mut json = Vec::new();
    for (row, samples) in &berth {
        let floor = sdk.iter().find(|(name, _)| name == row).map(|(_, samples)| samples.clone()).unwrap_or_default();
        let note = if *row == "provision" { "real server (Docker runtime)" } else { "emulated: execd stand-in" };
        for (via, samples) in [("berth", samples.clone()), ("sdk (floor)", floor)] {
            if samples.is_empty() {
                continue;
            }
            let (p50, p90) = (percentile(&samples, 0.5), percentile(&samples, 0.9));
            println!("| {row} | {via} | {p50:.1} | {p90:.1} | {} | {note} |", samples.len());
            json.push(serde_json::json!({ "row": row, "via": via, "p50_ms": p50, "p90_ms": p90, "n": samples.len(), "emulated": *row != "provision" }));
        }
    }
    for row in json {
        println!("{row}");
    }
}
