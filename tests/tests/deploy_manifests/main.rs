//! The deployment files under `deploy/` are checked without a cluster:
//!
//! - `deploy/kubernetes/make-secrets.sh` runs (openssl) for two nodes, and its
//!   `secrets.yaml` and `nodes.yaml` are checked together with the static manifests;
//! - every Kubernetes manifest document parses into its typed `k8s-openapi` structure, and
//!   a field the type does not know fails (the typed value is serialized back and every
//!   field of the document must survive the round trip: k8s-openapi itself ignores unknown
//!   fields, so a typo like `readinesProbe` would otherwise pass silently);
//! - the documents agree with each other: Service selectors select a workload's pods and
//!   their target ports exist, probes name container ports, volume mounts name volumes,
//!   Secrets / ServiceAccounts / Roles referred to exist and hold the keys mounted from them
//!   (a StatefulSet's `subPathExpr: $(POD_NAME)…` for every pod it runs), `$(VAR)`
//!   references are defined;
//! - the Kubernetes deployment runs TLS everywhere: every Berth and etcd URL is https, no
//!   insecure switch is set, each certificate names the host its clients dial, each node agent
//!   mounts only its own Secret;
//! - every `BERTH_*` variable in the manifests and the compose file is one the `berth` CLI
//!   reads. (The example `--config` files under `deploy/` are loaded with the CLI's own
//!   loader by `cli/tests/config_file.rs`.)

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Container, Namespace, PodTemplateSpec, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every typed object of the manifests.
#[derive(Default)]
struct Manifests {
    namespaces: Vec<Namespace>,
    secrets: Vec<Secret>,
    service_accounts: Vec<ServiceAccount>,
    roles: Vec<Role>,
    role_bindings: Vec<RoleBinding>,
    services: Vec<Service>,
    deployments: Vec<Deployment>,
    stateful_sets: Vec<StatefulSet>,
    daemon_sets: Vec<DaemonSet>,
    jobs: Vec<Job>,
    disruption_budgets: Vec<PodDisruptionBudget>,
}

/// Parses `value` as `T` and fails on any field the round trip loses.
fn typed<T: DeserializeOwned + serde::Serialize>(origin: &str, value: &Value) -> Result<T, String> {
    let parsed: T = serde_json::from_value(value.clone()).map_err(|error| format!("{origin}: {error}"))?;
    let back = serde_json::to_value(&parsed).map_err(|error| format!("{origin}: {error}"))?;
    let mut lost = Vec::new();
    lost_fields(value, &back, String::new(), &mut lost);
    if !lost.is_empty() {
        return Err(format!("{origin}: unknown or mistyped fields: {}", lost.join(", ")));
    }
    Ok(parsed)
}

/// Paths of `original` that `round_trip` does not hold with the same value.
fn lost_fields(original: &Value, round_trip: &Value, path: String, lost: &mut Vec<String>) {
    match (original, round_trip) {
        (Value::Object(fields), Value::Object(kept)) => {
            for (name, value) in fields {
                let field = format!("{path}.{name}");
                match kept.get(name) {
                    Some(kept_value) => lost_fields(value, kept_value, field, lost),
                    // An explicit null is the same as an absent field.
                    None if value.is_null() => {}
                    None => lost.push(field),
                }
            }
        }
        (Value::Array(items), Value::Array(kept)) if items.len() == kept.len() => {
            for (index, (item, kept_item)) in items.iter().zip(kept).enumerate() {
                lost_fields(item, kept_item, format!("{path}[{index}]"), lost);
            }
        }
        (left, right) if left == right => {}
        (left, right) => lost.push(format!("{path} ({left} became {right})")),
    }
}

/// Parses every document of `text` into `manifests`.
fn parse_into(manifests: &mut Manifests, file: &str, text: &str) -> Result<usize, String> {
    let mut count = 0;
    for (index, document) in serde_yaml::Deserializer::from_str(text).enumerate() {
        let value = Value::deserialize(document).map_err(|error| format!("{file} document {index}: {error}"))?;
        if value.is_null() {
            continue;
        }
        let api_version = value["apiVersion"].as_str().unwrap_or_default().to_owned();
        let kind = value["kind"].as_str().unwrap_or_default().to_owned();
        let origin = format!("{file} document {index} ({api_version} {kind})");
        match (api_version.as_str(), kind.as_str()) {
            ("v1", "Namespace") => manifests.namespaces.push(typed(&origin, &value)?),
            ("v1", "Secret") => manifests.secrets.push(typed(&origin, &value)?),
            ("v1", "ServiceAccount") => manifests.service_accounts.push(typed(&origin, &value)?),
            ("v1", "Service") => manifests.services.push(typed(&origin, &value)?),
            ("rbac.authorization.k8s.io/v1", "Role") => manifests.roles.push(typed(&origin, &value)?),
            ("rbac.authorization.k8s.io/v1", "RoleBinding") => manifests.role_bindings.push(typed(&origin, &value)?),
            ("apps/v1", "Deployment") => manifests.deployments.push(typed(&origin, &value)?),
            ("apps/v1", "StatefulSet") => manifests.stateful_sets.push(typed(&origin, &value)?),
            ("apps/v1", "DaemonSet") => manifests.daemon_sets.push(typed(&origin, &value)?),
            ("batch/v1", "Job") => manifests.jobs.push(typed(&origin, &value)?),
            ("policy/v1", "PodDisruptionBudget") => manifests.disruption_budgets.push(typed(&origin, &value)?),
            _ => return Err(format!("{origin}: a kind this test does not know; add it here")),
        }
        count += 1;
    }
    Ok(count)
}

