//! Settings of the Kubernetes driver, built from the node-agent flags `--kube-*` (see the
//! crate docs). The credential is a kubeconfig file or the Pod's own service account
//! (in-cluster), never a flag.

use std::path::PathBuf;
use std::time::Duration;

use berth_workspace::error::{Result, WorkspaceError};

/// Name of the backend in logs, metric labels and errors.
pub const BACKEND_NAME: &str = "kubernetes";
/// `uid:gid` of the workspace container (workspace processes) unless configured otherwise.
pub const DEFAULT_AGENT_USER: (u32, u32) = (1000, 1000);
/// `uid:gid` of the secret-holder container: another uid, another pid namespace, and the
/// workspace volume not mounted.
pub const DEFAULT_SECRET_HOLDER_USER: (u32, u32) = (64_000, 64_000);

/// Settings of a [`KubernetesDriver`](crate::KubernetesDriver).
#[derive(Clone, Debug)]
pub struct KubernetesConfig {
    /// A kubeconfig file (its current context); `None`: in-cluster config (the service
    /// account token and CA mounted into the gateway's Pod).
    pub kubeconfig: Option<PathBuf>,
    /// The context of the kubeconfig to use (`None`: its current context).
    pub context: Option<String>,
    /// The namespace every Pod and PVC lives in (the RBAC of `deploy/kubernetes` grants
    /// exactly this one).
    pub namespace: String,
    /// Absolute path of the workspace inside the Pod: the PVC's mount point.
    pub workspace_dir: String,
    /// The cluster's registry key prefix: every object carries its hash, and this driver
    /// never sees, adopts or deletes an object without it.
    pub cluster_prefix: String,
    /// Container image of workspace Pods when the spec names none (a POSIX shell and
    /// coreutils or busybox inside).
    pub image: String,
    /// Image of the secret-holder container (the workspace image when `None`).
    pub holder_image: Option<String>,
    /// `storageClassName` of workspace PVCs (`None`: the cluster's default class).
    pub storage_class: Option<String>,
    /// Requested size of a workspace PVC (a Kubernetes quantity, `10Gi`).
    pub storage_size: String,
    /// `imagePullSecrets` of workspace Pods (names of Secrets in the namespace).
    pub pull_secrets: Vec<String>,
    /// `imagePullPolicy` (`IfNotPresent` unless set).
    pub pull_policy: String,
    /// Defaults for specs that set no CPU / memory (0: no limit).
    pub default_cpu_millis: u32,
    pub default_memory_bytes: u64,
    /// Size of the secret holder's and the workspace container's `/tmp` (a memory-backed
    /// emptyDir, since the root filesystem is read-only).
    pub tmp_size: String,
    pub agent_user: (u32, u32),
    pub secret_holder_user: (u32, u32),
    /// Bound of one API call.
    pub request_timeout: Duration,
    /// How long 429 / 5xx / connection failures are retried before the call fails.
    pub retry_deadline: Duration,
    /// How long a new Pod may take to become ready (scheduling, pulling, starting).
    pub pod_ready_timeout: Duration,
}

/// Default workspace root inside the Pod.
pub const WORKSPACE_DIR: &str = "/workspace";
/// Berth's own directory inside the workspace container (an emptyDir): run directories.
pub const STATE_DIR: &str = "/var/lib/berth";

impl KubernetesConfig {
    /// Defaults for everything but the credential, the namespace and the cluster.
    pub fn new(kubeconfig: Option<PathBuf>, namespace: impl Into<String>, cluster_prefix: impl Into<String>) -> Self {
        Self {
            kubeconfig,
            context: None,
            namespace: namespace.into(),
            workspace_dir: WORKSPACE_DIR.to_owned(),
            cluster_prefix: cluster_prefix.into(),
            image: "berth/base:latest".to_owned(),
            holder_image: None,
            storage_class: None,
            storage_size: "10Gi".to_owned(),
            pull_secrets: Vec::new(),
            pull_policy: "IfNotPresent".to_owned(),
            default_cpu_millis: 0,
            default_memory_bytes: 0,
            tmp_size: "256Mi".to_owned(),
            agent_user: DEFAULT_AGENT_USER,
            secret_holder_user: DEFAULT_SECRET_HOLDER_USER,
            request_timeout: Duration::from_secs(30),
            retry_deadline: Duration::from_secs(60),
            pod_ready_timeout: Duration::from_secs(300),
        }
    }

