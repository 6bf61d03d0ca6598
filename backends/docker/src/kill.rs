//! Killing the process tree of one exec (see `process.rs` for the design).
//!
//! The sweep itself (`kill.sh`) needs no fork, but starting it does: runc's init joins the
//! container's cgroup and then clones, which fails while a fork bomb holds every pid of the
//! limit. When the killer cannot start, the pids limit is lifted by [`PIDS_HEADROOM`] for
//! the duration of the kill: the bomb may grow into part of it, but the killer gets to
//! start and its sweep outruns the bomb (a killed process forks no more). The limit is
//! then set back to the container's configured value — a fixed value rather than "what
//! it was", so concurrent kills cannot leave the lifted limit behind.

use std::time::Duration;

use bollard::models::ContainerUpdateBody;

use berth_workspace::error::{Result, WorkspaceError};

use super::config::BACKEND_NAME;
use super::container::{ContainerHandle, run_plain_as};
use super::errors::docker_error;
use super::scripts;

/// Deadline of one kill, attempts included.
const KILL_TIMEOUT: Duration = Duration::from_secs(30);
/// Pids added to an exhausted limit so that the killer can start.
const PIDS_HEADROOM: i64 = 64;
/// Attempts to start the killer with the lifted limit.
const LIFTED_ATTEMPTS: usize = 20;

/// What one run of `kill.sh` achieved.
enum Sweep {
    Done,
    /// The runtime could not start the killer (no pid free for runc's init).
    NotStarted(String),
    Failed(String),
}

/// SIGKILLs session `pid` and every process carrying `nonce` in the container, sweeping as
/// `user` (the exec's own user: only it may signal the exec's processes and read their
/// environment). Without a pid (the exec never reported one) only the marker is swept.
pub(crate) async fn kill_session(container: &ContainerHandle, user: &str, pid: Option<u32>, nonce: &str) -> Result<()> {
    // "-" matches no session id.
    let pid = pid.map_or_else(|| "-".to_owned(), |pid| pid.to_string());
    let pid = pid.as_str();
    tokio::time::timeout(KILL_TIMEOUT, kill_with_relief(container, user, pid, nonce)).await.map_err(|_| {
        WorkspaceError::Timeout { operation: "killing a docker exec", millis: KILL_TIMEOUT.as_millis() as u64 }
    })?
}

async fn kill_with_relief(container: &ContainerHandle, user: &str, pid: &str, nonce: &str) -> Result<()> {
    let diagnostic = match sweep(container, user, pid, nonce).await? {
        Sweep::Done => return Ok(()),
        Sweep::Failed(message) => return Err(kill_failed(container, pid, &message)),
        Sweep::NotStarted(message) => message,
    };
    let Some(limit) = container.pids_limit else {
        return Err(kill_failed(container, pid, &diagnostic));
    };
    tracing::warn!(container = %container.container_name, session = pid, "pids limit exhausted; lifting it to kill an exec");
    let mut outcome = Err(kill_failed(container, pid, &diagnostic));
    let mut delay = Duration::from_millis(20);
    for _ in 0..LIFTED_ATTEMPTS {
        // Set on every attempt: a concurrent kill may have restored the limit meanwhile.
        set_pids_limit(container, limit + PIDS_HEADROOM).await?;
        match sweep(container, user, pid, nonce).await {
            Ok(Sweep::Done) => {
                outcome = Ok(());
                break;
            }
            Ok(Sweep::NotStarted(message)) => {
                outcome = Err(kill_failed(container, pid, &message));
            }
            Ok(Sweep::Failed(message)) => {
                outcome = Err(kill_failed(container, pid, &message));
                break;
            }
            Err(error) => {
                outcome = Err(error);
                break;
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
    set_pids_limit(container, limit).await?;
    outcome
}

async fn sweep(container: &ContainerHandle, user: &str, pid: &str, nonce: &str) -> Result<Sweep> {
    let cmd = vec![
        scripts::SHELL.to_owned(),
        "-c".to_owned(),
        scripts::KILL.to_owned(),
        "berth-kill".to_owned(),
        pid.to_owned(),
        nonce.to_owned(),
    ];
    let output = run_plain_as(container, user, cmd).await?;
    let said = format!(
        "{} {}",
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    if output.exit_code == 0
        && String::from_utf8_lossy(&output.stdout).lines().any(|line| line == scripts::KILLED_MARKER)
    {
        return Ok(Sweep::Done);
    }
    // 126 with the runtime's message: the exec never ran (runc's init could not clone).
    if output.exit_code == 126 && said.contains("OCI runtime") {
        return Ok(Sweep::NotStarted(said));
    }
    Ok(Sweep::Failed(format!("exit status {}: {}", output.exit_code, said.trim())))
}

async fn set_pids_limit(container: &ContainerHandle, limit: i64) -> Result<()> {
    let update = ContainerUpdateBody { pids_limit: Some(limit), ..Default::default() };
    container
        .docker
        .update_container(&container.container_id, update)
        .await
        .map_err(|error| docker_error("updating the pids limit", error))
}

fn kill_failed(container: &ContainerHandle, pid: &str, message: &str) -> WorkspaceError {
    WorkspaceError::Backend {
        backend: BACKEND_NAME,
        message: format!("killing exec session {pid} in {} failed: {message}", container.container_name),
    }
}
