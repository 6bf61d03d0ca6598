//! The Docker exec API over one workspace container: what every exec needs to know about
//! the container, starting an attached exec, its exit code, and running our own short
//! helper scripts to completion. `process.rs` (argv under `spawn.sh`), `kill.rs` and
//! `files.rs` build on it.

use std::pin::Pin;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};

use berth_workspace::backend::BoxedWriter;
use berth_workspace::error::{Result, WorkspaceError};

use super::errors::docker_error;
use super::scripts;

/// Most stdout/stderr kept by [`run_plain`].
const PLAIN_OUTPUT_MAX_BYTES: usize = 1024 * 1024;

/// What every exec needs to know about its container.
#[derive(Debug)]
pub(crate) struct ContainerHandle {
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
    let (exec_id, mut output, _input) = start_exec(container, user, cmd, Vec::new(), false).await?;
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
    let exit_code = exit_code_after_stream(&container.docker, &exec_id).await?;
    Ok(PlainOutput { exit_code, stdout: stdout.freeze(), stderr: stderr.freeze() })
}

pub(crate) type OutputStream =
    Pin<Box<dyn Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>> + Send>>;

/// Starts an attached exec of `cmd` as `user` (`uid:gid`: the workspace user, or the
/// secret-holder user of `process.rs`).
pub(crate) async fn start_exec(
    container: &ContainerHandle,
    user: &str,
    cmd: Vec<String>,
    env: Vec<String>,
    attach_stdin: bool,
) -> Result<(String, OutputStream, BoxedWriter)> {
    let options = CreateExecOptions {
        attach_stdin: Some(attach_stdin),
        attach_stdout: Some(true),
        attach_stderr: Some(true),
        tty: Some(false),
        env: Some(env),
        cmd: Some(cmd),
        user: Some(user.to_owned()),
        // The mount point itself: it always exists, so the daemon never creates a
        // root-owned working directory in the bind mount; spawn.sh does the real cd.
        working_dir: Some(container.scripts.mount_point.clone()),
        ..Default::default()
    };
    let created = container
        .docker
        .create_exec(&container.container_id, options)
        .await
        .map_err(|error| docker_error("creating an exec", error))?;
    let started = container
        .docker
        .start_exec(&created.id, Some(StartExecOptions { detach: false, tty: false, output_capacity: Some(64 * 1024) }))
        .await
        .map_err(|error| docker_error("starting an exec", error))?;
    match started {
        StartExecResults::Attached { output, input } => Ok((created.id, output, input)),
        StartExecResults::Detached => Err(WorkspaceError::Backend {
            backend: super::config::BACKEND_NAME,
            message: "the daemon started an attached exec detached".into(),
        }),
    }
}

/// Waits until the daemon has recorded the exit of an exec whose stream has ended. The
/// daemon sets the exit code before it closes the stream, so this is normally one call;
/// the backoff only covers a stream that broke while the process still runs.
pub(crate) async fn exit_code_after_stream(docker: &Docker, exec_id: &str) -> Result<i64> {
    let mut delay = Duration::from_millis(10);
    loop {
        let inspected =
            docker.inspect_exec(exec_id).await.map_err(|error| docker_error("inspecting an exec", error))?;
        if inspected.running != Some(true)
            && let Some(code) = inspected.exit_code
        {
            return Ok(code);
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(1));
    }
}
