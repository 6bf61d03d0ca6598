//! `berth`: parse flags, set up tracing, run the command, turn its result into an exit code.
//! Everything else lives in the library (`lib.rs`) so tests can drive it in-process.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    // Usage errors, --help and --version exit here (2 for usage errors, 0 otherwise).
    let cli = berth::Cli::parse();
    init_tracing(cli.command.default_log_level());
    // ring is the one crypto provider of the tree (DEPENDENCIES.md); installed once, before
    // any TLS config is built. An error means one is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return report(&anyhow::anyhow!("start async runtime: {error}")),
    };
    match runtime.block_on(berth::run(cli)) {
        Ok(code) => exit_code(code),
        Err(error) if berth::io::is_stdout_closed(&error) => exit_code(berth::io::EXIT_STDOUT_CLOSED),
        Err(error) => report(&error),
    }
}

/// Logs go to stderr so stdout carries only command output; colours only on a terminal.
/// `RUST_LOG` overrides the default level.
fn init_tracing(default_level: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_level));
    // try_init: a subscriber that cannot be installed is no reason to fail the command.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .try_init();
}

/// Exit statuses are one byte; commands map theirs into range, so anything else is a bug
/// reported as plain failure rather than wrapped into a false success.
fn exit_code(code: i32) -> ExitCode {
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Prints the one `error:` line and exits 1. A failed write to stderr is ignored: there
/// is nowhere left to report it, and `eprintln!` would panic instead.
fn report(error: &anyhow::Error) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "error: {}", berth::error_line(error));
    ExitCode::from(1)
}
