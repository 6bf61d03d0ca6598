//! Backend policy, operator ceilings, the node's exec output budget and per-user quotas.
//!
//! - **Backend downgrade** (entry point: CreateSession's `backend`, and no backend at all):
//!   a plain user asks for `local` on a node that offers it next to bubblewrap. Refused
//!   with PERMISSION_DENIED naming the grant; the host marker an unsandboxed `touch` would
//!   create never appears. A user granted `local` creates it (the positive control that
//!   the marker would show).
//! - **Careless operator**: a node agent naming `local` without `--allow-unsandboxed`, or
//!   with `local` as the default next to a sandbox, refuses to start.
//! - **Output bomb**: many concurrent unary execs printing a gigabyte each. Each gets its
//!   output cap; the node reserves 2 × cap per exec from `--exec-output-budget-bytes` and
//!   refuses the rest at once with RESOURCE_EXHAUSTED; the node agent's peak memory stays
//!   within the budget's reach. An output cap above the ceiling is INVALID_ARGUMENT.
//! - **Greedy specs and execs**: a spec asking for more memory than the node's ceiling is
//!   INVALID_ARGUMENT naming the limit, the value and the ceiling, and nothing is created on
//!   the node's disk; an exec timeout above the ceiling likewise; an exec naming no timeout
//!   gets the operator's default.
//! - **`berth up` with real authentication** offers `local` only with the flag.
//! - **Quotas**: workspaces per user and concurrent execs per user are RESOURCE_EXHAUSTED
//!   at once, never a wait.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use berth_proto::auth::{BearerInterceptor, Secret};
use berth_proto::v1;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use berth_testkit::wait_until;
use berth_tests::berth::{BerthProcess, channel, retry_transient};
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

const TOKENS: &str = r#"
[[token]]
secret = "mallory-token-0123456789"
user = "mallory"
[[token]]
secret = "trusted-token-0123456789"
user = "trusted"
backends = ["local"]
[[token]]
secret = "ops-token-0123456789"
admin = true
"#;
const MALLORY: &str = "mallory-token-0123456789";
const TRUSTED: &str = "trusted-token-0123456789";

type Client = WorkspaceServiceClient<InterceptedService<Channel, BearerInterceptor>>;

/// A replica with `--auth token` on the shared etcd and one node agent.
struct Stack {
    replica: BerthProcess,
    node: BerthProcess,
    dir: tempfile::TempDir,
}

