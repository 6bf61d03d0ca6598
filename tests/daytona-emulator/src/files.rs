//! The toolbox's file calls: `GET /files?path=` (list), `GET /files/info?path=`, `DELETE
//! /files?path=&recursive=`, `POST /files/move?source=&destination=`, `POST
//! /files/folder?path=&mode=`, `GET /files/download?path=` (raw bytes), `POST
//! /files/bulk-upload` (multipart pairs `files[i].path` + `files[i].file`; parents are
//! created), `POST /files/bulk-download {paths}` (a multipart answer: one `file` part per
//! path, or an `error` part with a JSON `{message, statusCode}`).
//!
//! Paths are resolved in the sandbox's namespace by the E2B emulator's `Vfs` (symlinks
//! followed as inside the sandbox, writes through a cap-std handle), so no sandbox symlink
//! ever reaches a host path.

use std::io::{Read, Write};
use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use serde_json::{Value, json};

use berth_e2b_emulator::platform::form_decode;
use berth_e2b_emulator::vfs::{FsError, Vfs};

use super::multipart;
use super::reply::{empty, error, json_ok};
use super::state::Sandbox;

/// Largest bulk upload the emulator buffers.
const MAX_UPLOAD: usize = 512 * 1024 * 1024;

fn fs_error(failure: FsError) -> Response {
    let (status, message) = match failure {
        FsError::NotFound(message) => (404, message),
        FsError::NotADirectory(message) | FsError::IsADirectory(message) | FsError::Loop(message) => (400, message),
        FsError::Permission(message) => (403, message),
        FsError::Other(message) => (500, message),
    };
    error(status, &message)
}

/// Daytona's `FileInfo` of an E2B-emulator entry.
fn file_info(entry: &Value) -> Value {
    let kind = entry.get("type").and_then(Value::as_str).unwrap_or("");
    let mode = entry.get("mode").and_then(Value::as_u64).unwrap_or(0);
    let modified = entry.get("modifiedTime").and_then(Value::as_str).unwrap_or("1970-01-01T00:00:00Z");
    json!({
        "name": entry.get("name").cloned().unwrap_or(json!("")),
        "path": entry.get("path").cloned().unwrap_or(json!("")),
        "isDir": kind == "FILE_TYPE_DIRECTORY",
        "size": entry.get("size").and_then(Value::as_str).and_then(|size| size.parse::<u64>().ok()).unwrap_or(0),
        "mode": entry.get("permissions").cloned().unwrap_or(json!("")),
        "permissions": format!("{mode:04o}"),
        "owner": entry.get("owner").cloned().unwrap_or(json!("")),
        "group": entry.get("group").cloned().unwrap_or(json!("")),
        "modTime": modified,
        "modifiedAt": modified,
    })
}

