//! The file endpoints: info, list, upload, download, remove, move, mkdir, chmod. Paths are
//! absolute paths inside the sandbox, used as given (the daemon runs as the sandbox's user
//! and confines nothing: that is the caller's business, as with the real execd).

use std::fs;
use std::io::ErrorKind;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::UNIX_EPOCH;

use axum::body::{Body, Bytes};
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::answer::{self, empty_ok, error, rfc3339};
use crate::multipart;
use crate::query::Query;

/// Largest upload body accepted (the tests write a few MiB).
const MAX_UPLOAD_BYTES: usize = 512 * 1024 * 1024;

fn io_error(path: &str, problem: std::io::Error) -> Response {
    // As the real daemon: a missing file is 404, every other failure 500 RUNTIME_ERROR.
    match problem.kind() {
        ErrorKind::NotFound => error(StatusCode::NOT_FOUND, "FILE_NOT_FOUND", format!("file not found: {path}")),
        _ => {
            error(StatusCode::INTERNAL_SERVER_ERROR, "RUNTIME_ERROR", format!("error accessing file {path}: {problem}"))
        }
    }
}

fn bad_request(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "INVALID_REQUEST", message)
}

/// Permission bits as the API writes them: the octal digits read as a decimal number.
fn octal_digits(mode: u32) -> u64 {
    format!("{:o}", mode & 0o7777).parse().unwrap_or(0)
}

/// The API's `mode` (octal digits as a decimal number, e.g. 755) as permission bits.
fn mode_bits(mode: u64) -> Option<u32> {
    u32::from_str_radix(&mode.to_string(), 8).ok()
}

fn file_info(path: &Path, metadata: &fs::Metadata) -> Value {
    let kind = metadata.file_type();
    let kind = if kind.is_symlink() {
        "symlink"
    } else if kind.is_dir() {
        "directory"
    } else if kind.is_file() {
        "file"
    } else {
        "other"
    };
    let modified = metadata.modified().ok().and_then(|time| time.duration_since(UNIX_EPOCH).ok());
    let modified = modified.map_or(0, |duration| duration.as_secs() as i64);
    json!({
        "path": path.to_string_lossy(),
        "type": kind,
        "size": metadata.len(),
        "modified_at": rfc3339(modified),
        "created_at": rfc3339(metadata.ctime()),
        "owner": metadata.uid().to_string(),
        "group": metadata.gid().to_string(),
        "mode": octal_digits(metadata.permissions().mode()),
    })
}

pub async fn info(request: Request) -> Response {
    let query = Query::parse(request.uri().query());
    let mut answer = serde_json::Map::new();
    for path in query.all("path") {
        match fs::symlink_metadata(&path) {
            Ok(metadata) => {
                answer.insert(path.clone(), file_info(Path::new(&path), &metadata));
            }
            Err(problem) => return io_error(&path, problem),
        }
    }
    answer::json(Value::Object(answer))
}

pub async fn list(request: Request) -> Response {
    let query = Query::parse(request.uri().query());
    let Some(path) = query.first("path").filter(|path| !path.is_empty()).map(str::to_owned) else {
        return error(StatusCode::BAD_REQUEST, "MISSING_QUERY", "missing query parameter 'path'");
    };
    let depth = match query.first("depth").map(str::parse::<u32>) {
        None => 1,
        Some(Ok(depth)) => depth,
        Some(Err(_)) => return bad_request("invalid query parameter 'depth'"),
    };
    let metadata = match fs::symlink_metadata(&path) {
        Ok(metadata) => metadata,
        Err(problem) => return io_error(&path, problem),
    };
    if metadata.file_type().is_symlink() {
        return bad_request(format!("path is a symbolic link, refusing to traverse: {path}"));
    }
    if !metadata.is_dir() {
        return bad_request(format!("path is not a directory: {path}"));
    }
    let mut entries = Vec::new();
    if let Err(problem) = walk(Path::new(&path), 0, depth, &mut entries) {
        return io_error(&path, problem);
    }
    answer::json(Value::Array(entries))
}

/// Entries in lexical order per directory, each directory's descendants right after it.
fn walk(dir: &Path, current: u32, depth: u32, out: &mut Vec<Value>) -> std::io::Result<()> {
    if current >= depth {
        return Ok(());
    }
    let mut names: Vec<_> = fs::read_dir(dir)?.filter_map(Result::ok).map(|entry| entry.file_name()).collect();
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let metadata = match fs::symlink_metadata(&path) {
            Ok(metadata) => metadata,
            // Gone between readdir and lstat: not an entry any more.
            Err(problem) if problem.kind() == ErrorKind::NotFound => continue,
            Err(problem) => return Err(problem),
        };
        out.push(file_info(&path, &metadata));
        if metadata.is_dir() {
            walk(&path, current + 1, depth, out)?;
        }
    }
    Ok(())
}

