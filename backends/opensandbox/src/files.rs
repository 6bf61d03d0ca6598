//! Files of a workspace in a sandbox.
//!
//! Who does what, and why: the execd daemon runs as the sandbox's root and its file API
//! follows symlinks anywhere in the sandbox. A client path checked first and then handed to
//! it could be redirected by a workspace process that swaps a directory for a symlink in
//! between, and root would read or write what the agent user cannot (a secret holder's
//! files, the daemon itself). So content moves as the agent user, through scripts that
//! resolve the path inside the root (`resolve.sh`) and do the I/O in one go:
//!
//! - `read_file`: `read.sh` streams the file through `od` (hex, decoded here: the API's
//!   output events are JSON text, not binary-safe).
//! - `write_file`: the content is uploaded whole to a fresh name in `$S/stage` (root's,
//!   0711: the agent can read a file it is told the name of, never list, create or swap
//!   one), then `write.sh` copies it into a temp file beside the target and renames that
//!   over it (atomic), then the staged file is deleted. A failed or over-limit upload never
//!   reaches the workspace.
//!
//! Metadata is native: `stat` and `list_dir` use `/files/info` (lstat) and
//! `/directories/list`, after one `/files/info` call over every prefix of the path shows no
//! symlink on the way (a symlink, or anything unexpected, falls back to the POSIX path
//! through exec, which resolves links inside the root). A concurrent swap can then at most
//! redirect a metadata read inside the sandbox, never content.

use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use tokio::io::AsyncReadExt;

use berth_workspace::backend::{ByteStream, DEFAULT_CHUNK_BYTES, FileInfo, FileKind, ProcessControl, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use crate::backend::Sandbox;
use crate::config::BACKEND_NAME;
use crate::execd::{CommandRequest, Ending, FileEntry};
use crate::lifecycle::rfc3339_ms;
use crate::process::{self, Input, Launch, nonce};
use crate::scripts::FAILED_EXIT_CODE;

/// A helper script's failure (`berth-error KIND` as its last stderr line) as a typed error.
pub(crate) fn script_error(operation: &str, path: &str, ending: &Ending, stderr: &str) -> WorkspaceError {
    let kind = stderr.lines().rev().find_map(|line| line.strip_prefix("berth-error ")).map(str::trim);
    let path = path.to_owned();
    match (ending, kind) {
        (Ending::Exited(FAILED_EXIT_CODE), Some("notfound")) => WorkspaceError::NotFound { path },
        (Ending::Exited(FAILED_EXIT_CODE), Some("escape")) => WorkspaceError::PathEscapesRoot { path },
        (Ending::Exited(FAILED_EXIT_CODE), Some("isdir")) => WorkspaceError::IsADirectory { path },
        (Ending::Exited(FAILED_EXIT_CODE), Some("notdir")) => WorkspaceError::NotADirectory { path },
        _ => WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("{operation} {path:?} failed ({ending:?}): {}", stderr.trim()),
        },
    }
}

pub(crate) async fn read_file(sandbox: &Sandbox, path: &RelPath) -> Result<ByteStream> {
    let display = path.as_fs_str().to_owned();
    let nonce = nonce();
    let launch = Launch {
        command: sandbox.scripts.read(&nonce, path.as_str()),
        nonce,
        user: sandbox.agent_user,
        env: Default::default(),
        timeout: None,
        input: Input::Null,
        program: "read".into(),
        cwd: display.clone(),
    };
    let spawned = process::start(&sandbox.execd, &sandbox.scripts, launch).await.map_err(|error| match error {
        WorkspaceError::SpawnFailed { reason, .. } => {
            WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("read {display:?}: {reason}") }
        }
        other => other,
    })?;
    let state = ReadState { stdout: spawned.stdout, control: Some(spawned.control), display };
    Ok(futures::stream::unfold(state, |mut state| async move {
        let control = state.control.as_mut()?;
        let mut chunk = BytesMut::with_capacity(DEFAULT_CHUNK_BYTES);
        match state.stdout.read_buf(&mut chunk).await {
            Ok(0) => {
                let outcome = control.wait().await;
                state.control = None;
                match outcome {
                    Ok(exit) if exit.code == Some(0) => None,
                    Ok(exit) => Some((
                        Err(WorkspaceError::Backend {
                            backend: BACKEND_NAME,
                            message: format!("read {:?} ended with {exit:?}", state.display),
                        }),
                        state,
                    )),
                    Err(error) => Some((Err(error), state)),
                }
            }
            Ok(_) => Some((Ok(chunk.freeze()), state)),
            Err(error) => {
                state.control = None;
                let error = WorkspaceError::from_io("read", &state.display, error);
                Some((Err(error), state))
            }
        }
    })
    .boxed())
}

struct ReadState {
    stdout: berth_workspace::backend::BoxedReader,
    /// Dropped (killing the reader) when the stream is dropped early.
    control: Option<Box<dyn ProcessControl>>,
    display: String,
}

pub(crate) async fn write_file(
    sandbox: &Sandbox,
    path: &RelPath,
    data: ByteStream,
    options: WriteOptions,
) -> Result<u64> {
    let display = path.as_fs_str().to_owned();
    if path.is_root() {
        return Err(WorkspaceError::IsADirectory { path: display });
    }
    let staged = sandbox.staged_path("w");
    let uploaded = sandbox.execd.upload(&staged, 644, data, options.max_bytes).await;
    let written = match uploaded {
        Ok(written) => written,
        Err(error) => {
            sandbox.discard(&staged).await;
            return Err(error);
        }
    };
    let command = sandbox.scripts.write(&nonce(), path.as_str(), options.mode & 0o7777, &staged);
    let outcome = sandbox.execd.run_collect(&sandbox.agent_command(command)).await;
    sandbox.discard(&staged).await;
    let collected = outcome?;
    if collected.ending != Ending::Exited(0) {
        return Err(script_error("write", &display, &collected.ending, &collected.stderr));
    }
    Ok(written)
}

