//! Hostile input through the public API (token auth, node secret, local backend):
//! the path-escape corpus through every file RPC (and exec's cwd), a symlink swapped
//! between check and use while reads and writes run, and oversize inputs — each refused
//! with a typed status naming the problem, nothing outside the workspace touched.

mod support;

use std::path::Path;
use std::time::Duration;

use berth_proto::meta::ErrorKind;
use berth_proto::v1;
use support::{ALICE, Client, Creds, Limits, write_messages};
use tonic::Code;

/// What an attempt must produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// Refused lexically: INVALID_ARGUMENT.
    Invalid,
    /// Over a path limit: INVALID_ARGUMENT with `x-berth-error: limit-exceeded`.
    TooLarge,
    /// Resolves outside the root: PERMISSION_DENIED with `x-berth-error: path-escapes-root`.
    Escapes,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Read,
    Write,
    Stat,
    List,
    Remove,
    Mkdir,
    ExecCwd,
}

const ALL_OPS: [Op; 7] = [Op::Read, Op::Write, Op::Stat, Op::List, Op::Remove, Op::Mkdir, Op::ExecCwd];

/// Traps set up inside the workspace (by exec, as an agent would).
const TRAPS: &str = r#"echo victim > ../berth-victim \
  && ln -s /etc esc && ln -s .. up && ln -s "$(cd .. && pwd -P)" absup \
  && mkdir sub && ln -s ../.. sub/link && ln -s /etc b && ln -s b chain && ln -s .. c2 && ln -s c2 c1 \
  && ln -s ../berth-dangling dang && ln -s /etc/berth-escape-probe dang_etc \
  && ln -s loop2 loop1 && ln -s loop1 loop2 \
  && name=$(basename "$(pwd -P)") && ln -s "../$name" backdir"#;

fn corpus() -> Vec<(Op, String, Expect)> {
    let mut cases = Vec::new();
    let lexical =
        ["..", "../", "./..", "a/../../berth-victim", "a/../b", "/etc/passwd", "/", "a\0b", "./../berth-victim"];
    for path in lexical {
        cases.extend(ALL_OPS.iter().map(|&op| (op, path.to_owned(), Expect::Invalid)));
    }
    cases.extend(ALL_OPS.iter().map(|&op| (op, "y".repeat(256), Expect::Invalid)));
    cases.extend(ALL_OPS.iter().map(|&op| (op, "x".repeat(4097), Expect::TooLarge)));
    cases.extend(ALL_OPS.iter().map(|&op| (op, vec!["d"; 65].join("/"), Expect::TooLarge)));
    // Through links that lead out: reads of existing files, writes of names that exist
    // nowhere (a broken backend must not be able to damage the machine).
    for link in ["esc", "up", "absup", "sub/link", "chain", "c1", "loop1", "backdir"] {
        let read_target = if matches!(link, "esc" | "chain") { "passwd" } else { "berth-victim" };
        cases.push((Op::Read, format!("{link}/{read_target}"), Expect::Escapes));
        cases.push((Op::Stat, format!("{link}/{read_target}"), Expect::Escapes));
        cases.push((Op::List, link.to_owned(), Expect::Escapes));
        cases.push((Op::ExecCwd, link.to_owned(), Expect::Escapes));
        cases.push((Op::Write, format!("{link}/berth-escape-probe"), Expect::Escapes));
        cases.push((Op::Mkdir, format!("{link}/berth-escape-probe-dir"), Expect::Escapes));
        cases.push((Op::Remove, format!("{link}/berth-escape-probe"), Expect::Escapes));
    }
    cases.push((Op::Remove, "up/berth-victim".into(), Expect::Escapes));
    for link in ["dang", "dang_etc"] {
        cases.push((Op::Write, link.into(), Expect::Escapes));
        cases.push((Op::Read, link.into(), Expect::Escapes));
        cases.push((Op::Mkdir, format!("{link}/below"), Expect::Escapes));
    }
    cases
}

async fn attempt(client: &mut Client, workspace: &str, op: Op, path: &str) -> Result<(), tonic::Status> {
    let workspace_id = workspace.to_owned();
    match op {
        Op::Read => support::read_all(client, workspace, path).await.map(drop),
        Op::Write => {
            client.write_file(futures::stream::iter(write_messages(workspace, path, b"escaped\n"))).await.map(drop)
        }
        Op::Stat => client.stat(v1::StatRequest { workspace_id, path: path.into() }).await.map(drop),
        Op::List => client.list_dir(v1::ListDirRequest { workspace_id, path: path.into() }).await.map(drop),
        Op::Remove => client
            .remove_path(v1::RemovePathRequest { workspace_id, path: path.into(), recursive: true })
            .await
            .map(drop),
        Op::Mkdir => {
            client.make_dir(v1::MakeDirRequest { workspace_id, path: path.into(), parents: true }).await.map(drop)
        }
        Op::ExecCwd => client
            .exec(v1::ExecRequest { workspace_id, argv: vec!["pwd".into()], cwd: path.into(), ..Default::default() })
            .await
            .map(drop),
    }
}

