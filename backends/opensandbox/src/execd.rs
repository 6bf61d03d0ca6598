//! The in-sandbox execd API (port 44772, `specs/execd-api.yaml`): commands with their event
//! stream, interrupt, uploads, and the metadata calls (`/files/info`, `/directories/list`,
//! `DELETE /files`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use reqwest::StatusCode;
use serde::{Deserialize, Serialize};

use berth_workspace::backend::ByteStream;
use berth_workspace::error::{Result, WorkspaceError};

use crate::config::BACKEND_NAME;
use crate::http::{Http, Retry, failure, read_error, unexpected};

const TOKEN_HEADER: &str = "X-EXECD-ACCESS-TOKEN";
/// Largest event accepted from a command stream (an output chunk is far smaller).
const MAX_EVENT_BYTES: usize = 8 * 1024 * 1024;

#[derive(Clone)]
pub(crate) struct Execd {
    http: Http,
    /// `http://host:port/proxy/44772` as the server's endpoint names it.
    base: String,
    headers: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct CommandRequest {
    pub command: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    pub background: bool,
    /// Milliseconds; the daemon kills the command's group when it passes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timeout: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    pub envs: BTreeMap<String, String>,
}

#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Event {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub error: Option<EventError>,
}

#[derive(Clone, Debug, Deserialize)]
pub(crate) struct EventError {
    #[serde(default)]
    pub ename: String,
    #[serde(default)]
    pub evalue: String,
    #[serde(default)]
    pub traceback: Vec<String>,
}

/// How a command ended, as its last event says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Ending {
    /// `execution_complete`, or `error` whose `evalue` is an exit code.
    Exited(i64),
    /// An `error` that is not an exit code (the command could not start).
    Failed(String),
}

impl Event {
    pub fn ending(&self) -> Option<Ending> {
        match self.kind.as_str() {
            "execution_complete" => Some(Ending::Exited(0)),
            "error" => {
                let error = self.error.clone().unwrap_or(EventError {
                    ename: String::new(),
                    evalue: String::new(),
                    traceback: Vec::new(),
                });
                Some(match error.evalue.trim().parse::<i64>() {
                    Ok(code) => Ending::Exited(code),
                    Err(_) => {
                        Ending::Failed(format!("{}: {} {}", error.ename, error.evalue, error.traceback.join(" / ")))
                    }
                })
            }
            _ => None,
        }
    }
}

/// The events of one command's answer: JSON objects separated by blank lines (an SSE
/// `data:` prefix is tolerated).
pub(crate) struct EventStream {
    body: BoxStream<'static, reqwest::Result<Bytes>>,
    buffer: BytesMut,
    done: bool,
}

impl EventStream {
    fn new(response: reqwest::Response) -> Self {
        Self { body: response.bytes_stream().boxed(), buffer: BytesMut::new(), done: false }
    }

    fn take_event(&mut self) -> Option<Bytes> {
        let position = self.buffer.windows(2).position(|window| window == b"\n\n")?;
        let event = self.buffer.split_to(position + 2).freeze();
        Some(event.slice(..position))
    }

    /// The next event, `None` at the end of the stream.
    pub async fn next(&mut self) -> Result<Option<Event>> {
        loop {
            while let Some(raw) = self.take_event() {
                let text = String::from_utf8_lossy(&raw);
                let json: String =
                    text.lines().map(|line| line.strip_prefix("data:").map_or(line, str::trim_start)).collect();
                if json.trim().is_empty() {
                    continue;
                }
                return serde_json::from_str(&json).map(Some).map_err(|error| WorkspaceError::Backend {
                    backend: BACKEND_NAME,
                    message: format!("unreadable command event: {error}"),
                });
            }
            if self.done {
                let rest = std::mem::take(&mut self.buffer);
                if String::from_utf8_lossy(&rest).trim().is_empty() {
                    return Ok(None);
                }
                self.buffer.extend_from_slice(&rest);
                self.buffer.extend_from_slice(b"\n\n");
                continue;
            }
            match self.body.next().await {
                Some(Ok(chunk)) => {
                    self.buffer.extend_from_slice(&chunk);
                    if self.buffer.len() > MAX_EVENT_BYTES {
                        return Err(WorkspaceError::Backend {
                            backend: BACKEND_NAME,
                            message: "a command event exceeds 8 MiB".into(),
                        });
                    }
                }
                Some(Err(error)) => {
                    return Err(WorkspaceError::BackendUnavailable {
                        backend: BACKEND_NAME,
                        reason: format!("command stream broke: {error}"),
                    });
                }
                None => self.done = true,
            }
        }
    }
}

/// A started command: its id (`init`) and the rest of its events.
pub(crate) struct Command {
    pub id: String,
    pub events: EventStream,
}

/// A command's whole output, for the small helper scripts.
#[derive(Debug)]
pub(crate) struct Collected {
    pub ending: Ending,
    pub stderr: String,
}

