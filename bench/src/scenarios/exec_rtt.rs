//! `exec-rtt`: `true` run through the control plane on each backend the binary and the
//! machine offer (local, bubblewrap, docker), against starting `true` directly: a plain
//! spawn, `bwrap` with a comparable sandbox, `docker exec` into a running container. Also
//! the provision latency of a fresh workspace per backend, against the registry writes a
//! bind needs (plus `docker run` for docker).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use berth_control_plane::registry::etcd::EtcdRegistry;
use berth_control_plane::registry::{Compare, Registry, Txn, TxnOp};
use berth_proto::v1;
use berth_tests::berth::{BerthProcess, is_serving};
use bytes::Bytes;
use tonic::transport::Channel;

use super::common::{self, create_request};
use crate::env::progress;
use crate::env::{self, Ctx};
use crate::machine::command_line;
use crate::report::{Floor, Quantity, ScenarioResult};
use crate::stats::Summary;

pub const NAME: &str = "exec-rtt";

const BACKENDS: [&str; 3] = ["local", "bubblewrap", "docker"];
const WARM_UP: usize = 5;

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<ScenarioResult>> {
    let mut available = Vec::new();
    let mut skipped = Vec::new();
    for backend in BACKENDS {
        match probe(ctx, backend).await {
            Ok(()) => available.push(backend),
            Err(reason) => {
                progress!("{NAME}: {backend} skipped: {reason}");
                skipped.push((backend, reason));
            }
        }
    }
    let docker_container = match DockerContainer::start(&ctx.settings.docker_image) {
        Ok(container) => Some(container),
        Err(error) => {
            progress!("{NAME}: no docker exec floor: {error:#}");
            None
        }
    };
    let etcd = env::start_etcd().await?;
    let mut config = env::cluster_config(ctx, &etcd, 1, 1);
    // A sandbox first: `local` may not be the default next to one (the node refuses).
    let mut offered = available.clone();
    offered.sort_by_key(|backend| *backend == "local");
    config.node_flags = vec!["--backend".into(), offered.join(",")];
    let cluster = env::start_cluster(config).await?;
    let channel = env::connect(&cluster.replicas[0].server.endpoint).await?;
    let registry = env::registry(&etcd).await?;

    let mut results = Vec::new();
    for backend in &available {
        let case = format!("exec true {backend}");
        let node = &cluster.nodes[0].server.endpoint;
        let row = exec_case(ctx, &channel, Some(node), backend, &case, docker_container.as_ref()).await;
        let mut row = common::row_or_error(NAME, &case, &ctx.machine, row);
        if *backend == "bubblewrap" || *backend == "docker" {
            // Measured right after the exec loop: the supervisor is idle and warm.
            if let Some(kib) = supervisor_idle_rss_kib(backend) {
                row.metric("supervisor_idle_rss_kib", kib as f64);
            }
        }
        results.push(row);
        let case = format!("provision {backend}");
        let row = provision_case(ctx, &channel, &registry, backend).await;
        results.push(common::row_or_error(NAME, &case, &ctx.machine, row));
    }
    // The same sandbox execs without the supervisor (`--no-supervisor`: a bwrap sandbox or
    // a Docker exec per command, the way it was before), on a cluster of their own, in the
    // same run.
    for backend in ["bubblewrap", "docker"].into_iter().filter(|backend| available.contains(backend)) {
        let case = format!("exec true {backend} --no-supervisor");
        let row = unsupervised_case(ctx, backend, &case, docker_container.as_ref()).await;
        results.push(common::row_or_error(NAME, &case, &ctx.machine, row));
    }
    // A first session served from a warm pool, on a cluster of its own.
    if available.contains(&"docker") {
        let case = "provision docker --warm-pool";
        let row = pool_case(ctx, &registry, case).await;
        results.push(common::row_or_error(NAME, case, &ctx.machine, row));
    }
    // The targets are ratios to Berth's own local exec (same run).
    let local_p50 = results
        .iter()
        .find(|row| row.case == "exec true local")
        .and_then(|row| row.latency_ms.as_ref())
        .map(|latency| latency.p50_ms);
    if let Some(local_p50) = local_p50.filter(|p50| *p50 > 0.0) {
        for row in results.iter_mut().filter(|row| row.case.starts_with("exec true ") && row.case != "exec true local")
        {
            if let Some(p50) = row.latency_ms.as_ref().map(|latency| latency.p50_ms) {
                row.metric("ratio_to_exec_true_local", p50 / local_p50);
            }
        }
    }
    for (backend, reason) in skipped {
        let mut exec_row = ScenarioResult::new(NAME, format!("exec true {backend}"), &ctx.machine);
        // The floor is still worth knowing where it can be measured.
        if backend == "docker"
            && let Some(container) = &docker_container
            && let Ok(floor) = docker_exec_floor(container, ctx.settings.exec_iterations).await
        {
            exec_row.set_floor(floor);
        }
        results.push(exec_row.skip(reason.clone()));
        results.push(ScenarioResult::new(NAME, format!("provision {backend}"), &ctx.machine).skip(reason));
    }
    // Dropped in reverse order: the cluster before its etcd.
    Ok(results)
}

