//! One workspace's sandbox as a [`Backend`]: processes and files through execd (see
//! `process.rs` and `files.rs` for how and why).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use futures::stream::BoxStream;

use berth_workspace::backend::{
    Backend, ByteStream, Capabilities, ExecEvent, ExecOutput, ExecSpec, FileInfo, SpawnRole, SpawnSpec, Spawned,
    WriteOptions,
};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::exec;
use berth_workspace::path::RelPath;
use berth_workspace::posix;

use crate::config::BACKEND_NAME;
use crate::files::{self, Discard};
use crate::process::{self, Input, Launch, nonce};
use crate::sandbox::Sandbox;

/// Margin of the daemon's own timeout over an exec's (the exec engine kills first).
const DAEMON_TIMEOUT_MARGIN: Duration = Duration::from_secs(30);

/// A workspace's sandbox (cheap to clone).
#[derive(Clone)]
pub struct OpenSandboxBackend {
    pub(crate) sandbox: Arc<Sandbox>,
}

impl OpenSandboxBackend {
    /// The provider's id of the sandbox.
    pub fn sandbox_id(&self) -> &str {
        &self.sandbox.sandbox_id
    }

    /// `limit`: bytes per output stream worth sending (the exec's cap); `None` for a spawn.
    async fn launch(
        &self,
        spec: &SpawnSpec,
        input: Input,
        timeout: Option<Duration>,
        limit: Option<usize>,
    ) -> Result<Spawned> {
        spec.validate()?;
        let sandbox = &self.sandbox;
        let nonce = nonce();
        let program = spec.argv[0].clone();
        let cwd = spec.cwd.as_fs_str().to_owned();
        let word = process::input_word(&input).to_owned();
        let (command, user, env) = match spec.role {
            SpawnRole::Agent => {
                let mut env = sandbox.env.clone();
                env.entry("HOME".into()).or_insert_with(|| sandbox.workspace_dir.clone());
                env.extend(spec.env.clone());
                (sandbox.scripts.spawn(&nonce, spec.cwd.as_str(), &word, limit, &spec.argv), sandbox.agent_user, env)
            }
            SpawnRole::SecretHolder => {
                let pin = spec.program_sha256.map_or_else(|| "-".to_owned(), hex::encode);
                let command = sandbox.scripts.secret(&nonce, spec.cwd.as_str(), &word, limit, &pin, &spec.argv);
                (command, sandbox.secret_holder_user, spec.env.clone())
            }
        };
        let launch = Launch { nonce, command, user, env, timeout, input, program, cwd };
        process::start(&sandbox.execd, &sandbox.scripts, launch).await
    }

    /// The exec's stdin as a staged file (none when empty).
    async fn staged_input(&self, spec: &ExecSpec) -> Result<(Input, Option<String>)> {
        if spec.stdin.is_empty() {
            return Ok((Input::Null, None));
        }
        let staged = self.sandbox.stage_stdin(spec.stdin.clone()).await?;
        Ok((Input::File(staged.clone()), Some(staged)))
    }
}

#[async_trait]
impl Backend for OpenSandboxBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::FULL
    }

    async fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned> {
        self.launch(spec, Input::Fifo, None, None).await
    }

    async fn read_file(&self, path: &RelPath) -> Result<ByteStream> {
        files::read_file(&self.sandbox, path).await
    }

    async fn write_file(&self, path: &RelPath, data: ByteStream, options: WriteOptions) -> Result<u64> {
        files::write_file(&self.sandbox, path, data, options).await
    }

    async fn exec(&self, spec: &ExecSpec) -> Result<ExecOutput> {
        spec.validate()?;
        let (input, staged) = self.staged_input(spec).await?;
        let _staged = Discard { sandbox: self.sandbox.clone(), path: staged };
        let spawned = self
            .launch(&spec.spawn, input, Some(spec.timeout + DAEMON_TIMEOUT_MARGIN), Some(spec.max_output_bytes))
            .await?;
        let mut unary = spec.clone();
        unary.stdin = bytes::Bytes::new();
        exec::run_to_completion(spawned, &unary).await
    }

    async fn exec_stream(&self, spec: &ExecSpec) -> Result<BoxStream<'static, Result<ExecEvent>>> {
        spec.validate()?;
        let (input, staged) = self.staged_input(spec).await?;
        let staged = Discard { sandbox: self.sandbox.clone(), path: staged };
        let spawned = self
            .launch(&spec.spawn, input, Some(spec.timeout + DAEMON_TIMEOUT_MARGIN), Some(spec.max_output_bytes))
            .await?;
        let mut streamed = spec.clone();
        streamed.stdin = bytes::Bytes::new();
        let events = exec::stream_events(spawned, streamed);
        // The staged stdin lives as long as the stream.
        Ok(events
            .map(move |event| {
                let _ = &staged;
                event
            })
            .boxed())
    }

    async fn stat(&self, path: &RelPath) -> Result<FileInfo> {
        match files::stat(&self.sandbox, path).await? {
            Some(info) => Ok(info),
            None => posix::stat(self, path).await,
        }
    }

    async fn list_dir(&self, path: &RelPath) -> Result<Vec<FileInfo>> {
        match files::list_dir(&self.sandbox, path).await? {
            Some(entries) => Ok(entries),
            None => posix::list_dir(self, path).await,
        }
    }
}

impl std::fmt::Debug for OpenSandboxBackend {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.debug_struct("OpenSandboxBackend").field("sandbox_id", &self.sandbox.sandbox_id).finish()
    }
}

/// Refuses what cannot be kept apart on this backend.
pub(crate) fn check_users(agent: (u32, u32), holder: (u32, u32)) -> Result<()> {
    if agent.0 == 0 || agent.0 == holder.0 {
        return Err(WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: "workspace processes would run as root or as the secret holder".into(),
        });
    }
    Ok(())
}
