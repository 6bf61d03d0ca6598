//! The shell scripts Berth runs inside workspace Pods through `pods/exec` (any POSIX shell
//! with coreutils or busybox). An exec carries an argv, so every client path and argument
//! is a positional parameter (`sh -c SCRIPT berth ARGS…`), never parsed by a shell; the
//! script is the variable prefix (`W` workspace root, `S` Berth's state directory: both
//! validated absolute paths), the confinement routine `resolve.sh`, then the body.

const RESOLVE: &str = include_str!("scripts/resolve.sh");
const SPAWN: &str = include_str!("scripts/spawn.sh");
const SECRET: &str = include_str!("scripts/secret.sh");
const PROGRAM: &str = include_str!("scripts/program.sh");
const RUN: &str = include_str!("scripts/run.sh");
const KILL: &str = include_str!("scripts/kill.sh");
const READ: &str = include_str!("scripts/read.sh");
const STAGE: &str = include_str!("scripts/stage.sh");
const WRITE: &str = include_str!("scripts/write.sh");
const SETUP: &str = include_str!("scripts/setup.sh");
const HOLDER_STAGE: &str = include_str!("scripts/holder_stage.sh");

/// Exit status of a helper script that failed with a classified error (`berth-error KIND`
/// or `berth-NONCE fail KIND` on stderr).
pub(crate) const FAILED_EXIT_CODE: i32 = 86;

/// Where the secret holder's container keeps its run directories (its own `/tmp`).
pub(crate) const HOLDER_STATE_DIR: &str = "/tmp/.berth";

#[derive(Clone, Debug)]
pub(crate) struct Scripts {
    /// `W=…`, `S=…` and resolve.sh, for the workspace container.
    agent: String,
    /// `S=…` for the secret holder's container.
    holder: String,
}

fn argv(script: String, args: &[&str]) -> Vec<String> {
    let mut argv = vec!["/bin/sh".to_owned(), "-c".to_owned(), script, "berth".to_owned()];
    argv.extend(args.iter().map(|arg| (*arg).to_owned()));
    argv
}

fn env_words(env: &std::collections::BTreeMap<String, String>) -> Vec<String> {
    env.iter().map(|(name, value)| format!("{name}={value}")).collect()
}

impl Scripts {
    /// Both paths must have passed `config::safe_absolute`.
    pub fn new(workspace_dir: &str, state_dir: &str) -> Self {
        Self {
            agent: format!("W='{workspace_dir}'\nS='{state_dir}'\n{RESOLVE}\n"),
            holder: format!("S='{HOLDER_STATE_DIR}'\n"),
        }
    }

    fn agent(&self, body: &[&str], args: &[&str]) -> Vec<String> {
        argv(format!("{}{}", self.agent, body.join("\n")), args)
    }

    pub fn setup(&self) -> Vec<String> {
        self.agent(&[SETUP], &[])
    }

    /// An agent process in `cwd` (relative to the root) with `env` exported.
    pub fn spawn(
        &self,
        nonce: &str,
        cwd: &str,
        env: &std::collections::BTreeMap<String, String>,
        program: &[String],
    ) -> Vec<String> {
        let count = env.len().to_string();
        let mut args: Vec<String> = vec![nonce.to_owned(), cwd.to_owned(), count];
        args.extend(env_words(env));
        args.extend(program.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.agent(&[SPAWN, "berth_check_program() {", PROGRAM, "}", "berth_check_program \"$@\"", RUN], &args)
    }

    /// A secret-holding process in its own container; `dir` is the staged program's
    /// directory or `-`.
    pub fn secret(
        &self,
        nonce: &str,
        dir: &str,
        env: &std::collections::BTreeMap<String, String>,
        program: &[String],
    ) -> Vec<String> {
        let count = env.len().to_string();
        let mut args: Vec<String> = vec![nonce.to_owned(), dir.to_owned(), count];
        args.extend(env_words(env));
        args.extend(program.iter().cloned());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let body = [SECRET, "berth_check_program() {", PROGRAM, "}", "berth_check_program \"$@\"", RUN].join("\n");
        argv(format!("{}{body}", self.holder), &args)
    }

    /// Stages a pinned program (stdin) in the secret holder's container.
    pub fn holder_stage(&self, pin: &str) -> Vec<String> {
        argv(format!("{}{HOLDER_STAGE}", self.holder), &[pin])
    }

    /// Kills an exec's processes (`holder`: in the secret holder's container).
    pub fn kill(&self, nonce: &str, holder: bool) -> Vec<String> {
        if holder { argv(format!("{}{KILL}", self.holder), &[nonce]) } else { self.agent(&[KILL], &[nonce]) }
    }

    pub fn read(&self, nonce: &str, rel: &str) -> Vec<String> {
        self.agent(&[READ], &[nonce, rel])
    }

    pub fn stage(&self, nonce: &str) -> Vec<String> {
        self.agent(&[STAGE], &[nonce])
    }

    pub fn staged_path(state_dir: &str, nonce: &str) -> String {
        format!("{state_dir}/stage/{nonce}")
    }

    pub fn write(&self, nonce: &str, rel: &str, mode: u32, staged: &str) -> Vec<String> {
        self.agent(&[WRITE], &[nonce, rel, &format!("{mode:o}"), staged])
    }

    /// `rm -f` of a staged file.
    pub fn discard(&self, staged: &str) -> Vec<String> {
        argv("rm -f -- \"$1\"".to_owned(), &[staged])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_are_posix_sh() {
        let scripts = Scripts::new("/workspace", "/var/lib/berth");
        let env = std::collections::BTreeMap::from([("A".to_owned(), "b c".to_owned())]);
        for argv in [
            scripts.setup(),
            scripts.spawn("n", "", &env, &["true".into()]),
            scripts.secret("n", "-", &env, &["true".into()]),
            scripts.holder_stage("00"),
            scripts.kill("n", false),
            scripts.kill("n", true),
            scripts.read("n", "a"),
            scripts.stage("n"),
            scripts.write("n", "a", 0o644, "/var/lib/berth/stage/x"),
        ] {
            let checked = std::process::Command::new("sh").arg("-n").arg("-c").arg(&argv[2]).output().unwrap();
            assert!(checked.status.success(), "{}\n{}", argv[2], String::from_utf8_lossy(&checked.stderr));
        }
    }
}
