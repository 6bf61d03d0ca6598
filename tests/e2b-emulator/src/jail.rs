//! The "VM" of an emulated sandbox: one bubblewrap init per running sandbox holding its
//! namespaces (user, pid, mount, network, IPC, UTS), its `/home` and `/tmp` bound from the
//! sandbox directory and the host's system directories read-only — the same view `vfs.rs`
//! serves. Every process envd starts enters those namespaces with `nsenter`, so the
//! sandbox's processes share one pid namespace, see each other in `/proc` and signal each
//! other, as in a VM. Killing the init ends the pid namespace and with it every process.
//!
//! When the emulator runs as root the sandbox gets a host uid of its own (`setpriv` before
//! bubblewrap), mapped to uid 1000 inside; otherwise the emulator's own uid is mapped.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

use super::vfs::{HOME, Layout, SANDBOX_UID, Top, USER};

/// The PATH envd gives processes.
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A running sandbox's init.
pub struct Init {
    /// The bubblewrap process (outside); killing it ends the sandbox.
    bwrap: Child,
    /// Host pid of the init inside the namespaces (what `nsenter -t` targets).
    pub init_pid: u32,
}

impl Init {
    /// Starts the init of a sandbox whose files are in `dir` (`home/`, `tmp/`).
    pub async fn start(dir: &Path, layout: &Layout, host_uid: Option<u32>) -> Result<Self> {
        let mut command = match host_uid {
            Some(uid) => {
                let mut command = Command::new("setpriv");
                command.args([format!("--reuid={uid}"), format!("--regid={uid}"), "--clear-groups".to_owned()]);
                command.arg("bwrap");
                command
            }
            None => Command::new("bwrap"),
        };
        command.args(bwrap_args(dir, layout));
        command.env_clear().env("PATH", DEFAULT_PATH);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut bwrap = command.spawn().context("start bwrap (is bubblewrap installed?)")?;
        // `--info-fd 1`: bubblewrap writes {"child-pid": N, ...} on stdout, then the init
        // closes it.
        let mut stdout = bwrap.stdout.take().context("bwrap stdout")?;
        let mut info = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            let mut chunk = [0u8; 1024];
            // The pid-1 helper may keep the pipe open: read up to the end of the JSON.
            while !info.contains(&b'}') {
                match stdout.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(count) => info.extend_from_slice(&chunk[..count]),
                }
            }
        })
        .await;
        if read.is_err() {
            bail!("bwrap did not report its child in 10 s");
        }
        let text = String::from_utf8_lossy(&info);
        let init_pid = text
            .split("\"child-pid\":")
            .nth(1)
            .and_then(|rest| rest.trim_start().split(|c: char| !c.is_ascii_digit()).next())
            .and_then(|pid| pid.parse::<u32>().ok());
        let Some(init_pid) = init_pid else {
            let mut stderr = String::new();
            if let Some(mut pipe) = bwrap.stderr.take() {
                let _ = tokio::time::timeout(Duration::from_secs(2), pipe.read_to_string(&mut stderr)).await;
            }
            bail!("bwrap did not start a sandbox: {} {}", text.trim(), stderr.trim());
        };
        // bubblewrap reports the child before it wrote the child's uid map; a process
        // entering the namespaces before then could not become uid 1000.
        for _ in 0..1000 {
            let map = std::fs::read_to_string(format!("/proc/{init_pid}/uid_map")).unwrap_or_default();
            if map.split_whitespace().next() == Some("1000") {
                return Ok(Self { bwrap, init_pid });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        bail!("the sandbox's user namespace was not set up in 5 s")
    }

    /// The bubblewrap process's own pid (0 once it was reaped).
    pub fn bwrap_pid(&self) -> u32 {
        self.bwrap.id().unwrap_or(0)
    }

    /// Ends the sandbox: every process in it dies with its pid namespace.
    pub async fn stop(mut self) {
        let _ = self.bwrap.start_kill();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.bwrap.wait()).await;
    }
}

