//! The composition root of a replica: `serve(listener, config, registry, shutdown)`.
//! `berth control-plane`, `berth up`, tests and benchmarks all call this.

use std::sync::Arc;
use std::time::Duration;

use berth_proto::v1::admin_service_server::AdminServiceServer;
use berth_proto::v1::contract_service_server::ContractServiceServer;
use berth_proto::v1::node_service_server::NodeServiceServer;
use berth_proto::v1::workspace_service_server::WorkspaceServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::{AuthLayer, Authenticator};
use crate::authz::Access;
use crate::binding::Binder;
use crate::config::ControlPlaneConfig;
use crate::forward::Forwarder;
use crate::heartbeat::HeartbeatService;
use crate::keys::Keys;
use crate::lease::ReplicaLease;
use crate::node_client::NodeClients;
use crate::passthrough::ReadFilePassthrough;
use crate::quota::UserQuotas;
use crate::records::{self, RECORD_VERSION, ReplicaRecord, now_ms};
use crate::registry::RegistryRef;
use crate::router::Router;
use crate::service::admin::AdminApi;
use crate::service::contract::ContractApi;
use crate::service::sessions::Sessions;
use crate::service::workspace::WorkspaceApi;
use crate::store::WorkspaceStore;
use crate::sweeper::Sweeper;
use crate::view::ReplicaView;

