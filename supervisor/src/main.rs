//! `berth-supervisor`: one per live sandbox, started as the sandbox's command on its first
//! exec (see `lib.rs` for the design and [`serve`] for the loop). Arguments:
//! `--idle-ms N` (exit after N ms without a running command).
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
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next().and_then(|value| value.parse::<u64>().ok())) {
            ("--idle-ms", Some(millis)) => idle = Duration::from_millis(millis),
            _ => {
                eprintln!("berth-supervisor: usage: berth-supervisor [--idle-ms N]");
                std::process::exit(2);
            }
        }
    }
    serve::run(wire::CONTROL_FD, idle)
}
