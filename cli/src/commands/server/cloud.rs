//! Flags of the cloud backends a node agent (or a replica's embedded gateway, or `berth up`)
//! offers: each provider's API location, its credential *file* and its sandbox defaults.
//! A provider is offered only when `--backend` names it; its flags are checked then.

use std::path::PathBuf;
use std::time::Duration;

use berth_node_agent::cloud::{CloudConfig, DaytonaConfig, E2bConfig};
use clap::Args;

use super::flags::parse_duration;

/// Provider settings shared by `berth node-agent`, `berth control-plane --gateway-backend`
/// and `berth up`.
#[derive(Debug, Args)]
pub struct CloudFlags {
    /// File holding the E2B API key (`--backend e2b`).
    #[arg(long, env = "BERTH_E2B_API_KEY_FILE")]
    pub e2b_api_key_file: Option<PathBuf>,
    /// E2B platform API base URL.
    #[arg(long, env = "BERTH_E2B_API_URL", default_value = "https://api.e2b.app")]
    pub e2b_api_url: String,
    /// One envd URL for every E2B sandbox, routed by headers (default: each sandbox's own
    /// host under --e2b-domain).
    #[arg(long, env = "BERTH_E2B_SANDBOX_URL")]
    pub e2b_sandbox_url: Option<String>,
    /// Domain of per-sandbox E2B hosts.
    #[arg(long, env = "BERTH_E2B_DOMAIN", default_value = "e2b.app")]
    pub e2b_domain: String,
    /// E2B template sandboxes are created from.
    #[arg(long, env = "BERTH_E2B_TEMPLATE", default_value = "base")]
    pub e2b_template: String,
    /// E2B sandbox timeout (sandboxes auto-pause, files kept, when it passes unused).
    #[arg(long, default_value = "1h", value_parser = parse_duration)]
    pub e2b_sandbox_timeout: Duration,
    /// Deadline of one request to E2B (its API or a sandbox's envd).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub e2b_request_timeout: Duration,
    /// File holding the Daytona API key (`--backend daytona`).
    #[arg(long, env = "BERTH_DAYTONA_API_KEY_FILE")]
    pub daytona_api_key_file: Option<PathBuf>,
    /// Daytona API base URL.
    #[arg(long, env = "BERTH_DAYTONA_API_URL", default_value = "https://app.daytona.io/api")]
    pub daytona_api_url: String,
    /// Daytona organization (sent as `X-Daytona-Organization-ID`; default: the key's own).
    #[arg(long, env = "BERTH_DAYTONA_ORGANIZATION_ID")]
    pub daytona_organization_id: Option<String>,
    /// Daytona snapshot sandboxes are created from (default: Daytona's default snapshot).
    #[arg(long, env = "BERTH_DAYTONA_SNAPSHOT")]
    pub daytona_snapshot: Option<String>,
    /// Daytona's own auto-stop interval in minutes (0: never; Berth stops idle workspaces).
    #[arg(long, default_value_t = 0)]
    pub daytona_auto_stop_minutes: u32,
    /// The workspace root inside Daytona sandboxes (default: `<home>/workspace`).
    #[arg(long)]
    pub daytona_workspace_root: Option<String>,
    /// Deadline of one request to Daytona (its API or a sandbox's toolbox).
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub daytona_request_timeout: Duration,
}

impl CloudFlags {
    /// The cloud settings, labelled with the cluster's `key_prefix`.
    pub fn config(&self, key_prefix: &str) -> CloudConfig {
        let e2b = self.e2b_api_key_file.as_ref().map(|key_file| E2bConfig {
            api_url: self.e2b_api_url.clone(),
            sandbox_url: self.e2b_sandbox_url.clone(),
            domain: self.e2b_domain.clone(),
            template: self.e2b_template.clone(),
            sandbox_timeout: self.e2b_sandbox_timeout,
            request_timeout: self.e2b_request_timeout,
            ..E2bConfig::new(key_file, key_prefix)
        });
        let daytona = self.daytona_api_key_file.as_ref().map(|key_file| DaytonaConfig {
            api_url: self.daytona_api_url.clone(),
            organization_id: self.daytona_organization_id.clone(),
            snapshot: self.daytona_snapshot.clone(),
            auto_stop_minutes: self.daytona_auto_stop_minutes,
            workspace_root: self.daytona_workspace_root.clone(),
            request_timeout: self.daytona_request_timeout,
            ..DaytonaConfig::new(key_file, key_prefix)
        });
        CloudConfig { key_prefix: key_prefix.to_owned(), e2b, daytona }
    }
}