/// Whether `backend` can run here: its host tools exist and the `berth` binary's node agent
/// starts with it (an unknown backend or a missing engine is a start-up error there).
async fn probe(ctx: &Ctx, backend: &str) -> Result<(), String> {
    match backend {
        "local" => return Ok(()),
        "bubblewrap" if !Path::new("/usr/bin/bwrap").exists() => return Err("bwrap is not installed".into()),
        "docker" => {
            if command_line("docker", &["version", "--format", "{{.Server.Version}}"]).is_none() {
                return Err("no Docker engine answers".into());
            }
            let image = &ctx.settings.docker_image;
            if command_line("docker", &["image", "inspect", "--format", "{{.Id}}", image]).is_none() {
                return Err(format!("image {image} is not present (deploy/images/build-base.sh builds it)"));
            }
        }
        _ => {}
    }
    let data_dir = tempfile::tempdir().map_err(|error| error.to_string())?;
    let args = vec![
        "node-agent".to_owned(),
        "--control-plane".into(),
        "http://127.0.0.1:1".into(),
        "--data-dir".into(),
        data_dir.path().display().to_string(),
        "--node-id".into(),
        format!("probe-{backend}"),
        "--backend".into(),
        backend.into(),
        // Harmless for the sandboxes; `local` is offered only with it.
        "--allow-unsandboxed".into(),
    ];
    let agent = BerthProcess::spawn(&format!("probe-{backend}"), args, "info").map_err(|error| error.to_string())?;
    let endpoint = agent.endpoint.clone();
    berth_testkit::wait_until_every(Duration::from_secs(20), Duration::from_millis(50), || {
        let endpoint = endpoint.clone();
        let agent = &agent;
        async move { !agent.is_running() || is_serving(&endpoint).await }
    })
    .await;
    if agent.is_running() {
        return Ok(());
    }
    let log = agent.log();
    let reason = log
        .lines()
        .rev()
        .find(|line| line.to_lowercase().contains("error"))
        .unwrap_or_else(|| log.lines().last().unwrap_or("exited at start"));
    Err(format!("the berth node agent does not start with --backend {backend}: {}", reason.trim()))
}

/// `exec true <backend>` against a node agent started with `--no-supervisor`.
async fn unsupervised_case(
    ctx: &Ctx,
    backend: &str,
    case: &str,
    docker_container: Option<&DockerContainer>,
) -> anyhow::Result<ScenarioResult> {
    let etcd = env::start_etcd().await?;
    let mut config = env::cluster_config(ctx, &etcd, 1, 1);
    config.node_flags = vec!["--backend".into(), backend.into(), "--no-supervisor".into()];
    let cluster = env::start_cluster(config).await?;
    let channel = env::connect(&cluster.replicas[0].server.endpoint).await?;
    let row = exec_case(ctx, &channel, None, backend, case, docker_container).await?;
    drop(cluster);
    Ok(row.param("supervisor", false))
}

/// The largest VmRSS of the backend's supervisors running on the host (in the host's
/// /proc: bubblewrap's are `/proc/self/fd/5 --idle-ms N`, Docker's `/.berth/supervisor
/// --connect …`), in KiB.
fn supervisor_idle_rss_kib(backend: &str) -> Option<u64> {
    // bubblewrap starts it from its memfd; a Docker container from its bound binary.
    let program: &[u8] = if backend == "docker" { b"/.berth/supervisor" } else { b"/proc/self/fd/5" };
    let option: &[u8] = if backend == "docker" { b"--connect" } else { b"--idle-ms" };
    let entries = std::fs::read_dir("/proc").ok()?;
    entries
        .filter_map(|entry| {
            let path = entry.ok()?.path();
            let cmdline = std::fs::read(path.join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|byte| *byte == 0).collect();
            if args.first() != Some(&program) || args.get(1) != Some(&option) {
                return None;
            }
            let status = std::fs::read_to_string(path.join("status")).ok()?;
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmRSS:"))?
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .ok()
        })
        .max()
}

