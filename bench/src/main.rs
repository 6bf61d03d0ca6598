//! `berth-bench`: starts real Berth processes (etcd, `berth control-plane` replicas,
//! `berth node-agent`s from the release `berth` binary next to this one, or `$BERTH_BIN`),
//! runs benchmark scenarios against them, and writes `results.json` and `results.md`.
//!
//! Exit status: 0 when every case ran or was skipped; 1 when any case failed (an error, or
//! an invariant such as "one workspace per storm" did not hold); 2 on bad flags.

mod env;
mod machine;
mod report;
mod scenarios;
mod settings;
mod stats;

use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use clap::Parser;

use crate::env::{Ctx, progress};
use crate::machine::MachineInfo;
use crate::report::{ScenarioResult, Status};
use crate::settings::{Cli, Settings};

fn main() {
    let cli = Cli::parse();
    if cli.list {
        println!("{}", scenarios::ALL.join("\n"));
        return;
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("berth-bench: cannot start the async runtime: {error}");
            std::process::exit(1);
        }
    };
    let code = runtime.block_on(async {
        tokio::select! {
            outcome = run(cli) => match outcome {
                Ok(code) => code,
                Err(error) => {
                    eprintln!("berth-bench: {error:#}");
                    1
                }
            },
            // Dropping the run drops every guard it holds: processes are killed by PID,
            // floor containers and temporary data dirs removed, as at a normal end.
            signal = interrupted() => {
                eprintln!("berth-bench: {signal}: stopping, removing what the run started");
                130
            }
        }
    });
    // Every process was killed by PID as its owner dropped; nothing is left to wait for.
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    std::process::exit(code);
}

/// Resolves on the first SIGINT or SIGTERM (Ctrl-C, or an operator's `kill`), naming it.
async fn interrupted() -> &'static str {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut interrupt), Ok(mut terminate)) = (signal(SignalKind::interrupt()), signal(SignalKind::terminate()))
    else {
        // Without handlers the default action stays: the run cannot be cleaned up on a signal.
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => "interrupted (SIGINT)",
        _ = terminate.recv() => "terminated (SIGTERM)",
    }
}

/// Under `cargo run` (which builds only this package) with no `$BERTH_BIN`, builds the
/// `berth` binary of the same profile first, so the processes under test are never stale
/// or missing. A no-op build takes about a second.
fn build_berth_when_under_cargo() -> anyhow::Result<()> {
    if std::env::var_os("CARGO").is_none() || std::env::var_os("BERTH_BIN").is_some() {
        return Ok(());
    }
    let executable = std::env::current_exe()?;
    let profile = executable.parent().and_then(|dir| dir.file_name()).and_then(|name| name.to_str()).unwrap_or("debug");
    let mut command = berth_testkit::nested_cargo();
    command.args(["build", "-p", "berth", "--bin", "berth"]);
    match profile {
        "debug" => {}
        "release" => {
            command.arg("--release");
        }
        other => {
            command.args(["--profile", other]);
        }
    }
    progress!("building the berth binary ({profile} profile)");
    let status = command.status().context("running cargo build -p berth")?;
    anyhow::ensure!(status.success(), "cargo build -p berth failed ({status})");
    Ok(())
}

async fn run(cli: Cli) -> anyhow::Result<i32> {
    let names: Vec<&str> = match cli.scenario.as_str() {
        "all" => scenarios::ALL.to_vec(),
        name if scenarios::ALL.contains(&name) => vec![name],
        other => anyhow::bail!("unknown scenario {other:?}; one of: all, {}", scenarios::ALL.join(", ")),
    };
    let settings = Settings::resolve(cli.quick, cli.tuning)?;
    build_berth_when_under_cargo()?;
    let binary = berth_tests::berth::berth_binary();
    anyhow::ensure!(binary.is_file(), "the berth binary is not at {} (build it or set BERTH_BIN)", binary.display());
    let machine = Arc::new(MachineInfo::collect(&binary));
    progress!(
        "berth {} on {} ({} cores), {}{}",
        binary.display(),
        machine.cpu_model,
        machine.cores,
        if settings.quick { "quick run" } else { "full run" },
        if machine.git_dirty { ", work tree dirty" } else { "" }
    );
    let ctx = Ctx::new(settings, Arc::clone(&machine));
    let started = Instant::now();
    let mut results: Vec<ScenarioResult> = Vec::new();
    for name in names {
        let scenario_started = Instant::now();
        let load_before = machine::load_average().unwrap_or(0.0);
        progress!("== {name} (host load average {load_before:.2})");
        let mut rows = match scenarios::run(name, &ctx).await {
            Ok(rows) => rows,
            Err(error) => {
                progress!("{name}: error: {error:#}");
                vec![scenarios::common::error_row(name, "—", &machine, &error)]
            }
        };
        let load_after = machine::load_average().unwrap_or(0.0);
        for row in &mut rows {
            // Other processes on the machine skew every number; this says how busy it was.
            row.metric(report::LOAD_BEFORE, load_before);
            row.metric(report::LOAD_AFTER, load_after);
        }
        let failed = rows.iter().filter(|row| row.status == Status::Error).count();
        progress!(
            "== {name} done in {:.1}s, {} rows, {failed} failed",
            scenario_started.elapsed().as_secs_f64(),
            rows.len()
        );
        results.extend(rows);
        // Written after every scenario, so an interrupted run keeps what it measured.
        report::write(&cli.out, &results)?;
    }
    println!("{}", report::to_json(&results)?);
    println!();
    print!("{}", report::markdown(&results));
    let failed = results.iter().filter(|row| row.status == Status::Error).count();
    progress!(
        "done in {:.1}s: {} rows, {failed} failed; results in {}",
        started.elapsed().as_secs_f64(),
        results.len(),
        cli.out.display()
    );
    Ok(if failed > 0 { 1 } else { 0 })
}
