//! Docker API errors and script failures mapped to [`WorkspaceError`].

use bollard::errors::Error as DockerError;

use berth_workspace::error::WorkspaceError;

use super::config::BACKEND_NAME;

/// The HTTP status of a daemon response error.
pub(crate) fn status_code(error: &DockerError) -> Option<u16> {
    match error {
        DockerError::DockerResponseServerError { status_code, .. } => Some(*status_code),
        _ => None,
    }
}

pub(crate) fn is_not_found(error: &DockerError) -> bool {
    status_code(error) == Some(404)
}

/// Maps an error of a Docker API call; `operation` says what was being done.
pub(crate) fn docker_error(operation: &str, error: DockerError) -> WorkspaceError {
    match &error {
        DockerError::DockerResponseServerError { status_code, message } => {
            // 409 on exec or start: the container is stopped (released) or being removed.
            if *status_code == 409 && message.contains("is not running") {
                return WorkspaceError::BackendUnavailable {
                    backend: BACKEND_NAME,
                    reason: format!("{operation}: {message}"),
                };
            }
            WorkspaceError::Backend {
                backend: BACKEND_NAME,
                message: format!("{operation}: {message} (status {status_code})"),
            }
        }
        DockerError::IOError { .. }
        | DockerError::HyperResponseError { .. }
        | DockerError::HyperLegacyError { .. }
        | DockerError::SocketNotFoundError(_)
        | DockerError::RequestTimeoutError => WorkspaceError::BackendUnavailable {
            backend: BACKEND_NAME,
            reason: format!("{operation}: cannot reach the docker daemon: {error}"),
        },
        _ => WorkspaceError::Backend { backend: BACKEND_NAME, message: format!("{operation}: {error}") },
    }
}

/// Maps the failure of one of our scripts (`scripts.rs`) on `path`: the kinds of
/// `berth_fail` become typed errors, anything else keeps the script's stderr as context.
pub(crate) fn script_error(operation: &str, path: &str, exit_code: i64, stderr: &[u8]) -> WorkspaceError {
    let text = String::from_utf8_lossy(stderr);
    let kind = text.lines().rev().find_map(|line| line.strip_prefix("berth-error ")).map(str::trim);
    let path = path.to_owned();
    match (exit_code == super::scripts::FAILED_EXIT_CODE, kind) {
        (true, Some("notfound")) => WorkspaceError::NotFound { path },
        (true, Some("escape")) => WorkspaceError::PathEscapesRoot { path },
        (true, Some("isdir")) => WorkspaceError::IsADirectory { path },
        (true, Some("notdir")) => WorkspaceError::NotADirectory { path },
        (true, Some("notregular")) => WorkspaceError::InvalidArgument(format!("{path:?} is not a regular file")),
        _ => WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("{operation} {path:?} failed with exit status {exit_code}: {}", text.trim()),
        },
    }
}

/// Whether a script failure was an `aborted` write (the caller closed stdin early).
pub(crate) fn is_aborted(exit_code: i64, stderr: &[u8]) -> bool {
    exit_code == super::scripts::FAILED_EXIT_CODE
        && String::from_utf8_lossy(stderr).lines().any(|line| line.trim() == "berth-error aborted")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_script_failures() {
        assert!(matches!(
            script_error("read", "a", 86, b"berth-error escape\n"),
            WorkspaceError::PathEscapesRoot { .. }
        ));
        assert!(matches!(
            script_error("read", "a", 86, b"cat: x\nberth-error notfound\n"),
            WorkspaceError::NotFound { .. }
        ));
        // A user program cannot fake a classification: only exit code 86 of our scripts counts.
        assert!(matches!(script_error("read", "a", 1, b"berth-error notfound\n"), WorkspaceError::Backend { .. }));
        assert!(is_aborted(86, b"berth-error aborted\n"));
        assert!(!is_aborted(0, b""));
    }
}