/// The Kubernetes nodes [`load_manifests`] renders node agents for: one plain name and one
/// with dots (a Service name cannot hold them).
const NODES: [&str; 2] = ["worker-1", "ip-10-0-0-7.ec2.internal"];

/// What `deploy/kubernetes/make-secrets.sh` wrote for [`NODES`] (a temporary folder).
struct Generated {
    dir: tempfile::TempDir,
}

impl Generated {
    fn make() -> Self {
        let dir = tempfile::Builder::new().prefix("berth-k8s-secrets-").tempdir().expect("tempdir");
        let script = repo_root().join("deploy/kubernetes/make-secrets.sh");
        let output = std::process::Command::new("bash")
            .arg(&script)
            .arg(dir.path().join("out"))
            .args(NODES)
            .output()
            .expect("run make-secrets.sh");
        assert!(output.status.success(), "make-secrets.sh: {}", String::from_utf8_lossy(&output.stderr));
        Generated { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join("out").join(name)
    }
}

/// The static manifests of `deploy/kubernetes` and what make-secrets.sh generated.
fn load_manifests() -> (Manifests, Generated) {
    let dir = repo_root().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("deploy/kubernetes")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml" || ext == "yml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no manifests in {}", dir.display());
    let generated = Generated::make();
    files.push(generated.path("secrets.yaml"));
    files.push(generated.path("nodes.yaml"));
    let mut manifests = Manifests::default();
    for path in files {
        let name = path.file_name().expect("name").to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).expect("read manifest");
        let count = parse_into(&mut manifests, &name, &text).unwrap_or_else(|error| panic!("{error}"));
        assert!(count > 0, "{name} holds no document");
    }
    (manifests, generated)
}

/// A workload's name, pod template and its labels, and the volume claim templates.
struct Workload<'a> {
    name: String,
    /// The names its pods have where they are fixed (a StatefulSet's `<name>-<ordinal>`),
    /// for expanding `$(POD_NAME)` in `subPathExpr`.
    pod_names: Vec<String>,
    template: &'a PodTemplateSpec,
    selector: BTreeMap<String, String>,
    claims: Vec<String>,
}

impl Manifests {
    fn workloads(&self) -> Vec<Workload<'_>> {
        let mut all = Vec::new();
        for deployment in &self.deployments {
            let spec = &deployment.spec;
            all.push(Workload {
                name: format!("Deployment/{}", deployment.metadata.name.clone().unwrap_or_default()),
                pod_names: Vec::new(),
                template: &spec.template,
                selector: spec.selector.match_labels.clone().unwrap_or_default(),
                claims: Vec::new(),
            });
        }
        for set in &self.stateful_sets {
            let spec = &set.spec;
            let set_name = set.metadata.name.clone().unwrap_or_default();
            all.push(Workload {
                name: format!("StatefulSet/{set_name}"),
                pod_names: (0..spec.replicas.unwrap_or(1)).map(|ordinal| format!("{set_name}-{ordinal}")).collect(),
                template: &spec.template,
                selector: spec.selector.match_labels.clone().unwrap_or_default(),
                claims: spec
                    .volume_claim_templates
                    .iter()
                    .flatten()
                    .filter_map(|claim| claim.metadata.name.clone())
                    .collect(),
            });
        }
        for set in &self.daemon_sets {
            let spec = &set.spec;
            all.push(Workload {
                name: format!("DaemonSet/{}", set.metadata.name.clone().unwrap_or_default()),
                pod_names: Vec::new(),
                template: &spec.template,
                selector: spec.selector.match_labels.clone().unwrap_or_default(),
                claims: Vec::new(),
            });
        }
        for job in &self.jobs {
            let spec = job.spec.as_ref().expect("job spec");
            all.push(Workload {
                name: format!("Job/{}", job.metadata.name.clone().unwrap_or_default()),
                pod_names: Vec::new(),
                template: &spec.template,
                // A Job's pods carry the labels of its template; there is no selector to write.
                selector: pod_labels(&spec.template),
                claims: Vec::new(),
            });
        }
        all
    }
}

