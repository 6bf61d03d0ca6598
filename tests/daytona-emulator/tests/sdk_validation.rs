//! The official Daytona Python SDK drives the emulator through create / process.exec /
//! files (bulk upload and download, list, info, move, folder, delete) / sessions / list by
//! labels with paging / label replace / stop / start / delete (`sdk/validate.py`): proof
//! that the emulator speaks the published protocol. Needs the venv of `.ci/venv daytona`;
//! fails loudly without.

use std::path::PathBuf;
use std::time::Duration;

use berth_daytona_emulator::{Emulator, EmulatorConfig};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python of the `daytona` venv, made (or refreshed) by `.ci/venv daytona`.
pub fn daytona_python() -> PathBuf {
    let output = std::process::Command::new(repo_root().join(".ci/venv"))
        .arg("daytona")
        .current_dir(repo_root())
        .output()
        .expect("run .ci/venv daytona");
    assert!(output.status.success(), ".ci/venv daytona failed: {}", String::from_utf8_lossy(&output.stderr));
    let venv = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let python = venv.join("bin/python");
    assert!(python.exists(), "no python in the daytona venv at {}", venv.display());
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdk_flows_pass_against_the_emulator() {
    let python = daytona_python();
    let emulator = Emulator::start(EmulatorConfig::for_test("daytona_sdk_validation")).await.expect("start emulator");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sdk/validate.py");
    let mut command = tokio::process::Command::new(python);
    command
        .arg(script)
        .env("DAYTONA_API_URL", &emulator.api_url)
        .env("DAYTONA_API_KEY", "daytona_sdk_validation")
        // The SDK reads a `.env` of its working directory: none here.
        .current_dir(std::env::temp_dir())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(180), command.output())
        .await
        .expect("the SDK flows did not finish in 180 s")
        .expect("run the SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "SDK flows failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    for step in [
        "create",
        "process.exec",
        "process.exec.env_cwd",
        "fs.upload_download",
        "fs.ops",
        "process.sessions",
        "list.labels_paging",
        "stop.start",
        "delete",
    ] {
        assert!(stdout.lines().any(|line| line == format!("ok {step}")), "step {step} missing:\n{stdout}");
    }
    assert!(stdout.lines().any(|line| line == "ALL OK"), "{stdout}");
    assert!(emulator.sandbox_ids().is_empty(), "sandboxes left: {:?}", emulator.sandbox_ids());
}
