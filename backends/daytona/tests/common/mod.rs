//! What the Daytona tests share: an emulator (tests/daytona-emulator) per test, a driver
//! pointed at it with an API key file of its own, and a provisioned workspace.

#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use berth_backend_daytona::{DaytonaConfig, DaytonaDriver};
use berth_daytona_emulator::{Emulator, EmulatorConfig};
use berth_workspace::backend::BackendRef;
use berth_workspace::id::WorkspaceId;
use berth_workspace::spec::WorkspaceSpec;

pub const API_KEY: &str = "daytona_test_key";

/// An emulator and a temp dir holding the API key file.
pub struct Provider {
    pub emulator: Emulator,
    pub dir: tempfile::TempDir,
}

impl Provider {
    pub async fn start() -> Self {
        Self::start_with(EmulatorConfig::for_test(API_KEY)).await
    }

    pub async fn start_with(config: EmulatorConfig) -> Self {
        let emulator = Emulator::start(config).await.expect("start the daytona emulator");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("daytona.key"), format!("{API_KEY}\n")).unwrap();
        Self { emulator, dir }
    }

    pub fn key_file(&self) -> PathBuf {
        self.dir.path().join("daytona.key")
    }

    /// A gateway's config for cluster `prefix`.
    pub fn config(&self, prefix: &str) -> DaytonaConfig {
        let mut config = DaytonaConfig::new(self.key_file(), prefix);
        config.api_url = self.emulator.api_url.clone();
        config.request_timeout = Duration::from_secs(30);
        config.retry_deadline = Duration::from_secs(5);
        config
    }

    pub fn driver(&self, prefix: &str) -> DaytonaDriver {
        DaytonaDriver::new(self.config(prefix)).expect("build the daytona driver")
    }
}

pub fn workspace_id(name: &str) -> WorkspaceId {
    WorkspaceId::new(format!("ws-{name}-{}", rand::random::<u32>())).unwrap()
}

pub fn prefix() -> String {
    format!("/berth-test-{}", rand::random::<u32>())
}

/// Provisions `id` at `generation`.
pub async fn provision(
    driver: &DaytonaDriver,
    id: &WorkspaceId,
    generation: u64,
    fresh: bool,
) -> berth_workspace::error::Result<BackendRef> {
    berth_testkit::provision_as_alice(driver, id, generation, fresh, &WorkspaceSpec::default()).await
}

/// A provisioned workspace and what keeps it alive.
pub struct Workspace {
    pub backend: BackendRef,
    pub driver: DaytonaDriver,
    pub provider: Provider,
}

impl berth_testkit::BackendFixture for Workspace {
    fn backend(&self) -> BackendRef {
        self.backend.clone()
    }
}

pub async fn workspace() -> Workspace {
    let provider = Provider::start().await;
    let driver = provider.driver(&prefix());
    let backend = provision(&driver, &workspace_id("suite"), 1, true).await.expect("provision");
    Workspace { backend, driver, provider }
}
