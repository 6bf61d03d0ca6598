//! `berth::run_with_io` against an in-process fake WorkspaceService.
//!
//! The fake is a test double of our own API, scripted by argv / path so each test can ask
//! for the answer it needs; it checks what the CLI puts on the wire (header first, chunk
//! sizes, deadlines) and what the CLI makes of the answers (exit codes, bytes, errors).

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use berth::{Cli, Io};
use berth_proto::v1::workspace_service_server::{WorkspaceService, WorkspaceServiceServer};
use berth_proto::v1::*;
use clap::Parser;
use tokio::io::{AsyncRead, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::{Request, Response, Status, Streaming};

type Reply<T> = Result<Response<T>, Status>;
type ChunkStream<T> = tokio_stream::Iter<std::vec::IntoIter<Result<T, Status>>>;

/// Size of the chunks the fake's ReadFile sends: odd, so reassembly is really tested.
const FAKE_READ_CHUNK: usize = 1000;

#[derive(Default)]
struct FakeState {
    files: HashMap<String, Vec<u8>>,
    /// Chunk sizes of each committed upload, by path.
    upload_chunks: HashMap<String, Vec<usize>>,
}

#[derive(Clone)]
struct Fake {
    state: Arc<Mutex<FakeState>>,
    /// Counts WriteFile handlers that finished, committed or not.
    uploads_ended: watch::Sender<usize>,
    /// Counts WriteFile data chunks received, committed or not.
    chunks_received: watch::Sender<usize>,
}

impl Fake {
    fn new() -> Self {
        Fake { state: Arc::default(), uploads_ended: watch::channel(0).0, chunks_received: watch::channel(0).0 }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, FakeState> {
        self.state.lock().expect("fake state lock poisoned")
    }
}

/// Counts a WriteFile handler as ended however it ends: returned, failed, or dropped.
struct EndGuard(watch::Sender<usize>);

impl Drop for EndGuard {
    fn drop(&mut self) {
        self.0.send_modify(|count| *count += 1);
    }
}

fn check_workspace(workspace_id: &str) -> Result<(), Status> {
    if workspace_id == "ws-missing" {
        return Err(Status::not_found(format!("workspace {workspace_id} not found")));
    }
    Ok(())
}

/// The scripted outcome of an exec, chosen by argv[0].
fn scripted_exec(request: &Request<ExecRequest>) -> ExecResult {
    let exec = request.get_ref();
    let program = exec.argv.first().map(String::as_str).unwrap_or_default();
    let mut result = ExecResult { stdout: b"out\n".to_vec(), stderr: b"err\n".to_vec(), ..ExecResult::default() };
    match program {
        "exit" => result.exit_code = exec.argv.get(1).and_then(|code| code.parse().ok()).unwrap_or(0),
        "sleep" => {
            result.exit_code = -1;
            result.timed_out = true;
            result.signal = 9;
        }
        "kill" => {
            result.exit_code = -1;
            result.signal = 9;
        }
        "truncate" => result.stdout_truncated = true,
        "cat" => result.stdout = exec.stdin.clone(),
        "binary" => result.stdout = (0..=255).collect(),
        "deadline" => {
            let header = request.metadata().get("grpc-timeout").and_then(|value| value.to_str().ok());
            result.stdout = header.unwrap_or("none").as_bytes().to_vec();
            result.stderr = exec.timeout_ms.to_string().into_bytes();
        }
        _ => {}
    }
    result
}

#[tonic::async_trait]
impl WorkspaceService for Fake {
    type ExecStreamStream = ChunkStream<ExecChunk>;
    type ReadFileStream = ChunkStream<FileChunk>;

    async fn exec(&self, request: Request<ExecRequest>) -> Reply<ExecResult> {
        check_workspace(&request.get_ref().workspace_id)?;
        Ok(Response::new(scripted_exec(&request)))
    }

    async fn exec_stream(&self, request: Request<ExecRequest>) -> Reply<Self::ExecStreamStream> {
        check_workspace(&request.get_ref().workspace_id)?;
        let exit = ExecResult { stdout: Vec::new(), stderr: Vec::new(), ..scripted_exec(&request) };
        let chunk = |kind| Ok(ExecChunk { kind: Some(kind) });
        let chunks = vec![
            chunk(exec_chunk::Kind::Stdout(b"one ".to_vec())),
            chunk(exec_chunk::Kind::Stderr(b"warn\n".to_vec())),
            chunk(exec_chunk::Kind::Stdout(b"two\n".to_vec())),
            chunk(exec_chunk::Kind::Exit(exit)),
        ];
        Ok(Response::new(tokio_stream::iter(chunks)))
    }

    async fn write_file(&self, request: Request<Streaming<WriteFileRequest>>) -> Reply<WriteFileResponse> {
        // Counted in a guard, so tests can wait for the end however it comes: return,
        // error, or hyper dropping this future.
        let _end = EndGuard(self.uploads_ended.clone());
        let mut stream = request.into_inner();
        let header = match stream.message().await? {
            Some(WriteFileRequest { msg: Some(write_file_request::Msg::Header(header)) }) => header,
            _ => {
                return Err(Status::invalid_argument("first WriteFile message must be the header"));
            }
        };
        check_workspace(&header.workspace_id)?;
        let mut data = Vec::new();
        let mut chunk_sizes = Vec::new();
        let mut committed = false;
        while let Some(message) = stream.message().await? {
            let chunk = match message.msg {
                Some(write_file_request::Msg::Chunk(chunk)) if !committed => chunk,
                Some(write_file_request::Msg::Commit(commit)) if commit.size == data.len() as u64 => {
                    committed = true;
                    continue;
                }
                _ => return Err(Status::invalid_argument("unexpected WriteFile message")),
            };
            chunk_sizes.push(chunk.len());
            data.extend_from_slice(&chunk);
            self.chunks_received.send_modify(|count| *count += 1);
        }
        // Like the real node: no commit, no file.
        if !committed {
            return Err(Status::invalid_argument("the write stream ended without a commit"));
        }
        let bytes_written = data.len() as u64;
        let mut state = self.state();
        state.files.insert(header.path.clone(), data);
        state.upload_chunks.insert(header.path, chunk_sizes);
        Ok(Response::new(WriteFileResponse { bytes_written }))
    }

    async fn read_file(&self, request: Request<ReadFileRequest>) -> Reply<Self::ReadFileStream> {
        let read = request.into_inner();
        check_workspace(&read.workspace_id)?;
        let Some(data) = self.state().files.get(&read.path).cloned() else {
            return Err(Status::not_found(format!("{} does not exist", read.path)));
        };
        let chunks: Vec<_> = data
            .chunks(FAKE_READ_CHUNK)
            .map(|chunk| Ok(FileChunk { data: bytes::Bytes::copy_from_slice(chunk) }))
            .collect();
        Ok(Response::new(tokio_stream::iter(chunks)))
    }

    async fn list_workspaces(&self, request: Request<ListWorkspacesRequest>) -> Reply<ListWorkspacesResponse> {
        // Five workspaces in pages of two; the token is the index of the next one.
        let start: usize = request.get_ref().page_token.parse().unwrap_or(0);
        let end = (start + 2).min(5);
        let workspaces = (start..end)
            .map(|index| Workspace {
                workspace_id: format!("ws-{index}"),
                state: WorkspaceState::Ready as i32,
                ..Workspace::default()
            })
            .collect();
        let next_page_token = if end < 5 { end.to_string() } else { String::new() };
        Ok(Response::new(ListWorkspacesResponse { workspaces, next_page_token }))
    }

    async fn create_session(&self, request: Request<CreateSessionRequest>) -> Reply<Session> {
        let create = request.into_inner();
        Ok(Response::new(Session {
            session_id: "sess-1".into(),
            workspace_id: "ws-abc".into(),
            user_id: create.user_id,
            agent_id: create.agent_id,
            created_at: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 }),
        }))
    }

    async fn get_session(&self, _: Request<GetSessionRequest>) -> Reply<Session> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn close_session(&self, _: Request<CloseSessionRequest>) -> Reply<CloseSessionResponse> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn get_workspace(&self, _: Request<GetWorkspaceRequest>) -> Reply<Workspace> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn close_workspace(&self, _: Request<CloseWorkspaceRequest>) -> Reply<CloseWorkspaceResponse> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn stat(&self, _: Request<StatRequest>) -> Reply<FileInfo> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn list_dir(&self, _: Request<ListDirRequest>) -> Reply<ListDirResponse> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn remove_path(&self, _: Request<RemovePathRequest>) -> Reply<RemovePathResponse> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn make_dir(&self, _: Request<MakeDirRequest>) -> Reply<MakeDirResponse> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn share_workspace(&self, _: Request<ShareWorkspaceRequest>) -> Reply<Workspace> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn unshare_workspace(&self, _: Request<UnshareWorkspaceRequest>) -> Reply<Workspace> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn snapshot_workspace(
        &self,
        _: Request<berth_proto::v1::SnapshotWorkspaceRequest>,
    ) -> Reply<berth_proto::v1::Snapshot> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn list_snapshots(
        &self,
        _: Request<berth_proto::v1::ListSnapshotsRequest>,
    ) -> Reply<berth_proto::v1::ListSnapshotsResponse> {
        Err(Status::unimplemented("not in the fake"))
    }
    async fn restore_workspace(&self, _: Request<berth_proto::v1::RestoreWorkspaceRequest>) -> Reply<Workspace> {
        Err(Status::unimplemented("not in the fake"))
    }
}

