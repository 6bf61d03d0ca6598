//! Routing of workspace operations to the node agent holding the workspace (docs/design.md §4.4).
//!
//! The hot path is a view lookup. A node answering "wrong generation", "fenced" or being
//! unreachable means the view may be stale: the router re-reads the record linearizably,
//! re-binds if the workspace moved, went LOST or the node lost it, and retries once. A call
//! that runs something is not retried after a transport failure that may have come after
//! the node received it ([`Replay::OnlyUnsent`]).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use berth_proto::meta::ErrorKind;
use berth_workspace::WorkspaceId;
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Code, Response, Status, Streaming};

use crate::binding::{BindRequest, Binder};
use crate::error::ControlPlaneError;
use crate::node_client::{DataPlaneClient, NodeClients, node_request, untimed_node_request};
use crate::records::WorkspaceRecord;
use crate::store::WorkspaceStoreRef;
use crate::view::EffectiveState;

/// Where one call goes.
#[derive(Clone)]
pub struct Target {
    pub record: Arc<WorkspaceRecord>,
    pub client: DataPlaneClient,
}

impl Target {
    pub fn generation(&self) -> u64 {
        self.record.generation
    }
}

/// Whether a call may be sent again after its node connection failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay {
    /// Sending it twice is harmless (reads, idempotent writes).
    Any,
    /// Sending it twice may run it twice (exec, tool calls): after a transport failure it is
    /// retried only when the connection was never made, so the request never left.
    OnlyUnsent,
}

pub struct Router {
    binder: Arc<Binder>,
    store: WorkspaceStoreRef,
    nodes: Arc<NodeClients>,
    /// Longest the view may go unconfirmed before routing refuses.
    view_max_staleness: Duration,
}

impl Router {
    pub fn new(
        binder: Arc<Binder>,
        store: WorkspaceStoreRef,
        nodes: Arc<NodeClients>,
        view_max_staleness: Duration,
    ) -> Self {
        Self { binder, store, nodes, view_max_staleness }
    }

    /// Resolves a workspace to a READY placement, bringing it back if it is IDLE or LOST.
    pub async fn target(&self, workspace_id: &WorkspaceId) -> Result<Target, ControlPlaneError> {
        // A frozen view would route to wherever the workspace was when the registry last
        // spoke; refuse (retryable) instead.
        self.store.check_view_current(self.view_max_staleness)?;
        let record = match self.store.cached_ready(workspace_id) {
            Some(record) => record,
            None => self.binder.ensure_ready(BindRequest::existing(workspace_id.clone())).await?,
        };
        self.target_for(record)
    }

    fn target_for(&self, record: Arc<WorkspaceRecord>) -> Result<Target, ControlPlaneError> {
        let node_id = record.node_id.as_deref().unwrap_or_default();
        let node = self
            .store
            .node(node_id)
            .ok_or_else(|| ControlPlaneError::Internal(format!("node {node_id} of a ready workspace is not live")))?;
        let client = self.nodes.data_plane(&node.node_id, &node.address)?;
        Ok(Target { record, client })
    }

    /// Runs `call` against the workspace's node, retrying once after a linearizable re-read
    /// when the node says the view was stale.
    pub async fn call<T, F, Fut>(&self, workspace_id: &WorkspaceId, replay: Replay, call: F) -> Result<T, Status>
    where
        F: Fn(Target) -> Fut,
        Fut: Future<Output = Result<T, Status>>,
    {
        let target = self.target(workspace_id).await?;
        let stale_generation = target.generation();
        let outcome = match call(target).await {
            Err(status) if replay == Replay::OnlyUnsent && is_transport_failure(&status) && !never_sent(&status) => {
                tracing::warn!(ws_id = %workspace_id, error = %status.message(), "node connection broke after the call was sent; not retrying");
                Err(ControlPlaneError::OutcomeUnknown { reason: status.message().to_owned() }.into())
            }
            Err(status) if is_stale_route(&status) => {
                tracing::debug!(ws_id = %workspace_id, code = ?status.code(), "stale route; re-reading the record");
                let retry = self.retarget(workspace_id, stale_generation, &status).await?;
                call(retry).await
            }
            other => other,
        };
        // A node that could not be reached at all (its process is gone, its lease not yet):
        // nothing ran, so the caller may safely try again, and is told so.
        outcome.map_err(|status| {
            if is_transport_failure(&status) && never_sent(&status) && !berth_proto::meta::is_retryable(&status) {
                berth_proto::meta::mark_retryable(status)
            } else {
                status
            }
        })
    }

    /// Forwards one call (unary or server-streaming) to the workspace's node with
    /// [`call`](Self::call)'s retry: `message` goes out with the target's generation and
    /// `timeout` as the node call's deadline (`None` for long streams).
    pub async fn forward<M, R, F, Fut>(
        &self,
        workspace_id: &WorkspaceId,
        message: M,
        timeout: Option<Duration>,
        replay: Replay,
        call: F,
    ) -> Result<Response<R>, Status>
    where
        M: Clone,
        F: Fn(DataPlaneClient, tonic::Request<M>) -> Fut,
        Fut: Future<Output = Result<Response<R>, Status>>,
    {
        self.call(workspace_id, replay, |target: Target| {
            let request = match timeout {
                Some(timeout) => node_request(message.clone(), target.generation(), timeout),
                None => untimed_node_request(message.clone(), target.generation()),
            };
            call(target.client.clone(), request)
        })
        .await
    }

