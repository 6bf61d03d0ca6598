//! The emulated cluster's objects: namespaced Pods and PersistentVolumeClaims as JSON, one
//! `resourceVersion` counter for all of them (as etcd's revision is), and the running
//! containers of every Pod.
//!
//! Semantics kept from the API server: names are unique per namespace and kind (a second
//! create is 409 `AlreadyExists`); an update naming a `resourceVersion` other than the
//! current one is 409 `Conflict` (optimistic concurrency); a PVC deleted while a Pod uses
//! it stays, `Terminating`, until the last such Pod is gone (the `pvc-protection`
//! finalizer). Pods are deleted at once (grace period 0) and their containers killed.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;

use serde_json::{Value, json};

use crate::container::{Container, ContainerSpec, Mount};
use crate::selector::Selector;

pub const PODS: &str = "pods";
pub const PVCS: &str = "persistentvolumeclaims";

/// An API error as the server answers it (a `Status` object).
#[derive(Debug)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self { code, reason, message: message.into() }
    }

    pub fn not_found(kind: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{kind} \"{name}\" not found"))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    pub fn to_status(&self) -> Value {
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": self.message, "reason": self.reason, "code": self.code,
        })
    }
}

pub type ApiResult<T> = Result<T, ApiError>;

type Key = (String, String, String);

#[derive(Default)]
struct Objects {
    items: BTreeMap<Key, Value>,
    revision: u64,
}

pub struct State {
    pub root: PathBuf,
    objects: Mutex<Objects>,
    /// Running containers by Pod uid.
    containers: tokio::sync::Mutex<HashMap<String, Vec<std::sync::Arc<Container>>>>,
}

fn now() -> String {
    humantime_rfc3339()
}

fn humantime_rfc3339() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_secs())
        .unwrap_or(0);
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let days = (seconds / 86_400) as i64;
    let secs = seconds % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", secs / 3600, secs % 3600 / 60, secs % 60)
}

/// A DNS-1123 subdomain (what Pod and PVC names must be).
fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|byte| byte.is_ascii_lowercase() || byte.is_ascii_digit() || byte == b'-' || byte == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
}

/// A label value: at most 63 characters of `[A-Za-z0-9._-]`, alphanumeric at both ends.
fn valid_label_value(value: &str) -> bool {
    value.is_empty()
        || (value.len() <= 63
            && value.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
            && value.as_bytes()[0].is_ascii_alphanumeric()
            && value.as_bytes()[value.len() - 1].is_ascii_alphanumeric())
}

pub fn labels_of(object: &Value) -> BTreeMap<String, String> {
    object["metadata"]["labels"]
        .as_object()
        .map(|labels| {
            labels.iter().filter_map(|(key, value)| Some((key.clone(), value.as_str()?.to_owned()))).collect()
        })
        .unwrap_or_default()
}

fn check_labels(object: &Value) -> ApiResult<()> {
    for (key, value) in labels_of(object) {
        let name = key.rsplit('/').next().unwrap_or("");
        if name.is_empty() || !valid_label_value(name) || !valid_label_value(&value) {
            return Err(ApiError::new(
                422,
                "Invalid",
                format!("metadata.labels: Invalid value: {value:?}: a valid label must be 63 characters or less"),
            ));
        }
    }
    Ok(())
}

fn kind_of(resource: &str) -> (&'static str, &'static str) {
    if resource == PODS { ("Pod", "PodList") } else { ("PersistentVolumeClaim", "PersistentVolumeClaimList") }
}

impl State {
    pub fn new(root: PathBuf) -> Self {
        Self { root, objects: Mutex::default(), containers: tokio::sync::Mutex::default() }
    }

    fn objects(&self) -> std::sync::MutexGuard<'_, Objects> {
        self.objects.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn pvc_dir(&self, namespace: &str, name: &str) -> PathBuf {
        self.root.join("pvc").join(namespace).join(name)
    }

    fn pod_dir(&self, uid: &str) -> PathBuf {
        self.root.join("pod").join(uid)
    }

