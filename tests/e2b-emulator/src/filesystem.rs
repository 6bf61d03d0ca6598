//! envd's `filesystem.Filesystem` service (`Stat`, `ListDir`, `MakeDir`, `Move`, `Remove`;
//! unary, JSON) and the file bytes routes: `GET /files?path=` streams a file,
//! `POST /files?path=` writes one from an `application/octet-stream` body or from the
//! `file` parts of a `multipart/form-data` body (each part's filename is its path when the
//! query names none). As in envd, an upload writes the target in place (truncate, then
//! copy) and creates its parent directories; `Move` replaces; `Remove` is recursive.

use std::convert::Infallible;
use std::io::Read;
use std::sync::Arc;

use axum::body::{Body, to_bytes};
use axum::response::Response;
use bytes::Bytes;
use futures::StreamExt;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use super::connect::{ConnectError, json_response, unary_message, unary_ok};
use super::platform::form_decode;
use super::state::Sandbox;
use super::vfs::{FsError, Vfs};

/// Largest multipart body the emulator buffers (octet-stream uploads are streamed).
const MAX_MULTIPART: usize = 256 * 1024 * 1024;

fn connect_error(error: FsError) -> ConnectError {
    match error {
        FsError::NotFound(message) => ConnectError::not_found(message),
        FsError::NotADirectory(message) | FsError::IsADirectory(message) => ConnectError::invalid(message),
        FsError::Loop(message) => ConnectError::new("failed_precondition", message),
        FsError::Permission(message) => ConnectError::new("permission_denied", message),
        FsError::Other(message) => ConnectError::internal(message),
    }
}

fn http_error(error: FsError) -> Response {
    let (status, message) = match error {
        FsError::NotFound(message) => (StatusCode::NOT_FOUND, message),
        FsError::NotADirectory(message) | FsError::IsADirectory(message) | FsError::Loop(message) => {
            (StatusCode::BAD_REQUEST, message)
        }
        FsError::Permission(message) => (StatusCode::FORBIDDEN, message),
        FsError::Other(message) => (StatusCode::INTERNAL_SERVER_ERROR, message),
    };
    json_response(status, &json!({"code": status.as_u16(), "message": message}))
}

fn path_field(request: &Value, name: &str) -> Result<String, ConnectError> {
    let path = request.get(name).and_then(Value::as_str).unwrap_or("");
    if path.is_empty() {
        return Err(ConnectError::invalid(format!("{name} is required")));
    }
    Ok(Vfs::expand(path))
}

/// One unary Filesystem call; the blocking file work runs on the blocking pool.
pub async fn call(sandbox: Arc<Sandbox>, method: &str, body: &[u8]) -> Response {
    let request = match unary_message(body) {
        Ok(request) => request,
        Err(error) => return error.into_unary(),
    };
    let method = method.to_owned();
    let result = tokio::task::spawn_blocking(move || run(&sandbox.vfs, &method, &request)).await;
    match result {
        Ok(Ok(value)) => unary_ok(&value),
        Ok(Err(error)) => error.into_unary(),
        Err(error) => ConnectError::internal(error.to_string()).into_unary(),
    }
}

fn run(vfs: &Vfs, method: &str, request: &Value) -> Result<Value, ConnectError> {
    match method {
        "Stat" => {
            let path = path_field(request, "path")?;
            Ok(json!({"entry": vfs.entry_info(&path).map_err(connect_error)?}))
        }
        "ListDir" => {
            let path = path_field(request, "path")?;
            let depth = request.get("depth").and_then(Value::as_u64).unwrap_or(1) as u32;
            Ok(json!({"entries": vfs.list_dir(&path, depth).map_err(connect_error)?}))
        }
        "MakeDir" => {
            let path = path_field(request, "path")?;
            match vfs.make_dirs(&path).map_err(connect_error)? {
                true => Ok(json!({"entry": vfs.entry_info(&path).map_err(connect_error)?})),
                false => Err(ConnectError::new("already_exists", format!("directory already exists: {path}"))),
            }
        }
        "Move" => {
            let source = path_field(request, "source")?;
            let destination = path_field(request, "destination")?;
            vfs.rename(&source, &destination).map_err(connect_error)?;
            Ok(json!({"entry": vfs.entry_info(&destination).map_err(connect_error)?}))
        }
        "Remove" => {
            let path = path_field(request, "path")?;
            vfs.remove_all(&path).map_err(connect_error)?;
            Ok(json!({}))
        }
        other => Err(ConnectError::new("unimplemented", format!("filesystem.Filesystem/{other} is not emulated"))),
    }
}

fn query_path(query: &str) -> Option<String> {
    form_decode(query).into_iter().find(|(key, _)| key == "path").map(|(_, value)| Vfs::expand(&value))
}

