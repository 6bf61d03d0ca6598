//! Exec and file calls on a node (`WorkspaceService`'s data plane), each on a workspace the
//! [`Gate`](crate::gate::Gate) admitted. Admits at most `--max-execs-per-workspace`
//! concurrent execs per workspace; fills an exec's zero timeout / output cap with the
//! operator defaults and refuses values above the ceilings (`limits.rs`); a unary exec
//! first reserves its output buffer from the node-wide budget.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use berth_proto::convert::{
    exec_event_to_proto, exec_output_to_proto, exec_spec_from_proto, file_info_to_proto, read_chunk_size,
};
use berth_proto::v1::{self, write_file_request::Msg as WriteMsg};
use berth_workspace::{RelPath, WorkspaceError, WriteOptions};
use bytes::Bytes;
use futures::{Stream, StreamExt};
use tonic::{Status, Streaming};

use crate::error::{NodeError, status};
use crate::gate::Admitted;
use crate::limits::{NodeLimits, OutputBudget};
use crate::metrics;
use crate::state::Entry;

pub type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;
type Reply<T> = Result<T, Status>;

fn rel_path(value: &str) -> Result<RelPath, Status> {
    RelPath::parse(value).map_err(status)
}

/// Settings of the exec and file calls on this node.
pub struct Files {
    max_file_bytes: u64,
    max_execs_per_workspace: u32,
    limits: NodeLimits,
    output_budget: OutputBudget,
}

impl Files {
    pub fn new(
        max_file_bytes: u64,
        max_execs_per_workspace: u32,
        limits: NodeLimits,
        output_budget: OutputBudget,
    ) -> Self {
        Self { max_file_bytes, max_execs_per_workspace, limits, output_budget }
    }

    pub async fn exec(&self, workspace: Admitted, mut request: v1::ExecRequest) -> Reply<v1::ExecResult> {
        self.limits.apply_to_exec(&mut request)?;
        let spec = exec_spec_from_proto(&request).map_err(status)?;
        let _in_flight = InFlight::start(&workspace.entry, self.max_execs_per_workspace)?;
        // Held until the answer is built: the buffers live that long. Refused at once when
        // the node cannot cover it (never queued behind other execs).
        let _output = self.output_budget.reserve(spec.max_output_bytes as u64)?;
        let started = std::time::Instant::now();
        let output = workspace.backend.exec(&spec).await;
        metrics::exec_done(&workspace.entry.backend_name, output.is_ok(), started.elapsed());
        Ok(exec_output_to_proto(output.map_err(status)?))
    }

    pub async fn exec_stream(
        &self,
        workspace: Admitted,
        mut request: v1::ExecRequest,
    ) -> Reply<BoxStream<v1::ExecChunk>> {
        // A streamed exec forwards its output as it comes (the gRPC stream's flow control
        // bounds what is held), so it reserves no output budget; its limits still apply.
        self.limits.apply_to_exec(&mut request)?;
        let spec = exec_spec_from_proto(&request).map_err(status)?;
        let in_flight = InFlight::start(&workspace.entry, self.max_execs_per_workspace)?;
        let timer =
            ExecTimer { backend: workspace.entry.backend_name.clone(), started: std::time::Instant::now(), ok: true };
        let events = workspace.backend.exec_stream(&spec).await.map_err(status)?;
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
        Ok(Box::pin(stream))
    }

    /// The file's bytes in pieces of the chunk size the request asks for (`read_frames.rs`
    /// sends each as one `FileChunk`, its bytes never copied).
    pub async fn read_pieces(&self, workspace: Admitted, request: v1::ReadFileRequest) -> Reply<BoxStream<Bytes>> {
        let path = rel_path(&request.path)?;
        let chunk_size = read_chunk_size(request.chunk_size);
        let chunks = workspace.backend.read_file(&path).await.map_err(status)?;
        let stream = chunks.flat_map(move |chunk| {
            let pieces: Vec<Result<Bytes, Status>> = match chunk {
                Ok(data) => split(data, chunk_size).into_iter().map(Ok).collect(),
                Err(error) => vec![Err(status(error))],
            };
            futures::stream::iter(pieces)
        });
        Ok(Box::pin(stream))
    }

    /// `ReadFile` as the generated service answers it. The node serves `ReadFile` through
    /// `read_frames.rs`; this stays for the generated trait, and answers the same.
    pub async fn read_file(
        &self,
        workspace: Admitted,
        request: v1::ReadFileRequest,
    ) -> Reply<BoxStream<v1::FileChunk>> {
        let pieces = self.read_pieces(workspace, request).await?;
        Ok(Box::pin(pieces.map(|piece| piece.map(|data| v1::FileChunk { data }))))
    }

    pub async fn write_file(
        &self,
        workspace: Admitted,
        header: v1::WriteFileHeader,
        inbound: Streaming<v1::WriteFileRequest>,
    ) -> Reply<v1::WriteFileResponse> {
        let path = rel_path(&header.path)?;
        // Anything but chunks closed by a matching commit surfaces as an error item, which
        // makes the backend discard the temporary file: a write is whole or absent.
        let data = committed_chunks(inbound);
        let mode = if header.mode == 0 { 0o644 } else { header.mode & 0o777 };
        let options = WriteOptions { mode, max_bytes: self.max_file_bytes };
        let written = workspace.backend.write_file(&path, data, options).await.map_err(status)?;
        Ok(v1::WriteFileResponse { bytes_written: written })
    }

    pub async fn stat(&self, workspace: Admitted, request: v1::StatRequest) -> Reply<v1::FileInfo> {
        let path = rel_path(&request.path)?;
        let info = workspace.backend.stat(&path).await.map_err(status)?;
        Ok(file_info_to_proto(&info))
    }

    pub async fn list_dir(&self, workspace: Admitted, request: v1::ListDirRequest) -> Reply<v1::ListDirResponse> {
        let path = rel_path(&request.path)?;
        let entries = workspace.backend.list_dir(&path).await.map_err(status)?;
        Ok(v1::ListDirResponse { entries: entries.iter().map(file_info_to_proto).collect() })
    }

    pub async fn remove_path(
        &self,
        workspace: Admitted,
        request: v1::RemovePathRequest,
    ) -> Reply<v1::RemovePathResponse> {
        let path = rel_path(&request.path)?;
        if path.is_root() {
            return Err(NodeError::RemoveRoot.into());
        }
        let existed = workspace.backend.remove(&path, request.recursive).await.map_err(status)?;
        Ok(v1::RemovePathResponse { existed })
    }

    pub async fn make_dir(&self, workspace: Admitted, request: v1::MakeDirRequest) -> Reply<v1::MakeDirResponse> {
        let path = rel_path(&request.path)?;
        workspace.backend.mkdir(&path, request.parents).await.map_err(status)?;
        Ok(v1::MakeDirResponse {})
    }
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
                return Some((Ok(chunk), Some((inbound, received))));
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