    pub fn get(&self, resource: &str, namespace: &str, name: &str) -> ApiResult<Value> {
        self.objects()
            .items
            .get(&(resource.to_owned(), namespace.to_owned(), name.to_owned()))
            .cloned()
            .ok_or_else(|| ApiError::not_found(resource, name))
    }

    /// Every object of a kind in a namespace (`None`: all namespaces) matching the selectors.
    pub fn list(&self, resource: &str, namespace: Option<&str>, labels: &Selector, name: Option<&str>) -> Value {
        let objects = self.objects();
        let items: Vec<Value> = objects
            .items
            .iter()
            .filter(|((kind, ns, object_name), _)| {
                kind == resource
                    && namespace.is_none_or(|wanted| wanted == ns)
                    && name.is_none_or(|wanted| wanted == object_name)
            })
            .map(|(_, object)| object)
            .filter(|object| labels.matches(&labels_of(object)))
            .cloned()
            .collect();
        let (_, list_kind) = kind_of(resource);
        json!({"apiVersion": "v1", "kind": list_kind, "metadata": {"resourceVersion": objects.revision.to_string()}, "items": items})
    }

    pub fn count(&self, resource: &str) -> usize {
        self.objects().items.keys().filter(|(kind, _, _)| kind == resource).count()
    }

    pub fn create(&self, resource: &str, namespace: &str, mut object: Value) -> ApiResult<Value> {
        let name = object["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        if !valid_name(&name) {
            return Err(ApiError::new(422, "Invalid", format!("metadata.name: Invalid value: {name:?}")));
        }
        check_labels(&object)?;
        let (kind, _) = kind_of(resource);
        let key = (resource.to_owned(), namespace.to_owned(), name.clone());
        let mut objects = self.objects();
        if objects.items.contains_key(&key) {
            return Err(ApiError::new(409, "AlreadyExists", format!("{resource} \"{name}\" already exists")));
        }
        objects.revision += 1;
        let uid = format!("{:032x}", rand::random::<u128>());
        object["apiVersion"] = json!("v1");
        object["kind"] = json!(kind);
        let metadata = &mut object["metadata"];
        metadata["namespace"] = json!(namespace);
        metadata["uid"] = json!(uid);
        metadata["resourceVersion"] = json!(objects.revision.to_string());
        metadata["creationTimestamp"] = json!(now());
        if resource == PVCS {
            if object["spec"]["resources"]["requests"]["storage"].as_str().is_none() {
                return Err(ApiError::new(422, "Invalid", "spec.resources.requests.storage: Required value"));
            }
            std::fs::create_dir_all(self.pvc_dir(namespace, &name))
                .map_err(|error| ApiError::new(500, "InternalError", format!("provision volume: {error}")))?;
            object["status"] = json!({"phase": "Bound", "accessModes": object["spec"]["accessModes"]});
        } else {
            object["status"] = json!({"phase": "Pending"});
        }
        objects.items.insert(key, object.clone());
        Ok(object)
    }

