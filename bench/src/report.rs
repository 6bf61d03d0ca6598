//! Results: one [`ScenarioResult`] per scenario case, written as `results.json` (an array)
//! and `results.md` (one table row each), and printed to stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::Arc;

use anyhow::Context;
use serde::Serialize;
use serde_json::Value;

use crate::machine::MachineInfo;
use crate::stats::{self, Summary};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    /// Not measured on this machine or build (`reason` says why); not a failure.
    Skipped,
    /// The scenario failed or an invariant did not hold (`reason` says which); the run
    /// exits non-zero.
    Error,
}

/// A rate or size with its unit (`sessions/s`, `MiB/s`, `MiB RSS`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Quantity {
    pub value: f64,
    pub unit: String,
}

impl Quantity {
    pub fn new(value: f64, unit: impl Into<String>) -> Self {
        Self { value, unit: unit.into() }
    }
}

/// The lower bound a case is compared with, measured in the same run.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Floor {
    /// What was measured, e.g. `direct spawn of true`.
    pub name: String,
    pub latency_ms: Option<Summary>,
    pub throughput: Option<Quantity>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ScenarioResult {
    pub scenario: String,
    /// Short form of the parameters for the table, e.g. `R=3 N=1000`.
    pub case: String,
    pub status: Status,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub params: BTreeMap<String, Value>,
    pub latency_ms: Option<Summary>,
    pub throughput: Option<Quantity>,
    pub counts: BTreeMap<String, Value>,
    pub floor: Option<Floor>,
    /// How many times the floor: p50 latency / floor p50 latency, or for cases without
    /// latencies the floor's throughput / this throughput.
    pub ratio: Option<f64>,
    /// Other readings (CPU %, resident memory, etcd writes/s...).
    pub metrics: BTreeMap<String, f64>,
    /// Wall time of the measured part.
    pub wall_s: f64,
    pub machine: MachineInfo,
}

impl ScenarioResult {
    pub fn new(scenario: &str, case: impl Into<String>, machine: &Arc<MachineInfo>) -> Self {
        Self {
            scenario: scenario.to_owned(),
            case: case.into(),
            status: Status::Ok,
            reason: None,
            params: BTreeMap::new(),
            latency_ms: None,
            throughput: None,
            counts: BTreeMap::new(),
            floor: None,
            ratio: None,
            metrics: BTreeMap::new(),
            wall_s: 0.0,
            machine: MachineInfo::clone(machine),
        }
    }

    pub fn param(mut self, name: &str, value: impl Into<Value>) -> Self {
        self.params.insert(name.to_owned(), value.into());
        self
    }

    pub fn count(&mut self, name: &str, value: impl Into<Value>) {
        self.counts.insert(name.to_owned(), value.into());
    }

    pub fn metric(&mut self, name: &str, value: f64) {
        self.metrics.insert(name.to_owned(), value);
    }

    pub fn fail(&mut self, reason: impl Into<String>) {
        self.status = Status::Error;
        let reason = reason.into();
        self.reason = Some(match self.reason.take() {
            Some(earlier) => format!("{earlier}; {reason}"),
            None => reason,
        });
    }

    pub fn skip(mut self, reason: impl Into<String>) -> Self {
        self.status = Status::Skipped;
        self.reason = Some(reason.into());
        self
    }

    /// Sets the floor and the ratio to it (latency first, throughput otherwise).
    pub fn set_floor(&mut self, floor: Floor) {
        let by_latency = match (&self.latency_ms, &floor.latency_ms) {
            (Some(ours), Some(theirs)) => stats::ratio(ours.p50_ms, theirs.p50_ms),
            _ => None,
        };
        let by_throughput = || match (&self.throughput, &floor.throughput) {
            (Some(ours), Some(theirs)) => stats::ratio(theirs.value, ours.value),
            _ => None,
        };
        self.ratio = by_latency.or_else(by_throughput);
        self.floor = Some(floor);
    }
}

/// Writes `results.json` and `results.md` into `dir`.
pub fn write(dir: &Path, results: &[ScenarioResult]) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let json = to_json(results)?;
    std::fs::write(dir.join("results.json"), json + "\n").context("writing results.json")?;
    std::fs::write(dir.join("results.md"), markdown(results)).context("writing results.md")?;
    Ok(())
}

