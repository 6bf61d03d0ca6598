//! Suite cases: exec and exec_stream.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use super::{BackendFixture, assert_eventually, process_alive, read, rel, sh, sh_ok};
use crate::assert_err;
use berth_workspace::backend::{ExecEvent, ExecSpec};
use berth_workspace::error::WorkspaceError;

/// How long a killed process may take to disappear before a test fails.
const DEATH_DEADLINE: Duration = Duration::from_secs(10);

fn shell(script: &str) -> ExecSpec {
    ExecSpec::new(vec!["sh".into(), "-c".into(), script.into()])
}

pub async fn exit_code(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let output = backend.exec(&shell("exit 7")).await.unwrap();
    assert_eq!(output.exit_code, 7);
    assert_eq!(output.signal, None);
    assert!(!output.timed_out);
    assert!(output.duration > Duration::ZERO);
    let output = backend.exec(&ExecSpec::new(vec!["echo".into(), "a b".into(), "$HOME".into()])).await.unwrap();
    // argv is passed as is: no shell, no word splitting, no expansion.
    assert_eq!(&output.stdout[..], b"a b $HOME\n");
    assert_eq!(output.exit_code, 0);
}

pub async fn killed_by_signal(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let output = backend.exec(&shell("kill -9 $$")).await.unwrap();
    assert_eq!(output.exit_code, -1);
    assert_eq!(output.signal, Some(9));
    assert!(!output.timed_out);
}

pub async fn stdin_passthrough(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    // Larger than a pipe buffer both ways: stdin must be fed while stdout is read.
    let input: Vec<u8> = (0..1024 * 1024 + 17).map(|index| (index % 253) as u8).collect();
    let mut spec = ExecSpec::new(vec!["cat".into()]);
    spec.stdin = Bytes::from(input.clone());
    spec.max_output_bytes = 2 * input.len();
    let output = backend.exec(&spec).await.unwrap();
    assert_eq!(output.exit_code, 0);
    assert_eq!(output.stdout.len(), input.len());
    assert!(output.stdout[..] == input[..], "stdin did not come back unchanged");
    // A child that never reads stdin still finishes.
    let mut spec = shell("exit 0");
    spec.stdin = Bytes::from(vec![b'x'; 1024 * 1024]);
    assert_eq!(backend.exec(&spec).await.unwrap().exit_code, 0);
}