    /// PUT: replaces labels, annotations and spec; a stale `resourceVersion` is 409.
    pub fn replace(&self, resource: &str, namespace: &str, name: &str, object: Value) -> ApiResult<Value> {
        check_labels(&object)?;
        let key = (resource.to_owned(), namespace.to_owned(), name.to_owned());
        let mut objects = self.objects();
        let current = objects.items.get(&key).cloned().ok_or_else(|| ApiError::not_found(resource, name))?;
        if let Some(asked) = object["metadata"]["resourceVersion"].as_str()
            && !asked.is_empty()
            && Some(asked) != current["metadata"]["resourceVersion"].as_str()
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "Operation cannot be fulfilled on {resource} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
                ),
            ));
        }
        let mut updated = current;
        for field in ["labels", "annotations"] {
            updated["metadata"][field] = object["metadata"][field].clone();
        }
        if resource == PVCS {
            updated["spec"] = object["spec"].clone();
        }
        objects.revision += 1;
        updated["metadata"]["resourceVersion"] = json!(objects.revision.to_string());
        objects.items.insert(key, updated.clone());
        Ok(updated)
    }

    /// PATCH (merge patch, and strategic merge treated as one: enough for metadata).
    pub fn patch(&self, resource: &str, namespace: &str, name: &str, patch: &Value) -> ApiResult<Value> {
        let key = (resource.to_owned(), namespace.to_owned(), name.to_owned());
        let mut objects = self.objects();
        let mut updated = objects.items.get(&key).cloned().ok_or_else(|| ApiError::not_found(resource, name))?;
        if let Some(asked) = patch["metadata"]["resourceVersion"].as_str()
            && Some(asked) != updated["metadata"]["resourceVersion"].as_str()
        {
            return Err(ApiError::new(409, "Conflict", format!("{resource} \"{name}\": the object has been modified")));
        }
        let mut metadata_only = json!({"metadata": patch["metadata"].clone()});
        if let Some(map) = metadata_only["metadata"].as_object_mut() {
            map.remove("resourceVersion");
            map.remove("name");
            map.remove("namespace");
            map.remove("uid");
        }
        merge(&mut updated, &metadata_only);
        check_labels(&updated)?;
        objects.revision += 1;
        updated["metadata"]["resourceVersion"] = json!(objects.revision.to_string());
        objects.items.insert(key, updated.clone());
        Ok(updated)
    }

    fn pvc_in_use(&self, objects: &Objects, namespace: &str, claim: &str) -> bool {
        objects.items.iter().any(|((kind, ns, _), pod)| {
            kind == PODS && ns == namespace && claims_of(pod).iter().any(|(_, name)| name == claim)
        })
    }

    /// DELETE: a Pod goes at once (its containers are killed); a PVC still used by a Pod
    /// stays `Terminating` until that Pod is gone.
    pub async fn delete(&self, resource: &str, namespace: &str, name: &str) -> ApiResult<Value> {
        let key = (resource.to_owned(), namespace.to_owned(), name.to_owned());
        let removed = {
            let mut objects = self.objects();
            let mut current = objects.items.get(&key).cloned().ok_or_else(|| ApiError::not_found(resource, name))?;
            objects.revision += 1;
            let revision = objects.revision.to_string();
            if resource == PVCS && self.pvc_in_use(&objects, namespace, name) {
                current["metadata"]["deletionTimestamp"] = json!(now());
                current["metadata"]["finalizers"] = json!(["kubernetes.io/pvc-protection"]);
                current["metadata"]["resourceVersion"] = json!(revision);
                objects.items.insert(key, current.clone());
                return Ok(current);
            }
            objects.items.remove(&key);
            current["metadata"]["deletionTimestamp"] = json!(now());
            current["metadata"]["resourceVersion"] = json!(revision);
            current
        };
        if resource == PVCS {
            let _ = std::fs::remove_dir_all(self.pvc_dir(namespace, name));
        } else {
            self.stop_pod(&removed).await;
            self.release_claims(namespace);
        }
        Ok(removed)
    }

    /// PVCs marked for deletion that no Pod uses any more go now.
    fn release_claims(&self, namespace: &str) {
        let released: Vec<String> = {
            let mut objects = self.objects();
            let terminating: Vec<String> = objects
                .items
                .iter()
                .filter(|((kind, ns, _), pvc)| {
                    kind == PVCS && ns == namespace && pvc["metadata"]["deletionTimestamp"].is_string()
                })
                .map(|((_, _, name), _)| name.clone())
                .collect();
            let free: Vec<String> =
                terminating.into_iter().filter(|name| !self.pvc_in_use(&objects, namespace, name)).collect();
            for name in &free {
                objects.items.remove(&(PVCS.to_owned(), namespace.to_owned(), name.clone()));
            }
            if !free.is_empty() {
                objects.revision += 1;
            }
            free
        };
        for name in released {
            let _ = std::fs::remove_dir_all(self.pvc_dir(namespace, &name));
        }
    }

    async fn stop_pod(&self, pod: &Value) {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        let containers = self.containers.lock().await.remove(&uid).unwrap_or_default();
        for container in containers {
            container.stop().await;
        }
        let _ = std::fs::remove_dir_all(self.pod_dir(&uid));
    }

    /// Starts a created Pod's containers and records its status (`Running` and ready, or
    /// `Pending` with the reason when a claim is missing or a container failed to start).
    pub async fn start_pod(&self, namespace: &str, name: &str) {
        let Ok(pod) = self.get(PODS, namespace, name) else { return };
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        let result = self.start_containers(namespace, &pod).await;
        let mut objects = self.objects();
        let key = (PODS.to_owned(), namespace.to_owned(), name.to_owned());
        // Deleted (or replaced by a new Pod of the same name) meanwhile: nothing to record.
        let Some(current) = objects.items.get(&key).cloned() else { return };
        if current["metadata"]["uid"].as_str() != Some(uid.as_str()) {
            return;
        }
        objects.revision += 1;
        let mut updated = current;
        updated["metadata"]["resourceVersion"] = json!(objects.revision.to_string());
        let started = now();
        updated["status"] = match result {
            Ok(()) => {
                let statuses: Vec<Value> = containers_of(&pod)
                    .iter()
                    .map(|container| {
                        json!({
                            "name": container["name"], "image": container["image"], "imageID": "",
                            "ready": true, "started": true, "restartCount": 0,
                            "state": {"running": {"startedAt": started}},
                        })
                    })
                    .collect();
                json!({
                    "phase": "Running", "podIP": "127.0.0.1", "startTime": started,
                    "conditions": [
                        {"type": "Initialized", "status": "True"},
                        {"type": "ContainersReady", "status": "True"},
                        {"type": "Ready", "status": "True"},
                        {"type": "PodScheduled", "status": "True"},
                    ],
                    "containerStatuses": statuses,
                })
            }
            Err(message) => json!({
                "phase": "Pending",
                "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
            }),
        };
        objects.items.insert(key, updated);
    }

    async fn start_containers(&self, namespace: &str, pod: &Value) -> Result<(), String> {
        let uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        let name = pod["metadata"]["name"].as_str().unwrap_or_default().to_owned();
        let pod_dir = self.pod_dir(&uid);
        // Volumes: a claim's directory, or an emptyDir of the Pod's own.
        let mut volumes = BTreeMap::new();
        for volume in pod["spec"]["volumes"].as_array().cloned().unwrap_or_default() {
            let volume_name = volume["name"].as_str().unwrap_or_default().to_owned();
            if let Some(claim) = volume["persistentVolumeClaim"]["claimName"].as_str() {
                let pvc = self
                    .get(PVCS, namespace, claim)
                    .map_err(|_| format!("persistentvolumeclaim \"{claim}\" not found"))?;
                if pvc["metadata"]["deletionTimestamp"].is_string() {
                    return Err(format!("persistentvolumeclaim \"{claim}\" is being deleted"));
                }
                volumes.insert(volume_name, self.pvc_dir(namespace, claim));
            } else if volume.get("emptyDir").is_some() {
                let dir = pod_dir.join("empty").join(&volume_name);
                std::fs::create_dir_all(&dir).map_err(|error| format!("emptyDir {volume_name}: {error}"))?;
                volumes.insert(volume_name, dir);
            } else {
                return Err(format!("volume {volume_name}: only persistentVolumeClaim and emptyDir are emulated"));
            }
        }
        let pod_security = &pod["spec"]["securityContext"];
        let mut started = Vec::new();
        for container in containers_of(pod) {
            let security = &container["securityContext"];
            let id_of = |field: &str| security[field].as_u64().or_else(|| pod_security[field].as_u64());
            let run_as_user = id_of("runAsUser").unwrap_or(0) as u32;
            let run_as_group = id_of("runAsGroup").unwrap_or(u64::from(run_as_user)) as u32;
            let non_root = security["runAsNonRoot"].as_bool().or_else(|| pod_security["runAsNonRoot"].as_bool());
            if non_root == Some(true) && run_as_user == 0 {
                return Err(format!(
                    "container {}: container has runAsNonRoot and image will run as root",
                    container["name"]
                ));
            }
            let mut mounts = Vec::new();
            for mount in container["volumeMounts"].as_array().cloned().unwrap_or_default() {
                let volume_name = mount["name"].as_str().unwrap_or_default();
                let host = volumes.get(volume_name).ok_or_else(|| format!("volume {volume_name} not found"))?;
                let host = match mount["subPath"].as_str().filter(|sub| !sub.is_empty()) {
                    Some(sub) if !sub.split('/').any(|part| part == "..") => {
                        let dir = host.join(sub);
                        std::fs::create_dir_all(&dir).map_err(|error| format!("subPath {sub}: {error}"))?;
                        dir
                    }
                    Some(sub) => return Err(format!("subPath {sub:?} escapes its volume")),
                    None => host.clone(),
                };
                mounts.push(Mount {
                    host,
                    inside: mount["mountPath"].as_str().unwrap_or("/mnt").to_owned(),
                    read_only: mount["readOnly"].as_bool().unwrap_or(false),
                });
            }
            let env = container["env"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .iter()
                .filter_map(|pair| Some((pair["name"].as_str()?.to_owned(), pair["value"].as_str()?.to_owned())))
                .collect();
            let spec = ContainerSpec {
                name: container["name"].as_str().unwrap_or_default().to_owned(),
                hostname: name.chars().take(63).collect(),
                uid: run_as_user,
                gid: run_as_group,
                read_only_root: security["readOnlyRootFilesystem"].as_bool().unwrap_or(false),
                mounts,
                env,
                working_dir: container["workingDir"].as_str().map(str::to_owned),
            };
            let container = Container::start(spec).await.map_err(|error| format!("{error:#}"))?;
            started.push(std::sync::Arc::new(container));
        }
        self.containers.lock().await.insert(uid, started);
        Ok(())
    }

    /// A running container of a Pod (the first when `container` is `None`).
    pub async fn container(
        &self,
        namespace: &str,
        pod: &str,
        container: Option<&str>,
    ) -> ApiResult<std::sync::Arc<Container>> {
        let object = self.get(PODS, namespace, pod)?;
        let uid = object["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        let containers = self.containers.lock().await;
        let Some(running) = containers.get(&uid) else {
            return Err(ApiError::bad_request(format!("pod {pod} is not running")));
        };
        let found = match container {
            Some(name) => running.iter().find(|candidate| candidate.spec.name == name),
            None => running.first(),
        };
        found.cloned().ok_or_else(|| {
            ApiError::bad_request(format!("container {} is not valid for pod {pod}", container.unwrap_or("")))
        })
    }

    /// Stops every Pod's containers (the emulator is going away).
    pub async fn shutdown(&self) {
        let all: Vec<_> = self.containers.lock().await.drain().collect();
        for (_, containers) in all {
            for container in containers {
                container.stop().await;
            }
        }
    }
}

fn containers_of(pod: &Value) -> Vec<Value> {
    pod["spec"]["containers"].as_array().cloned().unwrap_or_default()
}

/// (volume name, claim name) of every claim a Pod mounts.
fn claims_of(pod: &Value) -> Vec<(String, String)> {
    pod["spec"]["volumes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|volume| {
            Some((
                volume["name"].as_str()?.to_owned(),
                volume["persistentVolumeClaim"]["claimName"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// JSON merge patch (RFC 7386).
pub fn merge(target: &mut Value, patch: &Value) {
    let Some(patch_map) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    let target_map = target.as_object_mut().expect("made an object above");
    for (key, value) in patch_map {
        if value.is_null() {
            target_map.remove(key);
        } else {
            merge(target_map.entry(key.clone()).or_insert(Value::Null), value);
        }
    }
}