/// Serves `fake` on an ephemeral loopback port for the rest of the test.
async fn start(fake: Fake) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let address = listener.local_addr().expect("local address");
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(WorkspaceServiceServer::new(fake))
            .serve_with_incoming(TcpListenerStream::new(listener)),
    );
    address
}

/// What one CLI run produced.
struct Outcome {
    result: anyhow::Result<i32>,
    stdout: Vec<u8>,
    stderr: Vec<u8>,
}

impl Outcome {
    fn code(&self) -> i32 {
        match &self.result {
            Ok(code) => *code,
            Err(error) => panic!("run failed: {error:#}; stderr: {}", String::from_utf8_lossy(&self.stderr)),
        }
    }

    fn error_line(&self) -> String {
        match &self.result {
            Ok(code) => panic!("run succeeded with {code}, expected an error"),
            Err(error) => berth::error_line(error),
        }
    }
}

async fn run_cli_with_stdin(address: SocketAddr, args: &[&str], stdin: &mut (dyn AsyncRead + Unpin + Send)) -> Outcome {
    let endpoint = format!("http://{address}");
    let argv = ["berth", "--endpoint", endpoint.as_str()].into_iter().chain(args.iter().copied());
    let cli = Cli::try_parse_from(argv).expect("arguments parse");
    let mut stdout = Vec::new();
    let mut stderr = Vec::new();
    let io = Io { stdin, stdout: &mut stdout, stderr: &mut stderr };
    let result = berth::run_with_io(cli, io).await;
    Outcome { result, stdout, stderr }
}

