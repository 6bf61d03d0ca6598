//! `NodeAgentService`: lifecycle, exec and file calls from replicas.
//!
//! Every workspace call is checked before it touches the workspace: the node must not be
//! fenced (lost lease), must hold the workspace, and at the generation the replica names
//! (`x-berth-generation`); otherwise a typed status tells the replica to re-read and retry.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use berth_proto::convert::{
    exec_event_to_proto, exec_output_to_proto, exec_spec_from_proto, file_info_to_proto, read_chunk_size,
    spec_from_proto,
};
use berth_proto::meta;
use berth_proto::v1::node_agent_service_server::NodeAgentService;
use berth_proto::v1::{self, write_file_request::Msg as WriteMsg};
use berth_workspace::{BackendRef, RelPath, WorkspaceError, WorkspaceId, WriteOptions};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

use crate::contract::{Contract, first_message};
use crate::error::{NodeError, status};
use crate::fence::Fence;
use crate::metrics;
use crate::state::{Entry, Workspaces};

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

pub struct NodeAgentApi {
    workspaces: Arc<Workspaces>,
    fence: Arc<Fence>,
    max_file_bytes: u64,
    max_execs_per_workspace: u32,
    contract: Arc<Contract>,
}

/// One admitted exec of a workspace; holds its slot while alive.
///
/// The in-flight counter is the workspace's semaphore: admission is a try-acquire (no
/// queue), because a queued exec would sit on a gRPC stream and its own timeout budget
/// while the caller cannot tell it is waiting. The N+1st exec fails at once.
struct InFlight(Arc<Entry>);

impl InFlight {
    fn start(entry: &Arc<Entry>, max: u32) -> Result<Self, NodeError> {
        let previous = entry.execs_in_flight.fetch_add(1, Ordering::AcqRel);
        if previous >= max {
            entry.execs_in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(NodeError::TooManyExecs { attempted: previous + 1, max });
        }
        Ok(Self(Arc::clone(entry)))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.execs_in_flight.fetch_sub(1, Ordering::AcqRel);
        self.0.touch();
    }
}

fn workspace_id(value: &str) -> Result<WorkspaceId, NodeError> {
    Ok(WorkspaceId::new(value)?)
}

fn rel_path(value: &str) -> Result<RelPath, NodeError> {
    Ok(RelPath::parse(value)?)
}

impl NodeAgentApi {
    pub fn new(
        workspaces: Arc<Workspaces>,
        fence: Arc<Fence>,
        max_file_bytes: u64,
        max_execs_per_workspace: u32,
        contract: Arc<Contract>,
    ) -> Self {
        Self { workspaces, fence, max_file_bytes, max_execs_per_workspace, contract }
    }

    /// [`Self::backend`] for the contract calls: the workspace id and its runtime.
    fn target<T>(&self, request: &Request<T>, id: &str) -> Result<(WorkspaceId, BackendRef), NodeError> {
        let (entry, backend) = self.backend(request, id)?;
        Ok((entry.id.clone(), backend))
    }

    fn check_serving(&self) -> Result<(), NodeError> {
        if self.fence.is_fenced() {
            return Err(NodeError::Fenced);
        }
        Ok(())
    }