    /// After a stale-route answer: re-read; if the record still names the same node and
    /// generation and the node denies holding it, re-provision (new generation).
    async fn retarget(
        &self,
        workspace_id: &WorkspaceId,
        stale_generation: u64,
        status: &Status,
    ) -> Result<Target, ControlPlaneError> {
        let Some(record) = self.store.load(workspace_id).await? else {
            return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()));
        };
        let unchanged = record.generation == stale_generation;
        if unchanged && ErrorKind::of(status) != Some(ErrorKind::WrongGeneration) {
            // Same placement, node unreachable or fenced: one more try at the same place,
            // unless the view has meanwhile seen the node go.
            if self.store.effective_state(&record) == EffectiveState::Ready {
                return self.target_for(Arc::new(record));
            }
        }
        let record = self
            .binder
            .ensure_ready(BindRequest {
                replace_generation: unchanged.then_some(stale_generation),
                ..BindRequest::existing(workspace_id.clone())
            })
            .await?;
        self.target_for(record)
    }
}

/// Answers that mean "the replica's idea of where the workspace lives may be stale".
fn is_stale_route(status: &Status) -> bool {
    matches!(ErrorKind::of(status), Some(ErrorKind::WrongGeneration | ErrorKind::NodeFenced))
        || is_transport_failure(status)
}

/// An UNAVAILABLE the node did not answer itself (no typed kind): the connection failed,
/// before or after the request went out.
fn is_transport_failure(status: &Status) -> bool {
    status.code() == Code::Unavailable && ErrorKind::of(status).is_none() && !berth_proto::meta::is_retryable(status)
}

/// True only when the transport failed while connecting (refused, unreachable, connect
/// timeout): no byte of the request reached the node. A reset, a closed connection or a
/// keep-alive timeout of an established connection may come after the node started the call.
fn never_sent(status: &Status) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(error) = cause {
        if error.is::<tonic::ConnectError>() {
            return true;
        }
        cause = error.source();
    }
    false
}

/// Pipes a client stream (its header already read) to a node call on `target`. A stream
/// cannot be replayed, so there is no retry: resolve the target first. The node must see
/// a failed client stream as a reset, never as a clean end (it would commit what arrived),
/// so a broken inbound stream drops the node call.
pub async fn pipe<M, R, F, Fut>(
    target: Target,
    header: M,
    mut inbound: Streaming<M>,
    call: F,
) -> Result<Response<R>, Status>
where
    M: Send + 'static,
    F: FnOnce(DataPlaneClient, tonic::Request<ReceiverStream<M>>) -> Fut,
    Fut: Future<Output = Result<Response<R>, Status>>,
{
    let (chunks, outbound) = mpsc::channel::<M>(8);
    let (abort, aborted) = oneshot::channel::<Status>();
    let pump = tokio::spawn(async move {
        if chunks.send(header).await.is_err() {
            return;
        }
        loop {
            match inbound.message().await {
                Ok(Some(message)) => {
                    if chunks.send(message).await.is_err() {
                        return;
                    }
                }
                Ok(None) => return,
                Err(status) => {
                    let _ = abort.send(status);
                    return;
                }
            }
        }
    });
    let request = untimed_node_request(ReceiverStream::new(outbound), target.generation());
    let outcome = tokio::select! {
        response = call(target.client.clone(), request) => response,
        Ok(status) = aborted => Err(ControlPlaneError::ClientStreamFailed { reason: status.message().to_owned() }.into()),
    };
    pump.abort();
    outcome
}

#[cfg(test)]
mod tests {
    use berth_proto::v1;
    use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
    use tokio::net::TcpListener;
    use tonic::transport::Endpoint;

    use super::*;

    /// A call to a port nobody listens on fails while connecting: provably never sent, so
    /// even an exec may be retried.
    #[tokio::test]
    async fn a_refused_connection_is_a_call_never_sent() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        drop(listener);
        let channel = Endpoint::from_shared(format!("http://{address}")).expect("endpoint").connect_lazy();
        let mut client = WorkspaceServiceClient::new(channel);
        let request = v1::StatRequest { workspace_id: "ws-1".into(), path: String::new() };
        let status = client.stat(request).await.expect_err("nobody listens");
        assert!(is_transport_failure(&status), "{status:?}");
        assert!(never_sent(&status), "{status:?}");
    }

    /// An UNAVAILABLE with no transport error behind it (a reset, a keep-alive timeout, or
    /// a status that crossed a process boundary) may have come after the node started.
    #[test]
    fn an_unavailable_without_a_connect_error_may_have_been_sent() {
        let status = Status::unavailable("http2 error");
        assert!(is_transport_failure(&status));
        assert!(!never_sent(&status));
    }
}
