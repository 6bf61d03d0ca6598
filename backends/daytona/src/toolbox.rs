//! A sandbox's toolbox, the daemon behind the sandbox's `toolboxProxyUrl` (every path
//! prefixed with `/{sandboxId}`, the API's bearer token): `process/execute` (one command to
//! its end; stdout and stderr come back combined, so this backend runs only its own
//! scripts through it, whose output it controls), sessions (an asynchronous command per
//! spawned process, `input` to its stdin), `user-home-dir`, bulk upload (multipart
//! `files[0].path` + `files[0].file`, streamed) and bulk download (a multipart answer).

use std::time::Duration;

use reqwest::{Body, Client, Method, Response, StatusCode};
use serde::Deserialize;
use serde_json::json;

use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;
use super::http::{self, Failure, Retry, encode, query};

/// Most output an internal command may print (its answer is buffered).
const MAX_EXECUTE_ANSWER: usize = 64 * 1024 * 1024;

#[derive(Clone)]
pub struct Toolbox {
    client: Client,
    /// `<toolboxProxyUrl>/<sandboxId>`.
    base: String,
    sandbox_id: String,
    key: String,
    organization_id: Option<String>,
    credential: String,
    request_timeout: Duration,
    retry_deadline: Duration,
}

#[derive(Deserialize)]
struct ExecuteAnswer {
    #[serde(rename = "exitCode", default)]
    exit_code: Option<i32>,
    #[serde(default)]
    result: String,
}

