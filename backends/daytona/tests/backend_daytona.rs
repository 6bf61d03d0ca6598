//! The backend and contract conformance suites on the Daytona backend, against the Daytona
//! emulator (tests/daytona-emulator): each test its own emulator and sandbox.
//!
//! Every case runs but one: the toolbox runs every command as the sandbox user, so the
//! backend refuses secret-holding processes (`Unsupported`) rather than run them with the
//! agent's uid, and `mcp_stdio_secrets_stay_out_of_the_workspace` is replaced by
//! `secret_holders_are_refused`, which asserts that refusal.

mod common;

use berth_testkit::assert_err;
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
        mcp_latency_report,
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
