//! The official E2B Python SDK drives the emulator through create / list by metadata /
//! connect / commands / files / pause / kill, and injected faults (`sdk/validate.py`):
//! proof that the emulator speaks the published protocol (connect-rpc with the JSON codec
//! over HTTP/1.1, the platform API's JSON and paging, E2B's error statuses). Needs the
//! venv of `.ci/venv e2b`; fails loudly without.

use std::path::PathBuf;
use std::time::Duration;

use berth_e2b_emulator::{Emulator, EmulatorConfig};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The Python of the `e2b` venv, made (or refreshed) by `.ci/venv e2b`.
pub fn e2b_python() -> PathBuf {
    let output = std::process::Command::new(repo_root().join(".ci/venv"))
        .arg("e2b")
        .current_dir(repo_root())
        .output()
        .expect("run .ci/venv e2b");
    assert!(output.status.success(), ".ci/venv e2b failed: {}", String::from_utf8_lossy(&output.stderr));
    let venv = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim());
    let python = venv.join("bin/python");
    assert!(python.exists(), "no python in the e2b venv at {}", venv.display());
    python
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn official_sdk_flows_pass_against_the_emulator() {
    let python = e2b_python();
    let emulator = Emulator::start(EmulatorConfig::for_test("e2b_sdk_validation")).await.expect("start emulator");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sdk/validate.py");
    let mut command = tokio::process::Command::new(python);
    command
        .arg(script)
        .env("E2B_API_URL", &emulator.api_url)
        .env("E2B_SANDBOX_URL", &emulator.sandbox_url)
        .env("E2B_API_KEY", "e2b_sdk_validation")
        .env("E2B_DOMAIN", "emulator.invalid")
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(120), command.output())
        .await
        .expect("the SDK flows did not finish in 120 s")
        .expect("run the SDK script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "SDK flows failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    for step in [
        "create",
        "commands.run",
        "commands.exit_code",
        "commands.cwd",
        "commands.stdin",
        "commands.kill",
        "files.write_read",
        "files.ops",
        "list.metadata_paging",
        "pause.connect",
        "kill",
        "faults",
    ] {
        assert!(stdout.lines().any(|line| line == format!("ok {step}")), "step {step} missing:\n{stdout}");
    }
    assert!(stdout.lines().any(|line| line == "ALL OK"), "{stdout}");
    assert!(emulator.sandbox_ids().is_empty(), "sandboxes left: {:?}", emulator.sandbox_ids());
}