impl Toolbox {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        client: Client,
        proxy_url: &str,
        sandbox_id: &str,
        key: String,
        organization_id: Option<String>,
        credential: String,
        request_timeout: Duration,
        retry_deadline: Duration,
    ) -> Self {
        Self {
            client,
            base: format!("{}/{}", proxy_url.trim_end_matches('/'), encode(sandbox_id)),
            sandbox_id: sandbox_id.to_owned(),
            key,
            organization_id,
            credential,
            request_timeout,
            retry_deadline,
        }
    }

    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    fn request(&self, method: Method, path: &str, timeout: Option<Duration>) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.key)
            .header("X-Daytona-Source", "berth")
            .timeout(timeout.unwrap_or(self.request_timeout));
        if let Some(organization) = &self.organization_id {
            request = request.header("X-Daytona-Organization-ID", organization);
        }
        request
    }

    pub fn fail(&self, what: &str, failure: Failure) -> WorkspaceError {
        let what = format!("{what} (sandbox {})", self.sandbox_id);
        // A stopped (or stopping, deleted) sandbox's toolbox cannot answer: the sandbox is
        // unavailable until a provision starts it, whatever status the proxy chose.
        if let Failure::Status(refusal) = &failure {
            let lower = refusal.message.to_ascii_lowercase();
            if refusal.status.is_client_error()
                && !matches!(refusal.status.as_u16(), 401 | 403)
                && ["not started", "is stopped", "not running", "no such sandbox"]
                    .iter()
                    .any(|hint| lower.contains(hint))
            {
                return WorkspaceError::BackendUnavailable {
                    backend: BACKEND_NAME,
                    reason: format!("{what}: the sandbox is not started: {}", refusal.message),
                };
            }
        }
        failure.into_error(&what, &self.credential)
    }

    async fn send(
        &self,
        what: &str,
        retry: Retry,
        accept: &[StatusCode],
        build: impl Fn() -> reqwest::RequestBuilder,
    ) -> Result<Response> {
        http::send(build, retry, self.retry_deadline, accept).await.map_err(|failure| self.fail(what, failure))
    }

    /// Runs `command` (a shell command line) to its end: exit code and combined output.
    /// `retry` says whether the command may run twice.
    pub async fn execute(&self, command: &str, timeout: Duration, retry: Retry) -> Result<(i32, String)> {
        let seconds = timeout.as_secs().max(1);
        let body = json!({"command": command, "cwd": "/", "timeout": seconds});
        // The request outlives the command's own timeout a little.
        let deadline = timeout + Duration::from_secs(10);
        let response = self
            .send("run a command", retry, &[], || {
                self.request(Method::POST, "/process/execute", Some(deadline)).json(&body)
            })
            .await?;
        let bytes = response.bytes().await.map_err(|error| WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: format!("run a command: reading the answer: {error}"),
        })?;
        if bytes.len() > MAX_EXECUTE_ANSWER {
            return Err(WorkspaceError::Backend {
                backend: BACKEND_NAME,
                message: "a command answered too much".into(),
            });
        }
        let answer: ExecuteAnswer = serde_json::from_slice(&bytes).map_err(|error| WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("run a command: unexpected answer: {error}"),
        })?;
        Ok((answer.exit_code.unwrap_or(-1), answer.result))
    }

    /// The sandbox user's home directory.
    pub async fn user_home_dir(&self) -> Result<String> {
        #[derive(Deserialize)]
        struct Dir {
            dir: String,
        }
        let what = "ask for the home directory";
        let response =
            self.send(what, Retry::Idempotent, &[], || self.request(Method::GET, "/user-home-dir", None)).await?;
        let dir: Dir = response.json().await.map_err(|error| WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("{what}: unexpected answer: {error}"),
        })?;
        Ok(dir.dir)
    }

    pub async fn create_session(&self, session_id: &str) -> Result<()> {
        let body = json!({"sessionId": session_id});
        self.send("create a session", Retry::Refused, &[], || {
            self.request(Method::POST, "/process/session", None).json(&body)
        })
        .await?;
        Ok(())
    }

    pub async fn delete_session(&self, session_id: &str) -> Result<()> {
        let path = format!("/process/session/{}", encode(session_id));
        self.send("delete a session", Retry::Idempotent, &[StatusCode::NOT_FOUND], || {
            self.request(Method::DELETE, &path, None)
        })
        .await?;
        Ok(())
    }

    /// Starts `command` asynchronously in a session: its command id.
    pub async fn session_exec(&self, session_id: &str, command: &str) -> Result<String> {
        #[derive(Deserialize)]
        struct Started {
            #[serde(rename = "cmdId")]
            cmd_id: String,
        }
        let what = "start a process";
        let path = format!("/process/session/{}/exec", encode(session_id));
        let body = json!({"command": command, "runAsync": true});
        let response =
            self.send(what, Retry::Refused, &[], || self.request(Method::POST, &path, None).json(&body)).await?;
        let started: Started = response.json().await.map_err(|error| WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("{what}: unexpected answer: {error}"),
        })?;
        Ok(started.cmd_id)
    }

    /// A session command's exit code, `None` while it runs.
    pub async fn command_exit(&self, session_id: &str, command_id: &str) -> Result<Option<i32>> {
        #[derive(Deserialize)]
        struct Command {
            #[serde(rename = "exitCode", default)]
            exit_code: Option<i32>,
        }
        let what = "ask for a process";
        let path = format!("/process/session/{}/command/{}", encode(session_id), encode(command_id));
        let response = self.send(what, Retry::Idempotent, &[], || self.request(Method::GET, &path, None)).await?;
        let command: Command = response.json().await.map_err(|error| WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("{what}: unexpected answer: {error}"),
        })?;
        Ok(command.exit_code)
    }

    /// Writes `data` to a session command's stdin (text: the wrapper's base64 lines).
    pub async fn send_input(&self, session_id: &str, command_id: &str, data: &str) -> Result<()> {
        let path = format!("/process/session/{}/command/{}/input", encode(session_id), encode(command_id));
        let body = json!({"data": data});
        self.send("write to a process's stdin", Retry::Refused, &[], || {
            self.request(Method::POST, &path, None).json(&body)
        })
        .await?;
        Ok(())
    }

    /// Uploads `body` (a multipart body from `multipart::upload_body`) — never retried, a
    /// stream cannot be replayed.
    pub async fn bulk_upload(
        &self,
        content_type: &str,
        body: Body,
        timeout: Duration,
    ) -> std::result::Result<(), Failure> {
        let body = std::sync::Mutex::new(Some(body));
        http::send(
            || {
                let request = self
                    .request(Method::POST, "/files/bulk-upload", Some(timeout))
                    .header(reqwest::header::CONTENT_TYPE, content_type);
                match body.lock().unwrap_or_else(|poison| poison.into_inner()).take() {
                    Some(body) => request.body(body),
                    None => request,
                }
            },
            Retry::Never,
            self.retry_deadline,
            &[],
        )
        .await
        .map(|_| ())
    }

    /// Asks for one file as a multipart answer (parsed by `multipart::Download`).
    pub async fn bulk_download(&self, path: &str) -> Result<Response> {
        let body = json!({"paths": [path]});
        self.send("read a file", Retry::Idempotent, &[], || {
            self.request(Method::POST, "/files/bulk-download", Some(Duration::from_secs(3600))).json(&body)
        })
        .await
    }

    /// `GET /files/info` of an absolute path (for tests and diagnostics).
    pub async fn file_info(&self, path: &str) -> Result<Option<serde_json::Value>> {
        let request_path = format!("/files/info?{}", query(&[("path", path)]));
        let response = self
            .send("stat a file", Retry::Idempotent, &[StatusCode::NOT_FOUND], || {
                self.request(Method::GET, &request_path, None)
            })
            .await?;
        if response.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        response.json().await.map(Some).map_err(|error| WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("stat a file: unexpected answer: {error}"),
        })
    }
}
