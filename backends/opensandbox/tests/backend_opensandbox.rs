//! The opensandbox backend against the real `opensandbox-server` (Docker runtime) with the
//! execd stand-in: the conformance suites, each test in a sandbox of its own.

mod support;

use berth_backend_opensandbox::OpenSandboxDriver;
use berth_testkit::Fixture;
use berth_workspace::{ProvisionContext, WorkspaceId, WorkspaceSpec};

/// The suites plant files in `..` of the root, which must be private and writable: `/tmp`
/// of a sandbox of the test's own is.
const SUITE_ROOT: &str = "/tmp/ws";

async fn suite_fixture() -> Fixture<support::Cluster> {
    let cluster = support::Cluster::with_config(|config| config.workspace_dir = SUITE_ROOT.to_owned());
    let id = WorkspaceId::new("ws-suite").unwrap();
    let root = std::env::temp_dir();
    let backend = BackendOf(&cluster.driver)
        .provision(ProvisionContext::unplaced(&id, &root, &WorkspaceSpec::default()))
        .await
        .unwrap_or_else(|error| panic!("provision the suite's sandbox: {error}"));
    Fixture::new(backend, cluster)
}

struct BackendOf<'a>(&'a OpenSandboxDriver);

impl BackendOf<'_> {
    async fn provision(&self, context: ProvisionContext<'_>) -> berth_workspace::Result<berth_workspace::BackendRef> {
        berth_workspace::BackendDriver::provision(self.0, context).await
    }
}

berth_testkit::backend_suite!(opensandbox, suite_fixture());
berth_testkit::contract_suite!(opensandbox_contract, suite_fixture());
