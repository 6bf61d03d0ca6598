//! `ReadFile` through a replica is relayed as the node's HTTP/2 frames, undecoded
//! (`control-plane/src/passthrough.rs`), with real replicas, node agents and etcd: the
//! bytes arrive whole in the chunks asked for, the node's refusals and the replica's own
//! checks reach the client typed, a malformed request is refused by the replica, and a
//! node that dies mid-read ends the read with an error, never with a short file.

use std::time::Duration;

use berth_proto::meta::ErrorKind;
use berth_proto::v1;
use berth_tests::cluster::{Cluster, ClusterConfig};
use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use http::header::{CONTENT_TYPE, TE};
use http::{HeaderValue, Method, Uri};
use http_body_util::{BodyExt, Full};
use prost::Message;
use rand::RngCore;
use tonic::body::Body;
use tonic::{Code, Status};
use tower::ServiceExt;

const READ_FILE: &str = "/berth.v1.WorkspaceService/ReadFile";

fn random(size: usize) -> Vec<u8> {
    let mut data = vec![0u8; size];
    rand::rng().fill_bytes(&mut data);
    data
}

/// Writes `data` in 1 MiB chunks (the harness's writer sends one message per call).
async fn write(replica: &berth_tests::berth::BerthProcess, workspace_id: &str, path: &str, data: &[u8]) {
    let header = v1::WriteFileHeader { workspace_id: workspace_id.into(), path: path.into(), mode: 0 };
    let messages = berth_proto::convert::write_file_messages(header, data, 1024 * 1024);
    let written = replica.workspace_client().write_file(futures::stream::iter(messages)).await.expect("write");
    assert_eq!(written.into_inner().bytes_written, data.len() as u64);
}

/// The chunks of a read, or the status it ended with (and the bytes before it).
async fn read_chunks(
    replica: &berth_tests::berth::BerthProcess,
    request: v1::ReadFileRequest,
) -> Result<Vec<Bytes>, Status> {
    let mut stream = replica.workspace_client().read_file(request).await?.into_inner();
    let mut chunks = Vec::new();
    while let Some(chunk) = stream.next().await {
        chunks.push(chunk?.data);
    }
    Ok(chunks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_through_a_replica_arrives_whole_in_the_chunks_asked_for_and_refusals_stay_typed() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(1, 1)).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let workspace_id = replica.create_session("ida", "agent").await.expect("create").workspace_id;
    // Three blocks of the node's reader and a ragged end.
    let data = random(3 * 1024 * 1024 + 5);
    write(replica, &workspace_id, "data/blob.bin", &data).await;

    for chunk_size in [4096u32, 65536, 1024 * 1024] {
        let request =
            v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "data/blob.bin".into(), chunk_size };
        let chunks = read_chunks(replica, request).await.expect("read");
        assert!(chunks.iter().all(|chunk| chunk.len() <= chunk_size as usize), "a chunk over {chunk_size}");
        let full = chunks.iter().filter(|chunk| chunk.len() == chunk_size as usize).count();
        assert_eq!(full, data.len() / chunk_size as usize, "chunks of {chunk_size} bytes");
        assert_eq!(chunks.concat(), data, "chunk size {chunk_size}: other bytes than were written");
    }
    let empty = v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "data/empty".into(), chunk_size: 0 };
    write(replica, &workspace_id, "data/empty", b"").await;
    assert_eq!(read_chunks(replica, empty).await.expect("read").concat(), b"");

    // The node's refusal (a trailers-only answer) reaches the client typed.
    let missing = v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "data/none".into(), chunk_size: 0 };
    let status = read_chunks(replica, missing).await.expect_err("a missing file");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains("data/none"), "{status:?}");
    let directory = v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "data".into(), chunk_size: 0 };
    let status = read_chunks(replica, directory).await.expect_err("a directory");
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    // The node's typed kind (metadata beside the status) passes through too.
    let linked = replica.exec(&workspace_id, &["ln", "-s", "/etc/passwd", "escape"]).await.expect("ln");
    assert_eq!(linked.exit_code, 0, "{linked:?}");
    let escape = v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "escape".into(), chunk_size: 0 };
    let status = read_chunks(replica, escape).await.expect_err("a symlink out of the workspace");
    assert_eq!(ErrorKind::of(&status), Some(ErrorKind::PathEscapesRoot), "{status:?}");
    // The replica's own checks, before anything reaches a node.
    let escape = v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "../x".into(), chunk_size: 0 };
    let status = read_chunks(replica, escape).await.expect_err("a path out of the workspace");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let unknown = v1::ReadFileRequest { workspace_id: "ws-none".into(), path: "a".into(), chunk_size: 0 };
    let status = read_chunks(replica, unknown).await.expect_err("an unknown workspace");
    assert!(matches!(status.code(), Code::NotFound | Code::InvalidArgument), "{status:?}");
}