fn matches(expect: Expect, status: &tonic::Status) -> bool {
    match expect {
        Expect::Invalid => status.code() == Code::InvalidArgument,
        Expect::TooLarge => {
            status.code() == Code::InvalidArgument && ErrorKind::of(status) == Some(ErrorKind::LimitExceeded)
        }
        Expect::Escapes => {
            status.code() == Code::PermissionDenied && ErrorKind::of(status) == Some(ErrorKind::PathEscapesRoot)
        }
    }
}

async fn alices_workspace(client: &mut Client, agent: &str) -> String {
    client
        .create_session(v1::CreateSessionRequest { agent_id: agent.into(), ..Default::default() })
        .await
        .expect("session")
        .into_inner()
        .workspace_id
}

async fn outside_snapshot(client: &mut Client, workspace: &str) -> String {
    support::sh(
        client,
        workspace,
        "ls -a .. && cat ../berth-victim && ls -d /etc/berth-escape-probe* 2>/dev/null; true",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn path_escape_corpus_through_every_file_rpc() {
    let harness = support::start(Limits::default()).await;
    let mut client = harness.workspace(Creds::token(ALICE));
    let workspace = alices_workspace(&mut client, "escape").await;
    support::sh(&mut client, &workspace, TRAPS).await;
    let before = outside_snapshot(&mut client, &workspace).await;
    assert!(before.contains("victim"), "{before}");
    let cases = corpus();
    let mut failures = Vec::new();
    for (op, path, expect) in &cases {
        let outcome = attempt(&mut client, &workspace, *op, path).await;
        let ok = match &outcome {
            Err(status) => matches(*expect, status),
            Ok(()) => false,
        };
        if !ok {
            let shown: String = path.chars().take(60).collect();
            failures.push(format!("{op:?} {shown:?}: expected {expect:?}, got {outcome:?}"));
        }
    }
    let after = outside_snapshot(&mut client, &workspace).await;
    assert!(
        failures.is_empty(),
        "{} of {} escape attempts not refused as expected:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    assert_eq!(before, after, "something changed outside the workspace root");
    assert!(!Path::new("/etc/berth-escape-probe").exists() && !Path::new("/etc/berth-escape-probe-dir").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn symlink_swapped_between_check_and_use_never_escapes() {
    let harness = support::start(Limits::default()).await;
    let mut client = harness.workspace(Creds::token(ALICE));
    let workspace = alices_workspace(&mut client, "race").await;
    let probe = Path::new("/etc/berth-race-probe");
    let probe_dir = Path::new("/etc/berth-race-dir");
    // `d` flips between a real directory holding `passwd` and a symlink to /etc. The inside
    // `passwd` appears whole (written aside, then renamed): a read never catches it empty
    // between the shell's create and its write, which would look like a leak.
    let swapper = r#"end=$(( $(date +%s) + 8 )); n=0
        while [ "$(date +%s)" -lt "$end" ]; do
          rm -rf d; mkdir d; echo inside > d/.passwd; mv d/.passwd d/passwd; rm -rf d; ln -s /etc d; n=$((n+1))
        done; rm -rf d; echo "$n""#;
    let mut swapping = harness.workspace(Creds::token(ALICE));
    let swap_workspace = workspace.clone();
    let swap = tokio::spawn(async move {
        swapping
            .exec(v1::ExecRequest {
                workspace_id: swap_workspace,
                argv: vec!["sh".into(), "-c".into(), swapper.into()],
                timeout_ms: 30_000,
                ..Default::default()
            })
            .await
    });
    let mut inside_reads = 0u32;
    let mut refused = 0u32;
    let mut leaked = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(7);
    while tokio::time::Instant::now() < deadline {
        match support::read_all(&mut client, &workspace, "d/passwd").await {
            Ok(data) if data == b"inside\n" => inside_reads += 1,
            Ok(data) => leaked.push(format!(
                "read {} bytes: {:?}",
                data.len(),
                String::from_utf8_lossy(&data[..data.len().min(40)])
            )),
            Err(_) => refused += 1,
        }
        let _ = client.write_file(futures::stream::iter(write_messages(&workspace, "d/berth-race-probe", b"x"))).await;
        let _ = client
            .make_dir(v1::MakeDirRequest {
                workspace_id: workspace.clone(),
                path: "d/berth-race-dir".into(),
                parents: true,
            })
            .await;
        let _ = client
            .remove_path(v1::RemovePathRequest {
                workspace_id: workspace.clone(),
                path: "d/passwd".into(),
                recursive: false,
            })
            .await;
    }
    let swaps = swap.await.unwrap().expect("the swapper ran").into_inner();
    let escaped = probe.exists() || probe_dir.exists();
    // Clean up before asserting, so a failure does not leave files in /etc.
    let _ = std::fs::remove_file(probe);
    let _ = std::fs::remove_dir_all(probe_dir);
    assert!(leaked.is_empty(), "reads through the swapped link leaked host files: {leaked:?}");
    assert!(!escaped, "a write or mkdir through the swapped link landed in /etc");
    eprintln!(
        "swaps: {}; reads inside: {inside_reads}; reads refused: {refused}",
        String::from_utf8_lossy(&swaps.stdout).trim()
    );
    assert!(inside_reads + refused > 10, "the race was barely exercised");
}

fn assert_limit(status: &tonic::Status, limit: &str, case: &str) {
    assert_eq!(ErrorKind::of(status), Some(ErrorKind::LimitExceeded), "{case}: {status:?}");
    assert!(status.message().contains(limit), "{case}: {status:?} does not name {limit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn oversize_inputs_get_typed_statuses_naming_the_limit() {
    let limits = Limits { max_message_bytes: 1024 * 1024, max_execs_per_workspace: 2, max_file_bytes: 256 * 1024 };
    let harness = support::start(limits).await;
    let mut client = harness.workspace(Creds::token(ALICE));
    let workspace = alices_workspace(&mut client, "limits").await;
    let exec = |argv: Vec<String>, env: Vec<(String, String)>| v1::ExecRequest {
        workspace_id: workspace.clone(),
        argv,
        env: env.into_iter().collect(),
        ..Default::default()
    };

    let status = client.exec(exec(vec!["x".repeat(300 * 1024)], vec![])).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_limit(&status, "argv size", "huge argv");
    let status = client.exec(exec(vec!["a".into(); 5000], vec![])).await.unwrap_err();
    assert_limit(&status, "argv entries", "many argv entries");
    let many_env = (0..300).map(|index| (format!("V{index}"), "v".into())).collect();
    let status = client.exec(exec(vec!["true".into()], many_env)).await.unwrap_err();
    assert_limit(&status, "env entries", "many env entries");
    let status = client.exec(exec(vec!["true".into()], vec![("BIG".into(), "v".repeat(70 * 1024))])).await.unwrap_err();
    assert_limit(&status, "env size", "huge env");

    let long_path = "p/".repeat(2100);
    let status =
        client.stat(v1::StatRequest { workspace_id: workspace.clone(), path: long_path.clone() }).await.unwrap_err();
    assert_limit(&status, "path length", "long path");
    let status =
        client.write_file(futures::stream::iter(write_messages(&workspace, &long_path, b"x"))).await.unwrap_err();
    assert_limit(&status, "path length", "long write path");

    let long_id = "w".repeat(200);
    let status = client.exec(exec(vec!["true".into()], vec![])).await.map(drop);
    assert!(status.is_ok(), "a normal exec works: {status:?}");
    let status = client
        .exec(v1::ExecRequest { workspace_id: long_id.clone(), argv: vec!["true".into()], ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("workspace id"), "{status:?}");
    let status = client.get_session(v1::GetSessionRequest { session_id: long_id.clone() }).await.unwrap_err();
    assert!(status.message().contains("session id"), "{status:?}");
    let status =
        client.create_session(v1::CreateSessionRequest { agent_id: long_id, ..Default::default() }).await.unwrap_err();
    assert!(status.message().contains("agent id"), "{status:?}");

    // A message over the replica's decoding limit is refused before any handler runs.
    let mut big = exec(vec!["true".into()], vec![]);
    big.stdin = vec![0u8; 2 * 1024 * 1024];
    let status = client.exec(big).await.unwrap_err();
    assert!(matches!(status.code(), Code::OutOfRange | Code::ResourceExhausted), "{status:?}");

    // A file over the node's --max-file-bytes.
    let data = vec![7u8; 300 * 1024];
    let status =
        client.write_file(futures::stream::iter(write_messages(&workspace, "big.bin", &data))).await.unwrap_err();
    assert_limit(&status, "file size", "file over max-file-bytes");
    let listing = client.list_dir(v1::ListDirRequest { workspace_id: workspace.clone(), path: String::new() }).await;
    assert!(
        listing.unwrap().into_inner().entries.iter().all(|entry| entry.name != "big.bin"),
        "a refused write left a file"
    );

    // Concurrent execs per workspace: two run, the third is refused at once.
    let mut running = Vec::new();
    for _ in 0..2 {
        let stream = client.exec_stream(exec(vec!["sleep".into(), "30".into()], vec![])).await.unwrap().into_inner();
        running.push(stream);
    }
    let status = client.exec(exec(vec!["true".into()], vec![])).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_limit(&status, "max-execs-per-workspace", "third concurrent exec");
    // Dropping the streams kills the sleeps and frees the slots.
    drop(running);
    berth_testkit::eventually_ok("the exec slots to be freed", Duration::from_secs(15), || {
        let mut client = client.clone();
        async move {
            let result = client.exec(exec(vec!["true".into()], vec![])).await;
            if let Err(status) = &result {
                assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
            }
            result
        }
    })
    .await;
}