#[derive(Clone, Debug, Deserialize)]
pub(crate) struct FileEntry {
    pub path: String,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub modified_at: Option<String>,
    /// Permission bits written as octal digits (`755`).
    #[serde(default)]
    pub mode: u64,
    /// The owner's uid (or user name), as the daemon writes it.
    #[serde(default)]
    pub owner: String,
}

impl Execd {
    pub fn new(http: Http, base: String, headers: BTreeMap<String, String>, token: Option<String>) -> Self {
        let mut headers = headers;
        if let Some(token) = token {
            headers.insert(TOKEN_HEADER.to_owned(), token);
        }
        Self { http, base, headers }
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let mut builder = self.http.client.request(method, format!("{}{path}", self.base));
        for (name, value) in &self.headers {
            builder = builder.header(name, value);
        }
        builder
    }

    /// A call that answers at once (metadata, moves, deletes): bounded by the request timeout.
    fn short(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request(method, path).timeout(self.http.request_timeout)
    }

    pub async fn ping(&self) -> Result<()> {
        let response =
            self.http.send("ping execd", Retry::Idempotent, || self.short(reqwest::Method::GET, "/ping")).await?;
        if response.status().is_success() { Ok(()) } else { Err(unexpected("ping execd", response).await) }
    }

    /// Starts a command and reads its `init` event.
    pub async fn run(&self, request: &CommandRequest) -> Result<Command> {
        let what = "run command";
        let body = serde_json::to_vec(request).map_err(|error| WorkspaceError::InvalidArgument(error.to_string()))?;
        let response = self
            .http
            .send(what, Retry::Once, || {
                self.request(reqwest::Method::POST, "/command")
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .header(reqwest::header::ACCEPT, "text/event-stream")
                    .body(body.clone())
            })
            .await?;
        if !response.status().is_success() {
            return Err(unexpected(what, response).await);
        }
        let mut events = EventStream::new(response);
        loop {
            match events.next().await? {
                Some(event) if event.kind == "init" => {
                    return Ok(Command { id: event.text.unwrap_or_default(), events });
                }
                Some(event) if event.kind == "ping" => continue,
                Some(event) => {
                    return Err(WorkspaceError::Backend {
                        backend: BACKEND_NAME,
                        message: format!("command stream began with {:?}, not init", event.kind),
                    });
                }
                None => {
                    return Err(WorkspaceError::Backend {
                        backend: BACKEND_NAME,
                        message: "command stream ended before init".into(),
                    });
                }
            }
        }
    }