    /// The workspace's runtime, if this node holds it at the generation the caller expects.
    fn backend<T>(&self, request: &Request<T>, id: &str) -> Result<(Arc<Entry>, BackendRef), NodeError> {
        self.check_serving()?;
        let id = workspace_id(id)?;
        berth_proto::trace::record_workspace(id.as_str());
        let expected = request
            .metadata()
            .get(meta::GENERATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        let entry = self.workspaces.get(&id).ok_or_else(|| NodeError::NotHeld { workspace_id: id.clone() })?;
        if let Some(expected) = expected
            && expected != entry.generation
        {
            return Err(NodeError::WrongGeneration { workspace_id: id, held: entry.generation, expected });
        }
        let backend = entry.backend.clone().ok_or_else(|| NodeError::Released { workspace_id: id.clone() })?;
        entry.touch();
        Ok((entry, backend))
    }
}

// ---- the workspace contract: checked here, handled in `contract.rs` ---------------------

/// Reads the header of a client-streaming contract call and checks fence and generation
/// against the request's metadata.
macro_rules! streamed_target {
    ($self:ident, $request:ident, $variant:path) => {{
        let metadata = $request.metadata().clone();
        let mut inbound = $request.into_inner();
        let header = match first_message(&mut inbound).await?.msg {
            Some($variant(header)) => header,
            _ => return Err(NodeError::MissingHeader { rpc: "" }.into()),
        };
        let (id, backend) =
            $self.target(&Request::from_parts(metadata, Default::default(), ()), &header.workspace_id)?;
        (id, backend, header, inbound)
    }};
}

#[tonic::async_trait]
impl NodeAgentService for NodeAgentApi {
    async fn provision(
        &self,
        request: Request<v1::ProvisionRequest>,
    ) -> Result<Response<v1::ProvisionResponse>, Status> {
        self.check_serving()?;
        let request = request.into_inner();
        let id = workspace_id(&request.workspace_id)?;
        berth_proto::trace::record_workspace(id.as_str());
        let spec = spec_from_proto(request.spec);
        spec.validate().map_err(status)?;
        tracing::debug!(ws_id = %id, generation = request.generation, "provisioning");
        // Run to completion even if the caller goes away: a provision cancelled between
        // creating the directory and writing the state file would leave a directory the
        // node never reports or cleans up. A copy nobody records is removed later by the
        // heartbeat reconciliation.
        let workspaces = Arc::clone(&self.workspaces);
        let task_id = id.clone();
        let asked_backend = if request.backend.is_empty() { "default".to_owned() } else { request.backend.clone() };
        let started = std::time::Instant::now();
        let provisioned =
            tokio::spawn(
                async move { workspaces.provision(&task_id, request.generation, &request.backend, &spec).await },
            )
            .await
            .map_err(|error| NodeError::ProvisionTask { reason: error.to_string() })?;
        let backend_label = provisioned.as_ref().map(|done| done.backend.as_str()).unwrap_or(&asked_backend);
        metrics::provision_done(backend_label, provisioned.is_ok(), started.elapsed());
        let provisioned = provisioned.map_err(status)?;
        tracing::info!(ws_id = %id, generation = request.generation, backend = %provisioned.backend, created = provisioned.created, "provisioned");
        Ok(Response::new(v1::ProvisionResponse { created: provisioned.created, backend: provisioned.backend }))
    }

    async fn release(&self, request: Request<v1::ReleaseRequest>) -> Result<Response<v1::ReleaseResponse>, Status> {
        let id = workspace_id(&request.get_ref().workspace_id)?;
        self.workspaces.release(&id).await.map_err(status)?;
        Ok(Response::new(v1::ReleaseResponse {}))
    }

    async fn destroy(&self, request: Request<v1::DestroyRequest>) -> Result<Response<v1::DestroyResponse>, Status> {
        let id = workspace_id(&request.get_ref().workspace_id)?;
        let existed = self.workspaces.destroy(&id, None).await.map_err(status)?;
        Ok(Response::new(v1::DestroyResponse { existed }))
    }

    async fn list_local(
        &self,
        _request: Request<v1::ListLocalRequest>,
    ) -> Result<Response<v1::ListLocalResponse>, Status> {
        let mut workspaces: Vec<v1::LocalWorkspace> =
            self.workspaces.all().iter().map(|entry| local_workspace(entry)).collect();
        workspaces.sort_by(|left, right| left.workspace_id.cmp(&right.workspace_id));
        Ok(Response::new(v1::ListLocalResponse { workspaces }))
    }