/// `GET /files?path=`: the file's bytes.
pub async fn download(sandbox: Arc<Sandbox>, query: &str) -> Response {
    let Some(path) = query_path(query) else {
        return http_error(FsError::Other("path is required".into()));
    };
    let opened = {
        let sandbox = sandbox.clone();
        tokio::task::spawn_blocking(move || sandbox.vfs.open_read(&path)).await
    };
    let mut file = match opened {
        Ok(Ok(file)) => file,
        Ok(Err(error)) => return http_error(error),
        Err(error) => return http_error(FsError::Other(error.to_string())),
    };
    let (sender, receiver) = tokio::sync::mpsc::channel::<Bytes>(4);
    tokio::task::spawn_blocking(move || {
        let mut buffer = vec![0u8; 64 * 1024];
        loop {
            match file.read(&mut buffer) {
                Ok(0) | Err(_) => return,
                Ok(count) => {
                    if sender.blocking_send(Bytes::copy_from_slice(&buffer[..count])).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|chunk| (Ok::<Bytes, Infallible>(chunk), receiver))
    });
    let mut response = Response::new(Body::from_stream(stream));
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    response
}

fn uploaded(paths: &[String]) -> Response {
    let entries: Vec<Value> = paths
        .iter()
        .map(|path| json!({"path": path, "name": path.rsplit('/').next().unwrap_or(""), "type": "file"}))
        .collect();
    json_response(StatusCode::OK, &entries)
}

async fn open_write(sandbox: &Arc<Sandbox>, path: &str) -> Result<tokio::fs::File, Response> {
    let sandbox = sandbox.clone();
    let path = path.to_owned();
    match tokio::task::spawn_blocking(move || sandbox.vfs.open_write(&path)).await {
        Ok(Ok(file)) => Ok(tokio::fs::File::from_std(file)),
        Ok(Err(error)) => Err(http_error(error)),
        Err(error) => Err(http_error(FsError::Other(error.to_string()))),
    }
}

/// `POST /files`.
pub async fn upload(sandbox: Arc<Sandbox>, headers: &HeaderMap, query: &str, body: Body) -> Response {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()).unwrap_or("").to_owned();
    if let Some(boundary) = content_type.split(';').map(str::trim).find_map(|part| part.strip_prefix("boundary=")) {
        let boundary = boundary.trim_matches('"').to_owned();
        let body = match to_bytes(body, MAX_MULTIPART).await {
            Ok(body) => body,
            Err(error) => return http_error(FsError::Other(format!("error reading form: {error}"))),
        };
        let Some(parts) = multipart_files(&body, &boundary) else {
            return http_error(FsError::Other("error parsing multipart form".into()));
        };
        let mut paths = Vec::new();
        for (filename, data) in parts {
            let Some(path) = query_path(query).or_else(|| filename.map(|name| Vfs::expand(&name))) else {
                return json_response(
                    StatusCode::BAD_REQUEST,
                    &json!({"code": 400, "message": "no path for a file part"}),
                );
            };
            let mut file = match open_write(&sandbox, &path).await {
                Ok(file) => file,
                Err(response) => return response,
            };
            if let Err(error) = file.write_all(&data).await {
                return http_error(FsError::Other(format!("error writing file: {error}")));
            }
            let _ = file.flush().await;
            paths.push(path);
        }
        return uploaded(&paths);
    }
    let Some(path) = query_path(query) else {
        return json_response(StatusCode::BAD_REQUEST, &json!({"code": 400, "message": "path is required"}));
    };
    let mut file = match open_write(&sandbox, &path).await {
        Ok(file) => file,
        Err(response) => return response,
    };
    let mut chunks = body.into_data_stream();
    while let Some(chunk) = chunks.next().await {
        let written = match chunk {
            Ok(chunk) => file.write_all(&chunk).await.map_err(|error| error.to_string()),
            Err(error) => Err(format!("error reading the body: {error}")),
        };
        if let Err(message) = written {
            return http_error(FsError::Other(format!("error writing file: {message}")));
        }
    }
    if let Err(error) = file.flush().await {
        return http_error(FsError::Other(format!("error writing file: {error}")));
    }
    uploaded(&[path])
}

/// The `file` parts of a multipart body: (filename, content).
fn multipart_files(body: &[u8], boundary: &str) -> Option<Vec<(Option<String>, Vec<u8>)>> {
    let delimiter = format!("--{boundary}").into_bytes();
    let mut parts = Vec::new();
    let mut rest = &body[find(body, &delimiter)? + delimiter.len()..];
    loop {
        if rest.starts_with(b"--") {
            return Some(parts);
        }
        rest = rest.strip_prefix(b"\r\n")?;
        let header_end = find(rest, b"\r\n\r\n")?;
        let head = String::from_utf8_lossy(&rest[..header_end]).into_owned();
        let content = &rest[header_end + 4..];
        let mut next_delimiter = b"\r\n".to_vec();
        next_delimiter.extend_from_slice(&delimiter);
        let end = find(content, &next_delimiter)?;
        let disposition = head.lines().find(|line| line.to_ascii_lowercase().starts_with("content-disposition"))?;
        if disposition_param(disposition, "name").as_deref() == Some("file") {
            parts.push((disposition_param(disposition, "filename"), content[..end].to_vec()));
        }
        rest = &content[end + next_delimiter.len()..];
    }
}

fn disposition_param(line: &str, name: &str) -> Option<String> {
    line.split(';').map(str::trim).find_map(|part| {
        let (key, value) = part.split_once('=')?;
        (key.trim() == name).then(|| value.trim().trim_matches('"').to_owned())
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|window| window == needle)
}