pub fn to_json(results: &[ScenarioResult]) -> anyhow::Result<String> {
    serde_json::to_string_pretty(results).context("encoding results")
}

/// The results table: scenario, params, p50, p99, max, throughput, floor, ratio; a skipped
/// or failed case says so in the ratio column and its reason below the table.
pub fn markdown(results: &[ScenarioResult]) -> String {
    let mut text = String::new();
    if let Some(first) = results.first() {
        let machine = &first.machine;
        let _ = writeln!(
            text,
            "Run {} on: {} ({} cores, {:.1} GiB), kernel {}, {}, data on {}, commit {}{}\n",
            machine.started_at,
            machine.cpu_model,
            machine.cores,
            machine.memory_bytes as f64 / GIB,
            machine.kernel,
            machine.etcd_version,
            machine.data_filesystem,
            short_commit(&machine.git_commit),
            if machine.git_dirty { " (dirty)" } else { "" },
        );
    }
    text.push_str("| scenario | params | p50 | p99 | max | throughput | floor | ratio |\n");
    text.push_str("|---|---|---:|---:|---:|---:|---|---:|\n");
    let mut notes = Vec::new();
    for result in results {
        let latency = |pick: fn(&Summary) -> f64| result.latency_ms.as_ref().map(pick).map(format_ms);
        let ratio = match result.status {
            Status::Ok => result.ratio.map(|ratio| format!("{ratio:.2}×")),
            Status::Skipped => Some("skipped".to_owned()),
            Status::Error => Some("**ERROR**".to_owned()),
        };
        if let Some(reason) = &result.reason {
            notes.push(format!("- {} {}: {}", result.scenario, result.case, reason));
        }
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            result.scenario,
            result.case,
            dash(latency(|summary| summary.p50_ms)),
            dash(latency(|summary| summary.p99_ms)),
            dash(latency(|summary| summary.max_ms)),
            dash(result.throughput.as_ref().map(format_quantity)),
            dash(result.floor.as_ref().map(format_floor)),
            dash(ratio),
        );
    }
    if !notes.is_empty() {
        text.push_str("\nSkipped and failed cases:\n\n");
        for note in notes {
            text.push_str(&note);
            text.push('\n');
        }
    }
    let mut loads: Vec<String> = Vec::new();
    for result in results {
        let (Some(before), Some(after)) = (result.metrics.get(LOAD_BEFORE), result.metrics.get(LOAD_AFTER)) else {
            continue;
        };
        let line = format!("{} {before:.1}→{after:.1}", result.scenario);
        if !loads.contains(&line) {
            loads.push(line);
        }
    }
    if !loads.is_empty() {
        let _ = writeln!(text, "\nHost load average (1 min) before→after each scenario: {}", loads.join(", "));
    }
    let details: Vec<String> = results
        .iter()
        .filter_map(|result| {
            let readings: Vec<String> = result
                .metrics
                .iter()
                .filter(|(name, _)| name.as_str() != LOAD_BEFORE && name.as_str() != LOAD_AFTER)
                .map(|(name, value)| format!("{name}={}", format_number(*value)))
                .collect();
            (!readings.is_empty()).then(|| format!("- {} {}: {}", result.scenario, result.case, readings.join(", ")))
        })
        .collect();
    if !details.is_empty() {
        text.push_str("\nOther readings:\n\n");
        for line in details {
            text.push_str(&line);
            text.push('\n');
        }
    }
    text
}

fn format_number(value: f64) -> String {
    if value.abs() >= 100.0 || value == value.trunc() { format!("{value:.0}") } else { format!("{value:.2}") }
}

/// Metric names of the host load average around a scenario (set by `main`).
pub const LOAD_BEFORE: &str = "host_load_avg_1m_before";
pub const LOAD_AFTER: &str = "host_load_avg_1m_after";

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

fn short_commit(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

fn dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "—".to_owned())
}

/// Milliseconds with about three significant digits.
pub fn format_ms(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else if ms >= 1.0 {
        format!("{ms:.2} ms")
    } else {
        format!("{:.0} µs", ms * 1000.0)
    }
}

