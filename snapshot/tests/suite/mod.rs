//! The conformance suite every `SnapshotStore` passes, store primitives and the engine on
//! top of them: `snapshot_store_suite!(dir, async { … Fixture … })`, one `#[tokio::test]`
//! per case. Each case gets a fresh fixture (its own directory, Redis key prefix or S3
//! prefix), so cases run in parallel and see only their own blobs.

#![allow(dead_code)]

pub mod cases;
pub mod tree;

use berth_snapshot::SnapshotStoreRef;

/// A store for one case, and whatever keeps it alive (a temp dir, a server process).
pub struct Fixture {
    pub store: SnapshotStoreRef,
    pub _guard: Box<dyn std::any::Any + Send>,
}

/// Expands to a module with one test per case of [`cases`].
#[macro_export]
macro_rules! snapshot_store_suite {
    ($module:ident, $fixture:expr $(,)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            async fn fixture() -> $crate::suite::Fixture {
                $fixture.await
            }

            $crate::snapshot_store_suite!(@cases
                blob_round_trip,
                put_is_idempotent,
                not_found_is_typed,
                invalid_names_refused,
                manifest_listing_and_deletes,
                large_blob_and_manifest,
                snapshot_restore_round_trip,
                incremental_uploads_only_changes,
                restore_replaces_target_atomically,
                concurrent_snapshots_of_two_workspaces,
                corrupt_blob_fails_naming_file_and_falls_back,
                missing_blob_fails_restore,
                hostile_manifest_paths_refused,
                symlinks_not_followed_and_specials_skipped,
                gc_removes_only_unreferenced_old_blobs,
                retention_prune_list_delete,
            );
        }
    };
    (@cases $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = fixture().await;
                let deadline = std::time::Duration::from_secs(120);
                tokio::time::timeout(deadline, $crate::suite::cases::$case(fixture.store.clone()))
                    .await
                    .unwrap_or_else(|_| panic!("{} did not finish within {deadline:?}", stringify!($case)));
                drop(fixture);
            }
        )*
    };
}
