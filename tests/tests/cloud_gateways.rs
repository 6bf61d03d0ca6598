//! Portable workspaces on cloud gateways (docs/design.md §4.7), with real replicas, real node
//! agents as gateways and each provider (an emulator where no real service runs here): a
//! workspace whose gateway is SIGKILLed is adopted by another gateway, found by its labels,
//! with its files; a storm of first sessions over three replicas makes one sandbox; idle
//! pauses and wake keeps the files; destroy leaves nothing labelled; the janitor removes an
//! orphan made behind Berth's back; two clusters sharing a provider never see each other's
//! sandboxes. Sandboxes are counted at the provider.
//!
//! `cloud_suite!(name, provider)` instantiates every case for one provider.

use std::sync::Arc;
use std::time::Duration;

use berth_proto::v1;
use berth_testkit::wait_until;
use berth_tests::berth::retry_transient;
use berth_tests::cloud::CloudProvider;
use berth_tests::cluster::{Cluster, ClusterConfig};

/// A cluster of `replicas` replicas and `gateways` gateways of `provider`, with a janitor
/// fast enough for a test.
async fn cluster(provider: &dyn CloudProvider, replicas: usize, gateways: usize) -> Cluster {
    let mut config = ClusterConfig::on_shared_etcd(replicas, gateways);
    config.node_flags = provider.node_flags();
    config.idle_ttl = "1h";
    // A data node's workspace would wait this long for its node; a portable one moves at once.
    config.lost_node_grace = "60s";
    config.replica_flags =
        vec!["--sandbox-janitor-grace".into(), "2s".into(), "--sandbox-janitor-interval".into(), "500ms".into()];
    Cluster::start(config).await.expect("cluster")
}

/// Retries transient failures (a gateway just died, a provider call being retried).
async fn session(cluster: &Cluster, replica: usize, user: &str) -> v1::Session {
    let server = &cluster.replicas[replica].server;
    let (session, _) = retry_transient(Duration::from_secs(60), || server.create_session(user, "agent")).await;
    session.unwrap_or_else(|status| panic!("create session: {status:?}\n{}", cluster.logs(30)))
}

pub async fn a_killed_gateway_s_workspace_is_adopted_by_another_with_its_files(provider: Arc<dyn CloudProvider>) {
    let cluster = cluster(provider.as_ref(), 2, 2).await;
    let workspace_id = session(&cluster, 0, "ada").await.workspace_id;
    let first = &cluster.replicas[0].server;
    first.write_file(&workspace_id, "notes/kept.txt", b"written before the gateway died").await.expect("write");
    let placed = first.get_workspace(&workspace_id).await.expect("get");
    let sandboxes = provider.sandboxes_of(&cluster.prefix, &workspace_id).await;
    assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");

    cluster.node(&placed.node_id).expect("gateway").server.kill();
    let second = &cluster.replicas[1].server;
    let (read, attempts) =
        retry_transient(Duration::from_secs(60), || second.read_file(&workspace_id, "notes/kept.txt")).await;
    assert_eq!(
        read.as_deref().ok(),
        Some(&b"written before the gateway died"[..]),
        "after the gateway died: {read:?}\n{}",
        cluster.logs(30)
    );
    let adopted = second.get_workspace(&workspace_id).await.expect("get");
    assert_ne!(adopted.node_id, placed.node_id, "still on the dead gateway: {adopted:?}");
    assert!(adopted.generation > placed.generation, "{adopted:?}");
    assert_eq!(adopted.origin(), v1::WorkspaceOrigin::Fresh, "the files came along: {adopted:?}");
    assert_eq!(adopted.origin_generation, placed.origin_generation, "{adopted:?}");
    assert_eq!(provider.sandboxes_of(&cluster.prefix, &workspace_id).await, sandboxes, "the same sandbox");
    println!("measured: adopted after {attempts} attempt(s)");
}

