//! File bytes of a workspace, through exec in the workspace container, as the workspace
//! user (so nothing reads or writes what the agent could not):
//!
//! - `read_file`: `read.sh` resolves the path inside the root (`resolve.sh`, hop by hop)
//!   and streams the file to stdout; the websocket carries raw bytes.
//! - `write_file`: the content streams into a private staging file (`stage.sh`: `cat`
//!   from stdin), then `write.sh` resolves the target, moves the staged file beside it and
//!   renames it over the target (atomic). A source stream that fails, or passes
//!   `max_bytes`, ends the staging exec and the staged file is removed: nothing reaches the
//!   workspace.
//!
//! Metadata (`stat`, `list_dir`, …) is the contract's POSIX path through exec.

use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncWriteExt;

use berth_workspace::backend::{ByteStream, WriteOptions};
use berth_workspace::error::WorkspaceError;
use berth_workspace::path::RelPath;

use crate::config::BACKEND_NAME;
use crate::process::nonce;
use crate::remote::{ExecError, ExecResult, Target, exit_of};
use crate::scripts::{FAILED_EXIT_CODE, Scripts};

const READ_CHUNK: usize = 256 * 1024;

/// What a helper script refused (its `… fail KIND` or `berth-error KIND` line).
fn failure(operation: &str, path: &str, code: Option<i32>, stderr: &str) -> WorkspaceError {
    let kind = stderr
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix("berth-error ").or_else(|| line.split_once(" fail ").map(|(_, kind)| kind)))
        .map(str::trim);
    let path = path.to_owned();
    match (code, kind) {
        (Some(FAILED_EXIT_CODE), Some("notfound")) => WorkspaceError::NotFound { path },
        (Some(FAILED_EXIT_CODE), Some("escape")) => WorkspaceError::PathEscapesRoot { path },
        (Some(FAILED_EXIT_CODE), Some("isdir")) => WorkspaceError::IsADirectory { path },
        (Some(FAILED_EXIT_CODE), Some("notdir")) => WorkspaceError::NotADirectory { path },
        (Some(FAILED_EXIT_CODE), Some("notregular")) => {
            WorkspaceError::InvalidArgument(format!("{path:?} is not a regular file"))
        }
        _ => WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("{operation} {path:?} failed (exit {code:?}): {}", stderr.trim()),
        },
    }
}

pub(crate) async fn read_file(target: &Target, scripts: &Scripts, path: &RelPath) -> ExecResult<ByteStream> {
    let display = path.as_fs_str().to_owned();
    let nonce = nonce();
    let mut attached = target.attach(scripts.read(&nonce, path.as_str()), false).await?;
    let status = attached.take_status();
    let (Some(stdout), Some(mut stderr)) = (attached.stdout(), attached.stderr()) else {
        return Err(ExecError::Other(WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: "the exec stream has no stdio".into(),
        }));
    };
    // The first stderr line says whether the file opened.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    loop {
        use tokio::io::AsyncReadExt;
        match stderr.read(&mut byte).await {
            Ok(1) if byte[0] != b'\n' && line.len() < 4096 => line.push(byte[0]),
            _ => break,
        }
    }
    let line = String::from_utf8_lossy(&line).into_owned();
    if line != format!("berth-{nonce} ok") {
        let exit = match status {
            Some(status) => exit_of(status.await.as_ref()),
            None => None,
        };
        return Err(ExecError::Other(failure("read", &display, exit.and_then(|exit| exit.code), &line)));
    }
    // The status is checked at the end: a read that broke is an error, not a short file.
    let status = status.map(Box::pin);
    let reader = tokio_util::io::ReaderStream::with_capacity(stdout, READ_CHUNK);
    let ending = futures::stream::once(async move {
        let exit = match status {
            Some(status) => exit_of(status.await.as_ref()),
            None => None,
        };
        drop(attached);
        match exit {
            Some(exit) if exit.code == Some(0) => None,
            other => Some(Err(WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!("reading {display:?} broke off ({other:?})"),
            })),
        }
    })
    .filter_map(futures::future::ready);
    Ok(reader
        .map(|chunk| {
            chunk.map_err(|error| WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!("read stream: {error}"),
            })
        })
        .chain(ending)
        .boxed())
}

/// The caller checked the path is not the root.
pub(crate) async fn write_file(
    target: &Target,
    scripts: &Scripts,
    state_dir: &str,
    path: &RelPath,
    mut data: ByteStream,
    options: WriteOptions,
) -> ExecResult<u64> {
    let display = path.as_fs_str().to_owned();
    if path.is_root() {
        return Err(ExecError::Other(WorkspaceError::IsADirectory { path: display }));
    }
    let nonce = nonce();
    let staged = Scripts::staged_path(state_dir, &nonce);
    let mut attached = target.attach(scripts.stage(&nonce), true).await?;
    let status = attached.take_status();
    let Some(mut stdin) = attached.stdin() else {
        return Err(ExecError::Other(WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: "the exec stream has no stdin".into(),
        }));
    };
    let mut written: u64 = 0;
    let mut failed: Option<WorkspaceError> = None;
    // Ends early when the staging command does (it failed): a write into a finished
    // stream would wait forever.
    let mut status = status.map(Box::pin);
    let mut early_exit = None;
    while let Some(chunk) = data.next().await {
        let chunk: Bytes = match chunk {
            Ok(chunk) => chunk,
            Err(error) => {
                failed = Some(error);
                break;
            }
        };
        written += chunk.len() as u64;
        if written > options.max_bytes {
            failed = Some(WorkspaceError::LimitExceeded { limit: "file size", size: written, max: options.max_bytes });
            break;
        }
        let wrote = match status.as_mut() {
            Some(ending) => tokio::select! {
                wrote = stdin.write_all(&chunk) => wrote.is_ok(),
                exit = ending.as_mut() => {
                    early_exit = Some(exit_of(exit.as_ref()));
                    false
                }
            },
            None => stdin.write_all(&chunk).await.is_ok(),
        };
        if !wrote {
            failed = Some(WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!("writing {display:?}: the staging command ended early ({early_exit:?})"),
            });
            break;
        }
    }
    if let Some(error) = failed {
        // The stream ends without committing: drop it, then remove what was staged.
        drop(stdin);
        drop(attached);
        discard(target, scripts, &staged).await;
        return Err(ExecError::Other(error));
    }
    let _ = stdin.shutdown().await;
    drop(stdin);
    let exit = match status {
        Some(status) => exit_of(status.await.as_ref()),
        None => None,
    };
    drop(attached);
    if exit.and_then(|exit| exit.code) != Some(0) {
        discard(target, scripts, &staged).await;
        return Err(ExecError::Other(WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("staging {display:?} failed ({exit:?})"),
        }));
    }
    let collected = target.run(scripts.write(&nonce, path.as_str(), options.mode & 0o7777, &staged), None).await?;
    if collected.code() != Some(0) {
        return Err(ExecError::Other(failure("write", &display, collected.code(), &collected.stderr)));
    }
    Ok(written)
}

async fn discard(target: &Target, scripts: &Scripts, staged: &str) {
    if let Err(ExecError::Other(error)) = target.run(scripts.discard(staged), None).await {
        tracing::warn!(%error, staged, "could not remove a staged file");
    }
}