/// Sends `body` as a ReadFile request body, as it is; the status the replica answers.
async fn raw_read_file(endpoint: &str, body: Bytes) -> Status {
    let mut request = http::Request::new(Body::new(Full::new(body)));
    *request.method_mut() = Method::POST;
    *request.uri_mut() = Uri::from_static(READ_FILE);
    request.headers_mut().insert(TE, HeaderValue::from_static("trailers"));
    request.headers_mut().insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    let response =
        berth_tests::berth::channel(endpoint).oneshot(request).await.expect("the replica answers over HTTP/2");
    if let Some(status) = Status::from_header_map(response.headers()) {
        return status;
    }
    let trailers = response.into_body().collect().await.expect("body").trailers().cloned().expect("trailers");
    Status::from_header_map(&trailers).expect("a grpc-status")
}

fn framed(compressed: bool, declared: usize, message: &[u8]) -> BytesMut {
    let mut frame = BytesMut::new();
    frame.put_u8(u8::from(compressed));
    frame.put_u32(declared as u32);
    frame.put_slice(message);
    frame
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_read_file_request_is_refused_by_the_replica_with_a_typed_error() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(1, 1)).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let workspace_id = replica.create_session("jon", "agent").await.expect("create").workspace_id;
    write(replica, &workspace_id, "a.txt", b"abc").await;
    let message =
        v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "a.txt".into(), chunk_size: 0 }.encode_to_vec();

    // The well-formed request, sent the same raw way, is served (the harness is sound).
    let served = raw_read_file(&replica.endpoint, framed(false, message.len(), &message).freeze()).await;
    assert_eq!(served.code(), Code::Ok, "{served:?}");

    let cases: Vec<(&str, Bytes, Code)> = vec![
        ("no message", Bytes::new(), Code::InvalidArgument),
        ("a cut header", Bytes::from_static(&[0, 0, 0]), Code::InvalidArgument),
        ("a compressed message", framed(true, message.len(), &message).freeze(), Code::Unimplemented),
        ("a length past the body", framed(false, message.len() + 1, &message).freeze(), Code::InvalidArgument),
        (
            "two messages",
            {
                let mut two = framed(false, message.len(), &message);
                two.extend_from_slice(&framed(false, message.len(), &message));
                two.freeze()
            },
            Code::InvalidArgument,
        ),
        ("bytes that do not decode", framed(false, 3, &[0xff, 0xff, 0xff]).freeze(), Code::InvalidArgument),
        ("a body over 64 KiB", framed(false, 100 * 1024, &vec![0u8; 100 * 1024]).freeze(), Code::ResourceExhausted),
    ];
    for (case, body, expected) in cases {
        let status = raw_read_file(&replica.endpoint, body).await;
        assert_eq!(status.code(), expected, "{case}: {status:?}");
    }
    // The replica still serves.
    assert_eq!(replica.read_file(&workspace_id, "a.txt").await.expect("read"), b"abc");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_mid_read_ends_the_read_with_an_error_not_a_short_file() {
    let cluster = Cluster::start(ClusterConfig::on_shared_etcd(1, 1)).await.expect("cluster");
    let replica = &cluster.replicas[0].server;
    let workspace_id = replica.create_session("kim", "agent").await.expect("create").workspace_id;
    // Far more than the flow-control windows and socket buffers of both hops hold, so the
    // node is still sending when it dies.
    let size = 48 * 1024 * 1024;
    write(replica, &workspace_id, "big.bin", &random(size)).await;

    let request = v1::ReadFileRequest { workspace_id: workspace_id.clone(), path: "big.bin".into(), chunk_size: 65536 };
    let mut stream = replica.workspace_client().read_file(request).await.expect("open").into_inner();
    let first = stream.next().await.expect("a first chunk").expect("a first chunk");
    let mut received = first.data.len();
    cluster.nodes[0].server.kill();
    let ended = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(chunk) = stream.next().await {
            match chunk {
                Ok(chunk) => received += chunk.data.len(),
                Err(status) => return Some(status),
            }
        }
        None
    })
    .await
    .expect("the read ends within 60 s of the node's death");
    assert!(received < size, "all {size} bytes arrived although the node died after the first chunk");
    let status = ended.unwrap_or_else(|| panic!("the read ended cleanly after {received} of {size} bytes"));
    assert_ne!(status.code(), Code::Ok, "{status:?}");
}