fn pod_labels(template: &PodTemplateSpec) -> BTreeMap<String, String> {
    template.metadata.as_ref().and_then(|metadata| metadata.labels.clone()).unwrap_or_default()
}

fn selects(selector: &BTreeMap<String, String>, labels: &BTreeMap<String, String>) -> bool {
    !selector.is_empty() && selector.iter().all(|(key, value)| labels.get(key) == Some(value))
}

fn containers(template: &PodTemplateSpec) -> &[Container] {
    template.spec.as_ref().map(|spec| spec.containers.as_slice()).unwrap_or_default()
}

/// Containers and init containers.
fn all_containers(template: &PodTemplateSpec) -> Vec<&Container> {
    let spec = template.spec.as_ref();
    spec.map(|spec| spec.containers.iter().chain(spec.init_containers.iter().flatten()).collect()).unwrap_or_default()
}

/// Whether a probe runs `berth … health` (the TLS health check) in the container.
fn probes_berth_health(probe: &k8s_openapi::api::core::v1::Probe) -> bool {
    let command = probe.exec.as_ref().and_then(|exec| exec.command.clone()).unwrap_or_default();
    command.first().map(String::as_str) == Some("berth") && command.iter().any(|word| word == "health")
}

/// The value of env variable `name` of `container`, as written.
fn env_value<'a>(container: &'a Container, name: &str) -> Option<&'a str> {
    container.env.iter().flatten().find(|variable| variable.name == name).and_then(|variable| variable.value.as_deref())
}

/// Whether `port` (a number or a name) is a port of `container`.
fn has_port(container: &Container, port: &IntOrString) -> bool {
    container.ports.iter().flatten().any(|declared| match port {
        IntOrString::Int(number) => declared.container_port == *number,
        IntOrString::String(name) => declared.name.as_deref() == Some(name.as_str()),
    })
}

#[test]
fn every_manifest_parses_into_typed_kubernetes_objects() {
    let (manifests, _generated) = load_manifests();
    assert_eq!(manifests.deployments.len(), NODES.len(), "one node agent Deployment per node");
    assert!(manifests.daemon_sets.is_empty(), "a DaemonSet's pods would share one Secret");
    let sets: BTreeSet<String> = manifests.stateful_sets.iter().filter_map(|set| set.metadata.name.clone()).collect();
    assert_eq!(sets, ["etcd".to_owned(), "replica".to_owned()].into(), "etcd and the replicas are StatefulSets");
    assert_eq!(manifests.jobs.len(), 1, "etcd-init");
    assert!(
        !manifests.roles.is_empty() && !manifests.role_bindings.is_empty() && !manifests.service_accounts.is_empty()
    );
    assert!(!manifests.secrets.is_empty());
}

#[test]
fn a_misspelled_field_fails_the_parse() {
    let mut manifests = Manifests::default();
    let good =
        "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\nspec:\n  selector: {app: a}\n  ports: [{port: 1}]\n";
    parse_into(&mut manifests, "good", good).expect("a correct Service parses");
    let typo = good.replace("selector:", "selektor:");
    let error = parse_into(&mut manifests, "typo", &typo).expect_err("a misspelled field fails");
    assert!(error.contains(".spec.selektor"), "{error}");
    let mistyped = good.replace("port: 1", "port: one");
    assert!(parse_into(&mut manifests, "mistyped", &mistyped).is_err(), "a string port fails");
    let unknown_kind = "apiVersion: v1\nkind: Servic\nmetadata:\n  name: s\n";
    assert!(parse_into(&mut manifests, "kind", unknown_kind).is_err());
}

