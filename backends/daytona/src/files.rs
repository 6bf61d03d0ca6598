//! File bytes of a Daytona workspace through the toolbox's bulk calls.
//!
//! Read: `read.sh` resolves the client path inside the root (symlinks hop by hop, escapes
//! refused) and checks it is a regular file; the resolved path is then fetched with
//! `files/bulk-download`, whose multipart answer is parsed as it streams. Write:
//! `write.sh` checks the fence, resolves the path creating missing parents and says which
//! it created and which mode the file gets; the content is streamed with
//! `files/bulk-upload` into a temp file beside the target (`.berth-tmp-<nonce>`), which
//! `finish.sh` gives its mode and renames over the target, so a reader sees the old
//! content or all of the new. A write that fails (the source stream errs, `max_bytes` is
//! passed, the upload breaks) removes the temp file and the directories it created
//! (`rollback.sh`).
//!
//! Like the Docker backend's scripts, confinement is exact for a workspace nobody changes
//! concurrently; a process racing it can only redirect the transfer to what the sandbox
//! user can reach anyway — the sandbox is the boundary.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use futures::StreamExt;

use berth_workspace::backend::{ByteStream, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use super::config::BACKEND_NAME;
use super::http::Retry;
use super::multipart::{self, FirstPart};
use super::process::INTERNAL_TIMEOUT;
use super::scripts::{self, FAILED_EXIT_CODE, command_line};
use super::toolbox::Toolbox;

/// How long one upload may take.
const UPLOAD_TIMEOUT: Duration = Duration::from_secs(3600);

/// A script's classified failure (`berth-error KIND`) as a workspace error.
pub fn script_error(kind: &str, display: &str) -> WorkspaceError {
    let path = display.to_owned();
    match kind {
        "notfound" => WorkspaceError::NotFound { path },
        "notdir" => WorkspaceError::NotADirectory { path },
        "isdir" => WorkspaceError::IsADirectory { path },
        "escape" => WorkspaceError::PathEscapesRoot { path },
        "notregular" => WorkspaceError::InvalidArgument(format!("{display:?} is not a regular file")),
        other => WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("{display:?}: {other}") },
    }
}

/// Runs a file script: the words after `berth-ok` on success.
async fn run_script(toolbox: &Toolbox, script: &str, name: &str, args: &[&str], display: &str) -> Result<Vec<String>> {
    let line = command_line(script, name, args);
    let (code, output) = toolbox.execute(&line, INTERNAL_TIMEOUT, Retry::Idempotent).await?;
    let last = output.lines().rev().find(|line| !line.trim().is_empty()).unwrap_or("").trim().to_owned();
    if code == 0
        && let Some(rest) = last.strip_prefix("berth-ok")
    {
        return Ok(rest.split_whitespace().map(str::to_owned).collect());
    }
    if code == FAILED_EXIT_CODE
        && let Some(kind) = last.strip_prefix("berth-error ")
    {
        if let Some(held) = kind.strip_prefix("fenced ") {
            return Err(WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("fenced {held}") });
        }
        return Err(script_error(kind, display));
    }
    Err(WorkspaceError::Backend {
        backend: BACKEND_NAME,
        message: format!("{name} {display:?} exited {code}: {}", output.trim().chars().take(500).collect::<String>()),
    })
}

fn decode_path(text: &str) -> Result<String> {
    let bytes = STANDARD.decode(text).map_err(|error| WorkspaceError::Backend {
        backend: BACKEND_NAME,
        message: format!("a file script printed bad base64: {error}"),
    })?;
    String::from_utf8(bytes).map_err(|_| WorkspaceError::InvalidArgument("a path that is not UTF-8".into()))
}

fn absolute(root: &str, relative: &str) -> String {
    if relative.is_empty() { root.to_owned() } else { format!("{root}/{relative}") }
}

pub async fn read_file(toolbox: &Toolbox, script: &str, root: &str, path: &RelPath) -> Result<ByteStream> {
    let display = path.as_fs_str().to_owned();
    let words = run_script(toolbox, script, "berth-read", &[path.as_str()], &display).await?;
    let relative = decode_path(words.first().map_or("", String::as_str))?;
    let target = absolute(root, &relative);
    let response = toolbox.bulk_download(&target).await?;
    match multipart::first_part(response).await? {
        FirstPart::File(stream) => Ok(stream),
        FirstPart::Error { status: Some(404), .. } => Err(WorkspaceError::NotFound { path: display }),
        FirstPart::Error { message, .. } => {
            Err(WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("read {display:?}: {message}") })
        }
    }
}

