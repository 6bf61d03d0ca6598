//! The Docker exec API over one container: an attached exec and its exit code. What runs
//! in a container without its supervisor, and how the supervisor itself is started.

use std::pin::Pin;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use futures::Stream;

use berth_workspace::backend::BoxedWriter;
use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;
use super::errors::docker_error;

pub(crate) type OutputStream =
    Pin<Box<dyn Stream<Item = std::result::Result<LogOutput, bollard::errors::Error>> + Send>>;

/// The container an exec runs in.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Target<'a> {
    pub docker: &'a Docker,
    pub container_id: &'a str,
    /// For logs.
    pub container_name: &'a str,
    /// Where the exec starts: the workspace's mount point.
    pub working_dir: &'a str,
}

/// Starts an attached Docker exec of `cmd` as `user`.
pub(crate) async fn start_docker_exec(
    target: Target<'_>,
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
        working_dir: Some(target.working_dir.to_owned()),
        ..Default::default()
    };
    let created = target
        .docker
        .create_exec(target.container_id, options)
        .await
        .map_err(|error| docker_error("creating an exec", error))?;
    let started = target
        .docker
        .start_exec(&created.id, Some(StartExecOptions { detach: false, tty: false, output_capacity: Some(64 * 1024) }))
        .await
        .map_err(|error| docker_error("starting an exec", error))?;
    match started {
        StartExecResults::Attached { output, input } => Ok((created.id, output, input)),
        StartExecResults::Detached => Err(WorkspaceError::Backend {
            backend: BACKEND_NAME,
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
