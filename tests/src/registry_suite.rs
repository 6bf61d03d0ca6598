//! Conformance suite every `Registry` implementation passes (`registry_suite!`).
//!
//! ```text
//! berth_tests::registry_suite!(embedded, async {
//!     berth_control_plane::registry::embedded::EmbeddedRegistry::new()
//! });
//! ```
//!
//! The second argument is an expression of type `impl Future<Output = F>` where
//! `F: RegistryFixture` (implemented for `Arc<EmbeddedRegistry>` and `Arc<EtcdRegistry>`); it
//! is evaluated once per test. The macro expands to a module with one `#[tokio::test]` per
//! behaviour, so the calling crate needs `tokio` (with `macros` and `rt-multi-thread`).
//!
//! Every case works under its own random key prefix, so any number of cases (and test
//! binaries) can share one etcd. Compaction is global, though: the one case that compacts
//! runs exclusively, the others hold a shared guard (see [`HISTORY`]). Every await is under
//! a deadline, so a broken implementation fails with a message instead of hanging.

mod case;
mod kv;
mod lease;
mod txn;
mod watch;

pub use self::case::*;
pub use self::kv::*;
pub use self::lease::*;
pub use self::txn::*;
pub use self::watch::*;

/// Expands to one `#[tokio::test]` per conformance case, in a module named `$module`.
/// `$fixture` is an expression of type `impl Future<Output = impl RegistryFixture>`.
#[macro_export]
macro_rules! registry_suite {
    ($module:ident, $fixture:expr $(,)?) => {
        mod $module {
            #[allow(unused_imports)]
            use super::*;

            async fn fixture() -> impl $crate::registry_suite::RegistryFixture {
                $fixture.await
            }

            $crate::registry_suite!(@cases run_shared:
                put_get_delete,
                key_metadata_tracks_writes,
                range_is_sorted_and_pages,
                a_page_of_large_records_is_returned_whole,
                revisions_strictly_increase,
                create_if_absent_creates_once,
                create_if_absent_race_has_one_winner,
                txn_fencing_with_lock_create_revision,
                txn_mod_revision_compare,
                txn_compare_operators,
                txn_failure_branch_get,
                txn_is_atomic,
                txn_put_on_missing_lease_fails,
                lease_expiry_deletes_keys,
                lease_keep_alive_extends_past_ttl,
                lease_revoke_deletes_keys_now,
                keep_alive_on_missing_lease_fails,
                put_without_lease_detaches_key,
                watch_sees_prefix_puts_and_deletes_in_order,
                watch_groups_txn_events,
                watch_replays_from_start_revision,
                watch_from_now_skips_history,
                watch_reports_lease_expiry,
                watch_concurrent_writers_exactly_once,
            );
            $crate::registry_suite!(@cases run_exclusive:
                watch_from_compacted_revision_fails,
            );
        }
    };
    (@cases $runner:ident: $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                $crate::registry_suite::$runner(
                    fixture().await,
                    stringify!($case),
                    $crate::registry_suite::$case,
                )
                .await;
            }
        )*
    };
}
