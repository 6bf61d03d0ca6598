//! What the server commands share: signal handling, duration and list flags, default ids.

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// `--config` of every server command. Read by `config_file::parse_from` before the real
/// parse; the commands themselves never look at it.
#[derive(Debug, Clone, clap::Args)]
pub struct ConfigFlag {
    /// TOML file of settings: each key is a long flag without the dashes (`idle-ttl = "30s"`,
    /// `etcd = ["http://a:2379", "http://b:2379"]`); flags and BERTH_* variables win over it.
    #[arg(long = "config", id = crate::config_file::CONFIG_ARG_ID, env = "BERTH_CONFIG", value_name = "FILE")]
    pub file: Option<PathBuf>,
}

/// A token cancelled on the first Ctrl-C or SIGTERM.
pub(crate) fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = async {
                match terminate.as_mut() {
                    Some(signal) => { signal.recv().await; }
                    None => std::future::pending::<()>().await,
                }
            } => {}
        }
        tracing::info!("shutting down");
        cancel.cancel();
    });
    token
}

/// clap parser for durations with units (`30s`, `1h`, `500ms`).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|error| format!("{text:?}: {error} (use units, e.g. 30s, 5m, 1h)"))
}

/// [`parse_duration`] for client commands.
pub fn parse_duration_arg(text: &str) -> Result<Duration, String> {
    parse_duration(text)
}

/// Splits a comma-separated list, dropping empty items.
pub(crate) fn split_list(values: &[String]) -> Vec<String> {
    values
        .iter()
        .flat_map(|value| value.split(','))
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(str::to_owned)
        .collect()
}

/// A stable-enough default id for this host: its hostname, else a random suffix.
pub(crate) fn default_id(prefix: &str) -> String {
    let host = std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|name| name.trim().to_owned())
        .filter(|name| !name.is_empty());
    match host {
        Some(host) => format!("{prefix}-{host}"),
        None => format!("{prefix}-{:08x}", rand::random::<u32>()),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    #[test]
    fn server_subcommands_parse() {
        assert!(matches!(Cli::try_parse_from(["berth", "up"]).unwrap().command, Command::Up(_)));
        let replica =
            Cli::try_parse_from(["berth", "control-plane", "--etcd", "http://a:1,http://b:2", "--idle-ttl", "2s"])
                .unwrap();
        assert!(matches!(replica.command, Command::ControlPlane(_)));
        let node =
            Cli::try_parse_from(["berth", "node-agent", "--control-plane", "http://x:1", "--data-dir", "/tmp/n"])
                .unwrap();
        assert!(matches!(node.command, Command::NodeAgent(_)));
    }

    #[test]
    fn durations_need_units_and_lists_split_on_commas() {
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert!(parse_duration("2").unwrap_err().contains("use units"));
        assert_eq!(split_list(&["a,b".into(), " c ".into(), ",".into()]), vec!["a", "b", "c"]);
    }
}

/// `--snapshot-*` of `berth node-agent`, `berth control-plane` and `berth up`.
#[derive(Debug, Clone, clap::Args)]
pub struct SnapshotFlags {
    /// Where workspace snapshots go: `file:///var/lib/berth/snapshots`,
    /// `redis://host:6379/0`, `s3://bucket/prefix?endpoint=http://127.0.0.1:9000&region=us-east-1`
    /// (S3 credentials from the usual AWS_* environment). The same store on every replica and
    /// node. `berth up` defaults to `file://<data dir>/snapshots`; elsewhere absent = off.
    #[arg(long, env = "BERTH_SNAPSHOT_STORE", value_name = "URL")]
    pub snapshot_store: Option<String>,
    /// Node agents: snapshot every workspace changed since its last snapshot this often
    /// (e.g. 5m); absent = only on release (idle), before a drain moves it, and on demand.
    #[arg(long, env = "BERTH_SNAPSHOT_INTERVAL", value_parser = parse_duration)]
    pub snapshot_interval: Option<Duration>,
    /// Snapshots kept per workspace (the newest); all go when the workspace is destroyed.
    #[arg(long, env = "BERTH_SNAPSHOT_KEEP", default_value_t = 5)]
    pub snapshot_keep: usize,
}

impl SnapshotFlags {
    pub fn apply_to_node(&self, config: &mut berth_node_agent::NodeAgentConfig, store: Option<String>) {
        config.snapshot_store = store;
        config.snapshot_interval = self.snapshot_interval;
        config.snapshot_keep = self.snapshot_keep;
    }

    pub fn apply_to_replica(&self, config: &mut berth_control_plane::ControlPlaneConfig, store: Option<String>) {
        config.snapshot_store = store;
        config.snapshot_keep = self.snapshot_keep;
    }
}
