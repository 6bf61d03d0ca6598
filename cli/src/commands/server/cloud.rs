//! Flags of the cloud backends a node agent (or a replica's embedded gateway, or `berth up`)
//! offers: each provider's API location, its credential *file* and its sandbox defaults.
//! A provider is offered only when `--backend` names it; its flags are checked then.

use std::path::PathBuf;
use std::time::Duration;

use berth_node_agent::cloud::{CloudConfig, E2bConfig, KubernetesConfig};
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
        CloudConfig { key_prefix: key_prefix.to_owned(), e2b, kubernetes: Some(kubernetes) }
    }
}
