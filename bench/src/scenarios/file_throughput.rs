//! `file-throughput`: one file written then read through the control plane (streaming
//! WriteFile / ReadFile: client → replica → node agent → disk), per file size and chunk
//! size, against the same bytes written and read on the local disk the way the node does
//! it (temp file, fsync, rename, fsync of the directory; then read back in chunks). A read
//! row also carries what the bytes alone cost over loopback TCP, in one hop and relayed
//! through a second, and in one hop over a Unix socket
//! ([`transport_floor`](super::transport_floor)).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use berth_proto::v1;
use berth_proto::v1::workspace_service_client::WorkspaceServiceClient;
use bytes::Bytes;
use futures::StreamExt;
use rand::RngCore;
use tonic::transport::Channel;

use super::common::{self, create_request};
use super::transport_floor;
use crate::env::progress;
use crate::env::{self, Ctx};
use crate::report::{Floor, Quantity, ScenarioResult};
use crate::stats::Summary;

pub const NAME: &str = "file-throughput";

const MIB: u64 = 1024 * 1024;
/// Files up to this size use the "small" repetition count.
const SMALL_FILE: u64 = 8 * MIB;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    Write,
    Read,
}

impl Direction {
    fn label(self) -> &'static str {
        match self {
            Self::Write => "write",
            Self::Read => "read",
        }
    }
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Vec<ScenarioResult>> {
    let etcd = env::start_etcd().await?;
    let cluster = env::start_cluster(env::cluster_config(ctx, &etcd, 1, 1)).await?;
    let channel = env::connect(&cluster.replicas[0].server.endpoint).await?;
    let mut client = env::workspace_client(channel.clone());
    let workspace_id = client
        .create_session(create_request("files", "coder", ""))
        .await
        .context("CreateSession")?
        .into_inner()
        .workspace_id;
    let generation = client
        .get_workspace(v1::GetWorkspaceRequest { workspace_id: workspace_id.clone() })
        .await
        .context("GetWorkspace")?
        .into_inner()
        .generation;
    let node_channel = env::connect(&cluster.nodes[0].server.endpoint).await?;
    // The floor writes on the filesystem holding the node's data directory.
    let floor_dir = tempfile::tempdir_in(cluster.nodes[0].data_dir.parent().unwrap_or(Path::new("/tmp")))
        .context("floor directory")?;

    let settings = &ctx.settings;
    let mut results = Vec::new();
    for &size_mib in &settings.file_sizes_mib {
        let size = size_mib * MIB;
        let mut data = vec![0u8; size as usize];
        rand::rng().fill_bytes(&mut data);
        let data = Bytes::from(data);
        let repetitions = if size <= SMALL_FILE { settings.file_repetitions.0 } else { settings.file_repetitions.1 };
        for &chunk_kib in &settings.file_chunks_kib {
            let chunk = (chunk_kib * 1024) as usize;
            let path = format!("bench/{size_mib}MiB-{chunk_kib}KiB.bin");
            let replica = Target::Replica(env::workspace_client(channel.clone()));
            let measured = measure(&replica, &workspace_id, &path, &data, chunk, repetitions).await;
            // The node agent alone, without the replica's hop: splits Berth's cost in two.
            let node = Target::Node(node_client(&node_channel), generation);
            let direct = measure(&node, &workspace_id, &format!("{path}.direct"), &data, chunk, repetitions).await;
            let floor = measure_floor(floor_dir.path(), &data, chunk, repetitions).await;
            let transport = transport_floor::measure(size as usize, chunk, repetitions).await;
            for direction in [Direction::Write, Direction::Read] {
                let case = format!("{} {size_mib} MiB chunk {chunk_kib} KiB", direction.label());
                let mut row = row(ctx, &case, direction, size, chunk_kib, repetitions, &measured, &floor);
                if let (Ok(row), Ok((writes, reads))) = (&mut row, &direct) {
                    let samples = if direction == Direction::Write { writes } else { reads };
                    if let Some(summary) = Summary::of(samples) {
                        row.metric("node_direct_p50_ms", summary.p50_ms);
                        row.metric("node_direct_mib_per_s", size as f64 / MIB as f64 / (summary.p50_ms / 1000.0));
                    }
                }
                if let (Ok(row), Direction::Read) = (&mut row, direction) {
                    transport_readings(row, &transport, &direct);
                }
                results.push(common::row_or_error(NAME, &case, &ctx.machine, row));
            }
        }
    }
    Ok(results)
}

