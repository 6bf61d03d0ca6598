//! The Kubernetes manifests' own scripts, probes and replica environment run as processes
//! against a real etcd with the certificates make-secrets.sh issued.

use super::*;

/// etcdctl: `$BERTH_ETCDCTL_BIN`, else `/usr/bin/etcdctl` (Debian's etcd-client), else `PATH`.
fn etcdctl_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("BERTH_ETCDCTL_BIN") {
        return PathBuf::from(path);
    }
    let packaged = Path::new("/usr/bin/etcdctl");
    if packaged.exists() { packaged.to_path_buf() } else { PathBuf::from("etcdctl") }
}

/// One pod of a workload as a process on this machine sees it: the files its Secret mounts
/// hold, under `root` at their mount paths, and its command words rewritten to match.
struct PodView<'a> {
    root: PathBuf,
    pod: &'a str,
    /// `(from, to)` replacements applied after the pod-path rebasing (endpoints, ports).
    replace: Vec<(String, String)>,
}

impl<'a> PodView<'a> {
    /// Writes every Secret key `container` of `workload` mounts, for pod `pod`, under `root`.
    fn lay_out(manifests: &Manifests, workload: &Workload, container: &str, pod: &'a str, root: &Path) -> Self {
        let spec = workload.template.spec.as_ref().expect("pod spec");
        let container = all_containers(workload.template)
            .into_iter()
            .find(|candidate| candidate.name == container)
            .unwrap_or_else(|| panic!("{} has no container {container}", workload.name));
        for mount in container.volume_mounts.iter().flatten() {
            let Some(secret) = spec
                .volumes
                .iter()
                .flatten()
                .find(|volume| volume.name == mount.name)
                .and_then(|volume| volume.secret.as_ref())
            else {
                continue;
            };
            let name = secret.secret_name.as_deref().unwrap_or_default();
            let data = manifests
                .secrets
                .iter()
                .find(|secret| secret.metadata.name.as_deref() == Some(name))
                .and_then(|secret| secret.data.clone())
                .unwrap_or_else(|| panic!("no Secret {name}"));
            let target = root.join(mount.mount_path.trim_start_matches('/'));
            let key = mount.sub_path.clone().or(mount.sub_path_expr.as_ref().map(|e| e.replace("$(POD_NAME)", pod)));
            let files: Vec<(PathBuf, &[u8])> = match &key {
                Some(key) => vec![(target, &data[key].0[..])],
                None => data.iter().map(|(key, value)| (target.join(key), &value.0[..])).collect(),
            };
            for (path, bytes) in files {
                std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
                std::fs::write(&path, bytes).expect("write mounted file");
            }
        }
        PodView { root: root.to_path_buf(), pod, replace: Vec::new() }
    }

    /// A word of the pod's command as it runs here: Kubernetes' `$$` escape undone, its
    /// `$(POD_NAME)` expanded, the container's paths under [`PodView::root`], etcdctl found.
    fn word(&self, word: &str) -> String {
        let root = self.root.display().to_string();
        let mut word = word
            .replace("$$", "$")
            .replace("$(POD_NAME)", self.pod)
            .replace("/usr/local/bin/etcdctl", &etcdctl_binary().display().to_string())
            .replace("/etc/", &format!("{root}/etc/"));
        for (from, to) in &self.replace {
            word = word.replace(from, to);
        }
        word
    }

    fn command(&self, words: &[String]) -> std::process::Command {
        let mut words = words.iter().map(|word| self.word(word));
        let program = words.next().expect("program");
        let program = if program == "etcdctl" { etcdctl_binary().display().to_string() } else { program };
        let program =
            if program == "berth" { berth_tests::berth::berth_binary().display().to_string() } else { program };
        let mut command = std::process::Command::new(program);
        command.args(words);
        command
    }
}

fn exec_probe(container: &Container) -> Vec<String> {
    let probe = container.readiness_probe.as_ref().expect("readiness probe");
    probe.exec.as_ref().and_then(|exec| exec.command.clone()).expect("an exec probe")
}

/// Runs `command` to its end within `seconds` (coreutils `timeout`; 124 when it ran out).
fn run_for(mut command: std::process::Command, seconds: u32) -> std::process::Output {
    let program = command.get_program().to_owned();
    let args: Vec<_> = command.get_args().map(ToOwned::to_owned).collect();
    command = std::process::Command::new("timeout");
    command.arg(seconds.to_string()).arg(program).args(args);
    command.output().expect("run")
}

