//! File bytes of an E2B workspace: reads stream `GET /files`; writes upload to a temp file
//! beside the target (`.berth-tmp-<nonce>`, streamed as `application/octet-stream`) and
//! `Move` it over the target, so a reader sees the old content or all of the new. A write
//! that fails (the source stream errs, `max_bytes` is passed, the upload breaks) removes
//! the temp file and the directories it created (while empty).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::StreamExt;
use serde_json::json;

use berth_workspace::backend::{ByteStream, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use super::config::BACKEND_NAME;
use super::envd::Envd;
use super::envd::json_u64 as json_number;
use super::http::Retry;
use super::process::run_internal;
use super::resolve::{Mode, Resolver, entry_type};

pub async fn read_file(envd: &Envd, root: &str, path: &RelPath) -> Result<ByteStream> {
    let display = path.as_fs_str().to_owned();
    let mut resolver = Resolver::new(envd, root);
    let resolved = resolver.resolve(path, Mode::Follow).await?;
    let Some(entry) = &resolved.entry else {
        return Err(WorkspaceError::NotFound { path: display });
    };
    match entry_type(entry) {
        "FILE_TYPE_FILE" => {}
        "FILE_TYPE_DIRECTORY" => return Err(WorkspaceError::IsADirectory { path: display }),
        _ => return Err(WorkspaceError::InvalidArgument(format!("{display:?} is not a regular file"))),
    }
    let absolute = resolver.absolute(&resolved.components);
    let response = envd.download(&absolute).await.map_err(|error| error.into_error("read", &display))?;
    Ok(response
        .bytes_stream()
        .map(move |chunk| {
            chunk.map_err(|error| WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!("read {display:?}: {error}"),
            })
        })
        .boxed())
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

/// The caller checked the fence.
pub async fn write_file(
    envd: &Envd,
    root: &str,
    path: &RelPath,
    data: ByteStream,
    options: WriteOptions,
) -> Result<u64> {
    let display = path.as_fs_str().to_owned();
    if path.is_root() {
        return Err(WorkspaceError::IsADirectory { path: display });
    }
    let mut resolver = Resolver::new(envd, root);
    let resolved = resolver.resolve(path, Mode::Create).await?;
    if resolved.is_dir() {
        return Err(WorkspaceError::IsADirectory { path: display });
    }
    let target = resolver.absolute(&resolved.components);
    let parent_components = &resolved.components[..resolved.components.len() - 1];
    let parent = resolver.absolute(parent_components);
    let temp = format!("{parent}/.berth-tmp-{}", hex::encode(rand::random::<[u8; 8]>()));
    // An existing file keeps its permission bits, as on the host backends.
    let mode = match &resolved.entry {
        Some(entry) => {
            entry.get("mode").and_then(|mode| json_number(Some(mode))).map_or(options.mode, |mode| mode as u32)
        }
        None => options.mode,
    } & 0o7777;
    let abort = Arc::new(Abort::default());
    let counted = {
        let abort = abort.clone();
        let max = options.max_bytes;
        let mut written: u64 = 0;
        data.map(move |chunk| match chunk {
            Ok(chunk) => {
                written += chunk.len() as u64;
                if written > max {
                    abort.set(WorkspaceError::LimitExceeded { limit: "file size", size: written, max });
                    Err(std::io::Error::other("file size limit exceeded"))
                } else {
                    Ok::<Bytes, std::io::Error>(chunk)
                }
            }
            Err(error) => {
                abort.set(error);
                Err(std::io::Error::other("the content stream failed"))
            }
        })
    };
    let size = Arc::new(Mutex::new(0u64));
    let sized = {
        let size = size.clone();
        counted.map(move |chunk| {
            if let Ok(chunk) = &chunk {
                *size.lock().unwrap_or_else(|poison| poison.into_inner()) += chunk.len() as u64;
            }
            chunk
        })
    };
    let uploaded = envd.upload(&temp, reqwest::Body::wrap_stream(sized)).await;
    let outcome = match (uploaded, abort.take()) {
        (_, Some(error)) => Err(error),
        (Err(error), None) => Err(error.into_error("write", &display)),
        (Ok(()), None) => finish(envd, &temp, &target, mode, &display).await,
    };
    match outcome {
        Ok(()) => Ok(*size.lock().unwrap_or_else(|poison| poison.into_inner())),
        Err(error) => {
            cleanup(envd, &resolver, &temp, &resolved.components, resolved.existing).await;
            Err(error)
        }
    }
}

/// Sets the temp file's mode when it differs, then moves it over the target.
async fn finish(envd: &Envd, temp: &str, target: &str, mode: u32, display: &str) -> Result<()> {
    let info = envd
        .unary("filesystem.Filesystem/Stat", &json!({"path": temp}), Retry::Idempotent)
        .await
        .map_err(|error| error.into_error("write", display))?;
    let current = info.get("entry").and_then(|entry| json_number(entry.get("mode"))).unwrap_or(0) as u32 & 0o7777;
    if current != mode {
        let mode_text = format!("{mode:o}");
        let (exit, _, stderr) = run_internal(envd, &["chmod", &mode_text, "--", temp], "/").await?;
        if exit.code != Some(0) {
            return Err(WorkspaceError::Backend {
                backend: BACKEND_NAME,
                message: format!("write {display:?}: chmod: {}", String::from_utf8_lossy(&stderr).trim()),
            });
        }
    }
    envd.unary("filesystem.Filesystem/Move", &json!({"source": temp, "destination": target}), Retry::Refused)
        .await
        .map_err(|error| error.into_error("write", display))?;
    Ok(())
}

/// Removes a failed write's temp file and, innermost first, the directories it created
/// (only while empty).
async fn cleanup(envd: &Envd, resolver: &Resolver<'_>, temp: &str, components: &[String], existing: usize) {
    let _ = envd.unary("filesystem.Filesystem/Remove", &json!({"path": temp}), Retry::Idempotent).await;
    let parents = components.len().saturating_sub(1);
    for end in (existing + 1..=parents).rev() {
        let dir = resolver.absolute(&components[..end]);
        let listed =
            envd.unary("filesystem.Filesystem/ListDir", &json!({"path": dir, "depth": 1}), Retry::Idempotent).await;
        let empty = listed.ok().is_some_and(|answer| {
            answer.get("entries").and_then(|entries| entries.as_array()).is_none_or(Vec::is_empty)
        });
        if !empty {
            return;
        }
        let _ = envd.unary("filesystem.Filesystem/Remove", &json!({"path": dir}), Retry::Idempotent).await;
    }
}
