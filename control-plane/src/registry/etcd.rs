//! The production registry on etcd (`etcd-client`).
//!
//! Every call goes through [`call::with_retries`]: one overall deadline (`call_timeout`),
//! retries with jittered backoff on transient failures, and error mapping in one place.
//! Durability is etcd's; this type holds no state of its own except a cache of open
//! keep-alive streams, which is only an optimisation (a missing or broken entry is reopened).

mod call;
mod convert;
mod watch;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Client, CompactionOptions, ConnectOptions, GetOptions, KvClient, LeaseKeepAliveStream, LeaseKeeper, WatchClient,
    WatchOptions,
};

use self::call::{AttemptError, CallPolicy, ErrorContext, Retry, with_retries};
use crate::registry::{
    KeyValue, LeaseId, RangeResponse, Registry, RegistryError, Result, Txn, TxnResponse, WatchStream,
};

/// Open keep-alive streams kept beyond this many are closed after use instead of cached, so
/// leases that are abandoned without a revoke cannot pile up streams.
const MAX_CACHED_KEEPERS: usize = 1024;

/// The largest etcd response a replica decodes. A listing's pages are sized to about
/// `view::LIST_PAGE_BYTES`, but the first page (1000 records) is sized before any record
/// is seen, and a whole-prefix range is as large as the prefix; etcd itself sends up to
/// 2 GiB.
const MAX_RESPONSE_BYTES: usize = 256 * 1024 * 1024;

#[derive(Clone, Debug)]
pub struct EtcdConfig {
    /// Client URLs of the cluster members, e.g. `http://127.0.0.1:2379`.
    pub endpoints: Vec<String>,
    /// Deadline of one registry call, retries included.
    pub call_timeout: Duration,
    /// Deadline for establishing the client at `connect`.
    pub connect_timeout: Duration,
    /// TLS towards `https://` endpoints: the CA of etcd's server certificates and, for
    /// etcd's `--client-cert-auth`, this replica's client certificate (`--etcd-ca`,
    /// `--etcd-cert`, `--etcd-key`).
    pub tls: Option<berth_proto::tls::ClientTls>,
    /// etcd authentication: user name and password (`--etcd-user`, `--etcd-password-file`).
    pub user: Option<(String, berth_proto::auth::Secret)>,
}

impl Default for EtcdConfig {
    fn default() -> Self {
        Self {
            endpoints: vec!["http://127.0.0.1:2379".into()],
            call_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(3),
            tls: None,
            user: None,
        }
    }
}

impl EtcdConfig {
    pub fn new(endpoints: impl IntoIterator<Item = impl Into<String>>) -> Self {
        Self { endpoints: endpoints.into_iter().map(Into::into).collect(), ..Self::default() }
    }

    pub fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(RegistryError::InvalidRequest("etcd config has no endpoints".into()));
        }
        if self.call_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(RegistryError::InvalidRequest("etcd timeouts must be positive".into()));
        }
        let https = self.endpoints.iter().filter(|endpoint| endpoint.starts_with("https://")).count();
        if self.tls.is_some() && https != self.endpoints.len() {
            return Err(RegistryError::InvalidRequest(
                "with etcd TLS (--etcd-ca) every etcd endpoint must be an https:// URL".into(),
            ));
        }
        if self.tls.is_none() && https > 0 {
            return Err(RegistryError::InvalidRequest(
                "https:// etcd endpoints need the CA of etcd's certificates (--etcd-ca)".into(),
            ));
        }
        Ok(())
    }
}

/// One open keep-alive stream: a request sender and its response stream. Used by one call at
/// a time (it is taken out of the cache while in use), so responses match requests.
struct Keeper {
    requests: LeaseKeeper,
    responses: LeaseKeepAliveStream,
}

pub struct EtcdRegistry {
    client: Client,
    policy: CallPolicy,
    keepers: Mutex<HashMap<LeaseId, Keeper>>,
}

