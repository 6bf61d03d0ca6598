//! Suite cases: the path-escape corpus.
//!
//! Each case sets up its trap through `exec` (so the same case runs against a sandbox whose
//! files the host cannot see), then tries every file operation that applies and asserts the
//! exact refusal. Around the attempts it snapshots what lies outside the root — the listing
//! of `..` and a victim file planted there — and asserts that nothing changed: no file was
//! created, written or removed outside. Destructive probes outside `..` (under `/etc`) only
//! ever name files that do not exist, so a broken backend cannot damage the machine.

use bytes::Bytes;

use super::{BackendFixture, rel, sh, sh_ok};
use berth_workspace::backend::Backend;
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::{MAX_PATH_BYTES, MAX_PATH_DEPTH, RelPath};

/// What an attempt must produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    /// `PathEscapesRoot`: the path is lexically fine but resolves outside.
    Escapes,
    /// `InvalidPath`: refused by `join_path` before any backend sees it.
    Invalid,
    /// `LimitExceeded` (path length or depth).
    TooLarge,
}

#[derive(Clone, Copy, Debug)]
enum Op {
    Read,
    Write,
    Stat,
    List,
    Remove,
    Mkdir,
}

const ALL_OPS: [Op; 6] = [Op::Read, Op::Write, Op::Stat, Op::List, Op::Remove, Op::Mkdir];

struct Attempt {
    op: Op,
    path: String,
    expect: Expect,
}

fn attempt(op: Op, path: &str, expect: Expect) -> Attempt {
    Attempt { op, path: path.to_owned(), expect }
}

/// The same path and expectation for every operation.
fn every_op(path: &str, expect: Expect) -> Vec<Attempt> {
    ALL_OPS.iter().map(|&op| attempt(op, path, expect)).collect()
}

/// A client request: parse the client string (as every API entry point does), then run the
/// operation. Removal is recursive and mkdir creates parents: the most dangerous variants.
async fn perform(backend: &dyn Backend, op: Op, client_path: &str) -> Result<String> {
    let path = RelPath::parse(client_path)?;
    match op {
        Op::Read => backend.read_to_bytes(&path, 1024 * 1024).await.map(|bytes| format!("read {} bytes", bytes.len())),
        Op::Write => backend
            .write_bytes(&path, Bytes::from_static(b"escaped\n"), 0o644)
            .await
            .map(|written| format!("wrote {written} bytes")),
        Op::Stat => backend.stat(&path).await.map(|info| format!("stat {info:?}")),
        Op::List => backend.list_dir(&path).await.map(|entries| format!("listed {} entries", entries.len())),
        Op::Remove => backend.remove(&path, true).await.map(|existed| format!("removed (existed: {existed})")),
        Op::Mkdir => backend.mkdir(&path, true).await.map(|()| "created a directory".into()),
    }
}