    pub fn validate(&self) -> Result<()> {
        let invalid = |message: String| Err(WorkspaceError::InvalidArgument(format!("kubernetes config: {message}")));
        if !dns_label(&self.namespace) {
            return invalid(format!("namespace {:?} is not a DNS label", self.namespace));
        }
        if !safe_absolute(&self.workspace_dir) || self.workspace_dir.starts_with(STATE_DIR) {
            return invalid(format!(
                "workspace dir {:?} must be an absolute path of [A-Za-z0-9._-] components",
                self.workspace_dir
            ));
        }
        if self.cluster_prefix.is_empty() {
            return invalid("the cluster prefix is empty".into());
        }
        if self.image.is_empty() || self.image.contains(char::is_whitespace) {
            return invalid(format!("image {:?} is not an image reference", self.image));
        }
        if let Some(class) = &self.storage_class
            && !dns_subdomain(class)
        {
            return invalid(format!("storage class {class:?} is not a DNS subdomain"));
        }
        for secret in &self.pull_secrets {
            if !dns_subdomain(secret) {
                return invalid(format!("pull secret {secret:?} is not a DNS subdomain"));
            }
        }
        if !quantity(&self.storage_size) || !quantity(&self.tmp_size) {
            return invalid("sizes must be Kubernetes quantities (e.g. 10Gi)".into());
        }
        if !matches!(self.pull_policy.as_str(), "Always" | "IfNotPresent" | "Never") {
            return invalid(format!("pull policy {:?} is not Always, IfNotPresent or Never", self.pull_policy));
        }
        if self.agent_user.0 == 0 || self.secret_holder_user.0 == 0 || self.agent_user.0 == self.secret_holder_user.0 {
            return invalid("the agent and secret-holder users must be two different non-root uids".into());
        }
        Ok(())
    }
}

/// A DNS-1123 label: what namespaces and our object names must be.
pub(crate) fn dns_label(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-')
        && !text.starts_with('-')
        && !text.ends_with('-')
}

fn dns_subdomain(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(dns_label)
}

fn quantity(text: &str) -> bool {
    let digits = text.trim_end_matches(|character: char| character.is_ascii_alphabetic());
    let suffix = &text[digits.len()..];
    !digits.is_empty()
        && digits.bytes().all(|byte| byte.is_ascii_digit())
        && matches!(suffix, "" | "k" | "M" | "G" | "T" | "Ki" | "Mi" | "Gi" | "Ti")
}

/// An absolute, normalised path of `[A-Za-z0-9._-]` components other than `/`: safe to
/// splice into a script between single quotes.
pub(crate) fn safe_absolute(path: &str) -> bool {
    let Some(relative) = path.strip_prefix('/') else { return false };
    !relative.is_empty()
        && relative.split('/').all(|component| {
            !component.is_empty()
                && component != "."
                && component != ".."
                && component.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_names_and_sizes() {
        let config = KubernetesConfig::new(None, "berth", "/berth");
        config.validate().unwrap();
        let mut bad = config.clone();
        bad.namespace = "Berth".into();
        assert!(bad.validate().is_err());
        let mut bad = config.clone();
        bad.storage_size = "10 GB".into();
        assert!(bad.validate().is_err());
        let mut bad = config;
        bad.secret_holder_user = bad.agent_user;
        assert!(bad.validate().is_err());
    }
}
