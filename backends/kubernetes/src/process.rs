//! Workspace processes: one `pods/exec` per process, wrapped by `spawn.sh` / `secret.sh` +
//! `run.sh` (see `scripts/`). The websocket carries raw bytes, so stdout and stderr arrive
//! as they are, and stdin is streamed (v5's close frame ends it), which MCP stdio servers
//! need. The wrapper's first stderr line is a handshake (`berth-NONCE ok` / `berth-NONCE
//! fail KIND`), so a program that cannot start is `SpawnFailed` before any output.
//!
//! Killing: a Pod exec's process outlives its stream, so `kill()` runs `kill.sh` in the same
//! container, which sweeps the program's session and every process carrying the exec's
//! `BERTH_EXEC_ID`; dropping a `Spawned` without waiting does the same in the background.

use std::io::Cursor;

use async_trait::async_trait;
use kube::api::AttachedProcess;
use tokio::io::{AsyncRead, AsyncReadExt};

use berth_workspace::backend::{BoxedReader, BoxedWriter, ExitInfo, ProcessControl, Spawned};
use berth_workspace::error::{Result, WorkspaceError};

use crate::config::BACKEND_NAME;
use crate::remote::{ExecError, ExecResult, Target, exit_of};
use crate::scripts::Scripts;

/// Longest handshake line read before it is given up on.
const HANDSHAKE_MAX: usize = 4096;
const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A fresh random nonce of 32 hex digits.
pub(crate) fn nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

/// What a wrapper refused, as the caller's error.
pub(crate) fn refusal(kind: &str, program: &str, cwd: &str) -> WorkspaceError {
    let path = cwd.to_owned();
    match kind {
        "noprogram" => WorkspaceError::SpawnFailed { program: program.to_owned(), reason: "not found".into() },
        "notfound" => WorkspaceError::NotFound { path },
        "notdir" => WorkspaceError::NotADirectory { path },
        "escape" => WorkspaceError::PathEscapesRoot { path },
        "env" => WorkspaceError::InvalidArgument("an environment entry was refused by the shell".into()),
        other => WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("the process wrapper failed ({other}) for {program:?}"),
        },
    }
}

/// One process to start.
pub(crate) struct Launch {
    pub nonce: String,
    pub argv: Vec<String>,
    pub program: String,
    pub cwd: String,
    /// Whether it runs in the secret holder's container (its kill sweep runs there too).
    pub holder: bool,
}

/// Reads the handshake line; returns what came after it on stderr.
async fn handshake<R: AsyncRead + Unpin>(stderr: &mut R, nonce: &str) -> Result<std::result::Result<Vec<u8>, String>> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 512];
    let read = async {
        loop {
            if let Some(end) = buffer.iter().position(|byte| *byte == b'\n') {
                return Some(end);
            }
            if buffer.len() > HANDSHAKE_MAX {
                return None;
            }
            match stderr.read(&mut chunk).await {
                Ok(0) | Err(_) => return None,
                Ok(count) => buffer.extend_from_slice(&chunk[..count]),
            }
        }
    };
    let end = tokio::time::timeout(HANDSHAKE_TIMEOUT, read).await.ok().flatten();
    let Some(end) = end else {
        return Err(WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: "the process wrapper did not report (is /bin/sh in the image?)".into(),
        });
    };
    let line = String::from_utf8_lossy(&buffer[..end]).into_owned();
    let rest = buffer[end + 1..].to_vec();
    let prefix = format!("berth-{nonce} ");
    match line.strip_prefix(&prefix) {
        Some("ok") => Ok(Ok(rest)),
        Some(other) => Ok(Err(other.strip_prefix("fail ").unwrap_or(other).trim().to_owned())),
        None => Err(WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("the process wrapper said {line:?}"),
        }),
    }
}

/// Starts a process (see the module docs).
pub(crate) async fn spawn(
    target: &Target,
    kill_target: Target,
    scripts: Scripts,
    launch: Launch,
) -> ExecResult<Spawned> {
    let mut attached = target.attach(launch.argv, true).await?;
    let (Some(stdin), Some(stdout), Some(mut stderr)) = (attached.stdin(), attached.stdout(), attached.stderr()) else {
        return Err(ExecError::Other(WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: "the exec stream has no stdio".into(),
        }));
    };
    let status = attached.take_status();
    let mut control = KubeControl {
        attached: Some(attached),
        status: status.map(|future| Box::pin(future) as StatusFuture),
        exit: None,
        kill: Some(Kill { target: kill_target, scripts, nonce: launch.nonce.clone(), holder: launch.holder }),
    };
    match handshake(&mut stderr, &launch.nonce).await? {
        Ok(rest) => {
            let stderr: BoxedReader = Box::pin(Cursor::new(rest).chain(stderr));
            Ok(Spawned {
                stdin: Box::pin(ClosingWriter(Some(stdin))) as BoxedWriter,
                stdout: Box::pin(stdout) as BoxedReader,
                stderr,
                control: Box::new(control),
            })
        }
        Err(kind) => {
            // The wrapper exited: nothing to kill.
            control.kill = None;
            Err(ExecError::Other(refusal(&kind, &launch.program, &launch.cwd)))
        }
    }
}