/// A read row's transport floors, and the replica's and the node's reads against them
/// (how far Berth is from what moving the bytes over its sockets costs at least).
fn transport_readings(
    row: &mut ScenarioResult,
    transport: &anyhow::Result<transport_floor::TransportFloor>,
    direct: &Timings,
) {
    let floor = match transport {
        Ok(floor) => floor,
        Err(error) => {
            row.fail(format!("transport floor: {error:#}"));
            return;
        }
    };
    let (Some(one_hop), Some(relayed)) = (Summary::of(&floor.one_hop), Summary::of(&floor.relayed)) else {
        return;
    };
    row.metric("tcp_one_hop_p50_ms", one_hop.p50_ms);
    row.metric("tcp_relayed_p50_ms", relayed.p50_ms);
    if let Some(unix) = Summary::of(&floor.unix_one_hop) {
        row.metric("unix_one_hop_p50_ms", unix.p50_ms);
    }
    if let Some(measured) = &row.latency_ms {
        row.metric("via_replica_over_tcp_relayed", measured.p50_ms / relayed.p50_ms);
    }
    if let Some(node) = direct.as_ref().ok().and_then(|(_, reads)| Summary::of(reads)) {
        row.metric("node_direct_over_tcp_one_hop", node.p50_ms / one_hop.p50_ms);
    }
}

/// Write and read latencies of `repetitions` round trips.
type Timings = anyhow::Result<(Vec<Duration>, Vec<Duration>)>;

#[allow(clippy::too_many_arguments)]
fn row(
    ctx: &Ctx,
    case: &str,
    direction: Direction,
    size: u64,
    chunk_kib: u64,
    repetitions: usize,
    measured: &Timings,
    floor: &Timings,
) -> anyhow::Result<ScenarioResult> {
    let pick = |timings: &Timings| -> anyhow::Result<Vec<Duration>> {
        match timings {
            Ok((writes, reads)) => Ok(if direction == Direction::Write { writes.clone() } else { reads.clone() }),
            Err(error) => bail!("{error:#}"),
        }
    };
    let latencies = pick(measured)?;
    let floor_latencies = pick(floor).context("local disk floor")?;
    let mib_per_second = |latencies: &[Duration]| {
        Summary::of(latencies)
            .map(|summary| Quantity::new(size as f64 / MIB as f64 / (summary.p50_ms / 1000.0), "MiB/s"))
    };
    let mut result = ScenarioResult::new(NAME, case, &ctx.machine)
        .param("direction", direction.label())
        .param("bytes", size)
        .param("chunk_bytes", chunk_kib * 1024)
        .param("repetitions", repetitions);
    result.latency_ms = Summary::of(&latencies);
    result.throughput = mib_per_second(&latencies);
    result.wall_s = latencies.iter().sum::<Duration>().as_secs_f64();
    result.set_floor(Floor {
        name: if direction == Direction::Write { "local write+fsync+rename" } else { "local read" }.into(),
        latency_ms: Summary::of(&floor_latencies),
        throughput: mib_per_second(&floor_latencies),
    });
    Ok(result)
}

/// Where the file calls go: the public API of a replica, or a node agent directly (with
/// the generation metadata a replica would add).
enum Target {
    Replica(v1::workspace_service_client::WorkspaceServiceClient<Channel>),
    Node(WorkspaceServiceClient<Channel>, u64),
}

impl Target {
    fn label(&self) -> &'static str {
        match self {
            Self::Replica(_) => "through the control plane",
            Self::Node(..) => "on the node agent directly",
        }
    }

    async fn write(&self, messages: Vec<v1::WriteFileRequest>) -> anyhow::Result<u64> {
        let stream = futures::stream::iter(messages);
        let written = match self {
            Self::Replica(client) => client.clone().write_file(stream).await,
            Self::Node(client, generation) => client.clone().write_file(with_generation(stream, *generation)).await,
        };
        Ok(written.context("WriteFile")?.into_inner().bytes_written)
    }

    async fn read(&self, request: v1::ReadFileRequest) -> anyhow::Result<tonic::Streaming<v1::FileChunk>> {
        let stream = match self {
            Self::Replica(client) => client.clone().read_file(request).await,
            Self::Node(client, generation) => client.clone().read_file(with_generation(request, *generation)).await,
        };
        Ok(stream.context("ReadFile")?.into_inner())
    }
}

