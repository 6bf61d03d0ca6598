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

mod kv;
mod lease;
mod txn;
mod watch;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::RwLock;

use berth_control_plane::registry::embedded::EmbeddedRegistry;
use berth_control_plane::registry::etcd::EtcdRegistry;
use berth_control_plane::registry::{RegistryRef, Result, WatchEvent, WatchStream};

pub use self::kv::*;
pub use self::lease::*;
pub use self::txn::*;
pub use self::watch::*;

/// What the suite needs from an implementation under test.
#[async_trait]
pub trait RegistryFixture: Send + Sync + 'static {
    fn registry(&self) -> RegistryRef;
    /// Discards history before `revision`, as etcd's compaction does.
    async fn compact(&self, revision: i64) -> Result<()>;
}

#[async_trait]
impl RegistryFixture for Arc<EmbeddedRegistry> {
    fn registry(&self) -> RegistryRef {
        self.clone()
    }
    async fn compact(&self, revision: i64) -> Result<()> {
        EmbeddedRegistry::compact(self, revision).await
    }
}

#[async_trait]
impl RegistryFixture for Arc<EtcdRegistry> {
    fn registry(&self) -> RegistryRef {
        self.clone()
    }
    async fn compact(&self, revision: i64) -> Result<()> {
        EtcdRegistry::compact(self, revision).await
    }
}

/// Deadline of one registry call or one awaited event in a case.
pub const STEP: Duration = Duration::from_secs(10);
/// Deadline of a whole case.
pub const CASE_DEADLINE: Duration = Duration::from_secs(90);

/// Compaction discards history every other case may be replaying: the compacting case holds
/// this exclusively, every other case shares it. Per process, which is enough because test
/// binaries do not share an etcd.
pub static HISTORY: RwLock<()> = RwLock::const_new(());

/// What a case gets: the registry, the fixture, and a key prefix nobody else uses.
#[derive(Clone)]
pub struct Case {
    pub registry: RegistryRef,
    pub fixture: Arc<dyn RegistryFixture>,
    /// `/berth-suite/<case>/<random>/`; every key of the case starts with it.
    pub prefix: String,
}

impl Case {
    pub fn key(&self, name: &str) -> String {
        format!("{}{name}", self.prefix)
    }
}

/// Runs one case under the shared history guard.
pub async fn run_shared<F, C, Fut>(fixture: F, name: &'static str, case: C)
where
    F: RegistryFixture,
    C: FnOnce(Case) -> Fut,
    Fut: Future<Output = ()>,
{
    // May wait behind the exclusive case, which itself waits for running cases.
    let guard = tokio::time::timeout(CASE_DEADLINE * 2, HISTORY.read()).await;
    let _guard = guard.unwrap_or_else(|_| panic!("{name}: the exclusive case never finished"));
    run(fixture, name, case).await;
}

/// Runs one case that compacts, excluding every other case of this process.
pub async fn run_exclusive<F, C, Fut>(fixture: F, name: &'static str, case: C)
where
    F: RegistryFixture,
    C: FnOnce(Case) -> Fut,
    Fut: Future<Output = ()>,
{
    // Waits for running cases, each bounded by CASE_DEADLINE.
    let guard = tokio::time::timeout(CASE_DEADLINE * 2, HISTORY.write()).await;
    let _guard = guard.unwrap_or_else(|_| panic!("{name}: other cases never released history"));
    run(fixture, name, case).await;
}

async fn run<F, C, Fut>(fixture: F, name: &'static str, case: C)
where
    F: RegistryFixture,
    C: FnOnce(Case) -> Fut,
    Fut: Future<Output = ()>,
{
    let fixture: Arc<dyn RegistryFixture> = Arc::new(fixture);
    let context = Case {
        registry: fixture.registry(),
        fixture,
        prefix: format!("/berth-suite/{name}/{:016x}/", rand::random::<u64>()),
    };
    if tokio::time::timeout(CASE_DEADLINE, case(context)).await.is_err() {
        panic!("{name} did not finish within {CASE_DEADLINE:?}");
    }
}

/// Awaits `future` for at most [`STEP`], naming `what` on timeout.
pub async fn within<T>(what: &str, future: impl Future<Output = T>) -> T {
    match tokio::time::timeout(STEP, future).await {
        Ok(value) => value,
        Err(_) => panic!("{what} did not finish within {STEP:?}"),
    }
}

/// Awaits a registry call for at most [`STEP`] and expects success.
pub async fn ok<T>(what: &str, future: impl Future<Output = Result<T>>) -> T {
    match within(what, future).await {
        Ok(value) => value,
        Err(error) => panic!("{what} failed: {error}"),
    }
}

/// The next item of a watch, which must be a batch of events.
pub async fn next_batch(watch: &mut WatchStream, what: &str) -> Vec<WatchEvent> {
    match within(what, watch.next()).await {
        Some(Ok(batch)) => batch,
        Some(Err(error)) => panic!("{what}: watch failed: {error}"),
        None => panic!("{what}: watch ended"),
    }
}

pub use berth_testkit::wait_until as eventually;

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