impl EtcdRegistry {
    /// A KV client that decodes responses up to [`MAX_RESPONSE_BYTES`]: a page of records
    /// (or a whole-prefix range) is as large as its records make it, and gRPC's default
    /// 4 MiB limit refused a page of 1000 records of 4 KiB or more (a spec with a big env),
    /// which kept a replica from listing its registry and so from starting.
    fn kv(&self) -> KvClient {
        self.client.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// A watch client under the same limit (a watch catching up may batch many events).
    fn watches(&self) -> WatchClient {
        self.client.watch_client().max_decoding_message_size(MAX_RESPONSE_BYTES)
    }

    /// Connects and checks that the cluster answers a linearizable read, so a replica with
    /// a wrong endpoint fails at start instead of at its first request.
    pub async fn connect(config: EtcdConfig) -> Result<Arc<Self>> {
        config.validate()?;
        let mut options = ConnectOptions::new()
            .with_connect_timeout(config.connect_timeout)
            // HTTP/2 pings find a dead peer under an otherwise idle watch stream.
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5))
            // `hasleader: true` on every call: a member cut off from the majority refuses
            // calls and, after a few election timeouts, ends its watches, instead of
            // answering from its frozen state (issue 13, finding 6).
            .with_require_leader(true);
        if let Some(tls) = &config.tls {
            let tls = tls.config().map_err(|error| RegistryError::InvalidRequest(format!("etcd tls: {error}")))?;
            options = options.with_tls(tls);
        }
        if let Some((user, password)) = &config.user {
            // The client authenticates at connect and again whenever etcd refuses its token:
            // tokens expire, and a member that restarted has forgotten every token it knew.
            options = options.with_user(user.clone(), password.expose().to_owned()).with_auto_token_refresh(true);
        }
        let client = tokio::time::timeout(config.connect_timeout, Client::connect(&config.endpoints, Some(options)))
            .await
            .map_err(|_| RegistryError::Timeout {
                operation: "connect",
                millis: u64::try_from(config.connect_timeout.as_millis()).unwrap_or(u64::MAX),
            })?
            .map_err(|error| call::map_error(error, ErrorContext::default()))?;
        let registry = Arc::new(Self {
            client,
            policy: CallPolicy::new(config.call_timeout),
            keepers: Mutex::new(HashMap::new()),
        });
        registry.get("/berth-connect-probe").await?;
        Ok(registry)
    }

    /// Compacts etcd's history up to `revision` (waits until it is applied). For tests and
    /// operators; replicas never compact.
    pub async fn compact(&self, revision: i64) -> Result<()> {
        let context = ErrorContext { revision, ..ErrorContext::default() };
        with_retries(self.policy, "compact", Retry::Idempotent, context, || {
            let mut kv = self.kv();
            async move {
                kv.compact(revision, Some(CompactionOptions::new().with_physical())).await?;
                Ok(())
            }
        })
        .await
    }

    fn take_keeper(&self, lease: LeaseId) -> Option<Keeper> {
        self.keepers.lock().unwrap_or_else(PoisonError::into_inner).remove(&lease)
    }

    fn return_keeper(&self, lease: LeaseId, keeper: Keeper) {
        let mut keepers = self.keepers.lock().unwrap_or_else(PoisonError::into_inner);
        if keepers.len() < MAX_CACHED_KEEPERS {
            keepers.insert(lease, keeper);
        }
    }

    /// One renewal over a cached or new keep-alive stream. The stream is out of the cache
    /// while in use, so a call cancelled between request and response (timeout) drops it
    /// instead of leaving an unread response for the next caller.
    async fn renew_once(&self, lease: LeaseId) -> std::result::Result<Duration, AttemptError> {
        let mut keeper = match self.take_keeper(lease) {
            Some(keeper) => keeper,
            None => {
                // Opening the stream already renews once and fails with "lease not found"
                // for a missing lease; the second renewal below reads the TTL.
                let (requests, responses) = self.client.lease_client().keep_alive(lease).await?;
                Keeper { requests, responses }
            }
        };
        keeper.requests.keep_alive().await?;
        match keeper.responses.message().await? {
            Some(response) if response.ttl() > 0 => {
                let ttl = Duration::from_secs(response.ttl().unsigned_abs());
                self.return_keeper(lease, keeper);
                Ok(ttl)
            }
            // etcd answers a renewal of a missing lease with TTL 0.
            Some(_) => Err(RegistryError::LeaseNotFound(lease).into()),
            None => Err(AttemptError::Transient("etcd closed the keep-alive stream".into())),
        }
    }
}