/// What the world outside the root looks like, as far as a case can change it.
async fn outside_snapshot(backend: &dyn Backend) -> String {
    let output =
        sh_ok(backend, "ls -a .. && cat ../berth-victim && ls -d /etc/berth-escape-probe* 2>/dev/null; true", &[])
            .await;
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Runs one corpus case: `setup` in the root, then every attempt, then the outside check.
async fn run_case(fixture: &dyn BackendFixture, setup: &str, attempts: Vec<Attempt>) {
    let backend = fixture.backend();
    sh_ok(&*backend, "echo victim > ../berth-victim", &[]).await;
    if !setup.is_empty() {
        sh_ok(&*backend, setup, &[]).await;
    }
    let before = outside_snapshot(&*backend).await;
    assert!(before.contains("victim"), "the victim file was not planted: {before:?}");
    let mut failures = Vec::new();
    for Attempt { op, path, expect } in &attempts {
        let result = perform(&*backend, *op, path).await;
        let matched = matches!(
            (expect, &result),
            (Expect::Escapes, Err(WorkspaceError::PathEscapesRoot { .. }))
                | (Expect::Invalid, Err(WorkspaceError::InvalidPath { .. }))
                | (Expect::TooLarge, Err(WorkspaceError::LimitExceeded { .. }))
        );
        if !matched {
            let shown: String = path.chars().take(80).collect();
            failures.push(format!("{op:?} {shown:?}: expected {expect:?}, got {result:?}"));
        }
    }
    let after = outside_snapshot(&*backend).await;
    assert!(failures.is_empty(), "escape attempts not refused:\n{}", failures.join("\n"));
    assert_eq!(before, after, "something changed outside the workspace root");
    // The root's own parent must not have gained a probe either way.
    let probes = sh(&*backend, "ls -d ../berth-probe* ../berth-dangling* 2>/dev/null", &[]).await;
    assert!(probes.stdout.is_empty(), "probes outside: {:?}", probes.stdout);
}

pub async fn dotdot(fixture: &dyn BackendFixture) {
    run_case(fixture, "", every_op("..", Expect::Invalid)).await;
}

pub async fn dotdot_twice_through_dir(fixture: &dyn BackendFixture) {
    run_case(fixture, "mkdir a", every_op("a/../../berth-victim", Expect::Invalid)).await;
}

pub async fn dotdot_inside(fixture: &dyn BackendFixture) {
    // Stays inside lexically, but `..` is refused outright: no normalisation corner cases.
    run_case(fixture, "mkdir a && echo b > b", every_op("a/../b", Expect::Invalid)).await;
}

pub async fn absolute_etc_passwd(fixture: &dyn BackendFixture) {
    run_case(fixture, "", every_op("/etc/passwd", Expect::Invalid)).await;
}

pub async fn absolute_root(fixture: &dyn BackendFixture) {
    run_case(fixture, "", every_op("/", Expect::Invalid)).await;
}

pub async fn nul_byte(fixture: &dyn BackendFixture) {
    let mut attempts = every_op("a\0b", Expect::Invalid);
    attempts.extend(every_op("berth-victim\0/../..", Expect::Invalid));
    run_case(fixture, "", attempts).await;
}

pub async fn dot_slash_dotdot(fixture: &dyn BackendFixture) {
    let mut attempts = every_op("./../x", Expect::Invalid);
    attempts.extend(every_op("./../berth-victim", Expect::Invalid));
    run_case(fixture, "", attempts).await;
}

pub async fn too_long(fixture: &dyn BackendFixture) {
    let long = "x".repeat(MAX_PATH_BYTES + 1);
    let mut attempts = every_op(&long, Expect::TooLarge);
    // A single component over NAME_MAX is malformed rather than large.
    attempts.extend(every_op(&"y".repeat(256), Expect::Invalid));
    run_case(fixture, "", attempts).await;
}

pub async fn too_deep(fixture: &dyn BackendFixture) {
    let deep = vec!["d"; MAX_PATH_DEPTH + 1].join("/");
    run_case(fixture, "", every_op(&deep, Expect::TooLarge)).await;
}

pub async fn symlink_to_etc(fixture: &dyn BackendFixture) {
    use Expect::Escapes;
    let attempts = vec![
        attempt(Op::Read, "esc/passwd", Escapes),
        attempt(Op::Stat, "esc/passwd", Escapes),
        attempt(Op::List, "esc", Escapes),
        attempt(Op::Write, "esc/berth-escape-probe", Escapes),
        attempt(Op::Mkdir, "esc/berth-escape-probe-dir", Escapes),
        attempt(Op::Remove, "esc/berth-escape-probe", Escapes),
        attempt(Op::Read, "esc", Escapes),
        attempt(Op::Write, "esc", Escapes),
        attempt(Op::Mkdir, "esc", Escapes),
    ];
    run_case(fixture, "ln -s /etc esc", attempts).await;
    // The link itself is an ordinary entry of the root.
    let backend = fixture.backend();
    assert_eq!(backend.stat(&rel("esc")).await.unwrap().kind, berth_workspace::backend::FileKind::Symlink);
}

/// Every operation through a directory symlink that leads to the root's parent.
fn through_parent_link(link: &str) -> Vec<Attempt> {
    use Expect::Escapes;
    vec![
        attempt(Op::Read, &format!("{link}/berth-victim"), Escapes),
        attempt(Op::Stat, &format!("{link}/berth-victim"), Escapes),
        attempt(Op::List, link, Escapes),
        attempt(Op::Write, &format!("{link}/berth-probe"), Escapes),
        attempt(Op::Write, &format!("{link}/berth-victim"), Escapes),
        attempt(Op::Mkdir, &format!("{link}/berth-probe-dir"), Escapes),
        attempt(Op::Remove, &format!("{link}/berth-victim"), Escapes),
    ]
}

pub async fn symlink_to_parent(fixture: &dyn BackendFixture) {
    run_case(fixture, "ln -s .. up", through_parent_link("up")).await;
}

pub async fn absolute_symlink_to_parent(fixture: &dyn BackendFixture) {
    run_case(fixture, r#"ln -s "$(cd .. && pwd -P)" absup"#, through_parent_link("absup")).await;
}

pub async fn symlink_chain(fixture: &dyn BackendFixture) {
    use Expect::Escapes;
    let mut attempts = vec![
        attempt(Op::Read, "a/passwd", Escapes),
        attempt(Op::Stat, "a/passwd", Escapes),
        attempt(Op::List, "a", Escapes),
        attempt(Op::Write, "a/berth-escape-probe", Escapes),
        attempt(Op::Mkdir, "a/berth-escape-probe-dir", Escapes),
        attempt(Op::Remove, "a/berth-escape-probe", Escapes),
    ];
    // A second chain whose last hop is relative: c1 -> c2 -> ..
    attempts.extend(through_parent_link("c1"));
    run_case(fixture, "ln -s /etc b && ln -s b a && ln -s .. c2 && ln -s c2 c1", attempts).await;
}

pub async fn dangling_symlink_outside(fixture: &dyn BackendFixture) {
    use Expect::Escapes;
    let mut attempts = Vec::new();
    for link in ["dang", "dang_abs", "dang_etc"] {
        attempts.push(attempt(Op::Write, link, Escapes));
        attempts.push(attempt(Op::Read, link, Escapes));
        attempts.push(attempt(Op::List, link, Escapes));
        attempts.push(attempt(Op::Mkdir, link, Escapes));
        attempts.push(attempt(Op::Write, &format!("{link}/below"), Escapes));
    }
    run_case(
        fixture,
        r#"ln -s ../berth-dangling dang && ln -s "$(cd .. && pwd -P)/berth-dangling-abs" dang_abs \
           && ln -s /etc/berth-escape-probe dang_etc"#,
        attempts,
    )
    .await;
    // Removing a dangling link removes the link only.
    let backend = fixture.backend();
    assert!(backend.remove(&rel("dang"), false).await.unwrap());
}

pub async fn symlink_dir_inside_pointing_out(fixture: &dyn BackendFixture) {
    let mut attempts = through_parent_link("sub/link");
    attempts.push(attempt(Op::Write, "sub/link/x", Expect::Escapes));
    attempts.push(attempt(Op::Write, "sub/link/new/dir/x", Expect::Escapes));
    run_case(fixture, "mkdir sub && ln -s ../.. sub/link", attempts).await;
}

pub async fn out_and_back_in(fixture: &dyn BackendFixture) {
    use Expect::Escapes;
    // `../<root name>/f` names a file inside the root, but only by passing through its
    // parent: refused like any other escape (cap-std semantics), not resolved lexically.
    let attempts = vec![
        attempt(Op::Read, "back", Escapes),
        attempt(Op::Write, "back", Escapes),
        attempt(Op::List, "backdir", Escapes),
        attempt(Op::Stat, "backdir/f", Escapes),
        attempt(Op::Read, "backdir/f", Escapes),
        attempt(Op::Mkdir, "backdir/x", Escapes),
        attempt(Op::Remove, "backdir/f", Escapes),
    ];
    run_case(
        fixture,
        r#"name=$(basename "$(pwd -P)") && echo inside > f && ln -s "../$name/f" back \
           && ln -s "../$name" backdir"#,
        attempts,
    )
    .await;
    let backend = fixture.backend();
    assert_eq!(super::read(&*backend, "f").await.unwrap(), b"inside\n");
}

pub async fn symlink_loop(fixture: &dyn BackendFixture) {
    use Expect::Escapes;
    let mut attempts = Vec::new();
    for link in ["loop1", "self"] {
        attempts.push(attempt(Op::Read, link, Escapes));
        attempts.push(attempt(Op::Write, link, Escapes));
        attempts.push(attempt(Op::List, link, Escapes));
        attempts.push(attempt(Op::Mkdir, link, Escapes));
        attempts.push(attempt(Op::Stat, &format!("{link}/x"), Escapes));
        attempts.push(attempt(Op::Remove, &format!("{link}/x"), Escapes));
        attempts.push(attempt(Op::Mkdir, &format!("{link}/x"), Escapes));
        attempts.push(attempt(Op::Write, &format!("{link}/x"), Escapes));
    }
    run_case(fixture, "ln -s loop2 loop1 && ln -s loop1 loop2 && ln -s self self", attempts).await;
}
