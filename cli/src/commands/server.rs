//! Server-side subcommands: `berth up`, `berth control-plane`, `berth node-agent`.
//!
//! Placeholders owned by the server-side work: fill in the argument structs and the
//! functions below; `lib.rs` already routes the subcommands here and `main.rs` already
//! sets up tracing (default level `info` for these three, see
//! `Command::default_log_level`). Each function gets the whole tokio runtime, should handle
//! Ctrl-C / SIGTERM itself (shut down in layers, STYLE.md Async) and return the process
//! exit code. The global `--endpoint` / `-o` flags are client flags and are not passed.

use clap::Args;

/// Flags of `berth up` (control plane + node agent + embedded registry in one process).
#[derive(Debug, Args)]
pub struct UpArgs {
    // Filled in by the server-side work: listen address, data directory, backends, ...
}

/// Flags of `berth control-plane` (one replica).
#[derive(Debug, Args)]
pub struct ControlPlaneArgs {
    // Filled in by the server-side work: listen address, etcd endpoints, key prefix, ...
}

/// Flags of `berth node-agent`.
#[derive(Debug, Args)]
pub struct NodeAgentArgs {
    // Filled in by the server-side work: control-plane endpoints, advertised address, ...
}

pub async fn up(_args: UpArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not wired yet")
}

pub async fn control_plane(_args: ControlPlaneArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not wired yet")
}

pub async fn node_agent(_args: NodeAgentArgs) -> anyhow::Result<i32> {
    anyhow::bail!("not wired yet")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use crate::{Cli, Command};

    #[test]
    fn server_subcommands_parse() {
        assert!(matches!(Cli::try_parse_from(["berth", "up"]).unwrap().command, Command::Up(_)));
        assert!(matches!(Cli::try_parse_from(["berth", "control-plane"]).unwrap().command, Command::ControlPlane(_)));
        assert!(matches!(Cli::try_parse_from(["berth", "node-agent"]).unwrap().command, Command::NodeAgent(_)));
    }
}