type StatusFuture = std::pin::Pin<
    Box<dyn std::future::Future<Output = Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Status>> + Send>,
>;

struct Kill {
    target: Target,
    scripts: Scripts,
    nonce: String,
    holder: bool,
}

impl Kill {
    async fn run(&self) -> Result<()> {
        match self.target.run(self.scripts.kill(&self.nonce, self.holder), None).await {
            Ok(collected) if collected.code() == Some(0) => Ok(()),
            Ok(collected) => Err(WorkspaceError::Backend {
                backend: BACKEND_NAME,
                message: format!("the kill sweep failed: {}", collected.stderr.trim()),
            }),
            // A Pod that is gone took its processes along.
            Err(ExecError::PodGone) => Ok(()),
            Err(ExecError::Other(error)) => Err(error),
        }
    }
}

struct KubeControl {
    /// Kept alive: dropping it aborts the websocket task.
    attached: Option<AttachedProcess>,
    status: Option<StatusFuture>,
    exit: Option<ExitInfo>,
    /// `None` once the process is known to have ended.
    kill: Option<Kill>,
}

#[async_trait]
impl ProcessControl for KubeControl {
    async fn wait(&mut self) -> Result<ExitInfo> {
        if let Some(exit) = self.exit {
            return Ok(exit);
        }
        // Cancellation-safe: the status future stays in `self` until it resolved (the exec
        // engine polls `wait` in a select).
        let status = match self.status.as_mut() {
            Some(future) => future.await,
            None => None,
        };
        self.status = None;
        let attached = self.attached.take();
        // Why the stream ended without a status, for the error below.
        let broke = match (&status, attached) {
            (None, Some(attached)) => attached.join().await.err().map(|error| error.to_string()),
            _ => None,
        };
        match exit_of(status.as_ref()) {
            Some(exit) => {
                self.exit = Some(exit);
                self.kill = None;
                Ok(exit)
            }
            None => Err(WorkspaceError::BackendUnavailable {
                backend: BACKEND_NAME,
                reason: match status {
                    Some(status) => format!("the exec failed: {}", status.message.unwrap_or_default()),
                    None => format!(
                        "the exec stream broke before the process ended ({})",
                        broke.unwrap_or_else(|| "no error".into())
                    ),
                },
            }),
        }
    }

    async fn kill(&mut self) -> Result<()> {
        if let Some(kill) = &self.kill {
            kill.run().await?;
        }
        Ok(())
    }
}

impl Drop for KubeControl {
    fn drop(&mut self) {
        if let Some(kill) = self.kill.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                if let Err(error) = kill.run().await {
                    tracing::warn!(%error, "could not kill a dropped process");
                }
            });
        }
    }
}

/// The exec's stdin; dropped without `shutdown`, it still ends the process's input (the
/// half of kube's pipe only reports EOF when shut down).
struct ClosingWriter<W: tokio::io::AsyncWrite + Unpin + Send + 'static>(Option<W>);

impl<W: tokio::io::AsyncWrite + Unpin + Send + 'static> tokio::io::AsyncWrite for ClosingWriter<W> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
        data: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.0.as_mut() {
            Some(writer) => std::pin::Pin::new(writer).poll_write(context, data),
            None => std::task::Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into())),
        }
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.0.as_mut() {
            Some(writer) => std::pin::Pin::new(writer).poll_flush(context),
            None => std::task::Poll::Ready(Ok(())),
        }
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        context: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let result = match self.0.as_mut() {
            Some(writer) => std::pin::Pin::new(writer).poll_shutdown(context),
            None => return std::task::Poll::Ready(Ok(())),
        };
        if result.is_ready() {
            self.0 = None;
        }
        result
    }
}

impl<W: tokio::io::AsyncWrite + Unpin + Send + 'static> Drop for ClosingWriter<W> {
    fn drop(&mut self) {
        if let Some(mut writer) = self.0.take()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                use tokio::io::AsyncWriteExt;
                let _ = writer.shutdown().await;
            });
        }
    }
}