pub async fn remove_files(request: Request) -> Response {
    let query = Query::parse(request.uri().query());
    for path in query.all("path") {
        match fs::symlink_metadata(&path) {
            Err(problem) if problem.kind() == ErrorKind::NotFound => continue,
            Err(problem) => return io_error(&path, problem),
            Ok(metadata) if metadata.is_dir() => {
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "RUNTIME_ERROR",
                    format!("error removing file {path}: is a directory"),
                );
            }
            Ok(_) => {
                if let Err(problem) = fs::remove_file(&path) {
                    return io_error(&path, problem);
                }
            }
        }
    }
    empty_ok()
}

pub async fn remove_dirs(request: Request) -> Response {
    let query = Query::parse(request.uri().query());
    for path in query.all("path") {
        match fs::remove_dir_all(&path) {
            Ok(()) => {}
            Err(problem) if problem.kind() == ErrorKind::NotFound => {}
            Err(problem) => return io_error(&path, problem),
        }
    }
    empty_ok()
}

#[derive(Deserialize)]
struct RenameItem {
    src: String,
    dest: String,
}

pub async fn rename(body: Bytes) -> Response {
    let items: Vec<RenameItem> = match serde_json::from_slice(&body) {
        Ok(items) => items,
        Err(problem) => return bad_request(format!("invalid body: {problem}")),
    };
    for item in items {
        if let Err(problem) = fs::symlink_metadata(&item.src) {
            return io_error(&item.src, problem);
        }
        if fs::symlink_metadata(&item.dest).is_ok() {
            return bad_request(format!("destination already exists: {}", item.dest));
        }
        if let Err(problem) = fs::rename(&item.src, &item.dest) {
            return io_error(&item.dest, problem);
        }
    }
    empty_ok()
}

#[derive(Deserialize, Default)]
struct Permission {
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    group: Option<String>,
    #[serde(default)]
    mode: Option<u64>,
}

/// A user or group given by number or by name (looked up in `/etc/passwd` / `/etc/group`).
fn lookup(table: &str, name: &str) -> Option<u32> {
    if let Ok(number) = name.parse() {
        return Some(number);
    }
    let text = fs::read_to_string(table).ok()?;
    text.lines().find_map(|line| {
        let mut fields = line.split(':');
        (fields.next()? == name).then_some(())?;
        fields.nth(1)?.parse().ok()
    })
}

fn apply_permission(path: &str, permission: &Permission) -> Result<(), Box<Response>> {
    if let Some(mode) = permission.mode.filter(|mode| *mode != 0) {
        let bits = mode_bits(mode).ok_or_else(|| Box::new(bad_request(format!("invalid mode {mode}"))))?;
        fs::set_permissions(path, fs::Permissions::from_mode(bits))
            .map_err(|problem| Box::new(io_error(path, problem)))?;
    }
    let owner = permission.owner.as_deref().filter(|name| !name.is_empty());
    let group = permission.group.as_deref().filter(|name| !name.is_empty());
    if owner.is_some() || group.is_some() {
        let uid = match owner {
            Some(name) => {
                Some(lookup("/etc/passwd", name).ok_or_else(|| Box::new(bad_request(format!("unknown user {name}"))))?)
            }
            None => None,
        };
        let gid = match group {
            Some(name) => {
                Some(lookup("/etc/group", name).ok_or_else(|| Box::new(bad_request(format!("unknown group {name}"))))?)
            }
            None => None,
        };
        std::os::unix::fs::lchown(path, uid, gid).map_err(|problem| Box::new(io_error(path, problem)))?;
    }
    Ok(())
}

pub async fn chmod(body: Bytes) -> Response {
    let items: std::collections::BTreeMap<String, Permission> = match serde_json::from_slice(&body) {
        Ok(items) => items,
        Err(problem) => return bad_request(format!("invalid body: {problem}")),
    };
    for (path, permission) in &items {
        if let Err(response) = apply_permission(path, permission) {
            return *response;
        }
    }
    empty_ok()
}

pub async fn make_dirs(body: Bytes) -> Response {
    let items: std::collections::BTreeMap<String, Permission> = match serde_json::from_slice(&body) {
        Ok(items) => items,
        Err(problem) => return bad_request(format!("invalid body: {problem}")),
    };
    for (path, permission) in &items {
        if let Err(problem) = fs::create_dir_all(path) {
            return io_error(path, problem);
        }
        if let Err(response) = apply_permission(path, permission) {
            return *response;
        }
    }
    empty_ok()
}

#[derive(Deserialize)]
struct UploadMetadata {
    path: String,
    #[serde(flatten)]
    permission: Permission,
}