pub async fn env_passthrough(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let mut spec = shell(r#"printf '%s|%s' "$BERTH_SUITE_VALUE" "${BERTH_UNSET-unset}""#);
    spec.spawn.env = BTreeMap::from([("BERTH_SUITE_VALUE".to_owned(), "spaces and $dollars".to_owned())]);
    let output = backend.exec(&spec).await.unwrap();
    assert_eq!(&output.stdout[..], b"spaces and $dollars|unset");
    let mut bad = shell("true");
    bad.spawn.env = BTreeMap::from([("BAD-NAME".to_owned(), "x".to_owned())]);
    assert_err!(backend.exec(&bad).await, WorkspaceError::InvalidArgument(_));
}

pub async fn cwd(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    backend.mkdir(&rel("sub/dir"), true).await.unwrap();
    let mut spec = shell("pwd -P && echo made > made.txt");
    spec.spawn.cwd = rel("sub/dir");
    let output = backend.exec(&spec).await.unwrap();
    assert_eq!(output.exit_code, 0);
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(printed.trim_end().ends_with("/sub/dir"), "pwd printed {printed:?}");
    assert_eq!(read(&*backend, "sub/dir/made.txt").await.unwrap(), b"made\n");
    // A symlinked directory inside the root is a fine cwd.
    sh_ok(&*backend, "ln -s sub/dir dirlink", &[]).await;
    let mut spec = shell("cat made.txt");
    spec.spawn.cwd = rel("dirlink");
    assert_eq!(&backend.exec(&spec).await.unwrap().stdout[..], b"made\n");
}

pub async fn cwd_refused(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    sh_ok(&*backend, "ln -s /etc esc && ln -s .. up && echo x > file", &[]).await;
    for (cwd, escapes) in [("esc", true), ("up", true), ("missing", false), ("file", false)] {
        let mut spec = shell("touch berth-cwd-probe");
        spec.spawn.cwd = rel(cwd);
        let result = backend.exec(&spec).await;
        match (escapes, &result) {
            (true, Err(WorkspaceError::PathEscapesRoot { .. })) => {}
            (false, Err(WorkspaceError::NotFound { .. } | WorkspaceError::NotADirectory { .. })) => {}
            _ => panic!("cwd {cwd:?}: unexpected {result:?}"),
        }
    }
    let leftovers = sh(&*backend, "ls /etc/berth-cwd-probe ../berth-cwd-probe", &[]).await;
    assert_ne!(leftovers.exit_code, 0, "a refused cwd still ran the command");
}

pub async fn timeout_kills_grandchildren(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let mut spec = shell("sleep 30 & echo $! > grandchild.pid; sleep 30");
    spec.timeout = Duration::from_secs(1);
    let started = std::time::Instant::now();
    let output = backend.exec(&spec).await.unwrap();
    let took = started.elapsed();
    assert!(output.timed_out);
    assert_eq!(output.exit_code, -1);
    assert!(output.duration >= Duration::from_secs(1), "{:?}", output.duration);
    assert!(took < Duration::from_secs(10), "exec returned after {took:?}");
    let pid = read(&*backend, "grandchild.pid").await.unwrap();
    let pid = String::from_utf8(pid).unwrap();
    let pid = pid.trim();
    assert!(!pid.is_empty());
    assert_eventually(&format!("grandchild {pid} of a timed-out exec to die"), DEATH_DEADLINE, || async {
        !process_alive(&*backend, pid).await
    })
    .await;
}

pub async fn output_truncation(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let script = "head -c \"$1\" /dev/zero; head -c \"$2\" /dev/zero >&2";
    let run = |stdout_bytes: usize, stderr_bytes: usize, cap: usize| {
        let backend = backend.clone();
        async move {
            let mut spec = ExecSpec::new(vec![
                "sh".into(),
                "-c".into(),
                script.into(),
                "sh".into(),
                stdout_bytes.to_string(),
                stderr_bytes.to_string(),
            ]);
            spec.max_output_bytes = cap;
            let output = backend.exec(&spec).await.unwrap();
            assert_eq!(output.exit_code, 0, "{}", String::from_utf8_lossy(&output.stderr));
            output
        }
    };
    let output = run(100_000, 10, 1000).await;
    assert_eq!((output.stdout.len(), output.stdout_truncated), (1000, true));
    assert_eq!((output.stderr.len(), output.stderr_truncated), (10, false));
    let output = run(10, 100_000, 1000).await;
    assert_eq!((output.stdout.len(), output.stdout_truncated), (10, false));
    assert_eq!((output.stderr.len(), output.stderr_truncated), (1000, true));
    // Exactly at the cap is not truncated.
    let output = run(1000, 1000, 1000).await;
    assert_eq!((output.stdout.len(), output.stdout_truncated), (1000, false));
    assert_eq!((output.stderr.len(), output.stderr_truncated), (1000, false));
    // Far past the cap: the child is drained, not blocked on a full pipe.
    let output = run(20 * 1024 * 1024, 20 * 1024 * 1024, 16).await;
    assert_eq!((output.stdout.len(), output.stdout_truncated), (16, true));
    assert_eq!((output.stderr.len(), output.stderr_truncated), (16, true));
    assert!(!output.timed_out);
}

pub async fn orphan_holding_pipe_does_not_hang(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    // The background sleep inherits stdout and outlives the shell.
    let mut spec = shell("sleep 30 & echo $! > orphan.pid; echo done");
    spec.timeout = Duration::from_secs(20);
    let output = backend.exec(&spec).await.unwrap();
    assert_eq!(output.exit_code, 0);
    assert!(!output.timed_out);
    assert_eq!(&output.stdout[..], b"done\n");
    assert!(
        output.duration < Duration::from_secs(5),
        "an orphan holding the pipe kept exec open for {:?}",
        output.duration
    );
    let pid = String::from_utf8(read(&*backend, "orphan.pid").await.unwrap()).unwrap();
    sh(&*backend, "kill -9 \"$1\"", &[pid.trim()]).await;
}

pub async fn missing_program(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let program = "berth-no-such-program";
    let result = backend.exec(&ExecSpec::new(vec![program.into(), "arg".into()])).await;
    match result {
        Err(WorkspaceError::SpawnFailed { program: named, .. }) => assert_eq!(named, program),
        other => panic!("expected SpawnFailed, got {other:?}"),
    }
    assert_err!(backend.exec(&ExecSpec::new(vec![])).await, WorkspaceError::InvalidArgument(_));
}

/// Collects a stream: stdout, stderr and the events in order.
async fn collect(
    backend: &dyn berth_workspace::backend::Backend,
    spec: &ExecSpec,
) -> (Vec<u8>, Vec<u8>, Vec<ExecEvent>) {
    let mut stream = backend.exec_stream(spec).await.unwrap();
    let (mut stdout, mut stderr, mut events) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(event) = stream.next().await {
        let event = event.unwrap();
        match &event {
            ExecEvent::Stdout(chunk) => stdout.extend_from_slice(chunk),
            ExecEvent::Stderr(chunk) => stderr.extend_from_slice(chunk),
            ExecEvent::Exit(_) => {}
        }
        events.push(event);
    }
    (stdout, stderr, events)
}

pub async fn stream_order(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let spec = shell("printf one; printf err >&2; printf two; exit 3");
    let (stdout, stderr, events) = collect(&*backend, &spec).await;
    assert_eq!(stdout, b"onetwo");
    assert_eq!(stderr, b"err");
    let exits: Vec<_> = events.iter().filter(|event| matches!(event, ExecEvent::Exit(_))).collect();
    assert_eq!(exits.len(), 1, "events: {events:?}");
    let Some(ExecEvent::Exit(exit)) = events.last() else {
        panic!("the last event is not Exit: {events:?}");
    };
    assert_eq!(exit.exit_code, 3);
    assert!(exit.stdout.is_empty() && exit.stderr.is_empty());
    assert!(!exit.stdout_truncated && !exit.stderr_truncated && !exit.timed_out);
}

pub async fn stream_caps(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let mut spec = shell("printf 0123456789ab; printf xy >&2");
    spec.max_output_bytes = 5;
    let (stdout, stderr, events) = collect(&*backend, &spec).await;
    assert_eq!(stdout, b"01234");
    assert_eq!(stderr, b"xy");
    let Some(ExecEvent::Exit(exit)) = events.last() else {
        panic!("the last event is not Exit: {events:?}");
    };
    assert!(exit.stdout_truncated);
    assert!(!exit.stderr_truncated);
    // The stream honours the timeout too.
    let mut spec = shell("sleep 30");
    spec.timeout = Duration::from_millis(300);
    let (_, _, events) = collect(&*backend, &spec).await;
    let Some(ExecEvent::Exit(exit)) = events.last() else {
        panic!("the last event is not Exit: {events:?}");
    };
    assert!(exit.timed_out);
    assert_eq!(exit.exit_code, -1);
}

pub async fn stream_drop_kills(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    // Liveness by heartbeat, not by pid: backends that give every exec its own pid
    // namespace (bubblewrap) cannot see one exec's pids from the next exec.
    let spec = shell(&format!("({HEARTBEAT}) & echo started; wait"));
    let mut stream = backend.exec_stream(&spec).await.unwrap();
    match stream.next().await {
        Some(Ok(ExecEvent::Stdout(chunk))) => assert_eq!(&chunk[..], b"started\n"),
        other => panic!("expected the first output, got {other:?}"),
    }
    assert_eventually("the child of a streamed exec to beat", DEATH_DEADLINE, || async {
        heart_beats(&*backend).await
    })
    .await;
    drop(stream);
    assert_eventually("the child of a dropped exec stream to die", DEATH_DEADLINE, || async {
        !heart_beats(&*backend).await
    })
    .await;
}

/// A loop that rewrites [`HEARTBEAT_FILE`] with a new count every 100 ms.
const HEARTBEAT: &str = "i=0; while :; do i=$((i+1)); echo $i > heartbeat; sleep 0.1; done";
const HEARTBEAT_FILE: &str = "heartbeat";
/// How long a heartbeat may stay unchanged before its writer counts as dead (20 beats).
const HEARTBEAT_QUIET: Duration = Duration::from_secs(2);

/// Whether the heartbeat file changes within [`HEARTBEAT_QUIET`].
async fn heart_beats(backend: &dyn berth_workspace::backend::Backend) -> bool {
    let first = read(backend, HEARTBEAT_FILE).await.ok();
    let give_up = tokio::time::Instant::now() + HEARTBEAT_QUIET;
    while tokio::time::Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if read(backend, HEARTBEAT_FILE).await.ok() != first {
            return true;
        }
    }
    false
}
