//! `berth-supervisor`: one per live sandbox, started as the sandbox's command on its first
//! exec (see `lib.rs` for the design and [`serve`] for the loop). Arguments:
//! `--idle-ms N` (exit after N ms without a running command), `--connect SOCKET` (serve the
//! node agent over a connection to its Unix socket at that path, as in a Docker container,
//! instead of the control socket inherited at fd 4; commands then get the supervisor's
//! own environment under the request's).
//!
//! Built twice: by cargo as this package's binary (tests), and by the sandbox backends'
//! build scripts with plain `rustc` (no dependency but std), which embed it.

mod serve;
mod shim;
mod sys;
#[allow(dead_code)] // the node-side half (encoders) is the library's
mod wire;

use std::time::Duration;

/// Idle period when no `--idle-ms` is given.
const DEFAULT_IDLE: Duration = Duration::from_secs(30);

fn main() {
    let mut idle = DEFAULT_IDLE;
    let mut connect = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--idle-ms", Some(value)) if value.parse::<u64>().is_ok() => {
                idle = Duration::from_millis(value.parse().unwrap_or_default());
            }
            ("--connect", Some(path)) => connect = Some(path),
            _ => {
                eprintln!("berth-supervisor: usage: berth-supervisor [--idle-ms N] [--connect SOCKET]");
                std::process::exit(2);
            }
        }
    }
    match connect {
        Some(path) => serve::run_connected(&path, idle),
        None => serve::run(wire::CONTROL_FD, idle),
    }
}