async fn run_cli(address: SocketAddr, args: &[&str]) -> Outcome {
    run_cli_with_stdin(address, args, &mut tokio::io::empty()).await
}

#[tokio::test]
async fn exec_exit_codes_follow_the_command() {
    let address = start(Fake::new()).await;
    let exited = run_cli(address, &["exec", "ws-1", "--", "exit", "7"]).await;
    assert_eq!(exited.code(), 7);
    assert_eq!(exited.stdout, b"out\n");
    assert_eq!(exited.stderr, b"err\n");

    let timed_out = run_cli(address, &["exec", "--timeout", "1s", "ws-1", "--", "sleep", "5"]).await;
    assert_eq!(timed_out.code(), 124);
    let stderr = String::from_utf8_lossy(&timed_out.stderr);
    assert!(stderr.starts_with("err\n") && stderr.contains("warning: command timed out after 1s"), "{stderr}");

    let killed = run_cli(address, &["exec", "ws-1", "--", "kill"]).await;
    assert_eq!(killed.code(), 137);
}

#[tokio::test]
async fn exec_output_is_byte_exact_and_truncation_warns() {
    let address = start(Fake::new()).await;
    let binary = run_cli(address, &["exec", "ws-1", "--", "binary"]).await;
    assert_eq!(binary.code(), 0);
    assert_eq!(binary.stdout, (0..=255).collect::<Vec<u8>>());

    let truncated = run_cli(address, &["exec", "ws-1", "--", "truncate"]).await;
    assert_eq!(truncated.code(), 0);
    let stderr = String::from_utf8_lossy(&truncated.stderr);
    assert!(stderr.contains("warning: stdout of the command was truncated"), "{stderr}");
}

#[tokio::test]
async fn exec_reads_stdin_only_when_asked() {
    let address = start(Fake::new()).await;
    let input = b"from stdin\n\x00\xff";
    let piped = run_cli_with_stdin(address, &["exec", "--stdin", "ws-1", "--", "cat"], &mut &input[..]).await;
    assert_eq!(piped.code(), 0);
    assert_eq!(piped.stdout, input);

    let ignored = run_cli_with_stdin(address, &["exec", "ws-1", "--", "cat"], &mut &input[..]).await;
    assert_eq!(ignored.code(), 0);
    assert!(ignored.stdout.is_empty());
}

#[tokio::test]
async fn exec_deadline_is_longer_than_the_timeout() {
    let address = start(Fake::new()).await;
    let outcome = run_cli(address, &["exec", "--timeout", "2s", "ws-1", "--", "deadline"]).await;
    assert_eq!(outcome.code(), 0);
    assert_eq!(outcome.stderr, b"2000", "timeout_ms sent to the server");
    let header = String::from_utf8(outcome.stdout).expect("grpc-timeout is ascii");
    let deadline = parse_grpc_timeout(&header).unwrap_or_else(|| panic!("bad grpc-timeout {header:?}"));
    assert!(deadline > Duration::from_secs(2), "deadline {deadline:?} must exceed the 2s timeout");
}