impl Stack {
    async fn start(replica_flags: &[&str], node_flags: &[&str]) -> Stack {
        let dir = tempfile::tempdir().unwrap();
        let tokens = dir.path().join("tokens.toml");
        std::fs::write(&tokens, TOKENS).unwrap();
        // Per-node credentials: the replica's key and this node's own credential.
        let key_file = dir.path().join("node-credential.key");
        std::fs::write(&key_file, format!("{:032x}\n", rand::random::<u128>())).unwrap();
        let key = berth_proto::credentials::NodeCredentialKey::from_file(&key_file).unwrap();
        let credential_file = dir.path().join("node-policy.credential");
        std::fs::write(&credential_file, key.node_credential("node-policy").secret().expose()).unwrap();
        let prefix = format!("/berth-policy-{:016x}", rand::random::<u64>());
        let mut args: Vec<String> = [
            "control-plane",
            "--etcd",
            &berth_tests::etcd::shared().endpoint(),
            "--key-prefix",
            &prefix,
            "--replica-id",
            "replica-policy",
            "--auth",
            "token",
            "--tokens-file",
            &tokens.display().to_string(),
            "--node-credential-key-file",
            &key_file.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(replica_flags.iter().map(|flag| (*flag).to_owned()));
        let replica = BerthProcess::start("replica-policy", args).await.unwrap();
        let mut args: Vec<String> = [
            "node-agent",
            "--control-plane",
            &replica.endpoint,
            "--data-dir",
            &dir.path().join("node").display().to_string(),
            "--node-id",
            "node-policy",
            "--node-credential-file",
            &credential_file.display().to_string(),
        ]
        .map(str::to_owned)
        .to_vec();
        args.extend(node_flags.iter().map(|flag| (*flag).to_owned()));
        let node = BerthProcess::start("node-policy", args).await.unwrap();
        // Sessions are retried while the node registers (see `session`).
        Stack { replica, node, dir }
    }

    fn client(&self, token: &str) -> Client {
        WorkspaceServiceClient::with_interceptor(
            channel(&self.replica.endpoint),
            BearerInterceptor::new(Some(&Secret::new(token.to_owned()))),
        )
        .max_decoding_message_size(64 * 1024 * 1024)
    }

    /// A session of `token`'s user, retried while the node registers (no live node is a
    /// retryable UNAVAILABLE); any other refusal comes back at once.
    async fn session(&self, token: &str, agent: &str, backend: &str) -> Result<v1::Session, tonic::Status> {
        let request =
            v1::CreateSessionRequest { agent_id: agent.into(), backend: backend.into(), ..Default::default() };
        let (outcome, _attempts) = retry_transient(Duration::from_secs(20), || {
            let mut client = self.client(token);
            let request = request.clone();
            async move { client.create_session(request).await.map(tonic::Response::into_inner) }
        })
        .await;
        outcome
    }
}

fn exec_request(workspace_id: &str, script: &str) -> v1::ExecRequest {
    v1::ExecRequest {
        workspace_id: workspace_id.into(),
        argv: vec!["sh".into(), "-c".into(), script.into()],
        timeout_ms: 30_000,
        ..Default::default()
    }
}

fn marker() -> PathBuf {
    PathBuf::from(format!("/tmp/berth-policy-marker-{:016x}", rand::random::<u64>()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_user_cannot_pick_local_and_lands_in_the_sandbox() {
    let stack = Stack::start(&[], &["--backend", "bubblewrap,local", "--allow-unsandboxed"]).await;
    let marker = marker();
    let touch = format!("touch {}", marker.display());

    // Asking for `local` outright: refused before anything exists, naming the grant.
    let refused = stack.session(MALLORY, "coder", "local").await.expect_err("mallory got a local workspace");
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    assert!(
        refused.message().contains("berth/backends") && refused.message().contains("backends = [\"local\"]"),
        "the refusal must name the grant: {}",
        refused.message()
    );
    // Naming no backend: the node's default, which is the sandbox.
    let session = stack.session(MALLORY, "coder", "").await.unwrap();
    let ran = stack.client(MALLORY).exec(exec_request(&session.workspace_id, &touch)).await.unwrap().into_inner();
    assert_eq!(ran.exit_code, 0, "{}", String::from_utf8_lossy(&ran.stderr));
    let workspace = stack
        .client(MALLORY)
        .get_workspace(v1::GetWorkspaceRequest { workspace_id: session.workspace_id.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(workspace.backend, "bubblewrap");
    assert!(!marker.exists(), "mallory's touch reached the host: {}", marker.display());

    // The control: a granted user gets `local`, and its touch lands on the host.
    let trusted = stack.session(TRUSTED, "coder", "local").await.unwrap();
    let ran = stack.client(TRUSTED).exec(exec_request(&trusted.workspace_id, &touch)).await.unwrap().into_inner();
    assert_eq!(ran.exit_code, 0, "{}", String::from_utf8_lossy(&ran.stderr));
    assert!(marker.exists(), "the unsandboxed control did not create {}", marker.display());
    std::fs::remove_file(&marker).ok();
}

/// Starts `berth node-agent` with `flags` and expects it to exit at once, naming `expected`.
async fn refuses_to_start(flags: &[&str], expected: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> =
        ["node-agent", "--control-plane", "http://127.0.0.1:1", "--data-dir"].map(str::to_owned).to_vec();
    args.push(dir.path().display().to_string());
    args.extend(flags.iter().map(|flag| (*flag).to_owned()));
    let node = BerthProcess::spawn("node-refused", args, "info").unwrap();
    let exited = wait_until(Duration::from_secs(20), || async { !node.is_running() }).await;
    let log = node.log();
    assert!(exited, "a node agent with {flags:?} started; log:\n{log}");
    assert!(log.contains(expected), "the refusal of {flags:?} must name {expected:?}; log:\n{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_offering_local_without_the_flag_refuses_to_start() {
    refuses_to_start(&["--backend", "bubblewrap,local"], "--allow-unsandboxed").await;
    refuses_to_start(&[], "--allow-unsandboxed").await;
    refuses_to_start(&["--backend", "local,bubblewrap", "--allow-unsandboxed"], "may not be the default").await;
}

/// The node agent's peak resident memory (`VmHWM`), in bytes.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0);
    kib * 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_output_bomb_is_capped_and_the_overflow_refused_at_once() {
    const CAP: u64 = 8 * 1024 * 1024;
    const BUDGET: u64 = 32 * 1024 * 1024;
    const BOMBS: usize = 12;
    let stack = Stack::start(
        &[],
        &[
            "--backend",
            "local",
            "--allow-unsandboxed",
            "--ceiling-output-bytes",
            &CAP.to_string(),
            "--exec-output-budget-bytes",
            &BUDGET.to_string(),
        ],
    )
    .await;
    let session = stack.session(TRUSTED, "bomber", "").await.unwrap();
    let workspace = session.workspace_id.clone();

    // Above the ceiling: refused whatever the budget, naming limit, value and ceiling.
    let mut greedy = exec_request(&workspace, "true");
    greedy.max_output_bytes = CAP + 1;
    let refused = stack.client(TRUSTED).exec(greedy).await.expect_err("an output cap above the ceiling ran");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("--ceiling-output-bytes"), "{}", refused.message());

    // A gigabyte each on stdout, many at once. Every call answers; none waits for another.
    let baseline = peak_rss(stack.node.pid());
    let started = Instant::now();
    let bombs = (0..BOMBS).map(|_| {
        let mut client = stack.client(TRUSTED);
        let mut request = exec_request(&workspace, "head -c 1073741824 /dev/zero");
        request.max_output_bytes = CAP;
        async move {
            let sent = Instant::now();
            (client.exec(request).await, sent.elapsed())
        }
    });
    let outcomes = futures::future::join_all(bombs).await;
    let (mut capped, mut refused) = (0, 0);
    for (outcome, took) in &outcomes {
        match outcome {
            Ok(result) => {
                let result = result.get_ref();
                assert!(result.stdout_truncated && result.stdout.len() as u64 == CAP, "{} bytes", result.stdout.len());
                capped += 1;
            }
            Err(status) => {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                assert!(status.message().contains("--exec-output-budget-bytes"), "{}", status.message());
                assert!(*took < Duration::from_secs(5), "a refusal took {took:?}: it waited");
                refused += 1;
            }
        }
    }
    let peak = peak_rss(stack.node.pid());
    eprintln!(
        "output bomb: {BOMBS} execs of 1 GiB, cap {CAP}, budget {BUDGET}: {capped} capped, {refused} refused in {:?}; \
         node peak RSS {} MiB (baseline {} MiB)",
        started.elapsed(),
        peak >> 20,
        baseline >> 20
    );
    assert!(capped >= 1 && refused >= 1, "{capped} capped, {refused} refused");
    assert!(capped as u64 * 2 * CAP <= BUDGET * 4, "more execs ran than the budget covers at once");
    // Every admitted exec buffers at most 2 × CAP; with copies for the answer a few times
    // the budget, never BOMBS × 2 × CAP (192 MiB) on top of the baseline.
    assert!(peak < baseline + 3 * BUDGET, "node agent peak RSS {peak} over baseline {baseline}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_refuse_at_once() {
    let stack = Stack::start(
        &["--max-workspaces-per-user", "2", "--max-execs-per-user", "2"],
        &["--backend", "local", "--allow-unsandboxed"],
    )
    .await;
    let first = stack.session(TRUSTED, "one", "").await.unwrap();
    stack.session(TRUSTED, "two", "").await.unwrap();
    // A new session on an existing workspace costs nothing.
    stack.session(TRUSTED, "one", "").await.unwrap();
    let started = Instant::now();
    let third = stack.session(TRUSTED, "three", "").await.expect_err("a third workspace was created");
    assert_eq!(third.code(), Code::ResourceExhausted, "{third:?}");
    assert!(third.message().contains("--max-workspaces-per-user"), "{}", third.message());
    assert!(started.elapsed() < Duration::from_secs(5));

    // Two execs, one unary and one streamed, hold the user's slots (each marks on the host
    // that it runs, then waits for `hold`); a third is refused while they run, at once, and
    // admitted after.
    let hold = marker();
    let started: Vec<PathBuf> = (0..2).map(|_| marker()).collect();
    let running = started
        .iter()
        .enumerate()
        .map(|(index, started)| {
            let mut client = stack.client(TRUSTED);
            let script = format!("touch {}; while [ ! -e {} ]; do sleep 0.05; done", started.display(), hold.display());
            let request = exec_request(&first.workspace_id, &script);
            tokio::spawn(async move {
                if index == 0 {
                    return client.exec(request).await.map(|result| result.into_inner().exit_code);
                }
                // The other holder is a streamed exec: its slot is held until the stream ends.
                let mut stream = client.exec_stream(request).await?.into_inner();
                let mut exit_code = -1;
                while let Some(chunk) = stream.message().await? {
                    if let Some(v1::exec_chunk::Kind::Exit(result)) = chunk.kind {
                        exit_code = result.exit_code;
                    }
                }
                Ok(exit_code)
            })
        })
        .collect::<Vec<_>>();
    let both_run = wait_until(Duration::from_secs(20), || async { started.iter().all(|path| path.exists()) }).await;
    assert!(both_run, "the two holding execs never ran; replica log:\n{}", stack.replica.log());
    let probe = Instant::now();
    let refused = stack
        .client(TRUSTED)
        .exec(exec_request(&first.workspace_id, "true"))
        .await
        .expect_err("a third concurrent exec ran");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(probe.elapsed() < Duration::from_secs(5), "the refusal waited {:?}", probe.elapsed());
    assert!(refused.message().contains("--max-execs-per-user"), "{}", refused.message());
    std::fs::write(&hold, b"").unwrap();
    for exec in running {
        assert_eq!(exec.await.unwrap().unwrap(), 0);
    }
    std::fs::remove_file(&hold).ok();
    for path in &started {
        std::fs::remove_file(path).ok();
    }
    let admitted = stack.client(TRUSTED).exec(exec_request(&first.workspace_id, "true")).await.unwrap();
    assert_eq!(admitted.into_inner().exit_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn specs_and_execs_over_a_ceiling_are_refused_and_zero_is_the_default() {
    let stack = Stack::start(
        &[],
        &[
            "--backend",
            "local",
            "--allow-unsandboxed",
            "--ceiling-memory-bytes",
            "1073741824",
            "--ceiling-exec-timeout",
            "5s",
            "--default-exec-timeout",
            "1s",
        ],
    )
    .await;
    let greedy = v1::CreateSessionRequest {
        agent_id: "greedy".into(),
        spec: Some(v1::WorkspaceSpec { memory_bytes: 2 << 30, ..Default::default() }),
        ..Default::default()
    };
    let (refused, _) = retry_transient(Duration::from_secs(20), || {
        let mut client = stack.client(TRUSTED);
        let request = greedy.clone();
        async move { client.create_session(request).await }
    })
    .await;
    let refused = refused.expect_err("a spec over the memory ceiling was provisioned");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    for needle in ["memory bytes", "2147483648", "1073741824", "--ceiling-memory-bytes"] {
        assert!(refused.message().contains(needle), "{needle:?} missing: {}", refused.message());
    }
    let node_data = stack.dir.path().join("node");
    assert!(
        berth_tests::cluster::workspace_dirs_in(&node_data).is_empty(),
        "the refused workspace exists on the node's disk"
    );

    let session = stack.session(TRUSTED, "modest", "").await.unwrap();
    let mut long = exec_request(&session.workspace_id, "true");
    long.timeout_ms = 6_000;
    let refused = stack.client(TRUSTED).exec(long).await.expect_err("a timeout over the ceiling ran");
    assert_eq!(refused.code(), Code::InvalidArgument, "{refused:?}");
    assert!(refused.message().contains("--ceiling-exec-timeout"), "{}", refused.message());
    // No timeout named: the operator's 1 s default, not the contract's 60 s.
    let mut unnamed = exec_request(&session.workspace_id, "sleep 30");
    unnamed.timeout_ms = 0;
    let started = Instant::now();
    let ran = stack.client(TRUSTED).exec(unnamed).await.unwrap().into_inner();
    assert!(ran.timed_out, "{ran:?}");
    assert!(started.elapsed() < Duration::from_secs(10), "the default timeout did not apply: {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_up_with_tokens_offers_local_only_with_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(&tokens, TOKENS).unwrap();
    let args: Vec<String> = [
        "up",
        "--data-dir",
        &dir.path().join("data").display().to_string(),
        "--auth",
        "token",
        "--tokens-file",
        &tokens.display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    let up = BerthProcess::spawn("up-tokens", args, "info").unwrap();
    let exited = wait_until(Duration::from_secs(20), || async { !up.is_running() }).await;
    let log = up.log();
    assert!(exited, "berth up --auth token offered local without --allow-unsandboxed; log:\n{log}");
    assert!(log.contains("--allow-unsandboxed"), "the refusal must name the flag; log:\n{log}");
}
