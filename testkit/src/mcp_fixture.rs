//! The MCP test server (`fixtures/mcp-echo`, package `berth-mcp-fixture`) as a static
//! binary, ready to copy into any workspace.
//!
//! Built on first use with `cargo rustc ... -- -C target-feature=+crt-static` (the gnu
//! target; rustc applies crt-static at the final link, so dependencies are shared with the
//! normal build). A static-pie binary runs with no libc in sight: in a bubblewrap sandbox,
//! and in a busybox or scratch container. Concurrent test processes serialise on cargo's
//! own build lock; the path is cached per process.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use bytes::Bytes;

use berth_workspace::backend::Backend;
use berth_workspace::path::RelPath;

/// Where [`install`] puts the binary in a workspace (run it as `bin/berth-mcp-fixture`,
/// relative to the workspace root, so the same declaration works on every backend).
pub const INSTALL_PATH: &str = "bin/berth-mcp-fixture";

/// The fixture binary's path, building it if needed. Panics (failing the test) when the
/// build fails: the tests that need it must not skip.
pub fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(build)
}

fn build() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
    let output = super::nested_cargo()
        .args(["rustc", "--manifest-path"])
        .arg(&manifest)
        .args([
            "-p",
            "berth-mcp-fixture",
            "--bin",
            "berth-mcp-fixture",
            "--locked",
            "--offline",
            "--message-format=json-render-diagnostics",
            "--",
            "-C",
            "target-feature=+crt-static",
        ])
        .output()
        .unwrap_or_else(|error| panic!("cannot run cargo to build the mcp fixture: {error}"));
    assert!(
        output.status.success(),
        "building the mcp fixture failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    let executable = stdout
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter_map(|message| message["executable"].as_str().map(PathBuf::from))
        .next_back()
        .unwrap_or_else(|| panic!("cargo named no fixture executable:\n{stdout}"));
    assert!(executable.is_file(), "{} is missing after the build", executable.display());
    executable
}

/// Copies the fixture into the workspace at [`INSTALL_PATH`] (mode 0755) through the
/// backend's `write_file`, so it works wherever the workspace's files live.
pub async fn install(backend: &dyn Backend) {
    let bytes = std::fs::read(binary()).expect("read the mcp fixture binary");
    let path = RelPath::parse(INSTALL_PATH).expect("valid path");
    backend.write_bytes(&path, Bytes::from(bytes), 0o755).await.expect("install the mcp fixture");
}

/// SHA-256 of the fixture binary as 64 lowercase hex digits: the pin a declaration that
/// gives the fixture secrets must carry (it runs from the workspace).
pub fn sha256_hex() -> &'static str {
    static DIGEST: OnceLock<String> = OnceLock::new();
    DIGEST.get_or_init(|| {
        use sha2::Digest as _;
        let bytes = std::fs::read(binary()).expect("read the mcp fixture binary");
        hex::encode(sha2::Sha256::digest(&bytes))
    })
}
