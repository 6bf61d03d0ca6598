//! The Daytona driver against the emulator: labels, adoption by a second gateway with the
//! files intact (and the labels rewritten), generation fencing, `fresh`, release → stop and
//! provision → start, destroy, cluster-prefix isolation, the janitor's listing with paging,
//! error mapping under injected faults.

mod common;

use std::time::Duration;

use berth_backend_daytona::{CLUSTER, DaytonaDriver, GENERATION, OWNER, WORKSPACE_ID};
use berth_daytona_emulator::{EmulatorConfig, Fault, FaultTarget};
use berth_testkit::{assert_err, read, rel, sh, write};
use berth_workspace::backend::{BackendRef, ExecSpec};
use berth_workspace::driver::BackendDriver;
use berth_workspace::error::WorkspaceError;

use common::{Provider, prefix, provision, workspace_id};

/// The one sandbox a driver's cluster holds.
async fn only_sandbox(driver: &DaytonaDriver) -> String {
    let listed = driver.list_labelled().await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    listed[0].provider_id.clone()
}

async fn exec(backend: &BackendRef, script: &str) -> berth_workspace::error::Result<String> {
    let output = backend.exec(&ExecSpec::new(vec!["sh".into(), "-c".into(), script.into()])).await?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_writes_the_labels() {
    let provider = Provider::start().await;
    let cluster = prefix();
    let driver = provider.driver(&cluster);
    let id = workspace_id("meta");
    let backend = provision(&driver, &id, 7, true).await.unwrap();
    let sandbox = only_sandbox(&driver).await;
    let metadata = provider.emulator.labels(&sandbox).unwrap();
    assert_eq!(metadata.get(WORKSPACE_ID).map(String::as_str), Some(id.as_str()));
    assert_eq!(metadata.get(GENERATION).map(String::as_str), Some("7"));
    assert_eq!(metadata.get(OWNER).map(String::as_str), Some("alice"));
    assert_eq!(metadata.get(CLUSTER).map(String::as_str), Some(cluster.as_str()));
    assert!(driver.portable());
    assert!(driver.is_running(&id).await);
    // A restarted gateway (no handles) finds it by its labels.
    assert!(provider.driver(&cluster).is_running(&id).await);
    assert!(!provider.driver(&prefix()).is_running(&id).await, "another cluster sees it");
    // The workspace root exists and is the exec cwd.
    assert!(exec(&backend, "pwd").await.unwrap().trim_end().ends_with("/workspace"));
    let labelled = driver.list_labelled().await.unwrap();
    assert_eq!(labelled[0].workspace_id.as_ref(), Some(&id));
    assert_eq!(labelled[0].generation, 7);
    assert!(labelled[0].created_at_ms > 0);
}

/// A workspace's `network` decides `networkBlockAll`: egress blocked unless the spec asks
/// for network (Daytona's own default would be open).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_is_blocked_unless_the_spec_asks_for_network() {
    let provider = Provider::start().await;
    for network in [false, true] {
        let driver = provider.driver(&prefix());
        let spec = berth_workspace::WorkspaceSpec { network, ..Default::default() };
        berth_testkit::provision_as_alice(&driver, &workspace_id("net"), 1, true, &spec).await.unwrap();
        let sandbox = only_sandbox(&driver).await;
        assert_eq!(provider.emulator.network_blocked(&sandbox), Some(!network), "network: {network}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_gateway_adopts_with_the_files_and_fences_the_old_one() {
    let provider = Provider::start().await;
    let cluster = prefix();
    let (gateway_a, gateway_b) = (provider.driver(&cluster), provider.driver(&cluster));
    let id = workspace_id("adopt");
    let old = provision(&gateway_a, &id, 5, true).await.unwrap();
    write(&*old, "notes/kept.txt", b"survives adoption").await;
    let sandbox = only_sandbox(&gateway_a).await;

    let new = provision(&gateway_b, &id, 9, false).await.unwrap();
    assert_eq!(only_sandbox(&gateway_b).await, sandbox, "adoption made another sandbox");
    // The adoption rewrote the labels: the janitor sees the new generation.
    assert_eq!(provider.emulator.labels(&sandbox).unwrap().get(GENERATION).map(String::as_str), Some("9"));
    assert_eq!(read(&*new, "notes/kept.txt").await.unwrap(), b"survives adoption");
    assert_eq!(exec(&new, "cat notes/kept.txt").await.unwrap(), "survives adoption");

    // The superseded gateway's handle is refused for every mutating call.
    assert_err!(
        old.write_bytes(&rel("x"), bytes::Bytes::from_static(b"x"), 0o644).await,
        WorkspaceError::SandboxFenced { held: 9, asked: 5, .. }
    );
    assert_err!(
        old.exec(&ExecSpec::new(vec!["true".into()])).await,
        WorkspaceError::SandboxFenced { held: 9, asked: 5, .. }
    );
    assert_err!(old.remove(&rel("notes"), true).await, WorkspaceError::SandboxFenced { .. });
    assert_err!(old.mkdir(&rel("d"), true).await, WorkspaceError::SandboxFenced { .. });
    // And its own provision at the old generation too.
    assert_err!(
        provision(&gateway_a, &id, 5, false).await.map(|_| ()),
        WorkspaceError::SandboxFenced { held: 9, asked: 5, .. }
    );
    assert_eq!(read(&*new, "notes/kept.txt").await.unwrap(), b"survives adoption");
    gateway_a.forget(&id).await.unwrap();
    // Provisioning the same generation again is idempotent.
    let again = provision(&gateway_b, &id, 9, false).await.unwrap();
    assert_eq!(read(&*again, "notes/kept.txt").await.unwrap(), b"survives adoption");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fresh_never_adopts() {
    let provider = Provider::start().await;
    let driver = provider.driver(&prefix());
    let id = workspace_id("fresh");
    let first = provision(&driver, &id, 3, true).await.unwrap();
    write(&*first, "orphan.txt", b"old data").await;
    let orphan = only_sandbox(&driver).await;
    let second = provision(&driver, &id, 4, true).await.unwrap();
    let replacement = only_sandbox(&driver).await;
    assert_ne!(replacement, orphan, "a fresh placement adopted the orphan");
    assert_err!(read(&*second, "orphan.txt").await, WorkspaceError::NotFound { .. });
    assert!(!provider.emulator.sandbox_ids().contains(&orphan), "the orphan was not killed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_stops_and_provision_starts_with_the_files() {
    let provider = Provider::start().await;
    let driver = provider.driver(&prefix());
    let id = workspace_id("stop");
    let backend = provision(&driver, &id, 1, true).await.unwrap();
    write(&*backend, "data/state.json", b"{\"step\":3}").await;
    let sandbox = only_sandbox(&driver).await;
    driver.release(&id).await.unwrap();
    assert_eq!(provider.emulator.is_stopped(&sandbox).await, Some(true));
    assert!(!driver.is_running(&id).await);
    // A stopped sandbox serves nothing.
    assert_err!(backend.exec(&ExecSpec::new(vec!["true".into()])).await, WorkspaceError::BackendUnavailable { .. });
    driver.release(&id).await.unwrap();
    let resumed = provision(&driver, &id, 2, false).await.unwrap();
    assert_eq!(provider.emulator.is_stopped(&sandbox).await, Some(false));
    assert_eq!(only_sandbox(&driver).await, sandbox);
    assert_eq!(read(&*resumed, "data/state.json").await.unwrap(), b"{\"step\":3}");
    assert_eq!(exec(&resumed, "cat data/state.json").await.unwrap(), "{\"step\":3}");
    assert!(driver.is_running(&id).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_leaves_nothing_labelled() {
    let provider = Provider::start().await;
    let driver = provider.driver(&prefix());
    let id = workspace_id("destroy");
    provision(&driver, &id, 1, true).await.unwrap();
    driver.destroy(&id).await.unwrap();
    assert!(driver.list_labelled().await.unwrap().is_empty());
    assert!(provider.emulator.sandbox_ids().is_empty());
    // Safe on an id with nothing.
    driver.destroy(&id).await.unwrap();
    driver.release(&id).await.unwrap();
    assert!(!driver.is_running(&id).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_prefixes_never_see_each_other() {
    let provider = Provider::start().await;
    let (first, second) = (provider.driver(&prefix()), provider.driver(&prefix()));
    let id = workspace_id("shared-id");
    let in_first = provision(&first, &id, 1, true).await.unwrap();
    let in_second = provision(&second, &id, 1, true).await.unwrap();
    write(&*in_first, "who", b"first").await;
    write(&*in_second, "who", b"second").await;
    let (sandbox_first, sandbox_second) = (only_sandbox(&first).await, only_sandbox(&second).await);
    assert_ne!(sandbox_first, sandbox_second);
    // A fresh placement, a destroy and the janitor of one cluster leave the other alone.
    let again = provision(&first, &id, 2, true).await.unwrap();
    assert_err!(read(&*again, "who").await, WorkspaceError::NotFound { .. });
    first.destroy(&id).await.unwrap();
    for sandbox in first.list_labelled().await.unwrap() {
        first.remove_labelled(&sandbox).await.unwrap();
    }
    assert_eq!(only_sandbox(&second).await, sandbox_second);
    assert_eq!(read(&*in_second, "who").await.unwrap(), b"second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn janitor_lists_every_page_and_removes() {
    let provider = Provider::start().await;
    let cluster = prefix();
    let mut config = provider.config(&cluster);
    config.list_page_size = 2;
    let driver = DaytonaDriver::new(config).unwrap();
    let mut ids = Vec::new();
    for index in 0..5 {
        let id = workspace_id(&format!("page{index}"));
        provision(&driver, &id, 10 + index, true).await.unwrap();
        ids.push(id);
    }
    let listed = driver.list_labelled().await.unwrap();
    assert_eq!(listed.len(), 5, "{listed:?}");
    let mut listed_ids: Vec<String> =
        listed.iter().filter_map(|sandbox| sandbox.workspace_id.clone()).map(String::from).collect();
    listed_ids.sort();
    let mut expected: Vec<String> = ids.iter().cloned().map(String::from).collect();
    expected.sort();
    assert_eq!(listed_ids, expected);
    driver.remove_labelled(&listed[0]).await.unwrap();
    driver.remove_labelled(&listed[0]).await.unwrap();
    assert_eq!(driver.list_labelled().await.unwrap().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_errors_map_to_clear_statuses() {
    let provider =
        Provider::start_with(EmulatorConfig { max_started: Some(1), ..EmulatorConfig::for_test(common::API_KEY) })
            .await;
    let mut config = provider.config(&prefix());
    config.retry_deadline = Duration::from_secs(2);
    let driver = DaytonaDriver::new(config).unwrap();
    // 429 and 503 are retried within the deadline.
    provider.emulator.inject(Fault::new(FaultTarget::Api, 429, 2).on_path("/sandbox").on_method("POST"));
    provider.emulator.inject(Fault::new(FaultTarget::Api, 503, 2).on_path("/sandbox").on_method("GET"));
    let id = workspace_id("errors");
    let backend = provision(&driver, &id, 1, true).await.unwrap();
    assert_eq!(provider.emulator.faults_fired(), 4);
    // The toolbox's 503 on a command is retried too.
    provider.emulator.inject(Fault::new(FaultTarget::Envd, 503, 2).on_path("/toolbox/").on_method("POST"));
    write(&*backend, "f", b"x").await;
    // The organization's quota: one more started sandbox is refused (403, limit exceeded).
    assert_err!(
        provision(&driver, &workspace_id("second"), 1, true).await.map(|_| ()),
        WorkspaceError::ProviderQuota { .. }
    );
    // A refused key names its file.
    provider.emulator.inject(Fault::new(FaultTarget::Api, 401, 1).with_message("Invalid API key"));
    match provision(&driver, &id, 2, false).await {
        Err(WorkspaceError::ProviderAuth { credential, message, .. }) => {
            assert_eq!(credential, provider.key_file().display().to_string());
            assert!(message.contains("Invalid API key"), "{message}");
        }
        other => panic!("expected ProviderAuth, got {:?}", other.err()),
    }
    // A 500 that persists is unavailable, not retried past the deadline.
    provider.emulator.inject(Fault::new(FaultTarget::Api, 500, 1000).on_method("GET"));
    let started = std::time::Instant::now();
    assert_err!(driver.list_labelled().await, WorkspaceError::BackendUnavailable { .. });
    assert!(started.elapsed() < Duration::from_secs(10), "retried for {:?}", started.elapsed());
    // A wrong key file is refused when the driver is built.
    let mut config = provider.config("/x");
    config.api_key_file = provider.dir.path().join("missing.key");
    assert_err!(DaytonaDriver::new(config).map(|_| ()), WorkspaceError::ProviderAuth { .. });
    let _ = sh(&*backend, "true", &[]).await;
}
