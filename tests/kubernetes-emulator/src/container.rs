//! A running container of an emulated Pod: one bubblewrap init holding the container's
//! namespaces (user, pid, mount, network, IPC, UTS), the host's system directories
//! read-only as the "image", the Pod's volumes bound at their mount paths, and `/`
//! read-only when the container asks for `readOnlyRootFilesystem`. Every exec enters those
//! namespaces with `nsenter`, so one container's processes share a pid namespace (and see
//! and signal each other) while two containers of a Pod do not, as with a real runtime
//! without `shareProcessNamespace`.
//!
//! The container's `runAsUser` / `runAsGroup` is the uid inside its user namespace; on the
//! host every container runs as the emulator's own user.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use tokio::io::AsyncReadExt;
use tokio::process::{Child, Command};

/// The PATH of a container whose spec sets none (the image's, on a real cluster).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A volume as a container sees it.
#[derive(Clone, Debug)]
pub struct Mount {
    pub host: PathBuf,
    pub inside: String,
    pub read_only: bool,
}

/// What to start.
#[derive(Clone, Debug)]
pub struct ContainerSpec {
    pub name: String,
    pub hostname: String,
    pub uid: u32,
    pub gid: u32,
    pub read_only_root: bool,
    pub mounts: Vec<Mount>,
    pub env: BTreeMap<String, String>,
    pub working_dir: Option<String>,
}

/// A running container's init.
pub struct Container {
    pub spec: ContainerSpec,
    bwrap: std::sync::Mutex<Option<Child>>,
    /// Host pid of the init inside the namespaces (what `nsenter -t` targets).
    pub init_pid: u32,
}

impl Container {
    pub async fn start(spec: ContainerSpec) -> Result<Self> {
        let mut command = Command::new("bwrap");
        command.args(bwrap_args(&spec));
        command.env_clear().env("PATH", DEFAULT_PATH);
        command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        let mut bwrap = command.spawn().context("start bwrap (is bubblewrap installed?)")?;
        // `--info-fd 1`: bubblewrap writes {"child-pid": N, ...} on stdout.
        let mut stdout = bwrap.stdout.take().context("bwrap stdout")?;
        let mut info = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), async {
            let mut chunk = [0u8; 1024];
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
            bail!("bwrap did not start container {}: {} {}", spec.name, text.trim(), stderr.trim());
        };
        // bubblewrap reports the child before it wrote the uid map; an exec entering the
        // namespaces before then could not take the container's uid.
        let wanted = spec.uid.to_string();
        for _ in 0..1000 {
            let map = std::fs::read_to_string(format!("/proc/{init_pid}/uid_map")).unwrap_or_default();
            if map.split_whitespace().next() == Some(wanted.as_str()) {
                return Ok(Self { spec, bwrap: std::sync::Mutex::new(Some(bwrap)), init_pid });
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        bail!("the user namespace of container {} was not set up in 5 s", spec.name)
    }

    /// Ends the container: every process in it dies with its pid namespace.
    pub async fn stop(&self) {
        let child = self.bwrap.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).take();
        if let Some(mut child) = child {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        }
    }

    /// A command entering this container as its user, in its working directory, with the
    /// container's environment (what a CRI exec gives a process).
    pub fn command(&self, argv: &[String]) -> Command {
        let mut command = Command::new("nsenter");
        command.args(["-t", &self.init_pid.to_string(), "-U", "-m", "-p", "-n", "-i", "-u", "-r", "-w"]);
        command.args(["-S", &self.spec.uid.to_string(), "-G", &self.spec.gid.to_string(), "--"]);
        // A shell that execs the command (so the process keeps the shell's pid); a missing
        // program is the shell's 127, as a runtime reports it.
        let cwd = self.spec.working_dir.clone().unwrap_or_else(|| "/".to_owned());
        command.args(["/bin/sh", "-c", "cd -- \"$1\" 2>/dev/null || cd /; shift; exec \"$@\"", "exec", &cwd]);
        command.args(argv);
        let mut env = BTreeMap::from([
            ("PATH".to_owned(), DEFAULT_PATH.to_owned()),
            ("HOME".to_owned(), "/".to_owned()),
            ("HOSTNAME".to_owned(), self.spec.hostname.clone()),
        ]);
        env.extend(self.spec.env.clone());
        command.env_clear().envs(env);
        command
    }
}

fn bwrap_args(spec: &ContainerSpec) -> Vec<String> {
    let mut args: Vec<String> =
        ["--unshare-all", "--unshare-user", "--die-with-parent", "--info-fd", "1", "--proc", "/proc", "--dev", "/dev"]
            .iter()
            .map(|arg| (*arg).to_owned())
            .collect();
    args.extend(["--uid".to_owned(), spec.uid.to_string(), "--gid".to_owned(), spec.gid.to_string()]);
    args.extend(["--hostname".to_owned(), spec.hostname.clone()]);
    // The "image": the host's system directories, read-only.
    for name in ["usr", "etc", "opt", "bin", "sbin", "lib", "lib64", "lib32"] {
        let host = Path::new("/").join(name);
        match std::fs::symlink_metadata(&host) {
            Ok(meta) if meta.file_type().is_symlink() => {
                if let Ok(target) = std::fs::read_link(&host) {
                    args.extend(["--symlink".to_owned(), target.to_string_lossy().into_owned(), format!("/{name}")]);
                }
            }
            Ok(meta) if meta.is_dir() => {
                args.extend(["--ro-bind".to_owned(), format!("/{name}"), format!("/{name}")]);
            }
            _ => {}
        }
    }
    for mount in &spec.mounts {
        let flag = if mount.read_only { "--ro-bind" } else { "--bind" };
        args.extend([flag.to_owned(), mount.host.to_string_lossy().into_owned(), mount.inside.clone()]);
    }
    if spec.read_only_root {
        args.extend(["--remount-ro".to_owned(), "/".to_owned()]);
    }
    args.extend(["--".to_owned(), "/bin/sh".to_owned(), "-c".to_owned()]);
    args.push("exec >/dev/null 2>&1 </dev/null; while :; do sleep 3600; done".to_owned());
    args
}