fn param(query: &str, name: &str) -> Option<String> {
    form_decode(query).into_iter().find(|(key, _)| key == name).map(|(_, value)| value)
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, Response> {
    tokio::task::spawn_blocking(work).await.map_err(|failure| error(500, &failure.to_string()))
}

pub async fn handle(
    sandbox: Arc<Sandbox>,
    method: &Method,
    path: &str,
    query: &str,
    headers: &HeaderMap,
    body: Body,
) -> Response {
    let target = param(query, "path").map(|path| Vfs::expand(&path));
    let outcome = match (method, path) {
        (&Method::GET, "/files") => {
            let Some(target) = target else { return error(400, "path is required") };
            blocking(move || sandbox.vfs.list_dir(&target, 1)).await.map(|listed| match listed {
                Ok(entries) => json_ok(StatusCode::OK, &json!(entries.iter().map(file_info).collect::<Vec<_>>())),
                Err(failure) => fs_error(failure),
            })
        }
        (&Method::GET, "/files/info") => {
            let Some(target) = target else { return error(400, "path is required") };
            // The daemon stats (follows a final symlink).
            blocking(move || {
                let resolved = sandbox.vfs.resolve(&target, true)?;
                if !resolved.exists() {
                    return Err(FsError::NotFound(format!("{target}: no such file or directory")));
                }
                sandbox.vfs.entry_info(&resolved.path())
            })
            .await
            .map(|info| match info {
                Ok(entry) => json_ok(StatusCode::OK, &file_info(&entry)),
                Err(failure) => fs_error(failure),
            })
        }
        (&Method::DELETE, "/files") => {
            let Some(target) = target else { return error(400, "path is required") };
            let recursive = param(query, "recursive").is_some_and(|value| value == "true");
            blocking(move || {
                let resolved = sandbox.vfs.resolve(&target, false)?;
                if !resolved.exists() {
                    return Err(FsError::NotFound(format!("{target}: no such file or directory")));
                }
                if resolved.is_dir() && !recursive && !sandbox.vfs.list_dir(&target, 1)?.is_empty() {
                    return Err(FsError::Other("directory is not empty; use recursive".into()));
                }
                sandbox.vfs.remove_all(&target)
            })
            .await
            .map(|removed| match removed {
                Ok(()) => empty(StatusCode::NO_CONTENT),
                Err(failure) => fs_error(failure),
            })
        }
        (&Method::POST, "/files/move") => {
            let (Some(source), Some(destination)) = (param(query, "source"), param(query, "destination")) else {
                return error(400, "source and destination are required");
            };
            blocking(move || sandbox.vfs.rename(&Vfs::expand(&source), &Vfs::expand(&destination))).await.map(|moved| {
                match moved {
                    Ok(()) => empty(StatusCode::OK),
                    Err(failure) => fs_error(failure),
                }
            })
        }
        (&Method::POST, "/files/folder") => {
            let Some(target) = target else { return error(400, "path is required") };
            let mode = param(query, "mode").and_then(|mode| u32::from_str_radix(&mode, 8).ok());
            blocking(move || {
                sandbox.vfs.make_dirs(&target)?;
                if let Some(mode) = mode {
                    set_mode(&sandbox, &target, mode)?;
                }
                Ok(())
            })
            .await
            .map(|made: Result<(), FsError>| match made {
                Ok(()) => empty(StatusCode::CREATED),
                Err(failure) => fs_error(failure),
            })
        }
        (&Method::GET, "/files/download") => {
            let Some(target) = target else { return error(400, "path is required") };
            blocking(move || {
                let mut file = sandbox.vfs.open_read(&target)?;
                let mut content = Vec::new();
                file.read_to_end(&mut content).map_err(|failure| FsError::Other(failure.to_string()))?;
                Ok(content)
            })
            .await
            .map(|content: Result<Vec<u8>, FsError>| match content {
                Ok(content) => {
                    let mut response = Response::new(Body::from(content));
                    response
                        .headers_mut()
                        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
                    response
                }
                Err(failure) => fs_error(failure),
            })
        }
        (&Method::POST, "/files/bulk-upload") => Ok(bulk_upload(sandbox, headers, body).await),
        (&Method::POST, "/files/bulk-download") => Ok(bulk_download(sandbox, body).await),
        _ => Ok(error(404, &format!("Cannot {method} {path}"))),
    };
    outcome.unwrap_or_else(|response| response)
}

fn set_mode(sandbox: &Sandbox, path: &str, mode: u32) -> Result<(), FsError> {
    use std::os::unix::fs::PermissionsExt;
    // Through the same confined open as a read: the mode of what the path names.
    let file = sandbox.vfs.open_read(path).or_else(|_| {
        let resolved = sandbox.vfs.resolve(path, true)?;
        std::fs::File::open(sandbox.dir.join(resolved.path().trim_start_matches('/')))
            .map_err(|failure| FsError::Other(failure.to_string()))
    })?;
    file.set_permissions(std::fs::Permissions::from_mode(mode)).map_err(|failure| FsError::Other(failure.to_string()))
}

async fn bulk_upload(sandbox: Arc<Sandbox>, headers: &HeaderMap, body: Body) -> Response {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or("");
    let Some(boundary) = multipart::boundary(content_type) else {
        return error(400, "request Content-Type isn't multipart/form-data");
    };
    let body = match to_bytes(body, MAX_UPLOAD).await {
        Ok(body) => body,
        Err(failure) => return error(400, &format!("error reading form: {failure}")),
    };
    let Some(parts) = multipart::parse(&body, &boundary) else { return error(400, "error parsing multipart form") };
    // Pair `files[i].path` with `files[i].file`.
    let mut uploads: std::collections::BTreeMap<String, (Option<String>, Option<Vec<u8>>)> = Default::default();
    for part in parts {
        if let Some(index) = part.name.strip_prefix("files[").and_then(|rest| rest.strip_suffix("].path")) {
            uploads.entry(index.to_owned()).or_default().0 = Some(String::from_utf8_lossy(&part.content).into_owned());
        } else if let Some(index) = part.name.strip_prefix("files[").and_then(|rest| rest.strip_suffix("].file")) {
            uploads.entry(index.to_owned()).or_default().1 = Some(part.content);
        }
    }
    let written = blocking(move || {
        for (index, (path, content)) in uploads {
            let (Some(path), Some(content)) = (path, content) else {
                return Err(FsError::Other(format!("files[{index}] needs a path and a file")));
            };
            let path = Vfs::expand(&path);
            let mut file = sandbox.vfs.open_write(&path)?;
            file.write_all(&content).map_err(|failure| FsError::Other(format!("{path}: {failure}")))?;
        }
        Ok(())
    })
    .await;
    match written {
        Ok(Ok(())) => empty(StatusCode::OK),
        Ok(Err(failure)) => fs_error(failure),
        Err(response) => response,
    }
}

async fn bulk_download(sandbox: Arc<Sandbox>, body: Body) -> Response {
    let Ok(body) = to_bytes(body, 16 * 1024 * 1024).await else { return error(400, "body") };
    let Ok(request) = serde_json::from_slice::<Value>(&body) else { return error(400, "invalid request body") };
    let paths: Vec<String> = request
        .get("paths")
        .and_then(Value::as_array)
        .map(|paths| paths.iter().filter_map(Value::as_str).map(str::to_owned).collect())
        .unwrap_or_default();
    if paths.is_empty() {
        return error(400, "paths is required");
    }
    let boundary = format!("berthemulator{}", rand::random::<u64>());
    let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(4);
    let answer_boundary = boundary.clone();
    tokio::task::spawn_blocking(move || {
        for path in paths {
            let opened = sandbox.vfs.open_read(&Vfs::expand(&path));
            match opened {
                Ok(mut file) => {
                    let head = multipart::part_head(&answer_boundary, "file", &path, "application/octet-stream");
                    if sender.blocking_send(Bytes::from(head)).is_err() {
                        return;
                    }
                    let mut chunk = vec![0u8; 64 * 1024];
                    loop {
                        match file.read(&mut chunk) {
                            Ok(0) | Err(_) => break,
                            Ok(count) => {
                                if sender.blocking_send(Bytes::copy_from_slice(&chunk[..count])).is_err() {
                                    return;
                                }
                            }
                        }
                    }
                }
                Err(failure) => {
                    let (status, message) = match failure {
                        FsError::NotFound(message) => (404, message),
                        FsError::IsADirectory(message) => (400, message),
                        other => (400, format!("{other:?}")),
                    };
                    let head = multipart::part_head(&answer_boundary, "error", &path, "application/json");
                    let mut part = head;
                    part.extend_from_slice(
                        json!({"message": message, "statusCode": status, "code": "FILE_ERROR"}).to_string().as_bytes(),
                    );
                    if sender.blocking_send(Bytes::from(part)).is_err() {
                        return;
                    }
                }
            }
            if sender.blocking_send(Bytes::from_static(b"\r\n")).is_err() {
                return;
            }
        }
        let _ = sender.blocking_send(Bytes::from(format!("--{answer_boundary}--\r\n")));
    });
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (Ok::<Bytes, std::convert::Infallible>(chunk), receiver))
    });
    let mut response = Response::new(Body::from_stream(stream));
    let content_type = format!("multipart/form-data; boundary={boundary}");
    if let Ok(value) = HeaderValue::from_str(&content_type) {
        response.headers_mut().insert(header::CONTENT_TYPE, value);
    }
    response
}