fn with_generation<T>(message: T, generation: u64) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Ok(value) = generation.to_string().parse() {
        request.metadata_mut().insert(berth_proto::meta::GENERATION, value);
    }
    request
}

fn node_client(channel: &Channel) -> WorkspaceServiceClient<Channel> {
    WorkspaceServiceClient::new(channel.clone()).max_decoding_message_size(64 * 1024 * 1024)
}

async fn measure(
    target: &Target,
    workspace_id: &str,
    path: &str,
    data: &Bytes,
    chunk: usize,
    repetitions: usize,
) -> Timings {
    progress!(
        "{NAME}: {} MiB in {} KiB chunks {}, {repetitions}×",
        data.len() as u64 / MIB,
        chunk / 1024,
        target.label()
    );
    let mut writes = Vec::with_capacity(repetitions);
    let mut reads = Vec::with_capacity(repetitions);
    for repetition in 0..repetitions {
        let header = v1::WriteFileRequest {
            msg: Some(v1::write_file_request::Msg::Header(v1::WriteFileHeader {
                workspace_id: workspace_id.to_owned(),
                path: path.to_owned(),
                mode: 0,
            })),
        };
        // Messages are built before the clock starts, as slices of the data (no copy).
        let chunks = (0..data.len()).step_by(chunk).map(|start| v1::WriteFileRequest {
            msg: Some(v1::write_file_request::Msg::Chunk(data.slice(start..(start + chunk).min(data.len())))),
        });
        let commit = berth_proto::convert::write_file_commit(data.len() as u64);
        let messages: Vec<v1::WriteFileRequest> = std::iter::once(header).chain(chunks).chain([commit]).collect();
        let started = Instant::now();
        let written = target.write(messages).await?;
        writes.push(started.elapsed());
        anyhow::ensure!(written == data.len() as u64, "WriteFile wrote {written} bytes");

        let request = v1::ReadFileRequest {
            workspace_id: workspace_id.to_owned(),
            path: path.to_owned(),
            chunk_size: chunk as u32,
        };
        let started = Instant::now();
        let mut stream = target.read(request).await?;
        // The first read keeps the bytes to check them; later ones only count, like the floor.
        let mut received = Vec::new();
        let mut length = 0usize;
        while let Some(piece) = stream.next().await {
            let piece = piece.context("ReadFile stream")?;
            length += piece.data.len();
            if repetition == 0 {
                received.extend_from_slice(&piece.data);
            }
        }
        reads.push(started.elapsed());
        anyhow::ensure!(length == data.len(), "ReadFile returned {length} of {} bytes", data.len());
        if repetition == 0 && received != data[..] {
            bail!("ReadFile returned other bytes than were written");
        }
    }
    Ok((writes, reads))
}

async fn measure_floor(dir: &Path, data: &Bytes, chunk: usize, repetitions: usize) -> Timings {
    let dir = dir.to_path_buf();
    let data = data.clone();
    tokio::task::spawn_blocking(move || {
        let target = dir.join("floor.bin");
        let mut writes = Vec::with_capacity(repetitions);
        let mut reads = Vec::with_capacity(repetitions);
        let mut buffer = vec![0u8; chunk];
        for _ in 0..repetitions {
            let started = Instant::now();
            write_like_the_node(&dir, &target, &data, chunk)?;
            writes.push(started.elapsed());
            let started = Instant::now();
            let mut file = std::fs::File::open(&target)?;
            let mut length = 0usize;
            loop {
                let read = file.read(&mut buffer)?;
                if read == 0 {
                    break;
                }
                length += read;
            }
            reads.push(started.elapsed());
            anyhow::ensure!(length == data.len(), "read back {length} of {} bytes", data.len());
        }
        Ok((writes, reads))
    })
    .await
    .context("floor task")?
}

/// A temp file in the same directory, written in `chunk` pieces, fsynced, renamed over
/// `target`, and the directory fsynced so the rename is durable.
fn write_like_the_node(dir: &Path, target: &Path, data: &[u8], chunk: usize) -> anyhow::Result<()> {
    let temporary: PathBuf = dir.join(format!(".floor-{:08x}.tmp", rand::random::<u32>()));
    let mut file = std::fs::File::create(&temporary).context("floor temp file")?;
    for piece in data.chunks(chunk) {
        file.write_all(piece)?;
    }
    file.sync_all()?;
    drop(file);
    std::fs::rename(&temporary, target)?;
    std::fs::File::open(dir)?.sync_all()?;
    Ok(())
}