pub async fn a_storm_of_first_sessions_makes_one_sandbox(provider: Arc<dyn CloudProvider>) {
    const CALLS: usize = 300;
    let cluster = Arc::new(cluster(provider.as_ref(), 3, 2).await);
    let mut calls = Vec::with_capacity(CALLS);
    for call in 0..CALLS {
        let cluster = Arc::clone(&cluster);
        calls.push(tokio::spawn(async move { session(&cluster, call % 3, "storm").await.workspace_id }));
    }
    let mut ids = std::collections::BTreeSet::new();
    for call in calls {
        ids.insert(call.await.expect("call"));
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    let workspace_id = ids.into_iter().next().expect("one id");
    let sandboxes = provider.sandboxes_of(&cluster.prefix, &workspace_id).await;
    assert_eq!(sandboxes.len(), 1, "{CALLS} first sessions made {} sandboxes: {sandboxes:?}", sandboxes.len());
}

pub async fn idle_pauses_and_wake_keeps_the_files(provider: Arc<dyn CloudProvider>) {
    let cluster = cluster(provider.as_ref(), 1, 1).await;
    let workspace_id = session(&cluster, 0, "ida").await.workspace_id;
    let replica = &cluster.replicas[0].server;
    replica.write_file(&workspace_id, "kept.txt", b"before the pause").await.expect("write");
    let sandbox = provider.sandboxes_of(&cluster.prefix, &workspace_id).await.pop().expect("a sandbox");
    let close = v1::CloseWorkspaceRequest { workspace_id: workspace_id.clone(), destroy: false };
    replica.workspace_client().close_workspace(close).await.expect("close (idle)");
    assert!(provider.is_paused(&sandbox).await, "idle did not pause the sandbox");

    let (read, _) = retry_transient(Duration::from_secs(30), || replica.read_file(&workspace_id, "kept.txt")).await;
    assert_eq!(read.as_deref().ok(), Some(&b"before the pause"[..]), "{read:?}\n{}", cluster.logs(20));
    assert!(!provider.is_paused(&sandbox).await, "wake did not resume the sandbox");
    assert_eq!(provider.sandboxes_of(&cluster.prefix, &workspace_id).await, vec![sandbox]);
}

pub async fn destroy_leaves_nothing_labelled(provider: Arc<dyn CloudProvider>) {
    let cluster = cluster(provider.as_ref(), 1, 1).await;
    let workspace_id = session(&cluster, 0, "dee").await.workspace_id;
    let replica = &cluster.replicas[0].server;
    assert_eq!(provider.sandboxes_of(&cluster.prefix, &workspace_id).await.len(), 1);
    let close = v1::CloseWorkspaceRequest { workspace_id: workspace_id.clone(), destroy: true };
    replica.workspace_client().close_workspace(close).await.expect("destroy");
    let left = provider.sandboxes_of(&cluster.prefix, &workspace_id).await;
    assert!(left.is_empty(), "destroy left {left:?}");
}

pub async fn the_janitor_removes_an_orphan_made_behind_berths_back(provider: Arc<dyn CloudProvider>) {
    let cluster = cluster(provider.as_ref(), 1, 1).await;
    let kept = session(&cluster, 0, "kay").await.workspace_id;
    let orphan = "ws-made-behind-berths-back";
    provider.create_orphan(&cluster.prefix, orphan).await.expect("orphan");
    assert_eq!(provider.sandboxes_of(&cluster.prefix, orphan).await.len(), 1);
    let removed = wait_until(Duration::from_secs(30), || async {
        provider.sandboxes_of(&cluster.prefix, orphan).await.is_empty()
    })
    .await;
    assert!(removed, "the janitor left the orphan\n{}", cluster.logs(20));
    // The janitor logs once the provider's delete has returned: the sandbox can be gone
    // from the provider a moment before the line is in the log.
    let report = "removed a labelled sandbox without a workspace record";
    let reported = wait_until(Duration::from_secs(10), || async {
        cluster.replica_log_lines("replica-0", orphan).iter().any(|line| line.contains(report))
    })
    .await;
    assert!(reported, "the janitor did not report it: {:?}", cluster.replica_log_lines("replica-0", orphan));
    assert_eq!(provider.sandboxes_of(&cluster.prefix, &kept).await.len(), 1, "the janitor removed a live sandbox");
}

pub async fn two_clusters_on_one_provider_never_see_each_other(provider: Arc<dyn CloudProvider>) {
    let first = cluster(provider.as_ref(), 1, 1).await;
    let second = cluster(provider.as_ref(), 1, 1).await;
    // The same user and agent: the same workspace id in both clusters.
    let in_first = session(&first, 0, "twin").await.workspace_id;
    let in_second = session(&second, 0, "twin").await.workspace_id;
    assert_eq!(in_first, in_second);
    first.replicas[0].server.write_file(&in_first, "whose.txt", b"first").await.expect("write");
    second.replicas[0].server.write_file(&in_second, "whose.txt", b"second").await.expect("write");
    assert_eq!(provider.sandboxes_of(&first.prefix, &in_first).await.len(), 1);
    assert_eq!(provider.sandboxes_of(&second.prefix, &in_second).await.len(), 1);
    // Each janitor removes an orphan of its own cluster, made after the twins: it has then
    // seen the twins past its grace too, and must have left the other cluster's alone.
    for cluster in [&first, &second] {
        let orphan = format!("ws-orphan-of-{}", cluster.prefix.trim_start_matches('/'));
        provider.create_orphan(&cluster.prefix, &orphan).await.expect("orphan");
        let removed = wait_until(Duration::from_secs(30), || async {
            provider.sandboxes_of(&cluster.prefix, &orphan).await.is_empty()
        })
        .await;
        assert!(removed, "the janitor of {} left its orphan\n{}", cluster.prefix, cluster.logs(20));
    }
    assert_eq!(provider.sandboxes_of(&first.prefix, &in_first).await.len(), 1, "the other cluster removed it");
    assert_eq!(provider.sandboxes_of(&second.prefix, &in_second).await.len(), 1, "the other cluster removed it");
    let read = first.replicas[0].server.read_file(&in_first, "whose.txt").await.expect("read");
    assert_eq!(read, b"first");
    let read = second.replicas[0].server.read_file(&in_second, "whose.txt").await.expect("read");
    assert_eq!(read, b"second");
    // Deleting in one cluster leaves the other's sandbox.
    let close = v1::CloseWorkspaceRequest { workspace_id: in_first.clone(), destroy: true };
    first.replicas[0].server.workspace_client().close_workspace(close).await.expect("destroy");
    assert!(provider.sandboxes_of(&first.prefix, &in_first).await.is_empty());
    assert_eq!(provider.sandboxes_of(&second.prefix, &in_second).await.len(), 1);
}

/// Every case for one provider: `cloud_suite!(e2b, async { Arc::new(E2bProvider::start().await?) })`.
macro_rules! cloud_suite {
    ($name:ident, $provider:expr) => {
        mod $name {
            use super::*;

            async fn provider() -> Arc<dyn CloudProvider> {
                let started: anyhow::Result<Arc<dyn CloudProvider>> = $provider.await;
                started.expect("start the provider")
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_killed_gateway_s_workspace_is_adopted_by_another_with_its_files() {
                super::a_killed_gateway_s_workspace_is_adopted_by_another_with_its_files(provider().await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn a_storm_of_first_sessions_makes_one_sandbox() {
                super::a_storm_of_first_sessions_makes_one_sandbox(provider().await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn idle_pauses_and_wake_keeps_the_files() {
                super::idle_pauses_and_wake_keeps_the_files(provider().await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn destroy_leaves_nothing_labelled() {
                super::destroy_leaves_nothing_labelled(provider().await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn the_janitor_removes_an_orphan_made_behind_berths_back() {
                super::the_janitor_removes_an_orphan_made_behind_berths_back(provider().await).await;
            }
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn two_clusters_on_one_provider_never_see_each_other() {
                super::two_clusters_on_one_provider_never_see_each_other(provider().await).await;
            }
        }
    };
}

cloud_suite!(e2b, async { Ok(Arc::new(berth_tests::cloud::E2bProvider::start().await?) as Arc<dyn CloudProvider>) });
cloud_suite!(opensandbox, async {
    Ok(Arc::new(berth_tests::cloud::OpenSandboxProvider::start().await?) as Arc<dyn CloudProvider>)
});
cloud_suite!(daytona, async {
    Ok(Arc::new(berth_tests::cloud::DaytonaProvider::start().await?) as Arc<dyn CloudProvider>)
});
cloud_suite!(kubernetes, async {
    Ok(Arc::new(berth_tests::cloud::KubernetesProvider::start().await?) as Arc<dyn CloudProvider>)
});
