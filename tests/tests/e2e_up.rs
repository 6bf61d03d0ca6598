//! End to end: the real `berth up` process, driven by the real `berth` CLI binary and by a
//! raw gRPC client, then stopped by PID.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use berth_proto::v1;
use berth_tests::berth::{berth_binary, channel, start_up};
use futures::StreamExt;
use nix::sys::signal::Signal;
use tonic::Code;

fn cli(endpoint: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(berth_binary())
        .arg("--endpoint")
        .arg(endpoint)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn berth cli");
    child.stdin.take().expect("stdin").write_all(stdin).expect("write stdin");
    child.wait_with_output().expect("cli output")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_up_serves_the_cli_and_raw_grpc_then_stops_on_signal() {
    let data_dir = tempfile::tempdir().unwrap();
    let up = start_up(data_dir.path(), &[]).await.unwrap();
    let endpoint = up.endpoint.clone();

    // ---- the CLI binary ------------------------------------------------------------------
    let created = cli(&endpoint, &["session", "create", "--user", "alice", "--agent", "coder", "-o", "json"], b"");
    assert!(created.status.success(), "session create failed: {}", text(&created.stderr));
    let session: serde_json::Value = serde_json::from_slice(&created.stdout).expect("one JSON object");
    let workspace = session["workspace_id"].as_str().expect("workspace_id").to_owned();
    assert!(workspace.starts_with("ws-"), "{session}");
    assert!(session["session_id"].as_str().is_some_and(|id| !id.is_empty()), "{session}");

    let exit7 = cli(&endpoint, &["exec", &workspace, "--", "sh", "-c", "echo out; echo err >&2; exit 7"], b"");
    assert_eq!(exit7.status.code(), Some(7), "stderr: {}", text(&exit7.stderr));
    assert_eq!(text(&exit7.stdout), "out\n");
    assert!(text(&exit7.stderr).starts_with("err\n"), "{}", text(&exit7.stderr));

    let started = Instant::now();
    let timed_out = cli(&endpoint, &["exec", "--timeout", "1s", &workspace, "--", "sleep", "30"], b"");
    assert_eq!(timed_out.status.code(), Some(124), "stderr: {}", text(&timed_out.stderr));
    assert!(started.elapsed() < Duration::from_secs(3), "timeout took {:?}", started.elapsed());

    let payload = b"hello from stdin\n".repeat(1000);
    let written = cli(&endpoint, &["fs", "write", &workspace, "notes/hello.txt"], &payload);
    assert!(written.status.success(), "fs write: {}", text(&written.stderr));
    let read = cli(&endpoint, &["fs", "read", &workspace, "notes/hello.txt"], b"");
    assert!(read.status.success(), "fs read: {}", text(&read.stderr));
    assert_eq!(read.stdout, payload);
    let listing = cli(&endpoint, &["fs", "ls", &workspace, "-o", "json"], b"");
    let names: Vec<String> = serde_json::from_slice::<serde_json::Value>(&listing.stdout)
        .expect("json listing")
        .as_array()
        .expect("array")
        .iter()
        .filter_map(|entry| entry["name"].as_str().map(str::to_owned))
        .collect();
    for expected in [".mcp", "data", "notes", "sessions", "skills"] {
        assert!(names.iter().any(|name| name == expected), "{expected} missing from {names:?}");
    }
    let stat = cli(&endpoint, &["fs", "stat", &workspace, "notes/hello.txt", "-o", "json"], b"");
    let stat: serde_json::Value = serde_json::from_slice(&stat.stdout).expect("json stat");
    assert_eq!(stat["size"].as_u64(), Some(payload.len() as u64), "{stat}");
    let removed = cli(&endpoint, &["fs", "rm", &workspace, "notes/hello.txt"], b"");
    assert!(removed.status.success(), "fs rm: {}", text(&removed.stderr));

    // Bad input from the CLI: one clear line, non-zero exit.
    let unknown = cli(&endpoint, &["exec", "ws-does-not-exist", "--", "true"], b"");
    assert_eq!(unknown.status.code(), Some(1));
    let line = text(&unknown.stderr);
    assert!(line.starts_with("error: ") && line.contains("ws-does-not-exist") && line.lines().count() == 1, "{line}");
    let escape = cli(&endpoint, &["fs", "read", &workspace, "../../etc/passwd"], b"");
    assert_eq!(escape.status.code(), Some(1));
    assert!(text(&escape.stderr).contains("not allowed"), "{}", text(&escape.stderr));

    // ---- a raw gRPC client ---------------------------------------------------------------
    let mut client = up.workspace_client();
    let again = client
        .create_session(v1::CreateSessionRequest {
            user_id: "alice".into(),
            agent_id: "coder".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.workspace_id, workspace, "same (user, agent) must get the same workspace");
    let fetched = client.get_session(v1::GetSessionRequest { session_id: again.session_id.clone() }).await.unwrap();
    assert_eq!(fetched.into_inner().workspace_id, workspace);

    // A multi-chunk file through the streaming RPCs.
    let big: Vec<u8> = (0..5 * 1024 * 1024u32).map(|index| (index % 251) as u8).collect();
    let mut messages = vec![v1::WriteFileRequest {
        msg: Some(v1::write_file_request::Msg::Header(v1::WriteFileHeader {
            workspace_id: workspace.clone(),
            path: "data/big.bin".into(),
            mode: 0,
        })),
    }];
    messages.extend(big.chunks(64 * 1024).map(|chunk| v1::WriteFileRequest {
        msg: Some(v1::write_file_request::Msg::Chunk(bytes::Bytes::copy_from_slice(chunk))),
    }));
    messages.push(berth_proto::convert::write_file_commit(big.len() as u64));
    let written = client.write_file(futures::stream::iter(messages)).await.unwrap().into_inner();
    assert_eq!(written.bytes_written, big.len() as u64);
    // The chunk size a reader asks for bounds what it gets, and is reached: no message is
    // empty or longer, and some are exactly that long (0 asks for the 64 KiB default).
    for (asked, size) in [(0u32, 64 * 1024usize), (4096, 4096), (100_000, 100_000), (1024 * 1024, 1024 * 1024)] {
        let mut chunks = client
            .read_file(v1::ReadFileRequest {
                workspace_id: workspace.clone(),
                path: "data/big.bin".into(),
                chunk_size: asked,
            })
            .await
            .unwrap()
            .into_inner();
        let mut back = Vec::new();
        let mut lengths = Vec::new();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk.unwrap();
            lengths.push(chunk.data.len());
            back.extend_from_slice(&chunk.data);
        }
        assert!(back == big, "chunk_size {asked}: the bytes read back differ");
        assert!(
            lengths.iter().all(|&length| length > 0 && length <= size),
            "chunk_size {asked}: chunk lengths {lengths:?}"
        );
        assert_eq!(lengths.iter().max(), Some(&size), "chunk_size {asked}: no chunk of the size asked for");
    }

    // Typed statuses naming the problem.
    let status = client
        .exec(v1::ExecRequest { workspace_id: "ws-nope".into(), argv: vec!["true".into()], ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(status.message().contains("ws-nope"), "{status:?}");
    let status =
        client.stat(v1::StatRequest { workspace_id: workspace.clone(), path: "/etc/passwd".into() }).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("/etc/passwd"), "{status:?}");
    let status = client
        .create_session(v1::CreateSessionRequest { user_id: String::new(), agent_id: "a".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("user id"), "{status:?}");
    let huge_argv = vec!["x".repeat(64 * 1024); 8];
    let status = client
        .exec(v1::ExecRequest { workspace_id: workspace.clone(), argv: huge_argv, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("argv size"), "{status:?}");
    // A write whose client goes away mid-stream (the call is dropped after a chunk, while
    // the request stream is still open) leaves nothing behind.
    let opened = futures::stream::iter(vec![
        v1::WriteFileRequest {
            msg: Some(v1::write_file_request::Msg::Header(v1::WriteFileHeader {
                workspace_id: workspace.clone(),
                path: "half.txt".into(),
                mode: 0,
            })),
        },
        v1::WriteFileRequest { msg: Some(v1::write_file_request::Msg::Chunk(bytes::Bytes::from_static(b"partial"))) },
    ])
    .chain(futures::stream::pending());
    let abandoned = tokio::time::timeout(Duration::from_millis(500), client.write_file(opened)).await;
    assert!(abandoned.is_err(), "the write cannot finish while its stream is open");
    // The node notices the reset asynchronously: wait (bounded) for the temp file to go.
    let names = || {
        let mut client = client.clone();
        let workspace = workspace.clone();
        async move {
            let listing = client.list_dir(v1::ListDirRequest { workspace_id: workspace, path: String::new() }).await;
            listing.unwrap().into_inner().entries.into_iter().map(|entry| entry.name).collect::<Vec<String>>()
        }
    };
    let clean = berth_testkit::wait_until(Duration::from_secs(10), || async {
        names().await.iter().all(|name| !name.contains("half") && !name.contains("berth-tmp"))
    })
    .await;
    assert!(clean, "a cancelled write left {:?}", names().await);

    // A stream that ends cleanly but without its commit writes nothing.
    let uncommitted = vec![
        v1::WriteFileRequest {
            msg: Some(v1::write_file_request::Msg::Header(v1::WriteFileHeader {
                workspace_id: workspace.clone(),
                path: "uncommitted.txt".into(),
                mode: 0,
            })),
        },
        v1::WriteFileRequest { msg: Some(v1::write_file_request::Msg::Chunk(bytes::Bytes::from_static(b"truncated"))) },
    ];
    let status = client.clone().write_file(futures::stream::iter(uncommitted)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("without a commit"), "{status:?}");
    assert!(names().await.iter().all(|name| !name.contains("uncommitted")), "an uncommitted write left a file");

    // Health and reflection are served.
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel(&endpoint));
    let serving = health.check(tonic_health::pb::HealthCheckRequest { service: String::new() }).await.unwrap();
    assert_eq!(serving.into_inner().status, tonic_health::pb::health_check_response::ServingStatus::Serving as i32);

    // ---- stop by PID: Ctrl-C (SIGINT) shuts down cleanly -------------------------------
    up.process.signal(Signal::SIGINT);
    assert!(up.process.wait_exit(Duration::from_secs(10)), "berth up did not stop on SIGINT; log:\n{}", up.log());
    assert!(up.log().contains("control plane stopped"), "no clean shutdown in the log:\n{}", up.log());
}

/// `berth up` with a certificate a CA issued (not self-signed): its in-process node agent
/// verifies the public listener with `--tls-ca`, registers, and a session runs over TLS.
/// Before `--tls-ca` the node trusted only the certificate itself, failed every heartbeat
/// handshake, and every session was refused with "no live node".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn berth_up_serves_tls_with_a_certificate_a_ca_issued() {
    use berth_tests::process::{ManagedProcess, ProcessSpec, free_port};

    let dir = tempfile::tempdir().unwrap();
    let pki = dir.path().join("pki");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/certs/make-dev-certs.sh");
    let made = Command::new("bash").arg(script).arg(&pki).output().expect("openssl");
    assert!(made.status.success(), "make-dev-certs.sh: {}", text(&made.stderr));
    let path = |name: &str| pki.join(name).display().to_string();
    let port = free_port().unwrap();
    let data_dir = dir.path().join("data");
    let args = [
        "up".to_owned(),
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--tls-cert".into(),
        path("replica.pem"),
        "--tls-key".into(),
        path("replica.key"),
        "--tls-ca".into(),
        path("ca.pem"),
    ];
    let up = ManagedProcess::spawn(ProcessSpec::new("up-ca-tls", berth_binary()).args(args)).unwrap();
    let endpoint = format!("https://127.0.0.1:{port}");
    let with_ca = |args: &[&str]| {
        let ca = path("ca.pem");
        let mut words: Vec<String> = vec!["--ca-cert".into(), ca];
        words.extend(args.iter().map(|word| (*word).to_owned()));
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        cli(&endpoint, &words, b"")
    };
    // The node registers once its heartbeat handshake verifies: sessions work from then on.
    let created = berth_testkit::wait_until(Duration::from_secs(30), || {
        let output = with_ca(&["session", "create", "--user", "alice", "--agent", "coder", "-o", "json"]);
        async move { output.status.success() }
    })
    .await;
    assert!(created, "no session over TLS: {}", up.log_tail(30));
    let listed = with_ca(&["ws", "list", "-o", "json"]);
    let workspaces: serde_json::Value = serde_json::from_slice(&listed.stdout).expect("json");
    let workspace = workspaces[0]["workspace_id"].as_str().expect("a workspace").to_owned();
    let echoed = with_ca(&["exec", &workspace, "--", "echo", "over tls"]);
    assert_eq!(text(&echoed.stdout), "over tls\n", "{}", text(&echoed.stderr));
    drop(up);
}