pub async fn upload(request: Request) -> Response {
    let content_type = request.headers().get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok());
    let Some(boundary) = content_type.and_then(multipart::boundary) else {
        return error(StatusCode::BAD_REQUEST, "INVALID_FILE", "multipart form is empty");
    };
    let body = match axum::body::to_bytes(request.into_body(), MAX_UPLOAD_BYTES).await {
        Ok(body) => body,
        Err(problem) => return bad_request(format!("cannot read the body: {problem}")),
    };
    let Some(parts) = multipart::parse(&body, &boundary) else {
        return error(StatusCode::BAD_REQUEST, "INVALID_FILE", "malformed multipart body");
    };
    let metadata: Vec<_> = parts.iter().filter(|part| part.name == "metadata").collect();
    let contents: Vec<_> = parts.iter().filter(|part| part.name == "file").collect();
    if metadata.is_empty() {
        return error(StatusCode::BAD_REQUEST, "INVALID_FILE_METADATA", "metadata file is missing");
    }
    if metadata.len() != contents.len() {
        return error(StatusCode::BAD_REQUEST, "INVALID_FILE", "metadata and file count mismatch");
    }
    for (meta, content) in metadata.iter().zip(contents) {
        let meta = match serde_json::from_slice::<UploadMetadata>(&meta.data) {
            Ok(meta) if !meta.path.is_empty() => meta,
            _ => return error(StatusCode::BAD_REQUEST, "INVALID_FILE_METADATA", "invalid metadata format"),
        };
        if let Some(parent) = Path::new(&meta.path).parent()
            && let Err(problem) = fs::create_dir_all(parent)
        {
            return io_error(&meta.path, problem);
        }
        if let Err(problem) = fs::write(&meta.path, &content.data) {
            return io_error(&meta.path, problem);
        }
        if let Err(response) = apply_permission(&meta.path, &meta.permission) {
            return *response;
        }
    }
    empty_ok()
}

/// `bytes=START-END` / `bytes=START-` / `bytes=-SUFFIX` against a file of `size` bytes.
fn parse_range(headers: &HeaderMap, size: u64) -> Option<Result<(u64, u64), ()>> {
    let raw = headers.get(header::RANGE)?.to_str().ok()?;
    let spec = raw.strip_prefix("bytes=")?;
    let (start, end) = spec.split_once('-')?;
    let range = match (start.trim(), end.trim()) {
        ("", suffix) => suffix.parse::<u64>().ok().map(|suffix| (size.saturating_sub(suffix), size.saturating_sub(1))),
        (start, "") => start.parse().ok().map(|start| (start, size.saturating_sub(1))),
        (start, end) => match (start.parse::<u64>(), end.parse::<u64>()) {
            (Ok(start), Ok(end)) => Some((start, end.min(size.saturating_sub(1)))),
            _ => None,
        },
    };
    Some(match range {
        Some((start, end)) if start <= end && start < size => Ok((start, end)),
        _ => Err(()),
    })
}

pub async fn download(request: Request) -> Response {
    let query = Query::parse(request.uri().query());
    let Some(path) = query.first("path").filter(|path| !path.is_empty()).map(str::to_owned) else {
        return error(StatusCode::BAD_REQUEST, "MISSING_QUERY", "missing query parameter 'path'");
    };
    let data = match fs::read(&path) {
        Ok(data) => data,
        Err(problem) if problem.raw_os_error() == Some(nix::libc::EISDIR) => {
            return bad_request(format!("path is a directory: {path}"));
        }
        Err(problem) => return io_error(&path, problem),
    };
    let name = Path::new(&path).file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let disposition = format!("attachment; filename=\"{}\"", name.replace('"', ""));
    let size = data.len() as u64;
    match parse_range(request.headers(), size) {
        None => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/octet-stream".to_owned()), (header::CONTENT_DISPOSITION, disposition)],
            Body::from(data),
        )
            .into_response(),
        Some(Ok((start, end))) => {
            let part = data[start as usize..=end as usize].to_vec();
            (
                StatusCode::PARTIAL_CONTENT,
                [
                    (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
                    (header::CONTENT_RANGE, format!("bytes {start}-{end}/{size}")),
                    (header::CONTENT_DISPOSITION, disposition),
                ],
                Body::from(part),
            )
                .into_response()
        }
        Some(Err(())) => error(StatusCode::RANGE_NOT_SATISFIABLE, "INVALID_RANGE", "requested range not satisfiable"),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn formats_times_and_modes() {
        assert_eq!(crate::answer::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(crate::answer::rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        assert_eq!(super::octal_digits(0o755), 755);
        assert_eq!(super::mode_bits(644), Some(0o644));
    }
}