/// Absolute paths of the root and of every prefix of `path`, root first.
fn prefixes(root: &str, path: &RelPath) -> Vec<String> {
    let mut out = vec![root.to_owned()];
    let mut current = root.to_owned();
    for component in path.components() {
        current = format!("{current}/{component}");
        out.push(current.clone());
    }
    out
}

fn kind_of(entry: &FileEntry) -> FileKind {
    match entry.kind.as_deref() {
        Some("file") => FileKind::File,
        Some("directory") => FileKind::Directory,
        Some("symlink") => FileKind::Symlink,
        _ => FileKind::Other,
    }
}

fn info_of(path: RelPath, entry: &FileEntry) -> FileInfo {
    let mode = u32::from_str_radix(&entry.mode.to_string(), 8).unwrap_or(0) & 0o7777;
    let modified = entry
        .modified_at
        .as_deref()
        .map(rfc3339_ms)
        .filter(|millis| *millis > 0)
        .map(|millis| SystemTime::UNIX_EPOCH + Duration::from_millis(millis as u64));
    FileInfo { path, kind: kind_of(entry), size: entry.size, mode, modified }
}

/// The lstat of every prefix of `path` when all exist and none but the last is anything
/// other than a plain directory; `None` sends the caller to the POSIX path.
async fn plain_prefixes(sandbox: &Sandbox, path: &RelPath) -> Result<Option<Vec<FileEntry>>> {
    let paths = prefixes(&sandbox.workspace_dir, path);
    let found = match sandbox.execd.info(&paths).await {
        Ok(found) => found,
        // A missing prefix answers 404 for the whole call: the POSIX path tells which.
        Err(WorkspaceError::Backend { .. }) => return Ok(None),
        Err(other) => return Err(other),
    };
    let mut entries = Vec::with_capacity(paths.len());
    for (index, prefix) in paths.iter().enumerate() {
        let Some(Some(entry)) = found.get(prefix) else { return Ok(None) };
        if index + 1 < paths.len() && kind_of(entry) != FileKind::Directory {
            return Ok(None);
        }
        entries.push(entry.clone());
    }
    Ok(Some(entries))
}

/// `None`: use the POSIX default.
pub(crate) async fn stat(sandbox: &Sandbox, path: &RelPath) -> Result<Option<FileInfo>> {
    let Some(entries) = plain_prefixes(sandbox, path).await? else { return Ok(None) };
    let last = entries.last().expect("the root is always a prefix");
    if path.is_root() && kind_of(last) != FileKind::Directory {
        return Ok(None);
    }
    Ok(Some(info_of(path.clone(), last)))
}

/// `None`: use the POSIX default.
pub(crate) async fn list_dir(sandbox: &Sandbox, path: &RelPath) -> Result<Option<Vec<FileInfo>>> {
    let Some(entries) = plain_prefixes(sandbox, path).await? else { return Ok(None) };
    if entries.last().map(kind_of) != Some(FileKind::Directory) {
        return Ok(None);
    }
    let absolute = prefixes(&sandbox.workspace_dir, path).pop().expect("the root is always a prefix");
    let Some(listed) = sandbox.execd.list(&absolute).await? else { return Ok(None) };
    let mut out = Vec::with_capacity(listed.len());
    for entry in &listed {
        let Some(name) = entry.path.strip_prefix(&absolute).and_then(|rest| rest.strip_prefix('/')) else {
            return Ok(None);
        };
        if name.is_empty() || name.contains('/') {
            return Ok(None);
        }
        let Ok(child) = path.join(name) else { return Ok(None) };
        out.push(info_of(child, entry));
    }
    out.sort_by(|left, right| left.name().as_bytes().cmp(right.name().as_bytes()));
    Ok(Some(out))
}

impl Sandbox {
    /// A unary helper command as the agent user.
    pub(crate) fn agent_command(&self, command: String) -> CommandRequest {
        CommandRequest {
            command,
            uid: Some(self.agent_user.0),
            gid: Some(self.agent_user.1),
            timeout: Some(300_000),
            ..CommandRequest::default()
        }
    }

    /// A fresh name in the staging directory.
    pub(crate) fn staged_path(&self, kind: &str) -> String {
        format!("{}/stage/{kind}-{}", self.state_dir, nonce())
    }

    /// Deletes a staged file (best effort: a leftover is only disk in the sandbox).
    pub(crate) async fn discard(&self, staged: &str) {
        if let Err(error) = self.execd.delete_file(staged).await {
            tracing::warn!(%error, staged, "cannot delete a staged file in an opensandbox sandbox");
        }
    }

    /// Uploads a unary exec's stdin for `Input::File`.
    pub(crate) async fn stage_stdin(&self, stdin: Bytes) -> Result<String> {
        let staged = self.staged_path("in");
        let stream = futures::stream::once(async move { Ok(stdin) }).boxed();
        if let Err(error) = self.execd.upload(&staged, 644, stream, u64::MAX).await {
            self.discard(&staged).await;
            return Err(error);
        }
        Ok(staged)
    }
}
