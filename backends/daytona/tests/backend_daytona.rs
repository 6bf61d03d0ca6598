//! The backend and contract conformance suites on the Daytona backend, against the Daytona
//! emulator (tests/daytona-emulator): each test its own emulator and sandbox.
//!
//! Every case runs but two: the toolbox runs every command as the sandbox user, so the
//! backend refuses secret-holding processes (`Unsupported`) rather than run them with the
//! agent's uid. `mcp_stdio_secrets_stay_out_of_the_workspace` is replaced by
//! `secret_holders_are_refused`, which asserts that refusal, and `mcp_latency_report` (whose
//! second half starts a server with a secret) by `mcp_latency_without_secrets`.

mod common;

use std::time::{Duration, Instant};

use berth_features::mcp::McpServiceConfig;
use berth_testkit::assert_err;
use berth_testkit::contract::{echo_spec, mcp_harness};
use berth_workspace::backend::{SpawnRole, SpawnSpec};
use berth_workspace::error::WorkspaceError;

berth_testkit::backend_suite!(daytona, common::workspace());

mod daytona_contract {
    use super::common;

    async fn __berth_fixture() -> impl berth_testkit::BackendFixture {
        common::workspace().await
    }

    berth_testkit::__contract_suite_cases!(
        append_creates_and_appends,
        rename_never_replaces,
        symlink_created_inside,
        tree_upload_and_download,
        tree_hostile_corpus,
        skills_add_list_get_remove,
        skills_seeded_once,
        offload_context_appends_and_moves_payloads,
        offload_tool_results_never_overwrite,
        mcp_single_flight_crash_and_timeout,
        mcp_corrupt_config_is_reseeded,
        mcp_lru_cap_and_idle_timeout,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secret_holders_are_refused() {
    let workspace = common::workspace().await;
    let mut spec = SpawnSpec::new(vec!["env".into()]);
    spec.role = SpawnRole::SecretHolder;
    assert_err!(
        workspace.backend.spawn(&spec).await.map(|_| ()),
        WorkspaceError::Unsupported { backend: "daytona", .. }
    );
    let capabilities = workspace.backend.capabilities();
    assert!(capabilities.separate_stderr && capabilities.streaming_stdin);
}

/// `mcp_latency_report` without its secret-holder half: a first call (start, initialize,
/// call) and warm calls of the MCP fixture as a stdio server over the toolbox.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_latency_without_secrets() {
    let workspace = common::workspace().await;
    let harness = mcp_harness(&workspace, McpServiceConfig::default()).await;
    let (service, backend, ws) = (&harness.service, &harness.backend, &harness.workspace);
    service.add(&**backend, ws, &echo_spec("echo", &[]), false).await.unwrap();
    let arguments = || serde_json::json!({"text": "x"}).as_object().cloned().unwrap_or_default();
    let mut first = Vec::new();
    for _ in 0..5 {
        service.pool().forget_workspace(ws);
        let started = Instant::now();
        let output = service.call_tool(backend, ws, "echo", "echo", arguments(), None).await.unwrap();
        assert!(output.started);
        first.push(started.elapsed());
    }
    let mut warm = Vec::new();
    for _ in 0..100 {
        let started = Instant::now();
        service.call_tool(backend, ws, "echo", "echo", arguments(), None).await.unwrap();
        warm.push(started.elapsed());
    }
    let stats = |samples: &mut Vec<Duration>| {
        samples.sort();
        let pick = |quantile: f64| samples[((samples.len() - 1) as f64 * quantile) as usize];
        format!("p50 {:?} p90 {:?} max {:?}", pick(0.5), pick(0.9), pick(1.0))
    };
    println!(
        "MCP latency [daytona, emulated]: first call (n={}) {}; warm call (n={}) {}",
        first.len(),
        stats(&mut first),
        warm.len(),
        stats(&mut warm)
    );
    service.forget_workspace(ws, true).await.unwrap();
}