#[test]
fn manifests_refer_only_to_what_exists() {
    let (manifests, _generated) = load_manifests();
    let workloads = manifests.workloads();
    let mut problems = Vec::new();

    // Everything but the Namespace lives in the namespace the manifests create.
    let namespaces: BTreeSet<String> =
        manifests.namespaces.iter().filter_map(|namespace| namespace.metadata.name.clone()).collect();
    let mut namespaced = Vec::new();
    namespaced.extend(manifests.secrets.iter().map(|item| ("Secret", &item.metadata)));
    namespaced.extend(manifests.service_accounts.iter().map(|item| ("ServiceAccount", &item.metadata)));
    namespaced.extend(manifests.roles.iter().map(|item| ("Role", &item.metadata)));
    namespaced.extend(manifests.role_bindings.iter().map(|item| ("RoleBinding", &item.metadata)));
    namespaced.extend(manifests.services.iter().map(|item| ("Service", &item.metadata)));
    namespaced.extend(manifests.deployments.iter().map(|item| ("Deployment", &item.metadata)));
    namespaced.extend(manifests.stateful_sets.iter().map(|item| ("StatefulSet", &item.metadata)));
    namespaced.extend(manifests.daemon_sets.iter().map(|item| ("DaemonSet", &item.metadata)));
    namespaced.extend(manifests.jobs.iter().map(|item| ("Job", &item.metadata)));
    namespaced.extend(manifests.disruption_budgets.iter().map(|item| ("PodDisruptionBudget", &item.metadata)));
    for (kind, metadata) in &namespaced {
        if !metadata.namespace.as_ref().is_some_and(|namespace| namespaces.contains(namespace)) {
            problems.push(format!("{kind}/{:?} is not in a namespace of the manifests", metadata.name));
        }
    }

    // Workloads: the selector selects the template; probes and mounts name what exists;
    // secrets and service accounts exist; $(VAR) references are defined before use.
    let secrets: BTreeMap<String, BTreeSet<String>> = manifests
        .secrets
        .iter()
        .map(|secret| {
            let mut keys: BTreeSet<String> = secret.string_data.iter().flatten().map(|(key, _)| key.clone()).collect();
            keys.extend(secret.data.iter().flatten().map(|(key, _)| key.clone()));
            (secret.metadata.name.clone().unwrap_or_default(), keys)
        })
        .collect();
    let accounts: BTreeSet<String> =
        manifests.service_accounts.iter().filter_map(|account| account.metadata.name.clone()).collect();
    for workload in &workloads {
        let name = &workload.name;
        if !selects(&workload.selector, &pod_labels(workload.template)) {
            problems.push(format!("{name}: selector {:?} does not select its own pods", workload.selector));
        }
        let spec = workload.template.spec.as_ref().expect("pod spec");
        if let Some(account) = &spec.service_account_name
            && !accounts.contains(account)
        {
            problems.push(format!("{name}: service account {account} does not exist"));
        }
        let mut volumes: BTreeSet<String> = workload.claims.iter().cloned().collect();
        // Volume name -> the keys of the Secret it shows.
        let mut secret_volumes: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for volume in spec.volumes.iter().flatten() {
            volumes.insert(volume.name.clone());
            if let Some(secret) = &volume.secret
                && let Some(keys) = secrets.get(secret.secret_name.as_deref().unwrap_or_default())
            {
                secret_volumes.insert(volume.name.clone(), keys.clone());
            }
            if let Some(secret) = &volume.secret {
                let secret_name = secret.secret_name.clone().unwrap_or_default();
                match secrets.get(&secret_name) {
                    None => problems.push(format!("{name}: volume {} uses missing Secret {secret_name}", volume.name)),
                    Some(keys) => {
                        for item in secret.items.iter().flatten() {
                            if !keys.contains(&item.key) {
                                problems.push(format!("{name}: Secret {secret_name} has no key {}", item.key));
                            }
                        }
                    }
                }
            }
        }
        for container in all_containers(workload.template) {
            let where_ = format!("{name} container {}", container.name);
            for mount in container.volume_mounts.iter().flatten() {
                if !volumes.contains(&mount.name) {
                    problems.push(format!("{where_}: mounts unknown volume {}", mount.name));
                }
                // A key mounted from a Secret exists in it, for every pod of a StatefulSet.
                let Some(keys) = secret_volumes.get(&mount.name) else { continue };
                let mut wanted = Vec::new();
                if let Some(path) = &mount.sub_path {
                    wanted.push(path.clone());
                }
                if let Some(expression) = &mount.sub_path_expr {
                    if workload.pod_names.is_empty() {
                        problems.push(format!("{where_}: subPathExpr {expression} outside a StatefulSet"));
                    }
                    for pod in &workload.pod_names {
                        wanted.push(expression.replace("$(POD_NAME)", pod));
                    }
                    for reference in references(expression) {
                        if !container.env.iter().flatten().any(|variable| variable.name == reference) {
                            problems.push(format!("{where_}: subPathExpr uses undefined $({reference})"));
                        }
                    }
                }
                for key in wanted {
                    if !keys.contains(&key) {
                        problems.push(format!("{where_}: mounts key {key} that its Secret does not hold"));
                    }
                }
            }
            if spec.init_containers.iter().flatten().any(|init| init.name == container.name) {
                continue;
            }
            let probes = [("readiness", &container.readiness_probe), ("liveness", &container.liveness_probe)];
            for (which, probe) in probes {
                if name.starts_with("Job/") {
                    break;
                }
                let Some(probe) = probe else {
                    problems.push(format!("{where_}: no {which} probe"));
                    continue;
                };
                if probe.exec.is_some() {
                    continue;
                }
                let port = if let Some(grpc) = &probe.grpc {
                    IntOrString::Int(grpc.port)
                } else if let Some(http) = &probe.http_get {
                    http.port.clone()
                } else if let Some(tcp) = &probe.tcp_socket {
                    tcp.port.clone()
                } else {
                    problems.push(format!("{where_}: {which} probe has no port"));
                    continue;
                };
                if !has_port(container, &port) {
                    problems.push(format!("{where_}: {which} probe port {port:?} is not a container port"));
                }
            }
            let image = container.image.clone().unwrap_or_default();
            if image.starts_with("berth/") && container.image_pull_policy.as_deref() != Some("IfNotPresent") {
                problems.push(format!("{where_}: locally built image {image} needs imagePullPolicy IfNotPresent"));
            }
            // Replicas answer `berth health` over TLS; node agents accept only replicas' client
            // certificates, so their probes see the port accept.
            if image.starts_with("berth/berth") {
                let node_agent = container.command.iter().flatten().any(|word| word == "node-agent");
                let probed = |probe: &Option<k8s_openapi::api::core::v1::Probe>| {
                    probe.as_ref().is_some_and(|probe| {
                        if node_agent { probe.tcp_socket.is_some() } else { probes_berth_health(probe) }
                    })
                };
                if !probed(&container.readiness_probe) || !probed(&container.liveness_probe) {
                    problems.push(format!("{where_}: probed neither by `berth health` nor (node agents) TCP"));
                }
            }
            // $(VAR) in env values, command and args must name an env var defined earlier.
            let mut defined = BTreeSet::new();
            for variable in container.env.iter().flatten() {
                for reference in references(variable.value.as_deref().unwrap_or_default()) {
                    if !defined.contains(&reference) {
                        problems.push(format!("{where_}: {} uses $({reference}) before it is defined", variable.name));
                    }
                }
                defined.insert(variable.name.clone());
            }
            for word in container.command.iter().flatten().chain(container.args.iter().flatten()) {
                for reference in references(word) {
                    if !defined.contains(&reference) {
                        problems.push(format!("{where_}: `{word}` uses undefined $({reference})"));
                    }
                }
            }
        }
    }

    // Services select some workload's pods, and their target ports exist there.
    for service in &manifests.services {
        let service_name = service.metadata.name.clone().unwrap_or_default();
        let spec = service.spec.as_ref().expect("service spec");
        let selector = spec.selector.clone().unwrap_or_default();
        let selected: Vec<&Workload> =
            workloads.iter().filter(|workload| selects(&selector, &pod_labels(workload.template))).collect();
        if selected.is_empty() {
            problems.push(format!("Service {service_name}: selector {selector:?} selects no workload"));
        }
        for port in spec.ports.iter().flatten() {
            let target = port.target_port.clone().unwrap_or(IntOrString::Int(port.port));
            for workload in &selected {
                if !containers(workload.template).iter().any(|container| has_port(container, &target)) {
                    problems.push(format!(
                        "Service {service_name}: target port {target:?} is not a port of {}",
                        workload.name
                    ));
                }
            }
        }
    }
    for set in &manifests.stateful_sets {
        let service_name = set.spec.service_name.clone().unwrap_or_default();
        let headless = manifests.services.iter().any(|service| {
            service.metadata.name.as_deref() == Some(service_name.as_str())
                && service.spec.as_ref().and_then(|spec| spec.cluster_ip.as_deref()) == Some("None")
        });
        if !headless {
            problems.push(format!(
                "StatefulSet {:?}: serviceName {service_name} is not a headless Service",
                set.metadata.name
            ));
        }
    }
    for budget in &manifests.disruption_budgets {
        let selector = budget
            .spec
            .as_ref()
            .and_then(|spec| spec.selector.as_ref())
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default();
        if !workloads.iter().any(|workload| selects(&selector, &pod_labels(workload.template))) {
            problems.push(format!("PodDisruptionBudget {:?} selects no workload", budget.metadata.name));
        }
    }

    // RBAC: bindings name existing roles and service accounts.
    let roles: BTreeSet<String> = manifests.roles.iter().filter_map(|role| role.metadata.name.clone()).collect();
    for binding in &manifests.role_bindings {
        let binding_name = binding.metadata.name.clone().unwrap_or_default();
        if binding.role_ref.kind != "Role" || !roles.contains(&binding.role_ref.name) {
            problems.push(format!("RoleBinding {binding_name}: role {} does not exist", binding.role_ref.name));
        }
        for subject in binding.subjects.iter().flatten() {
            if subject.kind == "ServiceAccount" && !accounts.contains(&subject.name) {
                problems.push(format!("RoleBinding {binding_name}: service account {} does not exist", subject.name));
            }
        }
    }

    assert!(problems.is_empty(), "deploy/kubernetes has broken references:\n{}", problems.join("\n"));
}

