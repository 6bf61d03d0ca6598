//! Files of a workspace in a sandbox.
//!
//! Who does what, and why: the execd daemon runs as the sandbox's root and its file API
//! follows symlinks anywhere in the sandbox. A client path checked first and then handed to
//! it could be redirected by a workspace process that swaps a directory for a symlink in
//! between, and root would read or write what the agent user cannot (a secret holder's
//! files, the daemon itself). So content moves as the agent user, through scripts that
//! resolve the path inside the root (`resolve.sh`) and do the I/O in one go:
//!
//! - `read_file`: `read.sh` hard-links (or copies) the file into the agent's run
//!   directory; the daemon moves that link into its own staging directory, checks it is a
//!   regular file of the agent, and the content is downloaded from there.
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

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use futures::StreamExt;

use berth_workspace::backend::{ByteStream, FileInfo, FileKind, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use crate::config::BACKEND_NAME;
use crate::execd::{CommandRequest, Ending, FileEntry};
use crate::lifecycle::rfc3339_ms;
use crate::process::nonce;
use crate::sandbox::Sandbox;
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

/// What `read.sh` refused, from its `berth-NONCE fail KIND` line.
fn read_failure(path: &str, ending: &Ending, stderr: &str) -> WorkspaceError {
    let kind = stderr.lines().rev().find_map(|line| line.split_once(" fail ").map(|(_, kind)| kind.trim()));
    let path = path.to_owned();
    match (ending, kind) {
        (Ending::Exited(FAILED_EXIT_CODE), Some("notfound")) => WorkspaceError::NotFound { path },
        (Ending::Exited(FAILED_EXIT_CODE), Some("escape")) => WorkspaceError::PathEscapesRoot { path },
        (Ending::Exited(FAILED_EXIT_CODE), Some("isdir")) => WorkspaceError::IsADirectory { path },
        (Ending::Exited(FAILED_EXIT_CODE), Some("notdir")) => WorkspaceError::NotADirectory { path },
        (Ending::Exited(FAILED_EXIT_CODE), Some("notregular")) => {
            WorkspaceError::InvalidArgument(format!("{path:?} is not a regular file"))
        }
        _ => WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("read {path:?} failed ({ending:?}): {}", stderr.trim()),
        },
    }
}

/// Streams a regular file: `read.sh` (as the agent) resolves it and hard-links it (or
/// copies it) into the agent's run directory; the link is moved into the staging directory
/// (root's: nothing can be swapped there any more), checked to be a regular file of the
/// agent user, and downloaded; the staged link goes when the stream ends or is dropped.
pub(crate) async fn read_file(sandbox: &Arc<Sandbox>, path: &RelPath) -> Result<ByteStream> {
    let display = path.as_fs_str().to_owned();
    let nonce = nonce();
    let link = format!("{}/run-{}/r-{nonce}", sandbox.state_dir, sandbox.agent_user.0);
    let command = sandbox.scripts.read(&nonce, path.as_str(), &link);
    let collected = sandbox.execd.run_collect(&sandbox.agent_command(command)).await?;
    if collected.ending != Ending::Exited(0) {
        return Err(read_failure(&display, &collected.ending, &collected.stderr));
    }
    let staged = sandbox.staged_path("r");
    if let Err(error) = sandbox.execd.rename(&link, &staged).await {
        sandbox.discard(&link).await;
        return Err(error);
    }
    let guard = Discard { sandbox: sandbox.clone(), path: Some(staged.clone()) };
    let info = sandbox.execd.info(std::slice::from_ref(&staged)).await?;
    let owner = sandbox.agent_user.0.to_string();
    match info.get(&staged) {
        Some(Some(entry)) if kind_of(entry) == FileKind::File && entry.owner == owner => {}
        _ => {
            return Err(WorkspaceError::Backend {
                backend: BACKEND_NAME,
                message: format!("read {display:?}: the staged copy is not a regular file of the workspace user"),
            });
        }
    }
    let body = sandbox.execd.download(&staged).await?;
    let stream = body.map(move |chunk| {
        let _ = &guard;
        chunk.map_err(|error| WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: format!("download broke: {error}"),
        })
    });
    Ok(stream.boxed())
}

/// Deletes a staged file when dropped (in the background).
pub(crate) struct Discard {
    pub sandbox: Arc<Sandbox>,
    pub path: Option<String>,
}

impl Drop for Discard {
    fn drop(&mut self) {
        if let Some(path) = self.path.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let sandbox = self.sandbox.clone();
            runtime.spawn(async move { sandbox.discard(&path).await });
        }
    }
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
