//! The shell scripts run inside workspace containers (busybox `sh` or any POSIX shell).
//!
//! Each is passed as `sh -c SCRIPT NAME ARGS...`: arguments are positional parameters, never
//! parsed by the shell, so client paths and argv need no quoting. `resolve.sh` is the one
//! confinement routine; the others are prefixed with it and with `W=<mount point>`.

const RESOLVE: &str = include_str!("scripts/resolve.sh");
/// Kills a spawned process's session and everything carrying its marker.
pub(crate) const KILL: &str = include_str!("scripts/kill.sh");

/// The scripts of one mount point, built once per container.
#[derive(Debug)]
pub(crate) struct Scripts {
    pub mount_point: String,
    /// Wraps every spawned process: resolves the cwd, finds argv[0], reports its pid.
    pub spawn: String,
    /// Wraps a secret-holding process: private HOME and cwd, a pinned copy or a system
    /// program, then like `spawn`.
    pub secret: String,
    /// Streams a regular file on stdout.
    pub read: String,
    /// Writes stdin (content + trailer) to a temp file and renames it over the target.
    pub write: String,
}

impl Scripts {
    /// `mount_point` must have passed [`valid_mount_point`] (it is spliced into the scripts).
    pub fn new(mount_point: &str) -> Self {
        let prefix = format!("W='{mount_point}'\n{RESOLVE}");
        Self {
            mount_point: mount_point.to_owned(),
            spawn: format!("{prefix}{}", include_str!("scripts/spawn.sh")),
            secret: format!("{prefix}{}", include_str!("scripts/secret.sh")),
            read: format!("{prefix}{}", include_str!("scripts/read.sh")),
            write: format!("{prefix}{}", include_str!("scripts/write.sh")),
        }
    }
}

/// An absolute, normalised path of `[A-Za-z0-9._-]` components, other than `/`: safe to
/// splice into a script between single quotes and to use as a mount target.
pub(crate) fn valid_mount_point(path: &str) -> bool {
    let Some(relative) = path.strip_prefix('/') else {
        return false;
    };
    !relative.is_empty()
        && relative.split('/').all(|component| {
            !component.is_empty()
                && component != "."
                && component != ".."
                && component.bytes().all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-'))
        })
}

/// Exit status of a script that failed with a classified error; its last stderr line is
/// `berth-error KIND`.
pub(crate) const FAILED_EXIT_CODE: i64 = 86;
/// What the kill script prints when its last sweep found nothing left.
pub(crate) const KILLED_MARKER: &str = "berth-killed";
/// Length of the write trailer: `berth-end-` + 32 hex nonce + `-` + 20 digits.
pub(crate) const TRAILER_BYTES: usize = 63;
/// The shell every script runs under.
pub(crate) const SHELL: &str = "/bin/sh";

/// The trailer that lets `write.sh` tell a complete upload from an interrupted one.
pub(crate) fn write_trailer(nonce: &str, size: u64) -> String {
    let trailer = format!("berth-end-{nonce}-{size:020}");
    debug_assert_eq!(trailer.len(), TRAILER_BYTES, "write.sh expects a fixed-length trailer");
    trailer
}

/// A fresh random nonce of 32 hex characters.
pub(crate) fn nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points() {
        for good in ["/workspace", "/tmp/ws", "/a.b/c_d-e"] {
            assert!(valid_mount_point(good), "{good}");
        }
        for bad in ["", "/", "workspace", "/a/../b", "/a//b", "/a/", "/it's", "/a b", "/./a"] {
            assert!(!valid_mount_point(bad), "{bad}");
        }
        assert!(Scripts::new("/tmp/ws").spawn.starts_with("W='/tmp/ws'\n"));
    }

    #[test]
    fn trailer_has_the_length_the_script_expects() {
        assert_eq!(write_trailer(&nonce(), 0).len(), TRAILER_BYTES);
        assert_eq!(write_trailer(&nonce(), u64::MAX).len(), TRAILER_BYTES);
    }
}