fn format_quantity(quantity: &Quantity) -> String {
    let value = quantity.value;
    let number = if value >= 100.0 {
        format!("{value:.0}")
    } else if value >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    };
    format!("{number} {}", quantity.unit)
}

fn format_floor(floor: &Floor) -> String {
    let value = match (&floor.latency_ms, &floor.throughput) {
        (Some(latency), _) => format!("p50 {}", format_ms(latency.p50_ms)),
        (None, Some(throughput)) => format_quantity(throughput),
        (None, None) => "—".to_owned(),
    };
    format!("{value} ({})", floor.name)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn machine() -> Arc<MachineInfo> {
        Arc::new(MachineInfo {
            started_at: "2026-11-30T12:00:00Z".into(),
            cpu_model: "Test CPU".into(),
            cores: 2,
            memory_bytes: 24 * 1024 * 1024 * 1024,
            kernel: "6.1".into(),
            git_commit: "0123456789abcdef".into(),
            git_dirty: false,
            etcd_version: "etcd Version: 3.4.23".into(),
            docker_version: None,
            berth_binary: "/x/berth".into(),
            data_filesystem: "ext4 with a journal on /dev/vda".into(),
        })
    }

    #[test]
    fn ratio_prefers_latency_then_throughput() {
        let machine = machine();
        let mut result = ScenarioResult::new("hot-resolve", "seq", &machine);
        result.latency_ms = Summary::of(&[Duration::from_millis(4)]);
        result.set_floor(Floor {
            name: "health".into(),
            latency_ms: Summary::of(&[Duration::from_millis(2)]),
            throughput: None,
        });
        assert_eq!(result.ratio, Some(2.0));

        let mut by_rate = ScenarioResult::new("file-throughput", "write", &machine);
        by_rate.throughput = Some(Quantity::new(100.0, "MiB/s"));
        by_rate.set_floor(Floor {
            name: "disk".into(),
            latency_ms: None,
            throughput: Some(Quantity::new(400.0, "MiB/s")),
        });
        assert_eq!(by_rate.ratio, Some(4.0));
    }

    #[test]
    fn markdown_has_a_row_per_result_and_notes_for_reasons() {
        let machine = machine();
        let mut ok = ScenarioResult::new("exec-rtt", "local", &machine).param("iterations", 10);
        ok.latency_ms = Summary::of(&[Duration::from_micros(1500), Duration::from_millis(3)]);
        ok.throughput = Some(Quantity::new(512.0, "exec/s"));
        ok.set_floor(Floor {
            name: "spawn".into(),
            latency_ms: Summary::of(&[Duration::from_micros(500)]),
            throughput: None,
        });
        let skipped = ScenarioResult::new("exec-rtt", "docker", &machine).skip("no docker backend");
        let mut failed = ScenarioResult::new("first-session-storm", "R=1 N=10", &machine);
        failed.fail("2 workspaces on disk");
        let text = markdown(&[ok, skipped, failed]);
        assert!(
            text.contains(
                "| exec-rtt | local | 1.50 ms | 3.00 ms | 3.00 ms | 512 exec/s | p50 500 µs (spawn) | 3.00× |"
            ),
            "{text}"
        );
        assert!(text.contains("| exec-rtt | docker | — | — | — | — | — | skipped |"), "{text}");
        assert!(text.contains("**ERROR**"), "{text}");
        assert!(text.contains("- exec-rtt docker: no docker backend"), "{text}");
        assert!(text.contains("- first-session-storm R=1 N=10: 2 workspaces on disk"), "{text}");
        assert!(text.starts_with("Run 2026-11-30T12:00:00Z on: Test CPU (2 cores, 24.0 GiB)"), "{text}");
        let json: Value = serde_json::from_str(&to_json(&[ScenarioResult::new("a", "b", &machine)]).unwrap()).unwrap();
        assert_eq!(json[0]["status"], "ok");
        assert_eq!(json[0]["machine"]["cores"], 2);
    }

    #[test]
    fn milliseconds_keep_three_digits() {
        assert_eq!(format_ms(0.0421), "42 µs");
        assert_eq!(format_ms(4.213), "4.21 ms");
        assert_eq!(format_ms(42.13), "42.1 ms");
        assert_eq!(format_ms(421.3), "421 ms");
        assert_eq!(format_ms(4213.0), "4.21 s");
    }
}