/// Parses the gRPC wire form of a deadline: digits then a unit letter.
fn parse_grpc_timeout(header: &str) -> Option<Duration> {
    let (digits, unit) = header.split_at(header.len().checked_sub(1)?);
    let value: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(value * 3600),
        "M" => Duration::from_secs(value * 60),
        "S" => Duration::from_secs(value),
        "m" => Duration::from_millis(value),
        "u" => Duration::from_micros(value),
        "n" => Duration::from_nanos(value),
        _ => return None,
    })
}

#[tokio::test]
async fn exec_stream_writes_chunks_in_order() {
    let address = start(Fake::new()).await;
    let outcome = run_cli(address, &["exec", "--stream", "ws-1", "--", "exit", "3"]).await;
    assert_eq!(outcome.code(), 3);
    assert_eq!(outcome.stdout, b"one two\n");
    assert_eq!(outcome.stderr, b"warn\n");
}

#[tokio::test]
async fn rpc_errors_are_one_line_with_code_and_message() {
    let address = start(Fake::new()).await;
    let outcome = run_cli(address, &["exec", "ws-missing", "--", "true"]).await;
    assert_eq!(outcome.error_line(), "exec on ws-missing: not found: workspace ws-missing not found");
}

#[tokio::test]
async fn connection_refused_names_the_endpoint_and_berth_up() {
    // Bind then close, so the port is known to have no listener.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("local address");
    drop(listener);
    let outcome = run_cli(address, &["ws", "list"]).await;
    let line = outcome.error_line();
    assert!(line.starts_with(&format!("connect to http://{address}: connection refused")), "{line}");
    assert!(line.contains("berth up"), "{line}");
}

#[tokio::test]
async fn fs_write_streams_64k_chunks_and_read_returns_the_same_bytes() {
    let fake = Fake::new();
    let address = start(fake.clone()).await;
    // 200 KiB of a non-repeating pattern: three full chunks and a partial one.
    let content: Vec<u8> = (0..200 * 1024_u32).map(|index| (index * 31 % 251) as u8).collect();

    let written = run_cli_with_stdin(address, &["fs", "write", "ws-1", "dir/blob.bin"], &mut &content[..]).await;
    assert_eq!(written.code(), 0);
    assert_eq!(String::from_utf8_lossy(&written.stdout), "wrote 204800 bytes to ws-1:dir/blob.bin\n");
    {
        let state = fake.state();
        assert_eq!(state.files.get("dir/blob.bin"), Some(&content));
        assert_eq!(state.upload_chunks["dir/blob.bin"], [65536, 65536, 65536, 8192]);
    }

    let read = run_cli(address, &["fs", "read", "ws-1", "dir/blob.bin"]).await;
    assert_eq!(read.code(), 0);
    assert!(read.stdout == content, "read back {} bytes, expected {}", read.stdout.len(), content.len());
}

#[tokio::test]
async fn fs_write_of_empty_stdin_creates_an_empty_file() {
    let fake = Fake::new();
    let address = start(fake.clone()).await;
    let written = run_cli(address, &["fs", "write", "-o", "json", "ws-1", "empty"]).await;
    assert_eq!(written.code(), 0);
    let json: serde_json::Value = serde_json::from_slice(&written.stdout).expect("json output");
    assert_eq!(json["bytes_written"], 0);
    assert_eq!(fake.state().files.get("empty"), Some(&Vec::new()));
}

/// Yields one full upload chunk, then fails once `fail_when` resolves: a pipe whose
/// writer died mid-transfer.
struct FailingReader {
    first_chunk: Option<Vec<u8>>,
    fail_when: Pin<Box<dyn Future<Output = ()> + Send>>,
}