/// `node`: the node agent's endpoint, to also time the same exec sent to it directly (the
/// replica's share of the round trip is the difference).
async fn exec_case(
    ctx: &Ctx,
    channel: &Channel,
    node: Option<&str>,
    backend: &str,
    case: &str,
    docker_container: Option<&DockerContainer>,
) -> anyhow::Result<ScenarioResult> {
    let iterations = ctx.settings.exec_iterations;
    let mut client = env::workspace_client(channel.clone());
    let session = client
        .create_session(create_request(&format!("exec-{backend}"), "coder", backend))
        .await
        .with_context(|| format!("CreateSession on {backend}"))?
        .into_inner();
    let request =
        v1::ExecRequest { workspace_id: session.workspace_id.clone(), argv: vec!["true".into()], ..Default::default() };
    progress!("{NAME}: {iterations} × `true` through the control plane on {backend}");
    let mut latencies = Vec::with_capacity(iterations);
    for index in 0..WARM_UP + iterations {
        let started = Instant::now();
        let result = client.exec(request.clone()).await.context("Exec")?.into_inner();
        let elapsed = started.elapsed();
        if result.exit_code != 0 {
            bail!("`true` exited {} on {backend}: {}", result.exit_code, String::from_utf8_lossy(&result.stderr));
        }
        if index >= WARM_UP {
            latencies.push(elapsed);
        }
    }
    let node_direct = match node {
        Some(node) => Some(exec_on_node(node, &mut client, &request, iterations).await?),
        None => None,
    };
    let floor = match backend {
        "local" => spawn_floor("direct spawn of true", Command::new("true"), iterations).await?,
        "bubblewrap" => bwrap_floor(iterations).await?,
        "docker" => match docker_container {
            Some(container) => docker_exec_floor(container, iterations).await?,
            None => bail!("no container for the docker exec floor"),
        },
        other => bail!("no floor for backend {other}"),
    };
    let mut result = ScenarioResult::new(NAME, case, &ctx.machine)
        .param("backend", backend)
        .param("iterations", iterations)
        .param("workspace_id", session.workspace_id);
    let total: Duration = latencies.iter().sum();
    result.latency_ms = Summary::of(&latencies);
    result.throughput = Some(Quantity::new(iterations as f64 / total.as_secs_f64(), "exec/s"));
    result.wall_s = total.as_secs_f64();
    result.set_floor(floor);
    if let Some(summary) = node_direct.as_deref().and_then(Summary::of) {
        result.metric("node_direct_p50_ms", summary.p50_ms);
    }
    Ok(result)
}

/// The same exec sent to the node agent directly, with the generation a replica would add.
async fn exec_on_node(
    node: &str,
    client: &mut v1::workspace_service_client::WorkspaceServiceClient<Channel>,
    request: &v1::ExecRequest,
    iterations: usize,
) -> anyhow::Result<Vec<Duration>> {
    let generation = client
        .get_workspace(v1::GetWorkspaceRequest { workspace_id: request.workspace_id.clone() })
        .await
        .context("GetWorkspace")?
        .into_inner()
        .generation;
    let mut node = env::workspace_client(env::connect(node).await?);
    progress!("{NAME}: {iterations} × `true` on the node agent directly");
    let mut latencies = Vec::with_capacity(iterations);
    for index in 0..WARM_UP + iterations {
        let mut call = tonic::Request::new(request.clone());
        call.metadata_mut().insert(berth_proto::meta::GENERATION, generation.to_string().parse()?);
        let started = Instant::now();
        let result = node.exec(call).await.context("Exec on the node")?.into_inner();
        let elapsed = started.elapsed();
        anyhow::ensure!(result.exit_code == 0, "`true` exited {} on the node", result.exit_code);
        if index >= WARM_UP {
            latencies.push(elapsed);
        }
    }
    Ok(latencies)
}

/// Times `iterations` runs of `command` (after a few unmeasured ones), each to exit 0.
async fn spawn_floor(name: &str, command: Command, iterations: usize) -> anyhow::Result<Floor> {
    let name = name.to_owned();
    progress!("{NAME}: floor: {name}");
    tokio::task::spawn_blocking(move || {
        let mut command = command;
        command.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::piped());
        let mut latencies = Vec::with_capacity(iterations);
        for index in 0..WARM_UP + iterations {
            let started = Instant::now();
            let output = command.output().with_context(|| format!("{name}: spawn"))?;
            let elapsed = started.elapsed();
            if !output.status.success() {
                bail!("{name}: {} {}", output.status, String::from_utf8_lossy(&output.stderr).trim());
            }
            if index >= WARM_UP {
                latencies.push(elapsed);
            }
        }
        let total: Duration = latencies.iter().sum();
        Ok(Floor {
            name,
            latency_ms: Summary::of(&latencies),
            throughput: Some(Quantity::new(iterations as f64 / total.as_secs_f64(), "exec/s")),
        })
    })
    .await
    .context("floor task")?
}

