//! Real servers behind the snapshot stores, for the store suites and the cluster tests:
//! `redis-server` (Debian) and `moto_server` (PyPI, the venv of
//! `.ci/requirements/snapshot.txt`), each started by a test on a free loopback port and
//! killed by PID when the guard drops. A missing program fails the test with
//! what to install; nothing is skipped.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// A child process killed (and reaped) on drop, with its log kept for failure messages.
pub struct ServerProcess {
    child: Child,
    pub port: u16,
    pub dir: tempfile::TempDir,
    name: &'static str,
}

impl ServerProcess {
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("server.log")).unwrap_or_default()
    }

    /// `--snapshot-store` of this `redis-server`, keys under `prefix`.
    pub fn redis_url(&self, prefix: &str) -> String {
        format!("redis://127.0.0.1:{}/0?prefix={prefix}", self.port)
    }

    /// `--snapshot-store` of this `moto_server`'s `bucket` under `prefix`, its credentials in
    /// a shared-credentials file in the server's directory (as an operator passes them).
    pub fn s3_url(&self, bucket: &str, prefix: &str) -> String {
        let credentials = self.dir.path().join("credentials");
        std::fs::write(
            &credentials,
            "[default]\naws_access_key_id = testing\naws_secret_access_key = testing-secret\n",
        )
        .expect("write the credentials file");
        format!(
            "s3://{bucket}/{prefix}?endpoint=http://127.0.0.1:{}&region=us-east-1&credentials_file={}",
            self.port,
            credentials.display()
        )
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Starts `program` (with `{port}` in `args` replaced) until `ready(port)` holds, trying
/// another port if the process dies (a port taken between probe and bind).
fn start(name: &'static str, program: &Path, args: &[&str], ready: impl Fn(u16) -> bool) -> ServerProcess {
    let mut failures = String::new();
    for _attempt in 0..3 {
        let dir = tempfile::Builder::new().prefix(&format!("berth-snapshot-{name}-")).tempdir().unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("server.log")).unwrap();
        let args: Vec<String> = args
            .iter()
            .map(|arg| arg.replace("{port}", &port.to_string()).replace("{dir}", &dir.path().display().to_string()))
            .collect();
        let child = Command::new(program)
            .args(&args)
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|error| {
                panic!("cannot start {} ({error}); install it: {}", program.display(), install_hint(name))
            });
        let mut server = ServerProcess { child, port, dir, name };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if ready(port) {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                failures.push_str(&format!("{} exited with {status}:\n{}\n", server.name, server.log()));
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name} on port {port} not ready after 60 s; its log:\n{}",
                server.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("{name} did not start:\n{failures}");
}

fn install_hint(name: &str) -> &'static str {
    match name {
        "redis" => "apt-get install redis-server (.ci/run does)",
        _ => ".ci/venv snapshot (pins in .ci/requirements/snapshot.txt)",
    }
}

/// One request on loopback; the status code, `None` when nothing answers.
pub fn http(port: u16, method: &str, path: &str) -> Option<u16> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let request =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    String::from_utf8_lossy(&answer).split_whitespace().nth(1)?.parse().ok()
}

fn redis_ping(port: u16) -> bool {
    let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut answer = [0u8; 7];
    stream.read_exact(&mut answer).is_ok() && &answer == b"+PONG\r\n"
}

/// A fresh `redis-server` with no persistence.
pub fn redis() -> ServerProcess {
    let program = which("redis-server").unwrap_or_else(|| panic!("redis-server not found; {}", install_hint("redis")));
    start(
        "redis",
        &program,
        &[
            "--port",
            "{port}",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "{dir}",
            "--protected-mode",
            "yes",
        ],
        redis_ping,
    )
}

/// The venv of `.ci/requirements/snapshot.txt` (once per process).
pub fn venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| crate::venv("snapshot")).clone()
}

/// A fresh `moto_server` (an S3-compatible server) on loopback, with `bucket` created.
pub fn moto(bucket: &str) -> ServerProcess {
    let program = venv().join("bin/moto_server");
    let server =
        start("moto", &program, &["-H", "127.0.0.1", "-p", "{port}"], |port| http(port, "GET", "/moto-api/").is_some());
    let status = http(server.port, "PUT", &format!("/{bucket}"));
    assert_eq!(status, Some(200), "creating bucket {bucket} on moto_server failed; its log:\n{}", server.log());
    server
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/bin", "/usr/sbin"])
        .map(|dir| Path::new(dir).join(program))
        .find(|path| path.is_file())
}