#[async_trait]
impl Registry for EtcdRegistry {
    fn name(&self) -> &'static str {
        "etcd"
    }

    async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        with_retries(self.policy, "get", Retry::Idempotent, ErrorContext::default(), || {
            let mut kv = self.kv();
            async move {
                let response = kv.get(key, None).await?;
                Ok(response.kvs().first().map(convert::key_value).transpose()?)
            }
        })
        .await
    }

    async fn range_page(&self, prefix: &str, after: &str, limit: usize) -> Result<RangeResponse> {
        let start = convert::page_start(prefix, after);
        let end = convert::prefix_end(prefix.as_bytes());
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        with_retries(self.policy, "range", Retry::Idempotent, ErrorContext::default(), || {
            let mut kv = self.kv();
            // etcd returns keys in ascending order without a sort option, and applies the
            // limit in that order.
            let options = GetOptions::new().with_range(end.clone()).with_limit(limit);
            let start = start.clone();
            async move {
                let response = kv.get(start, Some(options)).await?;
                let kvs = response.kvs().iter().map(convert::key_value).collect::<Result<Vec<_>>>()?;
                let revision = convert::header_revision(response.header())?;
                Ok(RangeResponse { kvs, revision })
            }
        })
        .await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResponse> {
        let retry = if convert::is_read_only(&txn) { Retry::Idempotent } else { Retry::OnlyUndelivered };
        let context = ErrorContext { lease: convert::first_lease(&txn), ..ErrorContext::default() };
        let request = convert::txn(&txn);
        with_retries(self.policy, "txn", retry, context, || {
            let mut kv = self.kv();
            let request = request.clone();
            async move {
                let response = kv.txn(request).await?;
                Ok(convert::txn_response(&response)?)
            }
        })
        .await
    }

    async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId> {
        // Whole seconds, rounded up; etcd raises it to its own minimum (2 s for 3.4 defaults).
        let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let seconds = i64::try_from(seconds.max(1)).unwrap_or(i64::MAX);
        with_retries(self.policy, "grant_lease", Retry::Idempotent, ErrorContext::default(), || {
            let mut leases = self.client.lease_client();
            async move {
                let response = leases.grant(seconds, None).await?;
                if !response.error().is_empty() {
                    return Err(RegistryError::Other(format!("lease grant refused: {}", response.error())).into());
                }
                Ok(response.id())
            }
        })
        .await
    }

    async fn keep_alive(&self, lease: LeaseId) -> Result<Duration> {
        let context = ErrorContext { lease, ..ErrorContext::default() };
        with_retries(self.policy, "keep_alive", Retry::Idempotent, context, || self.renew_once(lease)).await
    }

    async fn revoke_lease(&self, lease: LeaseId) -> Result<()> {
        // Close the cached stream; the lease is going away either way.
        drop(self.take_keeper(lease));
        let context = ErrorContext { lease, ..ErrorContext::default() };
        let revoked = with_retries(self.policy, "revoke_lease", Retry::Idempotent, context, || {
            let mut leases = self.client.lease_client();
            async move {
                leases.revoke(lease).await?;
                Ok(())
            }
        })
        .await;
        match revoked {
            // Revoking a missing lease is not an error (a retry may find it already gone).
            Ok(()) | Err(RegistryError::LeaseNotFound(_)) => Ok(()),
            Err(error) => Err(error),
        }
    }

    async fn watch_prefix(&self, prefix: &str, start_revision: i64) -> Result<WatchStream> {
        self.open_watch(prefix, start_revision, None).await
    }

    /// etcd's own progress: the watch asks for progress notifications, and requests one
    /// every `progress_interval`; with require-leader, a member without a leader cancels
    /// the watch rather than vouch for a frozen state.
    async fn watch_prefix_with_progress(
        &self,
        prefix: &str,
        start_revision: i64,
        progress_interval: Duration,
    ) -> Result<WatchStream> {
        self.open_watch(prefix, start_revision, Some(progress_interval)).await
    }
}

impl EtcdRegistry {
    async fn open_watch(&self, prefix: &str, start_revision: i64, progress: Option<Duration>) -> Result<WatchStream> {
        let state = with_retries(
            self.policy,
            "watch",
            Retry::Idempotent,
            ErrorContext { revision: start_revision, ..ErrorContext::default() },
            || {
                let mut watches = self.watches();
                async move {
                    let mut options = WatchOptions::new().with_prefix().with_start_revision(start_revision.max(0));
                    if progress.is_some() {
                        options = options.with_progress_notify();
                    }
                    let mut stream = watches.watch(prefix, Some(options)).await?;
                    // Wait for "created": only then is a watch "from now" registered, so every
                    // write that starts after this call returns is seen.
                    let created = stream
                        .message()
                        .await?
                        .ok_or_else(|| AttemptError::Transient("etcd closed the watch before creating it".into()))?;
                    let mut state = watch::WatchState::new(stream, start_revision, progress);
                    state.absorb(&created);
                    Ok(state)
                }
            },
        )
        .await?;
        Ok(state.into_stream())
    }
}
