//! The composition root of a node agent: `serve(listener, config, shutdown)`.

use std::sync::Arc;
use std::time::Duration;

use berth_proto::v1::contract_service_server::ContractServiceServer;
use berth_proto::v1::node_agent_service_server::NodeAgentServiceServer;
use berth_proto::v1::workspace_service_server::WorkspaceServiceServer;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::auth::NodeAuthLayer;
use crate::config::NodeAgentConfig;
use crate::contract::Contract;
use crate::data_plane::DataPlane;
use crate::error::NodeError;
use crate::fence::Fence;
use crate::files::Files;
use crate::gate::Gate;
use crate::heartbeat::Heartbeater;
use crate::limits::OutputBudget;
use crate::read_frames::ReadFileFrames;
use crate::service::NodeAgentApi;
use crate::state::Workspaces;

/// Largest gRPC message (file data travels in smaller chunks).
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;

/// Why a node agent could not start or stopped abnormally.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Workspace(#[from] berth_workspace::WorkspaceError),
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    #[error("grpc transport: {0}")]
    Transport(String),
}

/// Serves `NodeAgentService` and the data plane (`WorkspaceService`, `ContractService`) on
/// `listener` and heartbeats to the control plane until `shutdown` fires.
pub async fn serve(
    listener: TcpListener,
    mut config: NodeAgentConfig,
    shutdown: CancellationToken,
) -> Result<(), ServeError> {
    config.validate().map_err(ServeError::Config)?;
    let local_address = listener.local_addr()?;
    config.check_listener(local_address).map_err(ServeError::Config)?;
    if config.advertise_address.is_empty() {
        let scheme = if config.tls.is_some() { "https" } else { "http" };
        config.advertise_address = format!("{scheme}://{local_address}");
    }
    crate::metrics::describe();
    let drivers = crate::drivers::build(&config).await?;
    let workspaces = Arc::new(Workspaces::new(
        config.data_dir.clone(),
        drivers,
        config.default_backend().to_owned(),
        config.debug_provision_delay,
        config.max_concurrent_provisions,
    ));
    workspaces.set_debug_destroy_delay(config.debug_destroy_delay);
    // One budget for everything buffered on its way back: unary exec output, MCP results.
    let output_budget = OutputBudget::new(config.exec_output_budget_bytes);
    let contract =
        Arc::new(Contract::new(config.contract.clone(), config.data_dir.join("secrets"), output_budget.clone()));
    workspaces.add_hook(contract.clone());
    if let Some(url) = &config.snapshot_store {
        let snapshots = crate::snapshots::NodeSnapshots::open(url, config.snapshot_keep).map_err(ServeError::Config)?;
        tracing::info!(node_id = %config.node_id, store = %snapshots.describe(), interval = ?config.snapshot_interval, "snapshots on");
        workspaces.set_snapshots(Arc::new(snapshots));
    }
    workspaces.restore(&config.limits).await?;
    // Fenced until the first registration: no lease, no serving.
    let fence = Arc::new(Fence::new());
    fence.fence();
    let tasks = CancellationToken::new();
    let heartbeater =
        Heartbeater::new(config.clone(), config.advertise_address.clone(), Arc::clone(&workspaces), Arc::clone(&fence))
            .with_mcp_pool(contract.mcp().pool().clone());
    let heartbeat_task = tokio::spawn(heartbeater.run(tasks.clone()));
    tokio::spawn(purge_quarantine(Arc::clone(&workspaces), config.quarantine_retention, tasks.clone()));
    // Every backend that can keep a pool, at size 0 unless asked: its first fill removes
    // what an earlier agent's pool left.
    let sizes: std::collections::BTreeMap<String, usize> = config
        .backends
        .iter()
        .filter(|backend| crate::config::WARM_POOL_BACKENDS.contains(&backend.as_str()))
        .map(|backend| (backend.clone(), config.warm_pool.get(backend).copied().unwrap_or_default()))
        .collect();
    let pool_task = (!sizes.is_empty()).then(|| {
        tokio::spawn(crate::warm_pool::keep_warm(
            Arc::clone(&workspaces),
            sizes,
            config.capacity_workspaces,
            tasks.clone(),
        ))
    });
    if let (Some(snapshots), Some(interval)) = (workspaces.snapshots(), config.snapshot_interval) {
        tokio::spawn(snapshot_changed(Arc::clone(&workspaces), snapshots, interval, tasks.clone()));
    }

    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    health_reporter.set_serving::<NodeAgentServiceServer<NodeAgentApi>>().await;
    health_reporter.set_serving::<WorkspaceServiceServer<DataPlane>>().await;
    health_reporter.set_serving::<ContractServiceServer<DataPlane>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(berth_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|error| ServeError::Config(error.to_string()))?;
    let gate = Arc::new(Gate::new(Arc::clone(&workspaces), fence));
    let lifecycle = NodeAgentServiceServer::new(NodeAgentApi::new(Arc::clone(&gate), config.limits))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    let files = Files::new(config.max_file_bytes, config.max_execs_per_workspace, config.limits, output_budget);
    let data_plane = Arc::new(DataPlane::new(gate, files, contract));
    let workspace_api = WorkspaceServiceServer::from_arc(Arc::clone(&data_plane))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    // `ReadFile` written as frames by hand (`read_frames.rs`): no copy of the file's bytes.
    let workspace_api = ReadFileFrames::new(workspace_api, Arc::clone(&data_plane));
    let contract_api = ContractServiceServer::from_arc(data_plane)
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    tracing::info!(
        node_id = %config.node_id,
        address = %config.advertise_address,
        backends = ?config.backends,
        node_credential = config.node_credential.is_some(),
        shared_node_secret = config.node_secret.is_some(),
        insecure_plaintext = config.insecure_plaintext,
        mtls = config.client_ca.is_some(),
        "node agent serving"
    );
    let mut builder = berth_proto::transport::server(tonic::transport::Server::builder());
    if let Some(tls) = &config.tls {
        let tls = berth_proto::tls::server_config(tls, config.client_ca.as_deref()).map_err(ServeError::Config)?;
        builder = builder.tls_config(tls).map_err(|error| ServeError::Config(format!("tls: {error}")))?;
    }
    let node_id = config.node_id.clone();
    let served = builder
        // One span per request, a child of the caller's trace context (`traceparent`) when
        // it sent one, so one client call is one trace; `ws_id` is recorded once known.
        .trace_fn(move |request| {
            berth_proto::trace::request_span(
                request,
                |rpc| tracing::info_span!("grpc", rpc = %rpc, node_id = %node_id, ws_id = tracing::field::Empty),
            )
        })
        .layer(NodeAuthLayer::new(config.expected_caller()))
        .tcp_nodelay(true)
        .http2_keepalive_interval(Some(Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(Duration::from_secs(5)))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(lifecycle)
        .add_service(workspace_api)
        .add_service(contract_api)
        // `tcp_nodelay` above covers only listeners tonic binds itself.
        .serve_with_incoming_shutdown(berth_proto::trace::incoming(listener), shutdown.cancelled())
        .await;
    tasks.cancel();
    let _ = heartbeat_task.await;
    // The pool empties before the agent says it stopped: nothing anonymous is left.
    if let Some(pool_task) = pool_task {
        let _ = pool_task.await;
    }
    tracing::info!(node_id = %config.node_id, "node agent stopped");
    served.map_err(|error| ServeError::Transport(error.to_string()))
}

/// Deletes quarantine entries past their retention, at start and then hourly (or every
/// retention, when that is shorter).
async fn purge_quarantine(workspaces: Arc<Workspaces>, retention: std::time::Duration, cancel: CancellationToken) {
    let every = retention.clamp(std::time::Duration::from_secs(1), std::time::Duration::from_secs(3600));
    loop {
        if let Err(error) = workspaces.quarantine().purge(retention).await {
            tracing::warn!(%error, "purging the quarantine failed");
        }
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
    }
}

/// Every `interval`, snapshots each workspace that changed since its last snapshot and
/// queues it for the heartbeat. One workspace at a time: snapshots are I/O-heavy and the
/// node serves meanwhile.
async fn snapshot_changed(
    workspaces: Arc<Workspaces>,
    snapshots: crate::snapshots::NodeSnapshotsRef,
    interval: Duration,
    cancel: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
        for entry in workspaces.all() {
            if cancel.is_cancelled() {
                return;
            }
            if !entry.changed_since_snapshot() {
                continue;
            }
            match workspaces.snapshot(&entry.id, Some(entry.generation), false).await {
                Ok(Some(taken)) => snapshots.queue(taken),
                Ok(None) => {}
                // Logged by `take`; a copy that moved meanwhile is not an error.
                Err(NodeError::WrongGeneration { .. } | NodeError::NotHeld { .. }) => {}
                Err(error) => tracing::debug!(ws_id = %entry.id, %error, "interval snapshot skipped"),
            }
        }
    }
}
