//! `berth`: parse flags, set up tracing, run the command, turn its result into an exit code.
//! Everything else lives in the library (`lib.rs`) so tests can drive it in-process.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;

use berth::config_file::ParseError;

/// mimalloc instead of glibc's malloc: a replica's view of a million workspace records
/// takes a fifth less memory and loads faster (bench/results/allocator.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // Usage errors, --help and --version exit here (2 for usage errors, 0 otherwise); so does
    // a --config file that cannot be used, before anything starts.
    let cli = match berth::config_file::parse_from::<berth::Cli>(std::env::args_os()) {
        Ok(cli) => cli,
        Err(ParseError::Usage(error)) => error.exit(),
        Err(ParseError::ConfigFile(error)) => {
            let _ = writeln!(std::io::stderr(), "error: {error}");
            return ExitCode::from(2);
        }
    };
    for warning in berth::global::secrets_on_the_command_line(std::env::args_os().skip(1)) {
        let _ = writeln!(std::io::stderr(), "warning: {warning}");
    }
    // ring is the one crypto provider of the tree (docs/dependencies.md); installed once, before
    // any TLS config is built. An error means one is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => return report(&anyhow::anyhow!("start async runtime: {error}")),
    };
    // Inside the runtime: the OTLP exporter is a tonic client.
    let otlp = cli.command.telemetry().and_then(|(flags, service)| Some((flags.otlp_endpoint.clone()?, service)));
    let tracer_provider = {
        let _entered = runtime.enter();
        let otlp = otlp.as_ref().map(|(endpoint, service)| (endpoint.as_str(), *service));
        match berth::telemetry::init_tracing(cli.command.default_log_level(), otlp, std::io::stderr().is_terminal()) {
            Ok(provider) => provider,
            Err(error) => return report(&error),
        }
    };
    let outcome = runtime.block_on(berth::run(cli));
    // The runtime's workers still run: the exporter's last batch goes out over them.
    if let Some(provider) = tracer_provider {
        berth::telemetry::flush_traces(provider);
    }
    match outcome {
        Ok(code) => exit_code(code),
        Err(error) if berth::io::is_stdout_closed(&error) => exit_code(berth::io::EXIT_STDOUT_CLOSED),
        Err(error) => report(&error),
    }
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