/// Serves one replica on `listener` until `shutdown` fires, then stops accepting, lets
/// in-flight calls finish (bounded), and revokes the replica lease so its locks and
/// leadership free up at once.
pub async fn serve(
    listener: TcpListener,
    mut config: ControlPlaneConfig,
    registry: RegistryRef,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    config.validate().map_err(ServeError::Config)?;
    // Every registry call of this replica is timed (etcd only; see `registry_metrics`).
    let registry = crate::registry_metrics::metered(registry);
    let local_address = listener.local_addr().map_err(ServeError::Io)?;
    config.check_listener(local_address).map_err(ServeError::Config)?;
    if config.advertise_address.is_empty() {
        let scheme = if config.tls.is_some() { "https" } else { "http" };
        config.advertise_address = format!("{scheme}://{local_address}");
    }
    let authenticator = Authenticator::from_config(&config.auth).map_err(ServeError::Config)?;
    let keys = Keys::new(&config.key_prefix);
    // Background tasks stop on `tasks`, which is cancelled only after the server drained.
    let tasks = CancellationToken::new();
    let replica_record = ReplicaRecord {
        version: RECORD_VERSION,
        replica_id: config.replica_id.clone(),
        address: config.advertise_address.clone(),
        started_at_ms: now_ms(),
    };
    let lease = ReplicaLease::start(
        Arc::clone(&registry),
        config.replica_lease_ttl,
        keys.replica(&config.replica_id),
        records::encode(&replica_record),
        tasks.clone(),
    )
    .await?;
    let view = ReplicaView::start(Arc::clone(&registry), &keys, tasks.clone()).await?;
    crate::metrics::describe();
    tokio::spawn(crate::metrics::publish_view_gauges(Arc::clone(&view), Duration::from_millis(500), tasks.clone()));
    if let Authenticator::Tokens(store) = &authenticator {
        store.reload_on_sighup(tasks.clone());
    }
    let nodes = Arc::new(NodeClients::new(config.node_auth(), config.node_tls.clone()).map_err(ServeError::Config)?);
    // One store owns the workspace records, sessions and bind locks; the binder, the router,
    // the handlers and the sweeper get it (or what they need of it) injected.
    let store = Arc::new(WorkspaceStore::new(
        Arc::clone(&registry),
        keys.clone(),
        Arc::clone(&view),
        Arc::clone(&lease),
        config.replica_id.clone(),
    ));
    let snapshots = Arc::new(
        crate::snapshots::Snapshots::open(config.snapshot_store.as_deref(), config.snapshot_keep)
            .map_err(ServeError::Config)?,
    );
    let binder = Arc::new(
        Binder::new(Arc::clone(&store), Arc::clone(&view), Arc::clone(&nodes), config.clone())
            .with_snapshots(Arc::clone(&snapshots)),
    );
    let router =
        Arc::new(Router::new(Arc::clone(&binder), Arc::clone(&store), Arc::clone(&nodes), config.view_max_staleness));
    let quotas = Arc::new(UserQuotas::new(config.max_workspaces_per_user, config.max_execs_per_user));
    let access = Access::new(Arc::clone(&store), quotas);
    let sessions = Sessions::new(Arc::clone(&binder), Arc::clone(&store), Arc::clone(&nodes), access.clone(), &config)
        .with_snapshots(Arc::clone(&snapshots));
    tokio::spawn(
        Sweeper::new(Arc::clone(&store), Arc::clone(&nodes), &config)
            .with_snapshots(Arc::clone(&snapshots), config.snapshot_gc_interval, config.snapshot_gc_grace)
            .run(tasks.clone()),
    );
    tokio::spawn(crate::lock_janitor::LockJanitor::new(Arc::clone(&store)).run(tasks.clone()));
    tokio::spawn(
        crate::sandbox_janitor::SandboxJanitor::new(
            Arc::clone(&store),
            Arc::clone(&nodes),
            config.sandbox_janitor_interval,
            config.sandbox_janitor_grace,
            config.node_call_timeout,
        )
        .run(tasks.clone()),
    );

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<WorkspaceServiceServer<WorkspaceApi>>().await;
    health_reporter.set_serving::<ContractServiceServer<ContractApi>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(berth_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|error| ServeError::Config(error.to_string()))?;

    let contract_api =
        ContractServiceServer::new(ContractApi::new(Arc::clone(&router), access.clone(), config.node_call_timeout))
            .max_decoding_message_size(config.max_message_bytes)
            .max_encoding_message_size(config.max_message_bytes);
    // ReadFile bypasses the generated server: its answer is relayed undecoded.
    let read_file = Arc::new(Forwarder::new(Arc::clone(&router), access.clone(), config.node_call_timeout));
    let workspace_api = ReadFilePassthrough::new(
        WorkspaceServiceServer::new(WorkspaceApi::new(router, sessions, access, config.node_call_timeout))
            .max_decoding_message_size(config.max_message_bytes)
            .max_encoding_message_size(config.max_message_bytes),
        read_file,
    );
    let admin_api = AdminServiceServer::new(
        AdminApi::new(
            Arc::clone(&store),
            Arc::clone(&nodes),
            config.node_call_timeout,
            Arc::clone(&view),
            Arc::clone(&registry),
            keys.clone(),
            config.replica_id.clone(),
        )
        .with_migration(binder, Arc::clone(&snapshots), config.provision_timeout),
    )
    .max_decoding_message_size(config.max_message_bytes)
    .max_encoding_message_size(config.max_message_bytes);
    let heartbeat = HeartbeatService::new(
        Arc::clone(&registry),
        Arc::clone(&store),
        keys,
        Arc::clone(&view),
        config.clone(),
        shutdown.clone(),
    );
    tracing::info!(
        replica_id = %config.replica_id,
        address = %config.advertise_address,
        registry = registry.name(),
        isolation = %config.isolation,
        auth = config.auth.name(),
        node_auth = config.node_auth().name(),
        insecure_plaintext = config.insecure_plaintext,
        node_mtls = config.node_tls.is_some(),
        tls = config.tls.is_some(),
        snapshots = %snapshots.describe(),
        "control plane serving"
    );
    let mut builder = berth_proto::transport::server(tonic::transport::Server::builder());
    if let Some(tls) = &config.tls {
        let tls = berth_proto::tls::server_config(tls, None).map_err(ServeError::Config)?;
        builder = builder.tls_config(tls).map_err(|error| ServeError::Config(format!("tls: {error}")))?;
    }
    // Every service below sits behind the auth layer: a service added later is covered.
    let replica_id = config.replica_id.clone();
    let served = builder
        // One span per request, a child of the caller's trace context (`traceparent`) when
        // it sent one, so one client call is one trace; `ws_id` is recorded once known.
        .trace_fn(move |request| {
            berth_proto::trace::request_span(
                request,
                |rpc| tracing::info_span!("grpc", rpc = %rpc, replica_id = %replica_id, ws_id = tracing::field::Empty),
            )
        })
        .layer(AuthLayer::new(authenticator, config.node_auth()))
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(5)))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(workspace_api)
        .add_service(contract_api)
        .add_service(admin_api)
        .add_service(NodeServiceServer::new(heartbeat))
        // `tcp_nodelay` above covers only listeners tonic binds itself.
        .serve_with_incoming_shutdown(berth_proto::trace::incoming(listener), shutdown.cancelled())
        .await;
    tasks.cancel();
    lease.revoke().await;
    tracing::info!(replica_id = %config.replica_id, "control plane stopped");
    served.map_err(|error| ServeError::Transport(error.to_string()))
}

/// Why a replica could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("registry: {0}")]
    Registry(#[from] crate::registry::RegistryError),
    #[error("listener: {0}")]
    Io(std::io::Error),
    #[error("grpc transport: {0}")]
    Transport(String),
}