impl AsyncRead for FailingReader {
    fn poll_read(
        mut self: Pin<&mut Self>,
        context: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        if let Some(mut chunk) = self.first_chunk.take() {
            let now = chunk.len().min(buf.remaining());
            buf.put_slice(&chunk[..now]);
            chunk.drain(..now);
            if !chunk.is_empty() {
                self.first_chunk = Some(chunk);
            }
            return Poll::Ready(Ok(()));
        }
        match self.fail_when.as_mut().poll(context) {
            Poll::Ready(()) => Poll::Ready(Err(std::io::Error::other("pipe broke"))),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[tokio::test]
async fn fs_write_with_a_failing_stdin_commits_nothing() {
    let fake = Fake::new();
    let address = start(fake.clone()).await;
    let mut uploads_ended = fake.uploads_ended.subscribe();
    // Fail only once the server holds part of the upload, the case that must not commit.
    let mut chunks_received = fake.chunks_received.subscribe();
    let mut stdin = FailingReader {
        first_chunk: Some(vec![1; 64 * 1024]),
        fail_when: Box::pin(async move {
            let _ = chunks_received.wait_for(|count| *count >= 1).await;
        }),
    };
    let outcome = run_cli_with_stdin(address, &["fs", "write", "ws-1", "half"], &mut stdin).await;
    assert_eq!(outcome.error_line(), "write ws-1:half: read stdin: pipe broke");
    // Wait until the handler is over, whichever way it ended, then check it kept nothing.
    tokio::time::timeout(Duration::from_secs(10), uploads_ended.wait_for(|count| *count == 1))
        .await
        .expect("the fake's WriteFile handler did not end within 10s")
        .expect("fake server gone");
    assert!(!fake.state().files.contains_key("half"), "a partial upload was committed");
}

#[tokio::test]
async fn fs_read_of_a_missing_file_is_an_error() {
    let address = start(Fake::new()).await;
    let outcome = run_cli(address, &["fs", "read", "ws-1", "nope"]).await;
    assert_eq!(outcome.error_line(), "read ws-1:nope: not found: nope does not exist");
}

#[tokio::test]
async fn ws_list_follows_every_page() {
    let address = start(Fake::new()).await;
    let outcome = run_cli(address, &["ws", "list", "-o", "json"]).await;
    assert_eq!(outcome.code(), 0);
    let json: serde_json::Value = serde_json::from_slice(&outcome.stdout).expect("json output");
    let ids: Vec<&str> = json
        .as_array()
        .expect("an array")
        .iter()
        .map(|workspace| workspace["workspace_id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, ["ws-0", "ws-1", "ws-2", "ws-3", "ws-4"]);
    assert_eq!(json[0]["state"], "ready");
}

#[tokio::test]
async fn session_create_json_is_one_object() {
    let address = start(Fake::new()).await;
    let outcome = run_cli(address, &["session", "create", "--user", "u1", "--agent", "a1", "-o", "json"]).await;
    assert_eq!(outcome.code(), 0);
    let json: serde_json::Value = serde_json::from_slice(&outcome.stdout).expect("one json object");
    assert_eq!(json["session_id"], "sess-1");
    assert_eq!(json["workspace_id"], "ws-abc");
    assert_eq!(json["user_id"], "u1");
    assert_eq!(json["agent_id"], "a1");
    assert_eq!(json["created_at"], "2023-11-14T22:13:20Z");
}

/// The real binary: main's exit-status mapping and the one `error:` line on stderr.
async fn run_binary(address: SocketAddr, args: &[&str]) -> std::process::Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--endpoint")
        .arg(format!("http://{address}"))
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("spawn the berth binary")
}

#[tokio::test]
async fn binary_exits_with_the_command_status() {
    let address = start(Fake::new()).await;
    let exited = run_binary(address, &["exec", "ws-1", "--", "exit", "7"]).await;
    assert_eq!(exited.status.code(), Some(7));
    assert_eq!(exited.stdout, b"out\n");
    let timed_out = run_binary(address, &["exec", "ws-1", "--", "sleep"]).await;
    assert_eq!(timed_out.status.code(), Some(124));
    let missing = run_binary(address, &["exec", "ws-missing", "--", "true"]).await;
    assert_eq!(missing.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&missing.stderr),
        "error: exec on ws-missing: not found: workspace ws-missing not found\n"
    );
}

#[tokio::test]
async fn binary_stops_quietly_when_its_reader_goes_away() {
    use tokio::io::AsyncReadExt;

    let fake = Fake::new();
    fake.state().files.insert("big".into(), vec![b'x'; 4 * 1024 * 1024]);
    let address = start(fake).await;
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_berth"))
        .arg("--endpoint")
        .arg(format!("http://{address}"))
        .args(["fs", "read", "ws-1", "big"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the berth binary");
    // Read a little, then close the pipe like `| head -c 10` would.
    let mut stdout = child.stdout.take().expect("piped stdout");
    let mut first = [0_u8; 10];
    stdout.read_exact(&mut first).await.expect("first bytes");
    drop(stdout);
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("berth did not exit within 30s after its reader left")
        .expect("wait for berth");
    assert_eq!(output.status.code(), Some(141));
    assert_eq!(String::from_utf8_lossy(&output.stderr), "");
}