/// The names inside `$(…)` in `text` (Kubernetes' own expansion; `$$` is its escape for a
/// literal `$`, which shell scripts in `command:` use for `$$(…)`).
fn references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find('$') {
        let after = &rest[start + 1..];
        if let Some(escaped) = after.strip_prefix('$') {
            rest = escaped;
            continue;
        }
        let Some(after) = after.strip_prefix('(') else {
            rest = after;
            continue;
        };
        let Some(end) = after.find(')') else { break };
        found.push(after[..end].to_owned());
        rest = &after[end + 1..];
    }
    found
}

/// The `BERTH_*` variables the CLI's server commands read (`env = "BERTH_…"` in clap):
/// their own flags and the shared telemetry flags.
fn cli_variables() -> BTreeSet<String> {
    let dir = repo_root().join("cli/src/commands/server");
    let mut files: Vec<_> =
        std::fs::read_dir(&dir).expect("cli/src/commands/server").map(|entry| entry.expect("entry").path()).collect();
    files.push(repo_root().join("cli/src/telemetry.rs"));
    let mut known = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).expect("read");
        let mut rest = text.as_str();
        while let Some(start) = rest.find("env = \"") {
            let after = &rest[start + 7..];
            let end = after.find('"').expect("closing quote");
            known.insert(after[..end].to_owned());
            rest = &after[end..];
        }
    }
    assert!(
        ["BERTH_ETCD", "BERTH_NODE_CREDENTIAL_FILE", "BERTH_METRICS_LISTEN"].iter().all(|name| known.contains(*name)),
        "{known:?}"
    );
    known
}