/// The Kubernetes etcd, its etcd-init Job, the replicas' wait for it, their environment and
/// both exec probes, run as processes against a real etcd: the member serves TLS with the
/// certificate make-secrets.sh issued for etcd-0, as the StatefulSet mounts it; etcd-init turns
/// authentication on (twice: a rerun of the Job changes nothing); the member's readiness probe
/// passes before and after; `wait-for-etcd` waits until user berth can log in; a replica
/// started from the StatefulSet's own `env:` (paths and addresses mapped to this machine)
/// serves, and its `berth health` probe passes over TLS — and fails without the CA, over
/// plaintext, and once the replica is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_kubernetes_etcd_init_job_replica_environment_and_probes_work_against_a_real_etcd() {
    use berth_tests::process::{ManagedProcess, ProcessSpec, free_port};

    let (manifests, _generated) = load_manifests();
    let workloads = manifests.workloads();
    let workload = |name: &str| workloads.iter().find(|workload| workload.name == name).expect(name);
    let (etcd_set, replica_set, init_job) =
        (workload("StatefulSet/etcd"), workload("StatefulSet/replica"), workload("Job/etcd-init"));
    let scratch = tempfile::Builder::new().prefix("berth-k8s-pods-").tempdir().expect("tempdir");

    // etcd-0 with the manifest's TLS flags and files, on this machine's ports.
    let (client_port, peer_port) = (free_port().unwrap(), free_port().unwrap());
    let endpoint = format!("https://127.0.0.1:{client_port}");
    let peer = format!("https://127.0.0.1:{peer_port}");
    let mut member = PodView::lay_out(&manifests, etcd_set, "etcd", "etcd-0", &scratch.path().join("etcd-0"));
    member.replace.push(("https://127.0.0.1:2379".into(), endpoint.clone()));
    let etcd_container = &containers(etcd_set.template)[0];
    let tls_flags: Vec<String> = etcd_container
        .command
        .iter()
        .flatten()
        .filter(|word| ["cert", "key-file", "trusted-ca"].iter().any(|part| word.contains(part)))
        .map(|word| member.word(word))
        .collect();
    assert!(tls_flags.len() >= 8, "the etcd flags hold TLS for clients and peers: {tls_flags:?}");
    let data = scratch.path().join("etcd-0/data");
    let mut args = vec![
        "--name=etcd-0".to_owned(),
        format!("--data-dir={}", data.display()),
        format!("--listen-client-urls={endpoint}"),
        format!("--advertise-client-urls={endpoint}"),
        format!("--listen-peer-urls={peer}"),
        format!("--initial-advertise-peer-urls={peer}"),
        format!("--initial-cluster=etcd-0={peer}"),
    ];
    args.extend(tls_flags);
    let spec = ProcessSpec {
        env_remove_prefixes: vec!["ETCD_".into()],
        ..ProcessSpec::new("k8s-etcd-0", berth_tests::etcd::etcd_binary()).args(args)
    };
    let etcd = ManagedProcess::spawn(spec).expect("etcd");

    // Its readiness probe passes once it serves (auth still off).
    let etcd_probe = exec_probe(etcd_container);
    let ready = berth_testkit::wait_until(Duration::from_secs(30), || {
        let output = run_for(member.command(&etcd_probe), 10);
        async move { output.status.success() }
    })
    .await;
    assert!(ready, "etcd readiness probe never passed: {}", etcd.log_tail(20));

    // The replicas' wait: still waiting while user berth cannot log in.
    let replica_container = &containers(replica_set.template)[0];
    let wait_container = all_containers(replica_set.template)
        .into_iter()
        .find(|container| container.name == "wait-for-etcd")
        .expect("wait-for-etcd")
        .clone();
    let mut replica_pod =
        PodView::lay_out(&manifests, replica_set, "wait-for-etcd", "replica-0", &scratch.path().join("replica-0"));
    PodView::lay_out(&manifests, replica_set, "control-plane", "replica-0", &scratch.path().join("replica-0"));
    let endpoints_of = |text: &str| -> String {
        let start = text.find("--endpoints=").expect("--endpoints") + "--endpoints=".len();
        text[start..].split_whitespace().next().expect("endpoints").to_owned()
    };
    let wait_script = wait_container.command.clone().expect("command");
    replica_pod.replace.push((endpoints_of(&wait_script.join(" ")), endpoint.clone()));
    let waiting = run_for(replica_pod.command(&wait_script), 4);
    assert_eq!(waiting.status.code(), Some(124), "wait-for-etcd went on before etcd-init ran: {waiting:?}");

    // etcd-init, twice.
    let init_container = &containers(init_job.template)[0];
    let init_script = init_container.command.clone().expect("command");
    let mut init_pod = PodView::lay_out(&manifests, init_job, "etcd-init", "etcd-init", &scratch.path().join("init"));
    init_pod.replace.push((endpoints_of(&init_script.join(" ")), endpoint.clone()));
    for run in ["first", "second"] {
        let output = run_for(init_pod.command(&init_script), 60);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("authentication are on"),
            "etcd-init, {run} run: {output:?}"
        );
    }

    // Authentication is on: the member's probe still passes, and the wait ends.
    let probe = run_for(member.command(&etcd_probe), 10);
    assert!(probe.status.success(), "etcd readiness probe with authentication on: {probe:?}");
    let waited = run_for(replica_pod.command(&wait_script), 30);
    assert!(waited.status.success(), "wait-for-etcd after etcd-init: {waited:?}");

    // A replica from the StatefulSet's own env: serves, as etcd user berth.
    let (grpc_port, metrics_port) = (free_port().unwrap(), free_port().unwrap());
    let mut replica_view = PodView { root: scratch.path().join("replica-0"), pod: "replica-0", replace: Vec::new() };
    replica_view.replace.push(("$(POD_IP):9100".into(), format!("127.0.0.1:{metrics_port}")));
    replica_view.replace.push(("0.0.0.0:7070".into(), format!("127.0.0.1:{grpc_port}")));
    replica_view.replace.push(("https://127.0.0.1:7070".into(), format!("https://127.0.0.1:{grpc_port}")));
    let mut spec = ProcessSpec::new("k8s-replica-0", berth_tests::berth::berth_binary())
        .args(replica_container.command.iter().flatten().skip(1).cloned())
        .args(replica_container.args.iter().flatten().cloned());
    for variable in replica_container.env.iter().flatten() {
        let Some(value) = &variable.value else { continue };
        let value = if variable.name == "BERTH_ETCD" { endpoint.clone() } else { replica_view.word(value) };
        spec = spec.env(variable.name.clone(), value);
    }
    spec.env_remove_prefixes = vec!["BERTH_".into()];
    let replica = ManagedProcess::spawn(spec).expect("replica");
    let replica_probe = exec_probe(replica_container);
    assert!(probes_berth_health(replica_container.readiness_probe.as_ref().unwrap()));
    let serving = berth_testkit::wait_until(Duration::from_secs(30), || {
        let output = run_for(replica_view.command(&replica_probe), 10);
        async move { output.status.success() && String::from_utf8_lossy(&output.stdout).contains("SERVING") }
    })
    .await;
    assert!(serving, "the replica's probe never passed: {}", replica.log_tail(30));

    // The probe proves TLS: without the CA, or over plaintext, it fails.
    let without_ca: Vec<String> = replica_probe.iter().filter(|word| !word.starts_with("--ca-cert")).cloned().collect();
    let refused = run_for(replica_view.command(&without_ca), 10);
    assert!(!refused.status.success(), "probe without the CA passed: {refused:?}");
    let plaintext: Vec<String> = replica_probe.iter().map(|word| word.replace("https://", "http://")).collect();
    let refused = run_for(replica_view.command(&plaintext), 10);
    assert!(!refused.status.success(), "plaintext probe passed: {refused:?}");

    // Gone: the probe fails and says it could not connect.
    replica.kill();
    assert!(replica.wait_exit(Duration::from_secs(10)));
    let gone = run_for(replica_view.command(&replica_probe), 10);
    assert_eq!(gone.status.code(), Some(1), "{gone:?}");
    assert!(String::from_utf8_lossy(&gone.stderr).contains("connect"), "{gone:?}");
    drop(etcd);
}
