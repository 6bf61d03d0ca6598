//! The objects of a workspace: its PVC (the files, outliving every Pod) and its Pod (the
//! live runtime: the workspace container on the PVC, and the secret holder's container
//! beside it).
//!
//! Hardening of both containers: `runAsNonRoot` with fixed uids, `allowPrivilegeEscalation:
//! false`, `readOnlyRootFilesystem: true` (writable: the workspace, a size-capped
//! memory-backed `/tmp`, Berth's state directory), every capability dropped, the runtime's
//! default seccomp profile, no service-account token and no service links in the
//! environment. The secret holder's container runs as another uid, in its own pid
//! namespace (no `shareProcessNamespace`), and does not mount the workspace.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use serde_json::{Value, json};

use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::spec::WorkspaceSpec;

use crate::config::{BACKEND_NAME, KubernetesConfig, STATE_DIR};

pub const WORKSPACE_CONTAINER: &str = "workspace";
pub const HOLDER_CONTAINER: &str = "secret-holder";
/// What a container runs: nothing, until an exec; it ends at once on SIGTERM.
const IDLE: &str = "trap 'exit 0' TERM; while :; do sleep 3600 & wait $!; done";

fn decode<T: serde::de::DeserializeOwned>(value: Value, what: &str) -> Result<T> {
    serde_json::from_value(value).map_err(|error| WorkspaceError::Backend {
        backend: BACKEND_NAME,
        message: format!("build the {what}: {error}"),
    })
}

pub fn pvc(
    config: &KubernetesConfig,
    name: &str,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Result<PersistentVolumeClaim> {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": config.storage_size}},
    });
    if let Some(class) = &config.storage_class {
        spec["storageClassName"] = json!(class);
    }
    decode(
        json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": spec,
        }),
        "PVC",
    )
}

fn security(user: (u32, u32)) -> Value {
    json!({
        "runAsNonRoot": true, "runAsUser": user.0, "runAsGroup": user.1,
        "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "privileged": false,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    })
}

#[allow(clippy::too_many_arguments)]
pub fn pod(
    config: &KubernetesConfig,
    name: &str,
    claim: &str,
    workspace_dir: &str,
    spec: &WorkspaceSpec,
    labels: &BTreeMap<String, String>,
    annotations: &BTreeMap<String, String>,
) -> Result<Pod> {
    let mut limits = serde_json::Map::new();
    let cpu = if spec.cpu_millis > 0 { spec.cpu_millis } else { config.default_cpu_millis };
    if cpu > 0 {
        limits.insert("cpu".into(), json!(format!("{cpu}m")));
    }
    let memory = if spec.memory_bytes > 0 { spec.memory_bytes } else { config.default_memory_bytes };
    if memory > 0 {
        limits.insert("memory".into(), json!(memory.to_string()));
    }
    let mut env = vec![json!({"name": "HOME", "value": workspace_dir})];
    env.extend(spec.env.iter().map(|(name, value)| json!({"name": name, "value": value})));
    let image = spec.image.clone().unwrap_or_else(|| config.image.clone());
    let holder_image = config.holder_image.clone().unwrap_or_else(|| image.clone());
    let pull_secrets: Vec<Value> = config.pull_secrets.iter().map(|name| json!({"name": name})).collect();
    let resources = json!({"limits": limits, "requests": limits});
    decode(
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels, "annotations": annotations},
            "spec": {
                "automountServiceAccountToken": false,
                "enableServiceLinks": false,
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 5,
                "imagePullSecrets": pull_secrets,
                "securityContext": {
                    "runAsNonRoot": true,
                    "fsGroup": config.agent_user.1,
                    "fsGroupChangePolicy": "OnRootMismatch",
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "containers": [
                    {
                        "name": WORKSPACE_CONTAINER, "image": image, "imagePullPolicy": config.pull_policy,
                        "command": ["/bin/sh", "-c", IDLE], "workingDir": workspace_dir, "env": env,
                        "resources": resources, "securityContext": security(config.agent_user),
                        "volumeMounts": [
                            {"name": "tmp", "mountPath": "/tmp"},
                            {"name": "state", "mountPath": STATE_DIR},
                            {"name": "workspace", "mountPath": workspace_dir},
                        ],
                    },
                    {
                        "name": HOLDER_CONTAINER, "image": holder_image, "imagePullPolicy": config.pull_policy,
                        "command": ["/bin/sh", "-c", IDLE], "workingDir": "/tmp",
                        "resources": resources, "securityContext": security(config.secret_holder_user),
                        "volumeMounts": [{"name": "holder-tmp", "mountPath": "/tmp"}],
                    },
                ],
                "volumes": [
                    {"name": "workspace", "persistentVolumeClaim": {"claimName": claim}},
                    {"name": "tmp", "emptyDir": {"medium": "Memory", "sizeLimit": config.tmp_size}},
                    {"name": "state", "emptyDir": {"sizeLimit": config.tmp_size}},
                    {"name": "holder-tmp", "emptyDir": {"medium": "Memory", "sizeLimit": config.tmp_size}},
                ],
            },
        }),
        "pod",
    )
}

/// Whether a Pod is up: `Running`, every container ready, not being deleted.
pub fn is_ready(pod: &Pod) -> bool {
    if pod.metadata.deletion_timestamp.is_some() {
        return false;
    }
    let Some(status) = &pod.status else { return false };
    status.phase.as_deref() == Some("Running")
        && status
            .container_statuses
            .as_ref()
            .is_some_and(|statuses| !statuses.is_empty() && statuses.iter().all(|container| container.ready))
}

/// Why a Pod is not up yet, for a timeout's message.
pub fn waiting_reason(pod: &Pod) -> String {
    let Some(status) = &pod.status else { return "no status yet".into() };
    let conditions = status
        .conditions
        .iter()
        .flatten()
        .filter_map(|condition| condition.message.clone())
        .collect::<Vec<_>>()
        .join("; ");
    let waiting = status
        .container_statuses
        .iter()
        .flatten()
        .filter_map(|container| container.state.as_ref()?.waiting.as_ref()?.reason.clone())
        .collect::<Vec<_>>()
        .join(", ");
    format!("phase {} {conditions} {waiting}", status.phase.as_deref().unwrap_or("unknown")).trim().to_owned()
}
