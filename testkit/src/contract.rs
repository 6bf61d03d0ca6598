//! Suite cases of the workspace contract built on the primitives: derived ops, tree
//! transfer and the hostile tar corpus, skills, offload, MCP (stdio servers inside the
//! sandbox). Instantiated per backend by [`contract_suite!`](crate::contract_suite).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::StreamExt;

use super::tar_corpus::{self, archive, dir, file, gzip, hardlink, stream, symlink};
use super::{BackendFixture, mcp_fixture, names, read, rel, sh, sh_ok, write};
use crate::assert_err;
use berth_features::mcp::{McpService, McpServiceConfig, SecretStore, SpecTransport, SpecValue};
use berth_features::offload;
use berth_features::skills::{self, SkillIndex};
use berth_features::tree::{self, TreeLimits};
use berth_workspace::backend::{Backend, BackendRef, FileKind};
use berth_workspace::error::WorkspaceError;
use berth_workspace::id::WorkspaceId;
use berth_workspace::layout;

/// Every path below the root with its kind and size (content-level snapshot).
pub async fn snapshot(backend: &dyn Backend) -> Vec<(String, FileKind, u64)> {
    let mut out = Vec::new();
    let mut stack = vec![berth_workspace::path::RelPath::root()];
    while let Some(dir) = stack.pop() {
        for entry in backend.list_dir(&dir).await.unwrap_or_else(|error| panic!("list {dir}: {error}")) {
            let size = if entry.kind == FileKind::Directory { 0 } else { entry.size };
            out.push((entry.path.as_str().to_owned(), entry.kind, size));
            if entry.kind == FileKind::Directory {
                stack.push(entry.path);
            }
        }
    }
    out.sort_by(|left, right| left.0.cmp(&right.0));
    out
}

// ---- derived ops -------------------------------------------------------------------------