/// What ended the content stream of a write early.
#[derive(Default)]
struct Abort(Mutex<Option<WorkspaceError>>);

impl Abort {
    fn set(&self, error: WorkspaceError) {
        *self.0.lock().unwrap_or_else(|poison| poison.into_inner()) = Some(error);
    }
    fn take(&self) -> Option<WorkspaceError> {
        self.0.lock().unwrap_or_else(|poison| poison.into_inner()).take()
    }
}

/// A write's fence: the handle's generation and the record file.
pub struct Fence<'a> {
    pub generation: u64,
    pub generation_file: &'a str,
    pub workspace_id: &'a str,
}

pub async fn write_file(
    toolbox: &Toolbox,
    script: &str,
    root: &str,
    fence: Fence<'_>,
    path: &RelPath,
    data: ByteStream,
    options: WriteOptions,
) -> Result<u64> {
    let display = path.as_fs_str().to_owned();
    if path.is_root() {
        return Err(WorkspaceError::IsADirectory { path: display });
    }
    let mode_text = format!("{:o}", options.mode & 0o7777);
    let generation = fence.generation.to_string();
    let words = match run_script(
        toolbox,
        script,
        "berth-write",
        &[path.as_str(), &mode_text, &generation, fence.generation_file],
        &display,
    )
    .await
    {
        Ok(words) => words,
        Err(WorkspaceError::Backend { message, .. }) if message.starts_with("fenced ") => {
            let held = message.trim_start_matches("fenced ").parse().unwrap_or(0);
            return Err(WorkspaceError::SandboxFenced {
                workspace_id: fence.workspace_id.to_owned(),
                held,
                asked: fence.generation,
            });
        }
        Err(error) => return Err(error),
    };
    let (Some(relative), Some(mode)) = (words.first(), words.get(1)) else {
        return Err(WorkspaceError::Backend { backend: BACKEND_NAME, message: "write.sh answered too little".into() });
    };
    let relative = decode_path(relative)?;
    let created: Vec<String> =
        words[2..].iter().map(|word| decode_path(word).map(|dir| absolute(root, &dir))).collect::<Result<_>>()?;
    let target = absolute(root, &relative);
    let parent = target.rsplit_once('/').map_or(root, |(parent, _)| parent).to_owned();
    let temp = format!("{parent}/.berth-tmp-{}", scripts::nonce());
    let abort = Arc::new(Abort::default());
    let size = Arc::new(Mutex::new(0u64));
    let counted = {
        let abort = abort.clone();
        let size = size.clone();
        let max = options.max_bytes;
        let mut written: u64 = 0;
        data.map(move |chunk| match chunk {
            Ok(chunk) => {
                written += chunk.len() as u64;
                if written > max {
                    abort.set(WorkspaceError::LimitExceeded { limit: "file size", size: written, max });
                    Err(std::io::Error::other("file size limit exceeded"))
                } else {
                    *size.lock().unwrap_or_else(|poison| poison.into_inner()) = written;
                    Ok::<Bytes, std::io::Error>(chunk)
                }
            }
            Err(error) => {
                abort.set(error);
                Err(std::io::Error::other("the content stream failed"))
            }
        })
    };
    let boundary = multipart::boundary();
    let (content_type, head, tail) = multipart::upload_frame(&boundary, &temp);
    let body = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(head) })
        .chain(counted)
        .chain(futures::stream::once(async move { Ok::<Bytes, std::io::Error>(tail) }));
    let uploaded = toolbox.bulk_upload(&content_type, reqwest::Body::wrap_stream(body), UPLOAD_TIMEOUT).await;
    let outcome = match (uploaded, abort.take()) {
        (_, Some(error)) => Err(error),
        (Err(failure), None) => Err(toolbox.fail(&format!("write {display:?}"), failure)),
        (Ok(()), None) => {
            run_script(toolbox, scripts::FINISH, "berth-finish", &[&temp, &target, mode], &display).await.map(|_| ())
        }
    };
    match outcome {
        Ok(()) => Ok(*size.lock().unwrap_or_else(|poison| poison.into_inner())),
        Err(error) => {
            let mut args: Vec<&str> = vec![&temp];
            args.extend(created.iter().rev().map(String::as_str));
            let _ = run_script(toolbox, scripts::ROLLBACK, "berth-rollback", &args, &display).await;
            Err(error)
        }
    }
}