/// A command entering the sandbox of init `init_pid` as its user, in `cwd`, with exactly
/// `env`.
pub fn command_in(init_pid: u32, cwd: &str, argv: &[String], env: &BTreeMap<String, String>) -> Command {
    let mut command = Command::new("nsenter");
    command.args(["-t", &init_pid.to_string(), "-U", "-m", "-p", "-n", "-i", "-u", "-r", "-w"]);
    command.args(["-S", &SANDBOX_UID.to_string(), "-G", &SANDBOX_UID.to_string(), "--"]);
    // The same shape as envd's own wrapper (a shell that execs the command, so the process
    // keeps the shell's pid); a missing program is the shell's 127.
    command.args(["/bin/sh", "-c", "cd -- \"$1\" || exit 1; shift; exec \"$@\"", "envd", cwd]);
    command.args(argv);
    command.env_clear().envs(env);
    command
}

/// The environment envd gives a process: PATH, HOME, USER, LOGNAME, the sandbox's env, then
/// the request's.
pub fn process_env(
    sandbox_env: &BTreeMap<String, String>,
    request_env: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    let mut env = BTreeMap::from([
        ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
        ("HOME".to_owned(), HOME.to_owned()),
        ("USER".to_owned(), USER.to_owned()),
        ("LOGNAME".to_owned(), USER.to_owned()),
    ]);
    env.extend(sandbox_env.iter().map(|(key, value)| (key.clone(), value.clone())));
    env.extend(request_env.iter().map(|(key, value)| (key.clone(), value.clone())));
    env
}

fn bwrap_args(dir: &Path, layout: &Layout) -> Vec<String> {
    let mut args: Vec<String> = [
        "--unshare-all",
        "--unshare-user",
        "--uid",
        "1000",
        "--gid",
        "1000",
        "--die-with-parent",
        "--info-fd",
        "1",
        "--hostname",
        "e2b",
        "--proc",
        "/proc",
        "--dev",
        "/dev",
    ]
    .iter()
    .map(|arg| (*arg).to_owned())
    .collect();
    for (name, top) in &layout.top {
        let inside = format!("/{name}");
        match top {
            Top::Own => args.extend(["--bind".to_owned(), path_str(&dir.join(name)), inside]),
            Top::Host => args.extend(["--ro-bind".to_owned(), inside.clone(), inside]),
            Top::Link(target) => args.extend(["--symlink".to_owned(), target.clone(), inside]),
        }
    }
    args.extend(["--".to_owned(), "/bin/sh".to_owned(), "-c".to_owned()]);
    args.push("exec >/dev/null 2>&1 </dev/null; while :; do sleep 3600; done".to_owned());
    args
}

fn path_str(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The process `nsenter` (host pid `nsenter_pid`) forked into the sandbox: its host pid and
/// its pid inside the sandbox. Waits until it exists.
pub async fn inner_process(nsenter_pid: u32) -> Option<(u32, u32)> {
    for _ in 0..400 {
        // A process that already ended left nsenter a zombie (reaped by the caller later).
        let stat = std::fs::read_to_string(format!("/proc/{nsenter_pid}/stat")).ok()?;
        if stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('Z')) {
            return None;
        }
        let children = std::fs::read_to_string(format!("/proc/{nsenter_pid}/task/{nsenter_pid}/children")).ok()?;
        if let Some(child) = children.split_whitespace().next().and_then(|pid| pid.parse::<u32>().ok())
            && let Some(inner) = inner_pid(child)
        {
            return Some((child, inner));
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    None
}

fn inner_pid(host_pid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{host_pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("NSpid:"))?;
    line.split_whitespace().last()?.parse().ok()
}

/// Creates a sandbox directory: `home/user` and `tmp`, owned by the sandbox's host uid.
pub fn create_dirs(dir: &Path, host_uid: Option<u32>) -> Result<()> {
    let home = dir.join("home");
    let user = home.join(USER);
    let tmp = dir.join("tmp");
    for path in [&home, &user, &tmp] {
        std::fs::create_dir_all(path).with_context(|| format!("create {}", path.display()))?;
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777))?;
    std::fs::set_permissions(&user, std::fs::Permissions::from_mode(0o755))?;
    if let Some(uid) = host_uid {
        for path in [&user, &tmp] {
            std::os::unix::fs::chown(path, Some(uid), Some(uid))?;
        }
    }
    Ok(())
}

/// Where sandbox `id` keeps its files under the emulator's root.
pub fn sandbox_dir(root: &Path, id: &str) -> PathBuf {
    root.join(id)
}