    async fn exec(&self, request: Request<v1::ExecRequest>) -> Result<Response<v1::ExecResult>, Status> {
        let (entry, backend) = self.backend(&request, &request.get_ref().workspace_id)?;
        let spec = exec_spec_from_proto(request.get_ref()).map_err(status)?;
        let _in_flight = InFlight::start(&entry, self.max_execs_per_workspace)?;
        let started = std::time::Instant::now();
        let output = backend.exec(&spec).await;
        metrics::exec_done(&entry.backend_name, output.is_ok(), started.elapsed());
        Ok(Response::new(exec_output_to_proto(output.map_err(status)?)))
    }

    type ExecStreamStream = BoxStream<v1::ExecChunk>;

    async fn exec_stream(&self, request: Request<v1::ExecRequest>) -> Result<Response<Self::ExecStreamStream>, Status> {
        let (entry, backend) = self.backend(&request, &request.get_ref().workspace_id)?;
        let spec = exec_spec_from_proto(request.get_ref()).map_err(status)?;
        let in_flight = InFlight::start(&entry, self.max_execs_per_workspace)?;
        let timer = ExecTimer { backend: entry.backend_name.clone(), started: std::time::Instant::now(), ok: true };
        let events = backend.exec_stream(&spec).await.map_err(status)?;
        // The guard lives as long as the stream; dropping the stream kills the process. The
        // timer records when the stream is dropped: finished, failed or abandoned.
        let mut timer = timer;
        let stream = events.map(move |event| {
            let _keep = &in_flight;
            // Borrowing the whole timer moves it into the closure (a field alone would be
            // captured by copy, and the timer dropped right here).
            let timer = &mut timer;
            timer.ok &= event.is_ok();
            event.map(exec_event_to_proto).map_err(status)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    type ReadFileStream = BoxStream<v1::FileChunk>;

    async fn read_file(&self, request: Request<v1::ReadFileRequest>) -> Result<Response<Self::ReadFileStream>, Status> {
        let (_entry, backend) = self.backend(&request, &request.get_ref().workspace_id)?;
        let path = rel_path(&request.get_ref().path)?;
        let chunk_size = read_chunk_size(request.get_ref().chunk_size);
        let chunks = backend.read_file(&path).await.map_err(status)?;
        let stream = chunks.flat_map(move |chunk| {
            let pieces: Vec<Result<v1::FileChunk, Status>> = match chunk {
                Ok(data) => {
                    split(data, chunk_size).into_iter().map(|data| Ok(v1::FileChunk { data: data.to_vec() })).collect()
                }
                Err(error) => vec![Err(status(error))],
            };
            futures::stream::iter(pieces)
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn write_file(
        &self,
        request: Request<Streaming<v1::WriteFileRequest>>,
    ) -> Result<Response<v1::WriteFileResponse>, Status> {
        let generation_checked = Request::from_parts(request.metadata().clone(), Default::default(), ());
        let mut inbound = request.into_inner();
        let header = match inbound.message().await? {
            Some(v1::WriteFileRequest { msg: Some(WriteMsg::Header(header)) }) => header,
            _ => return Err(NodeError::MissingHeader { rpc: "WriteFile " }.into()),
        };
        let (_entry, backend) = self.backend(&generation_checked, &header.workspace_id)?;
        let path = rel_path(&header.path)?;
        // Anything but chunks closed by a matching commit surfaces as an error item, which
        // makes the backend discard the temporary file: a write is whole or absent.
        let data = committed_chunks(inbound);
        let mode = if header.mode == 0 { 0o644 } else { header.mode & 0o777 };
        let options = WriteOptions { mode, max_bytes: self.max_file_bytes };
        let written = backend.write_file(&path, data, options).await.map_err(status)?;
        Ok(Response::new(v1::WriteFileResponse { bytes_written: written }))
    }

    async fn stat(&self, request: Request<v1::StatRequest>) -> Result<Response<v1::FileInfo>, Status> {
        let (_entry, backend) = self.backend(&request, &request.get_ref().workspace_id)?;
        let path = rel_path(&request.get_ref().path)?;
        let info = backend.stat(&path).await.map_err(status)?;
        Ok(Response::new(file_info_to_proto(&info)))
    }

    async fn list_dir(&self, request: Request<v1::ListDirRequest>) -> Result<Response<v1::ListDirResponse>, Status> {
        let (_entry, backend) = self.backend(&request, &request.get_ref().workspace_id)?;
        let path = rel_path(&request.get_ref().path)?;
        let entries = backend.list_dir(&path).await.map_err(status)?;
        Ok(Response::new(v1::ListDirResponse { entries: entries.iter().map(file_info_to_proto).collect() }))
    }

    async fn remove_path(
        &self,
        request: Request<v1::RemovePathRequest>,
    ) -> Result<Response<v1::RemovePathResponse>, Status> {
        let (_entry, backend) = self.backend(&request, &request.get_ref().workspace_id)?;
        let path = rel_path(&request.get_ref().path)?;
        if path.is_root() {
            return Err(NodeError::RemoveRoot.into());
        }
        let existed = backend.remove(&path, request.get_ref().recursive).await.map_err(status)?;
        Ok(Response::new(v1::RemovePathResponse { existed }))
    }

    async fn make_dir(&self, request: Request<v1::MakeDirRequest>) -> Result<Response<v1::MakeDirResponse>, Status> {
        let (_entry, backend) = self.backend(&request, &request.get_ref().workspace_id)?;
        let path = rel_path(&request.get_ref().path)?;
        backend.mkdir(&path, request.get_ref().parents).await.map_err(status)?;
        Ok(Response::new(v1::MakeDirResponse {}))
    }

    async fn add_mcp(&self, request: Request<v1::AddMcpRequest>) -> Result<Response<v1::AddMcpResponse>, Status> {
        let (id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.add_mcp(&id, backend, request.into_inner()).await.map(Response::new)
    }

    async fn remove_mcp(
        &self,
        request: Request<v1::RemoveMcpRequest>,
    ) -> Result<Response<v1::RemoveMcpResponse>, Status> {
        let (id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.remove_mcp(&id, backend, request.into_inner()).await.map(Response::new)
    }

    async fn list_mcps(&self, request: Request<v1::ListMcpsRequest>) -> Result<Response<v1::ListMcpsResponse>, Status> {
        let (id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.list_mcps(&id, backend).await.map(Response::new)
    }

    async fn list_mcp_tools(
        &self,
        request: Request<v1::ListMcpToolsRequest>,
    ) -> Result<Response<v1::ListMcpToolsResponse>, Status> {
        let (id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.list_mcp_tools(&id, backend, request.into_inner()).await.map(Response::new)
    }

    async fn call_mcp_tool(
        &self,
        request: Request<v1::CallMcpToolRequest>,
    ) -> Result<Response<v1::CallMcpToolResponse>, Status> {
        let (id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.call_mcp_tool(&id, backend, request.into_inner()).await.map(Response::new)
    }

    async fn add_skill(
        &self,
        request: Request<Streaming<v1::AddSkillRequest>>,
    ) -> Result<Response<v1::AddSkillResponse>, Status> {
        let (id, backend, header, inbound) = streamed_target!(self, request, v1::add_skill_request::Msg::Header);
        self.contract.add_skill(&id, backend, header, inbound).await.map(Response::new)
    }

    async fn remove_skill(
        &self,
        request: Request<v1::RemoveSkillRequest>,
    ) -> Result<Response<v1::RemoveSkillResponse>, Status> {
        let (_id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.remove_skill(backend, request.into_inner()).await.map(Response::new)
    }

    async fn list_skills(
        &self,
        request: Request<v1::ListSkillsRequest>,
    ) -> Result<Response<v1::ListSkillsResponse>, Status> {
        let (id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.list_skills(&id, backend).await.map(Response::new)
    }

    async fn get_skill(&self, request: Request<v1::GetSkillRequest>) -> Result<Response<v1::GetSkillResponse>, Status> {
        let (_id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.get_skill(backend, request.into_inner()).await.map(Response::new)
    }

    async fn offload_context(
        &self,
        request: Request<v1::OffloadContextRequest>,
    ) -> Result<Response<v1::OffloadContextResponse>, Status> {
        let (_id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.offload_context(backend, request.into_inner()).await.map(Response::new)
    }

    async fn offload_tool_result(
        &self,
        request: Request<v1::OffloadToolResultRequest>,
    ) -> Result<Response<v1::OffloadToolResultResponse>, Status> {
        let (_id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.offload_tool_result(backend, request.into_inner()).await.map(Response::new)
    }

    async fn upload_tree(
        &self,
        request: Request<Streaming<v1::UploadTreeRequest>>,
    ) -> Result<Response<v1::UploadTreeResponse>, Status> {
        let (id, backend, header, inbound) = streamed_target!(self, request, v1::upload_tree_request::Msg::Header);
        self.contract.upload_tree(&id, backend, header, inbound).await.map(Response::new)
    }

    type DownloadTreeStream = BoxStream<v1::TreeChunk>;

    async fn download_tree(
        &self,
        request: Request<v1::DownloadTreeRequest>,
    ) -> Result<Response<Self::DownloadTreeStream>, Status> {
        let (_id, backend) = self.target(&request, &request.get_ref().workspace_id)?;
        self.contract.download_tree(backend, request.into_inner()).await.map(Response::new)
    }
}

/// The chunks of a WriteFile stream, ending cleanly only at a commit whose size matches
/// what arrived. A stream that ends without one (a client that crashed or gave up: gRPC
/// may deliver that as a clean end), breaks, or sends anything else ends with an error.
fn committed_chunks(inbound: Streaming<v1::WriteFileRequest>) -> berth_workspace::ByteStream {
    let refused = |reason: String| Err(WorkspaceError::InvalidArgument(reason));
    futures::stream::unfold(Some((inbound, 0u64)), move |state| async move {
        let (mut inbound, received) = state?;
        let item = match inbound.message().await {
            Ok(Some(v1::WriteFileRequest { msg: Some(WriteMsg::Chunk(chunk)) })) => {
                let received = received + chunk.len() as u64;
                return Some((Ok(Bytes::from(chunk)), Some((inbound, received))));
            }
            Ok(Some(v1::WriteFileRequest { msg: Some(WriteMsg::Commit(commit)) })) if commit.size == received => {
                return None;
            }
            Ok(Some(v1::WriteFileRequest { msg: Some(WriteMsg::Commit(commit)) })) => {
                refused(format!("write commit says {} bytes but {received} arrived; nothing was written", commit.size))
            }
            Ok(Some(_)) => refused("only chunks and one commit may follow the WriteFile header".into()),
            Ok(None) => refused("the write stream ended without a commit; nothing was written".into()),
            Err(status) => refused(format!("write stream broken: {}", status.message())),
        };
        Some((item, None))
    })
    .boxed()
}

pub fn local_workspace(entry: &Entry) -> v1::LocalWorkspace {
    v1::LocalWorkspace {
        workspace_id: entry.id.to_string(),
        generation: entry.generation,
        backend: entry.backend_name.clone(),
        running: entry.backend.is_some(),
        last_access_unix_ms: entry.last_access_ms.load(Ordering::Relaxed),
    }
}

fn split(mut data: Bytes, size: usize) -> Vec<Bytes> {
    let mut pieces = Vec::with_capacity(data.len() / size + 1);
    while data.len() > size {
        pieces.push(data.split_to(size));
    }
    if !data.is_empty() {
        pieces.push(data);
    }
    pieces
}

/// Records a streamed exec's duration when its stream is dropped.
struct ExecTimer {
    backend: String,
    started: std::time::Instant,
    ok: bool,
}

impl Drop for ExecTimer {
    fn drop(&mut self) {
        metrics::exec_done(&self.backend, self.ok, self.started.elapsed());
    }
}
