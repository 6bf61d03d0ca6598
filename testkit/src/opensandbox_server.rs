//! The real `opensandbox-server` (PyPI, Docker runtime) with the execd stand-in
//! (`tests/opensandbox-execd-standin`), shared by every test process of one test run — the
//! OpenSandbox backend's own tests and the cloud gateway tests alike.
//!
//! Needs Docker, a static busybox (`busybox-static`) and the venv of
//! `.ci/requirements/opensandbox.txt` (`.ci/venv opensandbox`, made here when missing). A
//! test that cannot get them fails; it never skips.
//!
//! Sharing: nextest runs each test in a process of its own, and the server takes a few
//! seconds to start, so the first process of a run (`NEXTEST_RUN_ID`, else this process)
//! starts it under a supervisor (`testkit/scripts/opensandbox-supervise.sh`) and the others
//! join it through a directory under the system temp dir (a lock file, the port, the pids
//! that joined). The supervisor stops the server once every joined process is gone, then
//! removes every container made from the run's own sandbox image (a fresh import of the
//! base image, so nothing else matches), the image and the directory.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub struct Server {
    pub port: u16,
    pub url: String,
    pub api_key_file: PathBuf,
    pub api_key: String,
    /// The run's sandbox image (the base image, imported again under a name of its own).
    pub image: String,
    pub dir: PathBuf,
    pub venv: PathBuf,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The venv of `.ci/requirements/opensandbox.txt` (once per process).
pub fn venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| crate::venv("opensandbox")).clone()
}

/// The stand-in built static (it runs in a container with nothing but busybox).
fn standin_binary() -> PathBuf {
    let manifest = repo().join("Cargo.toml");
    let output = crate::nested_cargo()
        .args(["rustc", "--manifest-path"])
        .arg(&manifest)
        .args([
            "-p",
            "berth-opensandbox-execd-standin",
            "--bin",
            "berth-opensandbox-execd-standin",
            "--locked",
            "--offline",
            "--message-format=json-render-diagnostics",
            "--",
            "-C",
            "target-feature=+crt-static",
        ])
        .output()
        .expect("run cargo to build the execd stand-in");
    assert!(
        output.status.success(),
        "building the execd stand-in failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter_map(|message| message["executable"].as_str().map(PathBuf::from))
        .next_back()
        .unwrap_or_else(|| panic!("cargo named no stand-in executable:\n{stdout}"))
}

fn run_script(script: &Path, args: &[&str]) -> String {
    let output =
        Command::new("bash").arg(script).args(args).output().unwrap_or_else(|error| panic!("run {script:?}: {error}"));
    assert!(
        output.status.success(),
        "{} failed (docker running? busybox-static installed?): {}",
        script.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).trim().to_owned()
}

/// The HTTP status of `GET path` on loopback, `None` when nothing answers.
pub fn http_status(port: u16, path: &str, api_key: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nOPEN-SANDBOX-API-KEY: {api_key}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let text = String::from_utf8_lossy(&answer);
    text.split_whitespace().nth(1)?.parse().ok()
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|listener| listener.local_addr()).expect("a free port").port()
}

pub fn server() -> &'static Server {
    static SERVER: OnceLock<Server> = OnceLock::new();
    SERVER.get_or_init(start_or_join)
}

fn start_or_join() -> Server {
    let venv = venv();
    let run = std::env::var("NEXTEST_RUN_ID").unwrap_or_else(|_| format!("pid{}", std::process::id()));
    let key = &hex::encode(<sha2::Sha256 as sha2::Digest>::digest(run.as_bytes()))[..12];
    let dir = std::env::temp_dir().join(format!("berth-opensandbox-server-{key}"));
    fs::create_dir_all(&dir).expect("create the server directory");
    let lock = File::create(dir.join("lock")).expect("create the lock file");
    lock.lock().expect("lock the server directory");
    let api_key_file = dir.join("api-key");
    let image = format!("berth/base:opensandbox-{key}");
    let state = fs::read_to_string(dir.join("state")).ok();
    let joined = state.and_then(|text| text.trim().parse::<u16>().ok()).and_then(|port| {
        let api_key = fs::read_to_string(&api_key_file).ok()?;
        (http_status(port, "/v1/sandboxes", api_key.trim()) == Some(200)).then_some((port, api_key.trim().to_owned()))
    });
    let (port, api_key) = match joined {
        Some(joined) => joined,
        None => start(&dir, &venv, &api_key_file, &image),
    };
    let mut pids = OpenOptions::new().create(true).append(true).open(dir.join("pids")).expect("open the pids file");
    writeln!(pids, "{}", std::process::id()).expect("register this test process");
    drop(lock);
    Server { port, url: format!("http://127.0.0.1:{port}"), api_key_file, api_key, image, dir, venv }
}

fn start(dir: &Path, venv: &Path, api_key_file: &Path, image: &str) -> (u16, String) {
    run_script(&repo().join("deploy/images/build-base.sh"), &[image]);
    let standin = standin_binary();
    let execd_image = run_script(
        &repo().join("tests/opensandbox-execd-standin/build-image.sh"),
        &[standin.to_str().expect("utf-8 path")],
    );
    let api_key = hex::encode(rand::random::<[u8; 16]>());
    fs::write(api_key_file, &api_key).expect("write the api key file");
    let port = free_port();
    let config = format!(
        r#"[server]
host = "127.0.0.1"
port = {port}
api_key = "{api_key}"

[runtime]
type = "docker"
execd_image = "{execd_image}"

[docker]
network_mode = "bridge"
publish_host = "127.0.0.1"

[proxy]
resolve_internal = false

[store]
type = "sqlite"
path = "{}"
"#,
        dir.join("store.db").display()
    );
    let config_path = dir.join("sandbox.toml");
    fs::write(&config_path, config).expect("write the server config");
    fs::write(dir.join("pids"), format!("{}\n", std::process::id())).expect("write the pids file");
    // Detached: `sh` backgrounds the supervisor and returns, so it is reparented to init
    // and outlives this test process (it stops once every joined process is gone).
    let started = Command::new("sh")
        .arg("-c")
        .arg(r#"sh "$0" "$@" </dev/null >/dev/null 2>&1 &"#)
        .arg(repo().join("testkit/scripts/opensandbox-supervise.sh"))
        .arg(dir)
        .arg(venv.join("bin/opensandbox-server"))
        .arg(&config_path)
        .arg(image)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .status()
        .expect("start the server's supervisor");
    assert!(started.success(), "starting the server's supervisor failed: {started}");
    let deadline = Instant::now() + Duration::from_secs(90);
    while http_status(port, "/v1/sandboxes", &api_key) != Some(200) {
        assert!(
            Instant::now() < deadline,
            "opensandbox-server did not answer within 90 s; its log: {}",
            fs::read_to_string(dir.join("server.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    fs::write(dir.join("state"), port.to_string()).expect("write the server state");
    (port, api_key)
}

pub fn docker(args: &[&str]) -> String {
    let output = Command::new("docker").args(args).output().unwrap_or_else(|error| panic!("docker {args:?}: {error}"));
    String::from_utf8_lossy(&output.stdout).into_owned()
}
