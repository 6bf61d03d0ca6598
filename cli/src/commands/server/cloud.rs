//! Flags of the cloud backends a node agent (or a replica's embedded gateway, or `berth up`)
//! offers: each provider's API location, its credential *file* and its sandbox defaults.
//! A provider is offered only when `--backend` names it; its flags are checked then.

use std::path::PathBuf;
use std::time::Duration;

use berth_node_agent::cloud::{CloudConfig, DaytonaConfig, E2bConfig, KubernetesConfig, OpenSandboxConfig};
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

    /// Base URL of the OpenSandbox lifecycle server (`--backend opensandbox`), e.g.
    /// `http://opensandbox:8090`.
    #[arg(long, env = "BERTH_OPENSANDBOX_URL")]
    pub opensandbox_url: Option<String>,
    /// File holding the OpenSandbox API key (none: a server started without one).
    #[arg(long, env = "BERTH_OPENSANDBOX_API_KEY_FILE")]
    pub opensandbox_api_key_file: Option<PathBuf>,
    /// File holding the execd access token, when the server's sandboxes require one.
    #[arg(long, env = "BERTH_OPENSANDBOX_EXECD_TOKEN_FILE")]
    pub opensandbox_execd_token_file: Option<PathBuf>,
    /// Image OpenSandbox sandboxes run when the workspace spec names none.
    #[arg(long, env = "BERTH_OPENSANDBOX_IMAGE", default_value = "berth/base:latest")]
    pub opensandbox_image: String,
    /// CPU of a sandbox whose spec sets none, in millicores (0: the server's default).
    #[arg(long, default_value_t = 0)]
    pub opensandbox_cpu_millis: u32,
    /// Memory of a sandbox whose spec sets none, in bytes (0: the server's default).
    #[arg(long, default_value_t = 0)]
    pub opensandbox_memory_bytes: u64,
    /// The sandbox's lifetime at the provider (at least 60s); none: Berth deletes it.
    #[arg(long, value_parser = parse_duration)]
    pub opensandbox_sandbox_timeout: Option<Duration>,
    /// How long 429 / 5xx / connection failures are retried before a call fails.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub opensandbox_retry_deadline: Duration,
    /// Deadline of one request to the server or a sandbox's execd.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub opensandbox_request_timeout: Duration,

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

    /// Kubeconfig file of the cluster workspaces run in (`--backend kubernetes`; its
    /// current context unless --kube-context). Without it: the in-cluster service account.
    #[arg(long, env = "BERTH_KUBE_CONFIG_FILE")]
    pub kube_config_file: Option<PathBuf>,
    /// Context of --kube-config-file to use.
    #[arg(long, env = "BERTH_KUBE_CONTEXT")]
    pub kube_context: Option<String>,
    /// Namespace of workspace Pods and PVCs (deploy/kubernetes grants exactly one).
    #[arg(long, env = "BERTH_KUBE_NAMESPACE", default_value = "berth")]
    pub kube_namespace: String,
    /// Image of workspace Pods when a spec names none.
    #[arg(long, env = "BERTH_KUBE_IMAGE", default_value = "berth/base:latest")]
    pub kube_image: String,
    /// storageClassName of workspace PVCs (default: the cluster's default class).
    #[arg(long, env = "BERTH_KUBE_STORAGE_CLASS")]
    pub kube_storage_class: Option<String>,
    /// Requested size of a workspace PVC.
    #[arg(long, default_value = "10Gi")]
    pub kube_storage_size: String,
    /// imagePullSecrets of workspace Pods (a Secret in the namespace; repeatable).
    #[arg(long)]
    pub kube_pull_secret: Vec<String>,
    /// CPU limit of a workspace Pod whose spec sets none (millicores, 0: none).
    #[arg(long, default_value_t = 0)]
    pub kube_cpu_millis: u32,
    /// Memory limit of a workspace Pod whose spec sets none (bytes, 0: none).
    #[arg(long, default_value_t = 0)]
    pub kube_memory_bytes: u64,
    /// How long a new workspace Pod may take to become ready.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub kube_pod_ready_timeout: Duration,
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
        let opensandbox = self.opensandbox_url.as_ref().map(|url| OpenSandboxConfig {
            api_key_file: self.opensandbox_api_key_file.clone(),
            execd_token_file: self.opensandbox_execd_token_file.clone(),
            image: self.opensandbox_image.clone(),
            default_cpu_millis: self.opensandbox_cpu_millis,
            default_memory_bytes: self.opensandbox_memory_bytes,
            sandbox_timeout: self.opensandbox_sandbox_timeout,
            retry_deadline: self.opensandbox_retry_deadline,
            request_timeout: self.opensandbox_request_timeout,
            ..OpenSandboxConfig::new(url.clone(), key_prefix)
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
        let kubernetes = KubernetesConfig {
            context: self.kube_context.clone(),
            image: self.kube_image.clone(),
            storage_class: self.kube_storage_class.clone(),
            storage_size: self.kube_storage_size.clone(),
            pull_secrets: self.kube_pull_secret.clone(),
            default_cpu_millis: self.kube_cpu_millis,
            default_memory_bytes: self.kube_memory_bytes,
            pod_ready_timeout: self.kube_pod_ready_timeout,
            ..KubernetesConfig::new(self.kube_config_file.clone(), self.kube_namespace.clone(), key_prefix)
        };
        CloudConfig { key_prefix: key_prefix.to_owned(), e2b, opensandbox, daytona, kubernetes: Some(kubernetes) }
    }
}
