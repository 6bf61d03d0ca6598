//! One workspace container: what every exec needs to know about it, starting an exec
//! (through the container's supervisor, else the Docker exec API of `exec_api.rs`), its
//! exit code, and running our own short helper scripts to completion. `process.rs` (argv under `spawn.sh`), `kill.rs` and
//! `files.rs` build on it.

use std::sync::Arc;

use bollard::Docker;
use bollard::container::LogOutput;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;

use berth_supervisor::wire::Request;
use berth_workspace::backend::{BoxedReader, BoxedWriter, ExitInfo, ProcessControl, Spawned};
use berth_workspace::error::Result;

use super::errors::docker_error;
use super::exec_api::{OutputStream, Target, exit_code_after_stream, start_docker_exec};
use super::scripts;
use super::supervised::DockerSupervisor;

/// Most stdout/stderr kept by [`run_plain`].
const PLAIN_OUTPUT_MAX_BYTES: usize = 1024 * 1024;

/// What every exec needs to know about its container.
#[derive(Debug)]
pub(crate) struct ContainerHandle {
    /// The container's supervisor (`None`: the container was made without its mounts, or
    /// the supervisor is off), which runs the workspace user's execs.
    pub supervisor: Option<Arc<DockerSupervisor>>,
    pub docker: Docker,
    pub container_id: String,
    pub container_name: String,
    /// `uid:gid` of workspace processes.
    pub user: String,
    /// The scripts, built for this container's mount point.
    pub scripts: scripts::Scripts,
    /// The container's pids limit (`None`: unlimited), restored after a kill lifted it.
    pub pids_limit: Option<i64>,
}

impl ContainerHandle {
    pub fn target(&self) -> Target<'_> {
        Target {
            docker: &self.docker,
            container_id: &self.container_id,
            container_name: &self.container_name,
            working_dir: &self.scripts.mount_point,
        }
    }
}

/// Output of a command run to completion by [`run_plain`].
pub(crate) struct PlainOutput {
    pub exit_code: i64,
    pub stdout: Bytes,
    pub stderr: Bytes,
}

/// Runs `cmd` (no wrapper, no stdin) to completion as the workspace user and returns its
/// capped output. For our own short helper scripts only: it cannot be killed.
pub(crate) async fn run_plain(container: &ContainerHandle, cmd: Vec<String>) -> Result<PlainOutput> {
    run_plain_as(container, &container.user, cmd).await
}

/// [`run_plain`] as `user` (`uid:gid`).
pub(crate) async fn run_plain_as(container: &ContainerHandle, user: &str, cmd: Vec<String>) -> Result<PlainOutput> {
    let (mut exec, mut output, _input) = start_exec(container, user, cmd, Vec::new(), false).await?;
    let mut stdout = BytesMut::new();
    let mut stderr = BytesMut::new();
    while let Some(frame) = output.next().await {
        let frame = frame.map_err(|error| docker_error("reading exec output", error))?;
        let (buffer, message) = match frame {
            LogOutput::StdErr { message } => (&mut stderr, message),
            LogOutput::StdOut { message } | LogOutput::Console { message } => (&mut stdout, message),
            LogOutput::StdIn { .. } => continue,
        };
        let room = PLAIN_OUTPUT_MAX_BYTES.saturating_sub(buffer.len());
        buffer.extend_from_slice(&message[..message.len().min(room)]);
    }
    let exit_code = exec.exit_code(&container.docker).await?;
    Ok(PlainOutput { exit_code, stdout: stdout.freeze(), stderr: stderr.freeze() })
}

/// A started exec: a Docker exec (its id) or a command of the container's supervisor.
pub(crate) enum Exec {
    Docker(String),
    Supervised(Box<dyn ProcessControl>),
}

impl Exec {
    /// The exit code once the output has ended, as Docker reports it (a signal n as
    /// 128 + n).
    pub async fn exit_code(&mut self, docker: &Docker) -> Result<i64> {
        match self {
            Exec::Docker(id) => exit_code_after_stream(docker, id).await,
            Exec::Supervised(control) => {
                let ExitInfo { code, signal } = control.wait().await?;
                Ok(code.map(i64::from).or(signal.map(|signal| 128 + i64::from(signal))).unwrap_or(-1))
            }
        }
    }

    /// Kills a supervised command's tree; `false` for a Docker exec (which has no kill).
    pub async fn kill_supervised(&mut self) -> Result<bool> {
        match self {
            Exec::Docker(_) => Ok(false),
            Exec::Supervised(control) => control.kill().await.map(|()| true),
        }
    }
}

/// Starts `cmd` as `user` (`uid:gid`: the workspace user, or the secret-holder user of
/// `process.rs`) with its output attached: through the container's supervisor when it
/// has one and `user` is the workspace user, else as a Docker exec.
pub(crate) async fn start_exec(
    container: &ContainerHandle,
    user: &str,
    cmd: Vec<String>,
    env: Vec<String>,
    attach_stdin: bool,
) -> Result<(Exec, OutputStream, BoxedWriter)> {
    if let Some(supervisor) = container.supervisor.as_ref().filter(|_| user == container.user) {
        let request = Request {
            argv: cmd.iter().map(|arg| arg.clone().into_bytes()).collect(),
            env: env.iter().map(|pair| pair.clone().into_bytes()).collect(),
            cwd: container.scripts.mount_point.clone().into_bytes(),
            beneath: Vec::new(),
            search_path: Vec::new(),
            rlimits: Vec::new(),
            private_tmp_bytes: None,
        };
        if let Some(Spawned { stdin, stdout, stderr, control }) =
            supervisor.spawn(container.target(), &container.user, &request).await?
        {
            return Ok((Exec::Supervised(control), multiplexed(stdout, stderr), stdin));
        }
    }
    let (id, output, input) = start_docker_exec(container.target(), user, cmd, env, attach_stdin).await?;
    Ok((Exec::Docker(id), output, input))
}

/// A supervised command's two pipes as one stream of frames, like a Docker exec's.
fn multiplexed(stdout: BoxedReader, stderr: BoxedReader) -> OutputStream {
    use tokio_util::io::ReaderStream;
    let frames = |reader: BoxedReader, frame: fn(Bytes) -> LogOutput| {
        ReaderStream::with_capacity(reader, 64 * 1024)
            .map(move |chunk| chunk.map(frame).map_err(|error| bollard::errors::Error::IOError { err: error }))
    };
    Box::pin(futures::stream::select(
        frames(stdout, |message| LogOutput::StdOut { message }),
        frames(stderr, |message| LogOutput::StdErr { message }),
    ))
}