/// `bwrap` with the sandbox the bubblewrap backend builds, minus its `setsid` / `prlimit`
/// wrappers and per-workspace `/etc` entries: every namespace unshared, no capabilities,
/// `/usr` read-only, the workspace bound at `/workspace`, the root remounted read-only.
async fn bwrap_floor(iterations: usize) -> anyhow::Result<Floor> {
    let workspace = tempfile::tempdir().context("bwrap floor workspace")?;
    let mut args: Vec<String> = ["--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent"]
        .into_iter()
        .chain(["--cap-drop", "ALL", "--uid", "1000", "--gid", "1000", "--ro-bind", "/usr", "/usr"])
        .map(str::to_owned)
        .collect();
    for system_dir in ["/bin", "/sbin", "/lib", "/lib64"] {
        let path = Path::new(system_dir);
        match std::fs::read_link(path) {
            Ok(target) => args.extend(["--symlink".into(), target.display().to_string(), system_dir.into()]),
            Err(_) if path.is_dir() => args.extend(["--ro-bind".into(), system_dir.into(), system_dir.into()]),
            Err(_) => {}
        }
    }
    args.extend(["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--bind"].map(str::to_owned));
    args.push(workspace.path().display().to_string());
    args.extend(["/workspace", "--remount-ro", "/", "--chdir", "/workspace", "true"].map(str::to_owned));
    let mut command = Command::new("bwrap");
    command.args(&args);
    spawn_floor("direct bwrap … true", command, iterations).await
}

async fn docker_exec_floor(container: &DockerContainer, iterations: usize) -> anyhow::Result<Floor> {
    let mut command = Command::new("docker");
    command.args(["exec", &container.name, "true"]);
    spawn_floor("docker exec … true (CLI)", command, iterations).await
}

/// P fresh workspaces (distinct users) on `backend`, each CreateSession timed.
async fn provision_case(
    ctx: &Ctx,
    channel: &Channel,
    registry: &Arc<EtcdRegistry>,
    backend: &str,
) -> anyhow::Result<ScenarioResult> {
    let samples = ctx.settings.provision_samples;
    progress!("{NAME}: {samples} fresh workspaces on {backend}");
    let mut client = env::workspace_client(channel.clone());
    let run_tag = format!("{:08x}", rand::random::<u32>());
    let mut latencies = Vec::with_capacity(samples);
    for index in 0..samples {
        let request = create_request(&format!("provision-{run_tag}-{index}"), "coder", backend);
        let started = Instant::now();
        client.create_session(request).await.with_context(|| format!("CreateSession on {backend}"))?;
        latencies.push(started.elapsed());
    }
    let mut floor_latencies = Vec::with_capacity(samples);
    for index in 0..samples {
        let started = Instant::now();
        bind_writes(registry, &format!("/bench-floor-{run_tag}"), index).await?;
        let container = match backend {
            "docker" => {
                let image = ctx.settings.docker_image.clone();
                Some(tokio::task::spawn_blocking(move || DockerContainer::start(&image)).await??)
            }
            _ => None,
        };
        floor_latencies.push(started.elapsed());
        // Removed outside the measurement.
        drop(container);
    }
    let floor_name = match backend {
        "docker" => "3 etcd round trips of a bind + docker run",
        _ => "3 sequential etcd round trips of a bind",
    };
    let mut result = ScenarioResult::new(NAME, format!("provision {backend}"), &ctx.machine)
        .param("backend", backend)
        .param("samples", samples);
    let total: Duration = latencies.iter().sum();
    result.latency_ms = Summary::of(&latencies);
    result.throughput = Some(Quantity::new(samples as f64 / total.as_secs_f64(), "workspaces/s"));
    result.wall_s = total.as_secs_f64();
    result.set_floor(Floor { name: floor_name.into(), latency_ms: Summary::of(&floor_latencies), throughput: None });
    Ok(result)
}