pub async fn append_creates_and_appends(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let path = rel("logs/day/one.jsonl");
    assert_eq!(backend.append_file(&path, Bytes::from_static(b"{\"a\":1}\n")).await.unwrap(), 8);
    backend.append_file(&path, Bytes::from_static(b"{\"b\":2}\n")).await.unwrap();
    assert_eq!(read(&*backend, "logs/day/one.jsonl").await.unwrap(), b"{\"a\":1}\n{\"b\":2}\n");
    assert_err!(backend.append_file(&rel("logs"), Bytes::from_static(b"x")).await, WorkspaceError::IsADirectory { .. });
    // Concurrent appenders lose nothing.
    let mut tasks = Vec::new();
    for index in 0..8 {
        let backend = backend.clone();
        tasks.push(tokio::spawn(async move {
            backend.append_file(&rel("concurrent.txt"), Bytes::from(format!("line {index}\n"))).await.unwrap();
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    let text = String::from_utf8(read(&*backend, "concurrent.txt").await.unwrap()).unwrap();
    assert_eq!(text.lines().count(), 8, "{text}");
}

pub async fn rename_never_replaces(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    write(&*backend, "a.txt", b"a").await;
    write(&*backend, "b.txt", b"b").await;
    assert_err!(backend.rename(&rel("a.txt"), &rel("b.txt")).await, WorkspaceError::AlreadyExists { .. });
    assert_eq!(read(&*backend, "a.txt").await.unwrap(), b"a");
    assert_eq!(read(&*backend, "b.txt").await.unwrap(), b"b");
    backend.rename(&rel("a.txt"), &rel("moved/deep/a.txt")).await.unwrap();
    assert_eq!(read(&*backend, "moved/deep/a.txt").await.unwrap(), b"a");
    assert!(!backend.exists(&rel("a.txt")).await.unwrap());
    write(&*backend, "d/inner.txt", b"i").await;
    backend.rename(&rel("d"), &rel("e")).await.unwrap();
    assert_eq!(read(&*backend, "e/inner.txt").await.unwrap(), b"i");
    // A directory target is not "moved into": it exists, so the rename is refused.
    write(&*backend, "f/x", b"x").await;
    assert_err!(backend.rename(&rel("e"), &rel("f")).await, WorkspaceError::AlreadyExists { .. });
    assert_eq!(names(&*backend, "f").await, ["x"]);
    assert_err!(backend.rename(&rel("missing"), &rel("z")).await, WorkspaceError::NotFound { .. });
}

pub async fn symlink_created_inside(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    write(&*backend, "target/file.txt", b"through").await;
    backend.symlink("../target", &rel("links/t")).await.unwrap();
    assert_eq!(backend.stat(&rel("links/t")).await.unwrap().kind, FileKind::Symlink);
    assert_eq!(read(&*backend, "links/t/file.txt").await.unwrap(), b"through");
    assert_err!(backend.symlink("x", &rel("links/t")).await, WorkspaceError::AlreadyExists { .. });
    // A link leading out can be created, but nothing resolves through it.
    backend.symlink("/etc", &rel("out")).await.unwrap();
    assert_err!(backend.read_to_bytes(&rel("out/passwd"), 1 << 20).await, WorkspaceError::PathEscapesRoot { .. });
}

// ---- tree transfer -----------------------------------------------------------------------

fn sample_archive() -> Vec<u8> {
    let long_name = format!("long/{}/file.txt", "segment".repeat(20));
    archive(&[
        dir("project/"),
        file("project/README.md", b"# readme\n"),
        file("project/src/main.rs", b"fn main() {}\n"),
        file(&format!("project/{long_name}"), b"long\n"),
        dir("project/empty/"),
        symlink("project/docs", "src"),
        hardlink("project/copy.rs", "project/src/main.rs"),
    ])
}

pub async fn tree_upload_and_download(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    let limits = TreeLimits::default();
    for (dest, data) in [("plain", sample_archive()), ("gzipped", gzip(&sample_archive()))] {
        let stats = tree::upload(&*backend, &rel(dest), stream(data, 333), limits, false).await.unwrap();
        assert_eq!((stats.files, stats.symlinks), (4, 1), "{dest}: {stats:?}");
        assert_eq!(read(&*backend, &format!("{dest}/project/src/main.rs")).await.unwrap(), b"fn main() {}\n");
        assert_eq!(read(&*backend, &format!("{dest}/project/copy.rs")).await.unwrap(), b"fn main() {}\n");
        assert_eq!(read(&*backend, &format!("{dest}/project/docs/main.rs")).await.unwrap(), b"fn main() {}\n");
        let long = format!("{dest}/project/long/{}/file.txt", "segment".repeat(20));
        assert_eq!(read(&*backend, &long).await.unwrap(), b"long\n");
        assert_eq!(backend.stat(&rel(&format!("{dest}/project/empty"))).await.unwrap().kind, FileKind::Directory);
    }
    // Into an existing directory: merged; a clash needs overwrite.
    let clash = archive(&[file("project/README.md", b"new\n")]);
    assert_err!(
        tree::upload(&*backend, &rel("plain"), stream(clash.clone(), 100), limits, false).await,
        WorkspaceError::AlreadyExists { .. }
    );
    tree::upload(&*backend, &rel("plain"), stream(clash, 100), limits, true).await.unwrap();
    assert_eq!(read(&*backend, "plain/project/README.md").await.unwrap(), b"new\n");
    // No temp dir is left at the root.
    let root = names(&*backend, "").await;
    assert!(!root.iter().any(|name| name.starts_with(tree::TEMP_PREFIX)), "{root:?}");

    // Download: a valid tar with the files and directories (the symlink left out).
    let mut packed = tree::pack(backend.clone(), rel("gzipped")).await.unwrap();
    let mut bytes = Vec::new();
    while let Some(chunk) = packed.next().await {
        bytes.extend_from_slice(&chunk.unwrap());
    }
    let mut found = BTreeMap::new();
    let mut reader = tar::Archive::new(&bytes[..]);
    for entry in reader.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().display().to_string();
        let mut content = Vec::new();
        std::io::Read::read_to_end(&mut entry, &mut content).unwrap();
        found.insert(path, (entry.header().entry_type(), content));
    }
    assert_eq!(found["project/README.md"].1, b"# readme\n");
    assert_eq!(found["project/copy.rs"].1, b"fn main() {}\n");
    assert!(found.contains_key(&format!("project/long/{}/file.txt", "segment".repeat(20))), "{:?}", found.keys());
    assert!(found.contains_key("project/empty/"), "{:?}", found.keys());
    assert!(!found.contains_key("project/docs"), "symlinks are not archived");
    // Round trip: what was downloaded uploads again.
    tree::upload(&*backend, &rel("again"), stream(bytes, 1000), limits, false).await.unwrap();
    assert_eq!(read(&*backend, "again/project/src/main.rs").await.unwrap(), b"fn main() {}\n");
    assert!(matches!(tree::pack(backend.clone(), rel("missing")).await, Err(WorkspaceError::NotFound { .. })));
}

pub async fn tree_hostile_corpus(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    layout::ensure(&*backend).await.unwrap();
    write(&*backend, "existing/keep.txt", b"keep").await;
    let parent_before = sh_ok(&*backend, "ls -a ..", &[]).await.stdout;
    let before = snapshot(&*backend).await;
    let corpus = tar_corpus::hostile_corpus();
    assert!(corpus.len() >= 12);
    for hostile in corpus {
        let started = Instant::now();
        let name = hostile.name;
        // Into a new directory and into an existing one: both refused, nothing left.
        let result = tree::upload(&*backend, &rel("dest"), hostile.input, hostile.limits, false).await;
        assert!(result.is_err(), "{name}: accepted: {result:?}");
        assert_eq!(snapshot(&*backend).await, before, "{name}: something was left behind ({result:?})");
        assert!(started.elapsed() < Duration::from_secs(60), "{name} took {:?}", started.elapsed());
    }
    for hostile in tar_corpus::hostile_corpus().into_iter().take(3) {
        let result = tree::upload(&*backend, &rel("existing"), hostile.input, hostile.limits, true).await;
        assert!(result.is_err(), "{}: accepted into an existing dir", hostile.name);
        let result =
            skills::add(&*backend, Some("hostile"), tar_corpus::stream(Vec::new(), 1), hostile.limits, false).await;
        assert!(result.is_err());
    }
    assert_eq!(snapshot(&*backend).await, before, "a refused upload into an existing dir changed it");
    assert_eq!(sh_ok(&*backend, "ls -a ..", &[]).await.stdout, parent_before, "something escaped the root");
}

// ---- skills ------------------------------------------------------------------------------

fn skill_archive(dir_name: Option<&str>, name: &str, description: &str) -> Vec<u8> {
    let prefix = dir_name.map(|dir| format!("{dir}/")).unwrap_or_default();
    let text = format!("---\nname: {name}\ndescription: {description}\n---\n# {name}\nUse it well.\n");
    archive(&[
        file(&format!("{prefix}SKILL.md"), text.as_bytes()),
        file(&format!("{prefix}scripts/run.sh"), b"echo hi\n"),
    ])
}

pub async fn skills_add_list_get_remove(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    layout::ensure(&*backend).await.unwrap();
    let limits = TreeLimits::default();
    let index = SkillIndex::new();
    // SKILL.md at the top, named by its front matter; then nested in one directory and
    // named by the request, gzipped.
    let (pdf, _) =
        skills::add(&*backend, None, stream(skill_archive(None, "pdf", "Fill PDF forms"), 100), limits, false)
            .await
            .unwrap();
    assert_eq!((pdf.name.as_str(), pdf.description.as_str()), ("pdf", "Fill PDF forms"));
    let nested = gzip(&skill_archive(Some("wrapper"), "ignored", "Search the web"));
    let (web, stats) = skills::add(&*backend, Some("web"), stream(nested, 50), limits, false).await.unwrap();
    assert_eq!(web.name, "web");
    assert_eq!(stats.files, 2);
    assert_eq!(read(&*backend, "skills/web/scripts/run.sh").await.unwrap(), b"echo hi\n");
    assert_err!(
        skills::add(&*backend, None, stream(skill_archive(None, "pdf", "again"), 100), limits, false).await,
        WorkspaceError::NameExists { .. }
    );
    skills::add(&*backend, None, stream(skill_archive(None, "pdf", "Replaced"), 100), limits, true).await.unwrap();
    // Not a skill: no SKILL.md.
    assert_err!(
        skills::add(&*backend, Some("bad"), stream(archive(&[file("x.txt", b"x")]), 100), limits, false).await,
        WorkspaceError::InvalidArgument(_)
    );
    let left: Vec<String> = names(&*backend, "skills").await;
    assert_eq!(left, ["pdf", "web"], "temp dirs left behind");

    let listed = index.list(&*backend).await.unwrap();
    assert_eq!(listed.iter().map(|skill| skill.name.as_str()).collect::<Vec<_>>(), ["pdf", "web"]);
    assert_eq!(listed[0].description, "Replaced");
    assert_eq!(listed[1].description, "Search the web");
    let hashed = index.hashes();
    assert_eq!(hashed, 2);
    // A second listing re-hashes nothing.
    assert_eq!(index.list(&*backend).await.unwrap(), listed);
    assert_eq!(index.hashes(), hashed, "an unchanged skill was hashed again");
    // A changed SKILL.md is re-hashed (only that one).
    write(&*backend, "skills/web/SKILL.md", b"---\nname: web\ndescription: Changed, longer text\n---\nbody\n").await;
    let relisted = index.list(&*backend).await.unwrap();
    assert_eq!(relisted[1].description, "Changed, longer text");
    assert_eq!(index.hashes(), hashed + 1);

    let (info, body) = skills::get(&*backend, "pdf").await.unwrap();
    assert_eq!(info.name, "pdf");
    assert_eq!(body, "# pdf\nUse it well.\n");
    assert_err!(skills::get(&*backend, "nope").await, WorkspaceError::NameNotFound { .. });
    assert!(skills::remove(&*backend, "pdf").await.unwrap());
    assert!(!skills::remove(&*backend, "pdf").await.unwrap());
    assert_eq!(names(&*backend, "skills").await, ["web"]);
    assert_eq!(index.list(&*backend).await.unwrap().len(), 1);
    assert_err!(skills::remove(&*backend, "../etc").await, WorkspaceError::InvalidId { .. });
}

pub async fn skills_seeded_once(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    layout::ensure(&*backend).await.unwrap();
    let seed = tempfile::tempdir().unwrap();
    for name in ["alpha", "beta"] {
        let dir = seed.path().join(name);
        std::fs::create_dir_all(dir.join("bin")).unwrap();
        std::fs::write(dir.join("SKILL.md"), format!("---\nname: {name}\ndescription: seed {name}\n---\n")).unwrap();
        std::fs::write(dir.join("bin/tool"), b"#!/bin/sh\necho tool\n").unwrap();
    }
    std::fs::create_dir(seed.path().join("not-a-skill")).unwrap();
    let outcome = skills::seed::seed(&*backend, seed.path(), TreeLimits::default()).await.unwrap();
    assert!(outcome.ran);
    assert_eq!(outcome.copied, ["alpha", "beta"]);
    assert_eq!(read(&*backend, "skills/beta/bin/tool").await.unwrap(), b"#!/bin/sh\necho tool\n");
    // The user removes one; seeding again (restart, re-provision) does not bring it back.
    skills::remove(&*backend, "alpha").await.unwrap();
    let again = skills::seed::seed(&*backend, seed.path(), TreeLimits::default()).await.unwrap();
    assert!(!again.ran);
    assert_eq!(names(&*backend, "skills").await, [".seeded", "beta"]);
}

// ---- offload -----------------------------------------------------------------------------

pub async fn offload_context_appends_and_moves_payloads(fixture: &dyn BackendFixture) {
    use base64::Engine as _;
    let backend = fixture.backend();
    layout::ensure(&*backend).await.unwrap();
    let image = b"\x89PNG\r\n\x1a\nnot really an image".to_vec();
    let encoded = base64::engine::general_purpose::STANDARD.encode(&image);
    let messages = vec![
        serde_json::json!({"role": "user", "content": [{"type": "text", "text": "line\nbreak"},
            {"type": "image", "data": encoded, "mime_type": "image/png"}]}),
        serde_json::json!({"role": "assistant", "content": format!("data:image/png;base64,{encoded}")}),
    ];
    let first = offload::offload_context(&*backend, "sess-1", messages.clone()).await.unwrap();
    assert_eq!(first.messages, 2);
    assert_eq!(first.path.as_str(), "sessions/sess-1/context.jsonl");
    assert_eq!(first.data_refs.len(), 2);
    assert_eq!(first.data_refs[0], first.data_refs[1], "same content, same file");
    offload::offload_context(&*backend, "sess-1", messages).await.unwrap();
    let text = String::from_utf8(read(&*backend, "sessions/sess-1/context.jsonl").await.unwrap()).unwrap();
    assert_eq!(text.lines().count(), 4, "{text}");
    assert!(!text.contains(&encoded), "inline data stayed in the context");
    for line in text.lines() {
        serde_json::from_str::<serde_json::Value>(line).unwrap();
    }
    let data_file = first.data_refs[0].strip_prefix("workspace://").unwrap();
    assert_eq!(read(&*backend, data_file).await.unwrap(), image);
    assert_eq!(names(&*backend, "data").await.len(), 1, "one file per content");
    assert_err!(offload::offload_context(&*backend, "../x", Vec::new()).await, WorkspaceError::InvalidId { .. });
}

pub async fn offload_tool_results_never_overwrite(fixture: &dyn BackendFixture) {
    let backend = fixture.backend();
    layout::ensure(&*backend).await.unwrap();
    let small = offload::offload_tool_result(&*backend, "s", "c1", Bytes::from_static(b"short"), 100, 0).await.unwrap();
    assert!(!small.offloaded);
    assert_eq!(small.preview, "short");
    let big: String = (0..2000).map(|index| format!("row {index}\n")).collect();
    let first =
        offload::offload_tool_result(&*backend, "s", "call/1 x", Bytes::from(big.clone()), 100, 64).await.unwrap();
    assert!(first.offloaded);
    let path = first.path.clone().unwrap();
    assert_eq!(path.as_str(), "sessions/s/tool_result-call_1_x.txt");
    assert!(first.head.starts_with("row 0\n") && first.tail.ends_with("row 1999\n"), "{first:?}");
    assert!(first.preview.contains(path.as_str()));
    let second = offload::offload_tool_result(&*backend, "s", "call/1 x", Bytes::from_static(&[b'z'; 500]), 100, 64)
        .await
        .unwrap();
    assert_eq!(second.path.unwrap().as_str(), "sessions/s/tool_result-call_1_x-1.txt");
    assert_eq!(read(&*backend, path.as_str()).await.unwrap(), big.as_bytes(), "the first result was overwritten");
    let left = names(&*backend, "sessions/s").await;
    assert_eq!(left, ["tool_result-call_1_x-1.txt", "tool_result-call_1_x.txt"], "temp files left");
}

// ---- MCP ---------------------------------------------------------------------------------

/// An MCP service with its secret store in a temp dir, and the fixture installed.
pub struct McpHarness {
    pub service: Arc<McpService>,
    pub backend: BackendRef,
    pub workspace: WorkspaceId,
    pub secrets_dir: tempfile::TempDir,
}

pub async fn mcp_harness(fixture: &dyn BackendFixture, config: McpServiceConfig) -> McpHarness {
    let backend = fixture.backend();
    layout::ensure(&*backend).await.unwrap();
    mcp_fixture::install(&*backend).await;
    let secrets_dir = tempfile::tempdir().unwrap();
    let secrets = Arc::new(SecretStore::new(secrets_dir.path().join("secrets")));
    let workspace = WorkspaceId::new(format!("ws-mcp-{}", rand::random::<u32>())).unwrap();
    McpHarness { service: Arc::new(McpService::new(config, secrets)), backend, workspace, secrets_dir }
}

pub fn echo_spec(name: &str, env: &[(&str, &str, bool)]) -> berth_features::mcp::McpServerSpec {
    berth_features::mcp::McpServerSpec {
        name: name.into(),
        transport: SpecTransport::Stdio {
            command: mcp_fixture::INSTALL_PATH.into(),
            args: Vec::new(),
            env: env
                .iter()
                .map(|(key, value, secret)| {
                    ((*key).to_owned(), SpecValue { value: (*value).to_owned(), secret: *secret })
                })
                .collect(),
            cwd: String::new(),
            // A server with secrets runs from the workspace only when pinned.
            sha256: env.iter().any(|(_, _, secret)| *secret).then(|| mcp_fixture::sha256_hex().to_owned()),
        },
    }
}

fn args(json: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
    json.as_object().cloned().unwrap_or_default()
}

pub async fn mcp_stdio_secrets_stay_out_of_the_workspace(fixture: &dyn BackendFixture) {
    let harness = mcp_harness(fixture, McpServiceConfig::default()).await;
    let (service, backend, ws) = (&harness.service, &harness.backend, &harness.workspace);
    let secret = format!("s3cret-{}", rand::random::<u64>());
    let spec = echo_spec("echo", &[("API_TOKEN", &secret, true), ("PLAIN", "visible", false)]);
    let stored = service.add(&**backend, ws, &spec, false).await.unwrap();
    assert_err!(service.add(&**backend, ws, &spec, false).await, WorkspaceError::NameExists { .. });
    // Inside the sandbox, .mcp shows the reference, never the value.
    let shown = sh_ok(&**backend, "cat .mcp", &[]).await;
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(!shown.contains(&secret), ".mcp shows the secret: {shown}");
    assert!(shown.contains("\"secret_ref\": \"mcp/echo/env/API_TOKEN\""), "{shown}");
    assert!(shown.contains("visible"), "{shown}");
    let grep = sh(&**backend, "grep -r \"$1\" . ; echo done", &[&secret]).await;
    assert_eq!(String::from_utf8_lossy(&grep.stdout), "done\n", "the secret is somewhere in the workspace");
    // The server still gets it in its environment.
    let echoed =
        service.call_tool(backend, ws, "echo", "echo", args(serde_json::json!({"text": "hi"})), None).await.unwrap();
    assert_eq!(echoed.text, "hi");
    assert!(echoed.started);
    let env = service
        .call_tool(backend, ws, "echo", "env", args(serde_json::json!({"name": "API_TOKEN"})), None)
        .await
        .unwrap();
    assert_eq!(env.text, secret);
    assert!(!env.started, "the second call started another server");
    let tools = service.list_tools(backend, ws, "echo", None).await.unwrap();
    let tool_names: Vec<&str> = tools.iter().map(|tool| tool.name.as_str()).collect();
    for expected in ["crash", "echo", "env", "sleep"] {
        assert!(tool_names.contains(&expected), "{tool_names:?}");
    }
    let (listed, reseeded) = service.list(&**backend, ws).await.unwrap();
    assert!(!reseeded);
    assert_eq!(listed.len(), 1);
    assert!(listed[0].live);
    assert_eq!(listed[0].config, stored);
    // Editing the declaration in .mcp (another command) unbinds the secret.
    let edited = shown.replace(mcp_fixture::INSTALL_PATH, "./bin/berth-mcp-fixture");
    write(&**backend, ".mcp", edited.as_bytes()).await;
    let refused =
        service.call_tool(backend, ws, "echo", "env", args(serde_json::json!({"name": "API_TOKEN"})), None).await;
    assert_err!(refused, WorkspaceError::McpServerFailed { .. });
    assert!(service.remove(&**backend, ws, "echo").await.unwrap());
    assert!(!service.remove(&**backend, ws, "echo").await.unwrap());
    assert_err!(
        service.call_tool(backend, ws, "echo", "echo", args(serde_json::json!({"text": "x"})), None).await,
        WorkspaceError::NameNotFound { .. }
    );
    service.forget_workspace(ws, true).await.unwrap();
    assert!(!harness.secrets_dir.path().join("secrets").join(format!("{ws}.json")).exists());
}

pub async fn mcp_single_flight_crash_and_timeout(fixture: &dyn BackendFixture) {
    let harness = mcp_harness(fixture, McpServiceConfig::default()).await;
    let (service, backend, ws) = (&harness.service, &harness.backend, &harness.workspace);
    service.add(&**backend, ws, &echo_spec("echo", &[]), false).await.unwrap();
    // Concurrent first calls start one server.
    let mut calls = Vec::new();
    for _ in 0..8 {
        let (service, backend, ws) = (service.clone(), backend.clone(), ws.clone());
        calls.push(tokio::spawn(async move {
            service.call_tool(&backend, &ws, "echo", "pid", serde_json::Map::new(), None).await.unwrap().text
        }));
    }
    let mut pids = Vec::new();
    for call in calls {
        pids.push(call.await.unwrap());
    }
    pids.dedup();
    assert_eq!(pids.len(), 1, "several servers answered: {pids:?}");
    assert_eq!(service.pool().starts(), 1);
    // A crash is a typed error; the next call starts the server again.
    let crashed = service.call_tool(backend, ws, "echo", "crash", serde_json::Map::new(), None).await;
    match crashed {
        Err(WorkspaceError::McpServerFailed { reason, .. }) => {
            assert!(reason.contains("17") || reason.contains("closed"), "{reason}")
        }
        other => panic!("expected McpServerFailed, got {other:?}"),
    }
    let after =
        service.call_tool(backend, ws, "echo", "echo", args(serde_json::json!({"text": "back"})), None).await.unwrap();
    assert_eq!(after.text, "back");
    assert!(after.started);
    assert_eq!(service.pool().starts(), 2);
    // A slow tool honours the call timeout; the server stays usable.
    let slow = service
        .call_tool(
            backend,
            ws,
            "echo",
            "sleep",
            args(serde_json::json!({"ms": 30_000})),
            Some(Duration::from_millis(300)),
        )
        .await;
    assert_err!(slow, WorkspaceError::Timeout { .. });
    let still =
        service.call_tool(backend, ws, "echo", "echo", args(serde_json::json!({"text": "ok"})), None).await.unwrap();
    assert_eq!(still.text, "ok");
    // A tool the server does not have is the server's refusal, not a crash.
    assert_err!(
        service.call_tool(backend, ws, "echo", "no-such-tool", serde_json::Map::new(), None).await,
        WorkspaceError::InvalidArgument(_)
    );
    // A command that cannot start is a typed failure too.
    let mut broken = echo_spec("broken", &[]);
    if let SpecTransport::Stdio { command, .. } = &mut broken.transport {
        *command = "bin/does-not-exist".into();
    }
    service.add(&**backend, ws, &broken, false).await.unwrap();
    assert_err!(
        service.call_tool(backend, ws, "broken", "echo", serde_json::Map::new(), None).await,
        WorkspaceError::McpServerFailed { .. }
    );
    service.forget_workspace(ws, true).await.unwrap();
}

pub async fn mcp_corrupt_config_is_reseeded(fixture: &dyn BackendFixture) {
    let defaults = vec![berth_features::mcp::McpServerConfig {
        name: "default-echo".into(),
        transport: berth_features::mcp::McpTransport::Stdio {
            command: mcp_fixture::INSTALL_PATH.into(),
            args: Vec::new(),
            env: BTreeMap::new(),
            cwd: String::new(),
            sha256: None,
        },
    }];
    let harness = mcp_harness(fixture, McpServiceConfig { defaults, ..McpServiceConfig::default() }).await;
    let (service, backend, ws) = (&harness.service, &harness.backend, &harness.workspace);
    for corrupt in [&b"{not json"[..], b"[{\"name\": \"../x\", \"transport\": \"stdio\", \"command\": \"\"}]", b"{}"] {
        write(&**backend, ".mcp", corrupt).await;
        let (listed, reseeded) = service.list(&**backend, ws).await.unwrap();
        assert!(reseeded, "{}", String::from_utf8_lossy(corrupt));
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].config.name, "default-echo");
        let text = read(&**backend, ".mcp").await.unwrap();
        assert!(String::from_utf8_lossy(&text).contains("default-echo"));
    }
    let echoed = service
        .call_tool(backend, ws, "default-echo", "echo", args(serde_json::json!({"text": "seeded"})), None)
        .await
        .unwrap();
    assert_eq!(echoed.text, "seeded");
    service.forget_workspace(ws, true).await.unwrap();
}

pub async fn mcp_lru_cap_and_idle_timeout(fixture: &dyn BackendFixture) {
    let config = McpServiceConfig {
        // Long enough that a backend whose every exec is a Docker exec finishes the three
        // starts below before the first idle client is reaped.
        pool: berth_features::mcp::McpPoolConfig { max_live: 2, idle_timeout: Duration::from_secs(5) },
        ..McpServiceConfig::default()
    };
    let harness = mcp_harness(fixture, config).await;
    let (service, backend, ws) = (&harness.service, &harness.backend, &harness.workspace);
    for name in ["one", "two", "three"] {
        service.add(&**backend, ws, &echo_spec(name, &[]), false).await.unwrap();
        service.call_tool(backend, ws, name, "echo", args(serde_json::json!({"text": name})), None).await.unwrap();
    }
    // The cap closed the least recently used.
    assert_eq!(service.pool().live_servers(ws), ["three", "two"]);
    // Idle clients are closed by the reaper.
    super::assert_eventually("idle mcp clients to be closed", Duration::from_secs(20), || async {
        service.pool().live_count() == 0
    })
    .await;
    let again =
        service.call_tool(backend, ws, "one", "echo", args(serde_json::json!({"text": "x"})), None).await.unwrap();
    assert!(again.started);
    service.forget_workspace(ws, true).await.unwrap();
}

/// Prints first-call (server start + initialize + call) and warm call latencies. No
/// assertion on the numbers: they are for the report.
pub async fn mcp_latency_report(fixture: &dyn BackendFixture) {
    let harness = mcp_harness(fixture, McpServiceConfig::default()).await;
    let (service, backend, ws) = (&harness.service, &harness.backend, &harness.workspace);
    service.add(&**backend, ws, &echo_spec("echo", &[]), false).await.unwrap();
    let mut first = Vec::new();
    for _ in 0..5 {
        service.pool().forget_workspace(ws);
        let started = Instant::now();
        let output =
            service.call_tool(backend, ws, "echo", "echo", args(serde_json::json!({"text": "x"})), None).await.unwrap();
        assert!(output.started);
        first.push(started.elapsed());
    }
    // The same with a secret: the server runs as a SpawnRole::SecretHolder (on Docker: a
    // private directory, a copy of the pinned program and its SHA-256 per start).
    service.add(&**backend, ws, &echo_spec("vault", &[("TOKEN", "t", true)]), false).await.unwrap();
    let mut first_secret = Vec::new();
    for _ in 0..5 {
        service.pool().forget_workspace(ws);
        let started = Instant::now();
        let output = service
            .call_tool(backend, ws, "vault", "echo", args(serde_json::json!({"text": "x"})), None)
            .await
            .unwrap();
        assert!(output.started);
        first_secret.push(started.elapsed());
    }
    let mut warm = Vec::new();
    for _ in 0..200 {
        let started = Instant::now();
        service.call_tool(backend, ws, "echo", "echo", args(serde_json::json!({"text": "x"})), None).await.unwrap();
        warm.push(started.elapsed());
    }
    let stats = |samples: &mut Vec<Duration>| {
        samples.sort();
        let pick = |quantile: f64| samples[((samples.len() - 1) as f64 * quantile) as usize];
        format!("p50 {:?} p90 {:?} max {:?}", pick(0.5), pick(0.9), pick(1.0))
    };
    println!(
        "MCP latency [{}]: first call (start + initialize + call, n={}) {}; with a secret (n={}) {}; warm call (n={}) {}",
        backend.name(),
        first.len(),
        stats(&mut first),
        first_secret.len(),
        stats(&mut first_secret),
        warm.len(),
        stats(&mut warm)
    );
    service.forget_workspace(ws, true).await.unwrap();
}

/// Generates the contract suite for one backend (same fixture form as
/// [`backend_suite!`](crate::backend_suite)): `contract_suite!(docker, docker_fixture())`.
#[macro_export]
macro_rules! contract_suite {
    ($suite:ident, $fixture:expr $(,)?) => {
        mod $suite {
            #[allow(unused_imports)]
            use super::*;

            async fn __berth_fixture() -> impl $crate::BackendFixture {
                $fixture.await
            }

            $crate::__contract_suite_cases!(
                append_creates_and_appends,
                rename_never_replaces,
                symlink_created_inside,
                tree_upload_and_download,
                tree_hostile_corpus,
                skills_add_list_get_remove,
                skills_seeded_once,
                offload_context_appends_and_moves_payloads,
                offload_tool_results_never_overwrite,
                mcp_stdio_secrets_stay_out_of_the_workspace,
                mcp_single_flight_crash_and_timeout,
                mcp_corrupt_config_is_reseeded,
                mcp_lru_cap_and_idle_timeout,
                mcp_latency_report,
            );
        }
    };
}

#[doc(hidden)]
#[macro_export]
macro_rules! __contract_suite_cases {
    ($($case:ident),* $(,)?) => {
        $(
            #[::tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let fixture = __berth_fixture().await;
                $crate::contract::$case(&fixture).await;
            }
        )*
    };
}
