//! Real child processes for cross-process tests, killed by PID and never outliving the test.
//!
//! Each process runs under a tiny `sh` supervisor holding the read end of a pipe whose write
//! end only this test process holds (the "lifeline"). When this process exits — normally,
//! by panic, or SIGKILLed by a harness — the pipe closes and the supervisor SIGKILLs the
//! child and deletes its directory. `Drop` kills explicitly; when the thread is panicking it
//! keeps the directory (logs) and prints where it is.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tempfile::TempDir;

/// `$1` log file, `$2` directory to delete when the lifeline closes, `$3...` the command.
/// Prints the child's PID, then waits for it and exits with its status. The watcher subshell
/// blocks reading the lifeline (fd 3); EOF means the test process is gone, so it marks that
/// and kills the child. The directory is removed only after `wait` has reaped the child
/// (removing it right after `kill -9` raced the child's last writes). When the test kills
/// the child itself there is no mark and `TempDir` cleans up.
const SUPERVISOR: &str = r#"
log="$1"; dir="$2"; shift 2
exec 3<&0 2>>"$log"
"$@" >>"$log" 2>&1 </dev/null 3<&- &
child=$!
echo "$child"
{ read -r _ <&3; : >"$dir/lifeline-closed"; kill -9 "$child" 2>/dev/null; } &
watcher=$!
exec 3<&-
wait "$child"
status=$?
kill "$watcher" 2>/dev/null
if [ -e "$dir/lifeline-closed" ]; then rm -rf "$dir"; fi
exit "$status"
"#;

/// A loopback port that was free a moment ago (bound to port 0, then released).
pub fn free_port() -> anyhow::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").context("bind 127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// What to start.
pub struct ProcessSpec {
    /// Name for messages and the temp dir prefix.
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Environment variables to drop (by prefix), e.g. stray `ETCD_*` of the developer's
    /// shell that would override flags.
    pub env_remove_prefixes: Vec<String>,
}

impl ProcessSpec {
    pub fn new(name: impl Into<String>, program: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            env_remove_prefixes: Vec::new(),
        }
    }

    pub fn args<I, S>(mut self, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// A supervised child process with its own temp directory (`dir()`) and log (`log.txt`).
pub struct ManagedProcess {
    name: String,
    pid: u32,
    supervisor: Mutex<Child>,
    /// Closing it makes the supervisor kill the child; see the module docs.
    lifeline: Mutex<Option<ChildStdin>>,
    dir: Mutex<Option<TempDir>>,
    dir_path: PathBuf,
    log_path: PathBuf,
}

impl ManagedProcess {
    /// Starts the process; `dir` is created first and may be used by the caller for data
    /// (see [`ManagedProcess::spawn_in`]).
    pub fn spawn(spec: ProcessSpec) -> anyhow::Result<Self> {
        let dir =
            tempfile::Builder::new().prefix(&format!("berth-{}-", spec.name)).tempdir().context("create temp dir")?;
        Self::spawn_in(spec, dir)
    }

    /// Starts the process with `dir` as its directory (logs go to `dir/log.txt`).
    pub fn spawn_in(spec: ProcessSpec, dir: TempDir) -> anyhow::Result<Self> {
        let log_path = dir.path().join("log.txt");
        let mut command = Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(SUPERVISOR)
            .arg(format!("berth-supervisor-{}", spec.name))
            .arg(&log_path)
            .arg(dir.path())
            .arg(&spec.program)
            .args(&spec.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (variable, _) in std::env::vars_os() {
            let variable_text = variable.to_string_lossy();
            if spec.env_remove_prefixes.iter().any(|prefix| variable_text.starts_with(prefix.as_str())) {
                command.env_remove(&variable);
            }
        }
        for (key, value) in &spec.env {
            command.env(key, value);
        }
        let mut supervisor =
            command.spawn().with_context(|| format!("spawn the supervisor for {}", spec.program.display()))?;
        let lifeline = supervisor.stdin.take();
        let stdout = supervisor.stdout.take().ok_or_else(|| anyhow!("supervisor has no stdout"))?;
        let mut first_line = String::new();
        BufReader::new(stdout).read_line(&mut first_line).context("read the child pid from the supervisor")?;
        let pid: u32 =
            first_line.trim().parse().with_context(|| format!("supervisor printed {first_line:?} instead of a pid"))?;
        Ok(Self {
            name: spec.name,
            pid,
            supervisor: Mutex::new(supervisor),
            lifeline: Mutex::new(lifeline),
            dir_path: dir.path().to_path_buf(),
            dir: Mutex::new(Some(dir)),
            log_path,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The process's private directory (deleted with it unless a test failed).
    pub fn dir(&self) -> &Path {
        &self.dir_path
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// The last `lines` lines of the log.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log_path).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// The whole log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Whether the child still runs (its supervisor exits as soon as the child does).
    pub fn is_running(&self) -> bool {
        let mut supervisor = self.supervisor.lock().unwrap_or_else(PoisonError::into_inner);
        matches!(supervisor.try_wait(), Ok(None))
    }

    /// Sends `signal` to the child by PID.
    pub fn signal(&self, signal: Signal) {
        if let Ok(pid) = i32::try_from(self.pid) {
            // ESRCH: already dead.
            let _ = kill(Pid::from_raw(pid), signal);
        }
    }

    /// SIGKILLs the child by PID and waits until it is gone. Idempotent.
    pub fn kill(&self) {
        self.signal(Signal::SIGKILL);
        self.wait_exit(Duration::from_secs(10));
    }

    /// Waits up to `timeout` for the child to exit; true if it did.
    pub fn wait_exit(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.is_running() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        true
    }

    /// Keeps the directory on disk (for a failed start) and returns its path.
    pub fn keep_dir(&self) -> PathBuf {
        if let Some(dir) = self.dir.lock().unwrap_or_else(PoisonError::into_inner).take() {
            return dir.keep();
        }
        self.dir_path.clone()
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.kill();
        // The supervisor has exited; closing the lifeline only releases its watcher.
        drop(self.lifeline.lock().unwrap_or_else(PoisonError::into_inner).take());
        if std::thread::panicking() {
            let kept = self.keep_dir();
            eprintln!("{} (pid {}) log kept at {}", self.name, self.pid, kept.join("log.txt").display());
        }
    }
}
