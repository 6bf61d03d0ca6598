//! The shell scripts this backend runs in a sandbox, and the command lines that carry
//! them. The toolbox takes a command *line*, so each script and its arguments are quoted
//! here (POSIX single quotes, which every shell the daemon may pick reads the same); inside
//! the script they are positional parameters, never parsed again. `resolve.sh` is the one
//! confinement routine; the scripts that take client paths are prefixed with it and with
//! `W=<workspace root>` (a root that passed `config::valid_root`).

const RESOLVE: &str = include_str!("scripts/resolve.sh");
const FENCE: &str = include_str!("scripts/fence.sh");
/// `poll.sh`: a spawned process's state and new output.
pub const POLL: &str = include_str!("scripts/poll.sh");
/// `kill.sh`: the session and marker sweep.
pub const KILL: &str = include_str!("scripts/kill.sh");
/// `finish.sh`: publishes an uploaded temp file.
pub const FINISH: &str = include_str!("scripts/finish.sh");
/// `rollback.sh`: removes a failed write's temp file and directories.
pub const ROLLBACK: &str = include_str!("scripts/rollback.sh");
/// `generation.sh`: the adoption record.
pub const GENERATION: &str = include_str!("scripts/generation.sh");

/// The exit status of a file script that failed with a classified error; its output is
/// `berth-error KIND`.
pub const FAILED_EXIT_CODE: i32 = 86;

/// The scripts of one workspace root.
#[derive(Debug)]
pub struct Scripts {
    pub spawn: String,
    pub read: String,
    pub write: String,
}

impl Scripts {
    pub fn new(root: &str) -> Self {
        let prefix = format!("W='{root}'\n{RESOLVE}{FENCE}");
        Self {
            spawn: format!("{prefix}{}", include_str!("scripts/spawn.sh")),
            read: format!("{prefix}{}", include_str!("scripts/read.sh")),
            write: format!("{prefix}{}", include_str!("scripts/write.sh")),
        }
    }
}

/// One word in POSIX single quotes.
pub fn quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// The command line `/bin/sh -c SCRIPT NAME ARGS...`.
pub fn command_line(script: &str, name: &str, args: &[&str]) -> String {
    let mut words = vec![quote("/bin/sh"), quote("-c"), quote(script), quote(name)];
    words.extend(args.iter().map(|arg| quote(arg)));
    words.join(" ")
}

/// A fresh random nonce of 32 hex characters.
pub fn nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_a_shell() {
        let tricky = "it's $HOME `x` \"y\"\n\\z";
        let line = command_line("printf '%s' \"$1\"", "t", &[tricky]);
        let output = std::process::Command::new("/bin/sh").arg("-c").arg(&line).output().unwrap();
        assert_eq!(String::from_utf8_lossy(&output.stdout), tricky);
    }
}
