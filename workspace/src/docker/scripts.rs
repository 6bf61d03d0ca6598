//! The shell scripts run inside workspace containers (busybox `sh` or any POSIX shell).
//!
//! Each is passed as `sh -c SCRIPT NAME ARGS...`: arguments are positional parameters, never
//! parsed by the shell, so client paths and argv need no quoting. `resolve.sh` is the one
//! confinement routine; the others are prefixed with it.

/// Wraps every spawned process: resolves the cwd, finds argv[0], reports its pid.
pub(crate) const SPAWN: &str = concat!(
    include_str!("scripts/resolve.sh"),
    include_str!("scripts/spawn.sh")
);
/// Streams a regular file on stdout.
pub(crate) const READ: &str = concat!(
    include_str!("scripts/resolve.sh"),
    include_str!("scripts/read.sh")
);
/// Writes stdin (content + trailer) to a temp file and renames it over the target.
pub(crate) const WRITE: &str = concat!(
    include_str!("scripts/resolve.sh"),
    include_str!("scripts/write.sh")
);
/// Kills a spawned process's session and everything carrying its marker.
pub(crate) const KILL: &str = include_str!("scripts/kill.sh");

/// Exit status of a script that failed with a classified error; its last stderr line is
/// `berth-error KIND`.
pub(crate) const FAILED_EXIT_CODE: i64 = 86;
/// What the kill script prints when its last sweep found nothing left.
pub(crate) const KILLED_MARKER: &str = "berth-killed";
/// Length of the write trailer: `berth-end-` + 32 hex nonce + `-` + 20 digits.
pub(crate) const TRAILER_BYTES: usize = 63;
/// Mount point of the workspace's host directory inside the container.
pub(crate) const MOUNT_POINT: &str = "/workspace";
/// The shell every script runs under.
pub(crate) const SHELL: &str = "/bin/sh";

/// The trailer that lets `write.sh` tell a complete upload from an interrupted one.
pub(crate) fn write_trailer(nonce: &str, size: u64) -> String {
    let trailer = format!("berth-end-{nonce}-{size:020}");
    debug_assert_eq!(
        trailer.len(),
        TRAILER_BYTES,
        "write.sh expects a fixed-length trailer"
    );
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
    fn trailer_has_the_length_the_script_expects() {
        assert_eq!(write_trailer(&nonce(), 0).len(), TRAILER_BYTES);
        assert_eq!(write_trailer(&nonce(), u64::MAX).len(), TRAILER_BYTES);
    }
}
