//! What every conformance case runs on: the fixture seam, the per-case key prefix, the
//! shared history guard and the deadline helpers the cases await with.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use tokio::sync::RwLock;

use berth_control_plane::registry::embedded::EmbeddedRegistry;
use berth_control_plane::registry::etcd::EtcdRegistry;
use berth_control_plane::registry::{RegistryRef, Result, WatchEvent, WatchStream};

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