/// Fresh workspaces claimed from a warm pool filled beforehand (one per sample), against
/// the registry round trips of their binds.
async fn pool_case(ctx: &Ctx, registry: &Arc<EtcdRegistry>, case: &str) -> anyhow::Result<ScenarioResult> {
    let samples = ctx.settings.provision_samples;
    let etcd = env::start_etcd().await?;
    let mut config = env::cluster_config(ctx, &etcd, 1, 1);
    config.node_flags = vec!["--backend".into(), "docker".into(), "--warm-pool".into(), format!("docker={samples}")];
    let cluster = env::start_cluster(config).await?;
    let node_id = cluster.nodes[0].id.clone();
    progress!("{NAME}: waiting for a warm pool of {samples} on docker");
    let deadline = Instant::now() + Duration::from_secs(30 + 5 * samples as u64);
    loop {
        let ready = ready_pool_containers(&node_id)?;
        if ready >= samples {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the warm pool holds {ready} of {samples} after the deadline");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let channel = env::connect(&cluster.replicas[0].server.endpoint).await?;
    let mut client = env::workspace_client(channel);
    let run_tag = format!("{:08x}", rand::random::<u32>());
    let mut latencies = Vec::with_capacity(samples);
    for index in 0..samples {
        let request = create_request(&format!("pool-{run_tag}-{index}"), "coder", "docker");
        let started = Instant::now();
        client.create_session(request).await.context("CreateSession from the warm pool")?;
        latencies.push(started.elapsed());
    }
    let mut floor_latencies = Vec::with_capacity(samples);
    for index in 0..samples {
        let started = Instant::now();
        bind_writes(registry, &format!("/bench-pool-floor-{run_tag}"), index).await?;
        floor_latencies.push(started.elapsed());
    }
    drop(cluster);
    let mut result = ScenarioResult::new(NAME, case, &ctx.machine).param("backend", "docker").param("samples", samples);
    let total: Duration = latencies.iter().sum();
    result.latency_ms = Summary::of(&latencies);
    result.throughput = Some(Quantity::new(samples as f64 / total.as_secs_f64(), "workspaces/s"));
    result.wall_s = total.as_secs_f64();
    result.set_floor(Floor {
        name: "3 etcd round trips of a bind".into(),
        latency_ms: Summary::of(&floor_latencies),
        throughput: None,
    });
    Ok(result)
}

/// Pool containers of a node (claimed or not).
fn ready_pool_containers(node_id: &str) -> anyhow::Result<usize> {
    let output = Command::new("docker")
        .args(["ps", "-q", "--filter", "label=berth.pool", "--filter", &format!("label=berth.node.id={node_id}")])
        .output()
        .context("docker ps")?;
    Ok(String::from_utf8_lossy(&output.stdout).lines().count())
}

/// The registry round trips of one bind, in order, as Berth makes them: take the lock and
/// read the record (one transaction), write the record guarded by the lock and delete the
/// lock (one), create the session.
async fn bind_writes(registry: &Arc<EtcdRegistry>, prefix: &str, index: usize) -> anyhow::Result<()> {
    let lock = format!("{prefix}/locks/ws-{index}");
    let record = format!("{prefix}/workspaces/ws-{index}");
    let session = format!("{prefix}/sessions/s-{index}");
    let value = Bytes::from(vec![b'x'; 400]);
    let take = Txn::new()
        .when([Compare::absent(&lock)])
        .and_then([TxnOp::put(&lock, Bytes::from_static(b"replica")), TxnOp::get(&record)]);
    let taken = registry.txn(take).await?;
    anyhow::ensure!(taken.succeeded, "floor lock {lock} exists");
    let guarded = Txn::new()
        .when([Compare::create_revision(&lock, taken.revision)])
        .and_then([TxnOp::put(&record, value.clone()), TxnOp::delete(&lock)]);
    anyhow::ensure!(registry.txn(guarded).await?.succeeded, "floor record write lost its fence");
    registry.create_if_absent(&session, value, 0).await?.map_err(|_| anyhow::anyhow!("floor session exists"))?;
    Ok(())
}

/// A container of the base image for the `docker exec` floor; removed on drop.
struct DockerContainer {
    name: String,
}

impl DockerContainer {
    fn start(image: &str) -> anyhow::Result<Self> {
        let name = format!("berth-bench-{:08x}", rand::random::<u32>());
        let output = Command::new("docker")
            .args(["run", "-d", "--rm", "--network", "none", "--name", &name, image, "sleep", "3600"])
            .output()
            .context("docker run")?;
        if !output.status.success() {
            bail!("docker run {image}: {}", String::from_utf8_lossy(&output.stderr).trim());
        }
        Ok(Self { name })
    }
}

impl Drop for DockerContainer {
    fn drop(&mut self) {
        let _ =
            Command::new("docker").args(["rm", "-f", &self.name]).stdout(Stdio::null()).stderr(Stdio::null()).status();
    }
}