/// Words of the form `BERTH_[A-Z_]+` followed by `=` or `:` (assignments and YAML keys) or
/// an env `name: ` entry.
fn berth_variables(text: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    for line in text.lines() {
        let line = line.trim_start().trim_start_matches("- ").trim_start_matches("name: ");
        if !line.starts_with("BERTH_") {
            continue;
        }
        let name: String =
            line.chars().take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_').collect();
        found.insert(name);
    }
    found
}

#[test]
fn every_berth_variable_in_deploy_is_one_the_cli_reads() {
    let known = cli_variables();
    // Variables the deploy files define for their own use, not for berth.
    let own: BTreeSet<&str> = [
        "BERTH_SECRETS_DIR",
        "BERTH_IMAGE",
        "BERTH_NODE_PUBLISH",
        "BERTH_PUBLISH_R1",
        "BERTH_PUBLISH_R2",
        "BERTH_PUBLISH_R3",
        "BERTH_NODE_LEASE_TTL",
        "BERTH_REPLICA_LEASE_TTL",
        "BERTH_HEARTBEAT_INTERVAL",
        "BERTH_BIND_TIMEOUT",
    ]
    .into();
    let files = [
        "deploy/kubernetes/40-control-plane.yaml",
        "deploy/kubernetes/node-agent.yaml.tmpl",
        "deploy/compose/docker-compose.yml",
    ];
    let mut unknown = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(repo_root().join(file)).unwrap_or_else(|error| panic!("{file}: {error}"));
        let used = berth_variables(&text);
        assert!(!used.is_empty(), "{file} sets no BERTH_ variable");
        for name in used {
            if !known.contains(&name) && !own.contains(name.as_str()) {
                unknown.push(format!("{file}: {name}"));
            }
        }
    }
    assert!(unknown.is_empty(), "variables berth does not read: {unknown:?}");
}

