//! `watch_prefix_with_progress` on both registries: a quiet watch yields progress
//! notifications (empty batches) within a few intervals, and still delivers changes. The
//! view counts on these to know it is current (docs/design.md §4.1).

use std::time::Duration;

use berth_control_plane::registry::embedded::EmbeddedRegistry;
use berth_control_plane::registry::{RegistryRef, WatchEvent};
use bytes::Bytes;
use futures::StreamExt;

const INTERVAL: Duration = Duration::from_millis(200);

async fn progress_then_events(registry: RegistryRef) {
    let prefix = format!("/progress-{:x}/", rand::random::<u64>());
    let mut watch = registry.watch_prefix_with_progress(&prefix, 0, INTERVAL).await.expect("watch");
    // Two progress notifications on a quiet prefix, each well within a few intervals.
    for _ in 0..2 {
        let batch = tokio::time::timeout(INTERVAL * 10, watch.next()).await.expect("progress in time");
        assert_eq!(batch.expect("open").expect("no error"), Vec::<WatchEvent>::new());
    }
    let key = format!("{prefix}a");
    registry.put(&key, Bytes::from_static(b"1")).await.expect("put");
    let seen = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            let batch = watch.next().await.expect("open").expect("no error");
            if let Some(event) = batch.first() {
                return event.key().to_owned();
            }
        }
    })
    .await
    .expect("the put in time");
    assert_eq!(seen, key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_watch_with_progress_ticks_and_delivers() {
    progress_then_events(berth_tests::etcd::shared_registry().await).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_watch_with_progress_ticks_and_delivers() {
    progress_then_events(EmbeddedRegistry::new()).await;
}
