//! The shell scripts Berth runs inside sandboxes through execd's `/command` (any POSIX
//! shell with coreutils or busybox), and the command lines that carry them.
//!
//! The daemon runs a command as `sh -c COMMAND`; ours is `set -- ARGS…` (every argument
//! single-quoted, so client paths and argv are never parsed by the shell), the variable
//! prefix (`W` workspace root, `S` state directory: both validated absolute paths), the
//! confinement routine `resolve.sh`, then the script.

const RESOLVE: &str = include_str!("scripts/resolve.sh");
const SPAWN: &str = include_str!("scripts/spawn.sh");
const SECRET: &str = include_str!("scripts/secret.sh");
const RUN: &str = include_str!("scripts/run.sh");
const READ: &str = include_str!("scripts/read.sh");
const WRITE: &str = include_str!("scripts/write.sh");
const SETUP: &str = include_str!("scripts/setup.sh");
const STDIN: &str = include_str!("scripts/stdin.sh");

/// Exit status of a helper script that failed with a classified error (`berth-error KIND`
/// or `berth-NONCE fail KIND` on stderr).
pub(crate) const FAILED_EXIT_CODE: i64 = 86;
/// Exit status of a stdin feed whose process is gone.
pub(crate) const STDIN_GONE_EXIT_CODE: i64 = 32;
/// Largest command line the daemon is given: the kernel's limit on one argument
/// (`MAX_ARG_STRLEN`, 128 KiB) bounds what `sh -c` can take.
pub(crate) const MAX_COMMAND_BYTES: usize = 120 * 1024;

/// `text` as one single-quoted shell word.
pub(crate) fn quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}

#[derive(Clone, Debug)]
pub(crate) struct Scripts {
    prefix: String,
}

impl Scripts {
    /// Both paths must have passed `config::safe_absolute`.
    pub fn new(workspace_dir: &str, state_dir: &str) -> Self {
        Self { prefix: format!("W='{workspace_dir}'\nS='{state_dir}'\n{RESOLVE}") }
    }

    fn command(&self, args: &[&str], body: &[&str]) -> String {
        let mut command = String::from("set --");
        for arg in args {
            command.push(' ');
            command.push_str(&quote(arg));
        }
        command.push('\n');
        command.push_str(&self.prefix);
        for part in body {
            command.push_str(part);
            command.push('\n');
        }
        command
    }

    pub fn setup(&self, agent: (u32, u32), holder: (u32, u32)) -> String {
        let ids = [agent.0, agent.1, holder.0, holder.1].map(|id| id.to_string());
        let args: Vec<&str> = ids.iter().map(String::as_str).collect();
        self.command(&args, &[SETUP])
    }

    /// An agent process: `input` is `null`, `fifo` or a staged file's path; `limit` the
    /// bytes of each output stream worth sending (`None`: all).
    pub fn spawn(&self, nonce: &str, cwd: &str, input: &str, limit: Option<usize>, argv: &[String]) -> String {
        let limit = limit.map_or_else(|| "-1".to_owned(), |limit| limit.to_string());
        let mut args = vec![nonce, cwd, input, &limit];
        args.extend(argv.iter().map(String::as_str));
        self.command(&args, &[SPAWN, RUN])
    }

    /// A secret-holding process; `pin` is the program's SHA-256 in hex, or `-`.
    pub fn secret(
        &self,
        nonce: &str,
        cwd: &str,
        input: &str,
        limit: Option<usize>,
        pin: &str,
        argv: &[String],
    ) -> String {
        let limit = limit.map_or_else(|| "-1".to_owned(), |limit| limit.to_string());
        let mut args = vec![nonce, cwd, input, &limit, pin];
        args.extend(argv.iter().map(String::as_str));
        self.command(&args, &[SECRET, RUN])
    }

    /// `link`: where to hard-link (or copy) the file, `-` to stream it through od.
    pub fn read(&self, nonce: &str, rel: &str, link: &str) -> String {
        self.command(&[nonce, rel, link], &[READ])
    }

    pub fn write(&self, nonce: &str, rel: &str, mode: u32, staged: &str) -> String {
        self.command(&[nonce, rel, &format!("{mode:o}"), staged], &[WRITE])
    }

    /// Feeds `data` to a running process's stdin FIFO (`None`: ends its input).
    pub fn stdin(&self, nonce: &str, data: Option<&[u8]>) -> String {
        let action = match data {
            Some(data) => format!("[ -p \"$f/i\" ] || exit 32\nprintf '{}' >\"$f/i\" || exit 32", printf_escape(data)),
            None => "[ -f \"$f/h\" ] && kill \"$(cat \"$f/h\")\" 2>/dev/null\nexit 0".to_owned(),
        };
        self.command(&[nonce], &[STDIN, &action])
    }
}

/// Bytes as a `printf` format that prints exactly them: letters, digits and a few safe
/// characters as themselves, everything else as a three-digit octal escape.
pub(crate) fn printf_escape(data: &[u8]) -> String {
    let mut out = String::with_capacity(data.len() * 2);
    for &byte in data {
        if byte.is_ascii_alphanumeric()
            || matches!(
                byte,
                b' ' | b',' | b'.' | b'_' | b'-' | b':' | b'/' | b'{' | b'}' | b'[' | b']' | b'"' | b'=' | b'+'
            )
        {
            out.push(byte as char);
        } else {
            out.push_str(&format!("\\{byte:03o}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_and_escapes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(printf_escape(b"a'%\\\n\x00"), r"a\047\045\134\012\000");
    }

    #[test]
    fn scripts_are_posix_sh() {
        let scripts = Scripts::new("/workspace", "/var/lib/berth");
        for script in [
            scripts.setup((1000, 1000), (64000, 64000)),
            scripts.spawn("n", "", "null", Some(10), &["true".into()]),
            scripts.secret("n", "", "fifo", None, "-", &["true".into()]),
            scripts.read("n", "a", "-"),
            scripts.write("n", "a", 0o644, "/var/lib/berth/stage/x"),
            scripts.stdin("n", Some(b"{}\n")),
            scripts.stdin("n", None),
        ] {
            let checked = std::process::Command::new("sh").arg("-n").arg("-c").arg(&script).output().unwrap();
            assert!(checked.status.success(), "{script}\n{}", String::from_utf8_lossy(&checked.stderr));
        }
    }
}