#[test]
fn the_compose_file_runs_tls_everywhere_and_each_node_mounts_only_its_own_credentials() {
    let text = std::fs::read_to_string(repo_root().join("deploy/compose/docker-compose.yml")).expect("compose file");
    let mut compose: serde_yaml::Value = serde_yaml::from_str(&text).expect("compose YAML");
    // The services share their settings through YAML merge keys (`<<`).
    compose.apply_merge().expect("merge keys");
    let compose: Value = serde_json::to_value(compose).expect("compose as JSON");
    let services = compose["services"].as_object().expect("services");
    let names: BTreeSet<&str> = services.keys().map(String::as_str).collect();
    let expected: BTreeSet<&str> = [
        "etcd1",
        "etcd2",
        "etcd3",
        "etcd-init",
        "replica1",
        "replica2",
        "replica3",
        "node1",
        "node2",
        "node3",
        "node4",
        "node5",
    ]
    .into();
    assert_eq!(names, expected);
    for (name, service) in services {
        assert_eq!(service["networks"], serde_json::json!(["berth"]), "{name} is on the private network");
        // One folder of make-secrets.sh per service, named after it, read-only.
        let volumes = service["volumes"].as_array().unwrap_or_else(|| panic!("{name} mounts no credentials"));
        let target = if name.starts_with("etcd") { "/etc/etcd" } else { "/etc/berth" };
        let own = format!("${{BERTH_SECRETS_DIR:-./secrets}}/{name}:{target}:ro");
        assert_eq!(volumes, &vec![Value::String(own)], "{name} mounts only its own folder");
        let environment = service["environment"].as_object().cloned().unwrap_or_default();
        for (variable, value) in &environment {
            assert!(
                !variable.starts_with("BERTH_INSECURE") && variable != "BERTH_SHARED_NODE_SECRET_FILE",
                "{name} sets {variable}"
            );
            let value = value.as_str().unwrap_or_default();
            if matches!(
                variable.as_str(),
                "BERTH_ETCD" | "BERTH_CONTROL_PLANE" | "BERTH_ADVERTISE" | "BERTH_NODE_ADVERTISE"
            ) {
                assert!(value.split(',').all(|url| url.starts_with("https://")), "{name}: {variable}={value}");
            }
            if variable.starts_with("ETCD_") && variable.ends_with("_URLS") || variable == "ETCD_INITIAL_CLUSTER" {
                assert!(!value.contains("http://"), "{name}: {variable}={value}");
            }
        }
        if name.starts_with("node") {
            assert_eq!(environment["BERTH_NODE_ID"], Value::String(name.clone()), "{name}'s id is its name");
            assert_eq!(service["hostname"], Value::String(name.clone()));
            assert!(
                environment.contains_key("BERTH_NODE_CREDENTIAL_FILE")
                    && environment.contains_key("BERTH_NODE_TLS_CERT")
            );
        }
        if name.starts_with("replica") {
            for variable in ["BERTH_TLS_CERT", "BERTH_NODE_CREDENTIAL_KEY_FILE", "BERTH_ETCD_CA", "BERTH_ETCD_USER"] {
                assert!(environment.contains_key(variable), "{name} lacks {variable}");
            }
        }
    }
    // node4 and node5 start only on demand.
    for name in ["node4", "node5"] {
        assert_eq!(services[name]["profiles"], serde_json::json!(["scale"]), "{name}");
    }
}