    /// Runs a command to its end; keeps its (small, textual) stderr, drops its stdout.
    pub async fn run_collect(&self, request: &CommandRequest) -> Result<Collected> {
        let mut command = self.run(request).await?;
        let mut stderr = String::new();
        while let Some(event) = command.events.next().await? {
            match event.kind.as_str() {
                "stderr" if stderr.len() < 64 * 1024 => stderr.push_str(event.text.as_deref().unwrap_or_default()),
                _ => {
                    if let Some(ending) = event.ending() {
                        return Ok(Collected { ending, stderr });
                    }
                }
            }
        }
        Err(WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: "command stream ended without an exit".into(),
        })
    }

    /// Asks the daemon to interrupt a command (SIGTERM to its group, then SIGKILL).
    pub async fn interrupt(&self, id: &str) -> Result<()> {
        let what = "interrupt command";
        let response = self
            .http
            .send(what, Retry::Idempotent, || self.short(reqwest::Method::DELETE, "/command").query(&[("id", id)]))
            .await?;
        match response.status() {
            status if status.is_success() || status == StatusCode::NOT_FOUND => Ok(()),
            _ => Err(unexpected(what, response).await),
        }
    }

    /// Uploads a file from a chunk stream (one multipart pair: metadata, then the file).
    /// Returns the bytes sent; past `max_bytes` the upload is aborted with `LimitExceeded`,
    /// and an error of the source stream aborts it with that error.
    pub async fn upload(&self, path: &str, mode_digits: u64, data: ByteStream, max_bytes: u64) -> Result<u64> {
        let what = "upload file";
        let boundary = format!("berth-{}", hex::encode(rand::random::<[u8; 12]>()));
        let metadata = serde_json::json!({ "path": path, "mode": mode_digits }).to_string();
        let head = format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"metadata\"; filename=\"metadata\"\r\nContent-Type: application/json\r\n\r\n{metadata}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"file\"\r\nContent-Type: application/octet-stream\r\n\r\n"
        );
        let tail = format!("\r\n--{boundary}--\r\n");
        let failed: Arc<Mutex<Option<WorkspaceError>>> = Arc::new(Mutex::new(None));
        let counted = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (failed_in, counted_in) = (failed.clone(), counted.clone());
        let body = futures::stream::once(async move { Ok::<_, std::io::Error>(Bytes::from(head)) })
            .chain(data.map(move |chunk| {
                let outcome = chunk.and_then(|chunk| {
                    let total = counted_in.fetch_add(chunk.len() as u64, std::sync::atomic::Ordering::SeqCst)
                        + chunk.len() as u64;
                    if total > max_bytes {
                        return Err(WorkspaceError::LimitExceeded { limit: "file size", size: total, max: max_bytes });
                    }
                    Ok(chunk)
                });
                outcome.map_err(|error| {
                    let text = error.to_string();
                    failed_in.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).get_or_insert(error);
                    std::io::Error::other(text)
                })
            }))
            .chain(futures::stream::once(async move { Ok(Bytes::from(tail)) }));
        let sent = self
            .request(reqwest::Method::POST, "/files/upload")
            .header(reqwest::header::CONTENT_TYPE, format!("multipart/form-data; boundary={boundary}"))
            .body(reqwest::Body::wrap_stream(body))
            .send()
            .await;
        if let Some(error) = failed.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take() {
            return Err(error);
        }
        let response = sent.map_err(|error| WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: format!("{what}: {error}"),
        })?;
        if !response.status().is_success() {
            return Err(self.auth_or(what, response).await);
        }
        Ok(counted.load(std::sync::atomic::Ordering::SeqCst))
    }

    async fn auth_or(&self, what: &str, response: reqwest::Response) -> WorkspaceError {
        let status = response.status();
        let (code, message) = read_error(response).await;
        if matches!(status, StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN) {
            return WorkspaceError::ProviderAuth {
                provider: BACKEND_NAME,
                credential: self.http.credential.clone(),
                message: format!("{what}: {message}"),
            };
        }
        failure(what, status, &code, &message)
    }

    /// `lstat` of each path (absolute, inside the sandbox); `None` for a missing one.
    pub async fn info(&self, paths: &[String]) -> Result<BTreeMap<String, Option<FileEntry>>> {
        let what = "file info";
        let query: Vec<(&str, &str)> = paths.iter().map(|path| ("path", path.as_str())).collect();
        let response = self
            .http
            .send(what, Retry::Lookup, || self.short(reqwest::Method::GET, "/files/info").query(&query))
            .await?;
        if response.status() == StatusCode::NOT_FOUND && paths.len() == 1 {
            return Ok(BTreeMap::from([(paths[0].clone(), None)]));
        }
        if !response.status().is_success() {
            return Err(unexpected(what, response).await);
        }
        let bytes = response.bytes().await.map_err(|error| WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: format!("{what}: {error}"),
        })?;
        let found: BTreeMap<String, FileEntry> = serde_json::from_slice(&bytes)
            .map_err(|error| WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("{what}: {error}") })?;
        Ok(paths.iter().map(|path| (path.clone(), found.get(path).cloned())).collect())
    }

    /// The entries of a directory (depth 1, lexical order); `Ok(None)` when it is missing.
    pub async fn list(&self, path: &str) -> Result<Option<Vec<FileEntry>>> {
        let what = "list directory";
        let response = self
            .http
            .send(what, Retry::Lookup, || {
                self.short(reqwest::Method::GET, "/directories/list").query(&[("path", path), ("depth", "1")])
            })
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        if !response.status().is_success() {
            return Err(unexpected(what, response).await);
        }
        let bytes = response.bytes().await.map_err(|error| WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: format!("{what}: {error}"),
        })?;
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|error| WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("{what}: {error}") })
    }

    /// Renames `src` to `dest` (which must not exist).
    pub async fn rename(&self, src: &str, dest: &str) -> Result<()> {
        let what = "move file";
        let body = serde_json::json!([{ "src": src, "dest": dest }]).to_string();
        let response = self
            .http
            .send(what, Retry::Once, || {
                self.short(reqwest::Method::POST, "/files/mv")
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await?;
        if response.status().is_success() { Ok(()) } else { Err(unexpected(what, response).await) }
    }

    /// A file's content as a stream.
    pub async fn download(&self, path: &str) -> Result<BoxStream<'static, reqwest::Result<Bytes>>> {
        let what = "download file";
        let response = self
            .http
            .send(what, Retry::Idempotent, || {
                self.request(reqwest::Method::GET, "/files/download").query(&[("path", path)])
            })
            .await?;
        match response.status() {
            StatusCode::NOT_FOUND => Err(WorkspaceError::NotFound { path: path.to_owned() }),
            status if status.is_success() => Ok(response.bytes_stream().boxed()),
            _ => Err(unexpected(what, response).await),
        }
    }

    pub async fn delete_file(&self, path: &str) -> Result<()> {
        let what = "delete file";
        let response = self
            .http
            .send(what, Retry::Idempotent, || self.short(reqwest::Method::DELETE, "/files").query(&[("path", path)]))
            .await?;
        match response.status() {
            status if status.is_success() || status == StatusCode::NOT_FOUND => Ok(()),
            _ => Err(unexpected(what, response).await),
        }
    }
}
