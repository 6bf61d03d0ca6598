//! Commands in a Pod's container through `pods/exec` (kube-rs over the websocket channel
//! protocol, v5 — whose close frame ends stdin — or v4), and how their ends map to Berth's
//! results.
//!
//! Exit status: the kubelet reports the process's exit code in the status channel
//! (`Success`, or `NonZeroExitCode` with an `ExitCode` cause); a signal `n` comes back as
//! `128 + n` and is read as that signal, as on the Docker backend. A Pod that is gone (the
//! upgrade answers 404) is [`ExecError::PodGone`]: the caller decides whether that means
//! "released" or "fenced" (a newer placement deleted it).

use bytes::Bytes;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::Api;
use kube::api::{AttachParams, AttachedProcess};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use berth_workspace::backend::ExitInfo;
use berth_workspace::error::WorkspaceError;

use crate::api::map_error;
use crate::config::BACKEND_NAME;

/// Bytes buffered per stream between kube's websocket task and a reader.
const STREAM_BUFFER: usize = 64 * 1024;

/// Where commands run: one container of one Pod.
#[derive(Clone)]
pub(crate) struct Target {
    pub pods: Api<Pod>,
    pub pod: String,
    pub container: String,
    /// Names the credential in auth errors.
    pub credential: String,
}

pub(crate) enum ExecError {
    /// The Pod does not exist (any more).
    PodGone,
    Other(WorkspaceError),
}

impl From<WorkspaceError> for ExecError {
    fn from(error: WorkspaceError) -> Self {
        Self::Other(error)
    }
}

pub(crate) type ExecResult<T> = std::result::Result<T, ExecError>;

/// A finished command.
pub(crate) struct Collected {
    pub exit: ExitInfo,
    pub stdout: Vec<u8>,
    pub stderr: String,
}

impl Collected {
    pub fn code(&self) -> Option<i32> {
        self.exit.code
    }
}

impl Target {
    pub async fn attach(&self, argv: Vec<String>, stdin: bool) -> ExecResult<AttachedProcess> {
        let params = AttachParams::default()
            .container(self.container.clone())
            .stdin(stdin)
            .stdout(true)
            .stderr(true)
            .max_stdin_buf_size(STREAM_BUFFER)
            .max_stdout_buf_size(STREAM_BUFFER)
            .max_stderr_buf_size(STREAM_BUFFER);
        match self.pods.exec(&self.pod, argv, &params).await {
            Ok(attached) => Ok(attached),
            Err(kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(status)))
                if status == http::StatusCode::NOT_FOUND =>
            {
                Err(ExecError::PodGone)
            }
            Err(kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(status)))
                if status == http::StatusCode::UNAUTHORIZED || status == http::StatusCode::FORBIDDEN =>
            {
                Err(ExecError::Other(WorkspaceError::ProviderAuth {
                    provider: BACKEND_NAME,
                    credential: self.credential.clone(),
                    message: format!("pods/exec answered {status}"),
                }))
            }
            Err(kube::Error::UpgradeConnection(kube::client::UpgradeConnectionError::ProtocolSwitch(status)))
                if status == http::StatusCode::BAD_REQUEST =>
            {
                // The Pod exists but its container is not running (starting, or ending).
                Err(ExecError::Other(WorkspaceError::BackendUnavailable {
                    backend: BACKEND_NAME,
                    reason: format!("pod {} is not running", self.pod),
                }))
            }
            Err(error) => Err(ExecError::Other(map_error(error, "exec into the pod", &self.credential))),
        }
    }

    /// Runs a command to completion, feeding `stdin` (none: stdin closed at once).
    pub async fn run(&self, argv: Vec<String>, stdin: Option<Bytes>) -> ExecResult<Collected> {
        let mut attached = self.attach(argv, stdin.is_some()).await?;
        let status = attached.take_status();
        let mut stdout_pipe = attached.stdout();
        let mut stderr_pipe = attached.stderr();
        // The feed runs apart: a command that exits without reading all of it ends the
        // stream, and a write into the finished stream would wait forever.
        let feed = match (stdin, attached.stdin()) {
            (Some(data), Some(mut writer)) => Some(tokio::spawn(async move {
                let _ = writer.write_all(&data).await;
                let _ = writer.shutdown().await;
            })),
            _ => None,
        };
        let read_out = async {
            let mut out = Vec::new();
            if let Some(pipe) = stdout_pipe.as_mut() {
                let _ = pipe.read_to_end(&mut out).await;
            }
            out
        };
        let read_err = async {
            let mut err = Vec::new();
            if let Some(pipe) = stderr_pipe.as_mut() {
                let _ = pipe.read_to_end(&mut err).await;
            }
            err
        };
        let (stdout, stderr) = tokio::join!(read_out, read_err);
        if let Some(feed) = feed {
            feed.abort();
        }
        let status = match status {
            Some(status) => status.await,
            None => None,
        };
        let exit = exit_of(status.as_ref()).ok_or_else(|| {
            ExecError::Other(WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: format!("the exec stream of pod {} ended without a status", self.pod),
            })
        })?;
        drop(attached);
        Ok(Collected { exit, stdout, stderr: String::from_utf8_lossy(&stderr).into_owned() })
    }
}

/// The exit a status reports (`None` for a status that is no exit: the exec failed).
pub(crate) fn exit_of(status: Option<&Status>) -> Option<ExitInfo> {
    let status = status?;
    match status.status.as_deref() {
        Some("Success") => Some(ExitInfo { code: Some(0), signal: None }),
        Some("Failure") if status.reason.as_deref() == Some("NonZeroExitCode") => {
            let code: i32 = status
                .details
                .as_ref()?
                .causes
                .as_ref()?
                .iter()
                .find(|cause| cause.reason.as_deref() == Some("ExitCode"))?
                .message
                .as_deref()?
                .parse()
                .ok()?;
            if (129..=128 + 64).contains(&code) {
                Some(ExitInfo { code: None, signal: Some(code - 128) })
            } else {
                Some(ExitInfo { code: Some(code), signal: None })
            }
        }
        _ => None,
    }
}