/// The subjectAltName entries of a PEM certificate (`DNS:name`, `IP Address:1.2.3.4`), read
/// by openssl.
fn subject_alt_names(pem: &[u8]) -> BTreeSet<String> {
    use std::io::Write;
    let mut child = std::process::Command::new("openssl")
        .args(["x509", "-noout", "-ext", "subjectAltName"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("openssl");
    child.stdin.take().expect("stdin").write_all(pem).expect("write pem");
    let output = child.wait_with_output().expect("openssl output");
    assert!(output.status.success(), "openssl x509 failed");
    let text = String::from_utf8_lossy(&output.stdout);
    text.lines().skip(1).flat_map(|line| line.split(',')).map(|entry| entry.trim().to_owned()).collect()
}

/// The host of `https://host:port`.
fn https_host(url: &str) -> &str {
    let rest = url.strip_prefix("https://").unwrap_or_else(|| panic!("{url} is not https"));
    rest.split([':', '/']).next().expect("host")
}

#[test]
fn the_kubernetes_deployment_runs_tls_everywhere_and_each_node_mounts_only_its_own_secret() {
    let (manifests, generated) = load_manifests();
    let secret = |name: &str| -> BTreeMap<String, Vec<u8>> {
        let found = manifests.secrets.iter().find(|secret| secret.metadata.name.as_deref() == Some(name));
        let found = found.unwrap_or_else(|| panic!("make-secrets.sh made no Secret {name}"));
        found.data.iter().flatten().map(|(key, value)| (key.clone(), value.0.clone())).collect()
    };

    // Nothing plaintext or shared, in what ships and in what make-secrets.sh renders.
    let mut texts = Vec::new();
    for entry in std::fs::read_dir(repo_root().join("deploy/kubernetes")).expect("deploy/kubernetes") {
        let path = entry.expect("entry").path();
        if path.is_file() && path.extension().is_none_or(|ext| ext != "sh") {
            texts.push((path.display().to_string(), std::fs::read_to_string(&path).expect("read")));
        }
    }
    texts.push(("nodes.yaml".into(), std::fs::read_to_string(generated.path("nodes.yaml")).expect("nodes.yaml")));
    for (file, text) in &texts {
        for banned in ["http://", "INSECURE", "insecure-", "SHARED_NODE_SECRET", "shared-node-secret", "node.secret"] {
            assert!(!text.contains(banned), "{file} holds {banned:?}");
        }
    }

    let workloads = manifests.workloads();
    let secrets_of = |workload: &Workload| -> BTreeSet<String> {
        let spec = workload.template.spec.as_ref().expect("pod spec");
        spec.volumes
            .iter()
            .flatten()
            .filter_map(|volume| volume.secret.as_ref().and_then(|secret| secret.secret_name.clone()))
            .collect()
    };
    let container_of = |workload: &Workload| containers(workload.template)[0].clone();

    // Node agents: one per node, each mounting only its own Secret, which holds exactly its
    // credential, its certificate and the CA; the certificate names the host replicas dial.
    let mut control_plane_hosts = BTreeSet::new();
    let node_workloads: Vec<&Workload> =
        workloads.iter().filter(|workload| pod_labels(workload.template).contains_key("berth.node")).collect();
    assert_eq!(node_workloads.len(), NODES.len());
    for (workload, node) in node_workloads.iter().zip(NODES) {
        let container = container_of(workload);
        assert_eq!(env_value(&container, "BERTH_NODE_ID"), Some(node), "{}", workload.name);
        let own = format!("berth-node-{}", node.replace('.', "-"));
        assert_eq!(secrets_of(workload), [own.clone()].into(), "{} mounts only its own Secret", workload.name);
        let files = secret(&own);
        let keys: BTreeSet<&str> = files.keys().map(String::as_str).collect();
        assert_eq!(keys, ["ca.pem", "node.credential", "tls.key", "tls.pem"].into(), "{own}");
        let credential = String::from_utf8_lossy(&files["node.credential"]).into_owned();
        assert!(credential.starts_with(&format!("berth-node.{node}.")), "{own} holds another node's credential");
        let advertise = env_value(&container, "BERTH_NODE_ADVERTISE").expect("advertise");
        let names = subject_alt_names(&files["tls.pem"]);
        for host in [https_host(advertise), node] {
            assert!(names.contains(&format!("DNS:{host}")), "{own}'s certificate lacks {host}: {names:?}");
        }
        let control_plane = env_value(&container, "BERTH_CONTROL_PLANE").expect("control plane");
        control_plane_hosts.extend(control_plane.split(',').map(|url| https_host(url).to_owned()));
        for variable in ["BERTH_NODE_TLS_CERT", "BERTH_NODE_CLIENT_CA_CERT", "BERTH_CONTROL_PLANE_CA_CERT"] {
            assert!(env_value(&container, variable).is_some(), "{} lacks {variable}", workload.name);
        }
    }

    // Replicas: each pod's certificate names its advertised host, the Service nodes dial and
    // the loopback address its probe dials; they reach etcd over TLS as user berth.
    let replica = workloads.iter().find(|workload| workload.name == "StatefulSet/replica").expect("replicas");
    assert_eq!(secrets_of(replica), ["berth-replicas".to_owned()].into());
    let replica_files = secret("berth-replicas");
    let container = container_of(replica);
    let advertise = env_value(&container, "BERTH_ADVERTISE").expect("advertise");
    for variable in ["BERTH_TLS_CERT", "BERTH_NODE_CREDENTIAL_KEY_FILE", "BERTH_NODE_CLIENT_CERT", "BERTH_ETCD_CERT"] {
        assert!(env_value(&container, variable).is_some(), "replicas lack {variable}");
    }
    assert_eq!(env_value(&container, "BERTH_ETCD_USER"), Some("berth"));
    assert_eq!(replica.pod_names.len(), 3);
    for pod in &replica.pod_names {
        let pem = replica_files.get(&format!("{pod}.pem")).unwrap_or_else(|| panic!("no certificate for {pod}"));
        let names = subject_alt_names(pem);
        let own_host = https_host(advertise).replace("$(POD_NAME)", pod);
        for host in control_plane_hosts.iter().chain([&own_host]) {
            assert!(names.contains(&format!("DNS:{host}")), "{pod}'s certificate lacks {host}: {names:?}");
        }
        assert!(names.contains("IP Address:127.0.0.1"), "{pod}: the probe dials 127.0.0.1");
    }

    // etcd: each member's certificate names the host replicas dial for it.
    let etcd_files = secret("berth-etcd");
    let endpoints = env_value(&container, "BERTH_ETCD").expect("BERTH_ETCD");
    for url in endpoints.split(',') {
        let host = https_host(url);
        let member = host.split('.').next().expect("member");
        let pem = etcd_files.get(&format!("{member}.pem")).unwrap_or_else(|| panic!("no certificate for {member}"));
        assert!(subject_alt_names(pem).contains(&format!("DNS:{host}")), "{member}'s certificate lacks {host}");
    }

    // Who holds what: the replicas' Secret (node credential key, tokens) and etcd's root
    // certificate reach nobody else.
    for workload in &workloads {
        let mounted = secrets_of(workload);
        let allowed: &[&str] = match workload.name.as_str() {
            "StatefulSet/replica" => &["berth-replicas"],
            "StatefulSet/etcd" => &["berth-etcd"],
            "Job/etcd-init" => &["berth-etcd-init"],
            _ => &[],
        };
        for name in mounted {
            assert!(
                allowed.contains(&name.as_str()) || name.starts_with("berth-node-"),
                "{} mounts Secret {name}",
                workload.name
            );
        }
    }
    assert!(!secret("berth-etcd").keys().any(|key| key.starts_with("root")), "etcd members hold etcd's root");
}

mod live;
