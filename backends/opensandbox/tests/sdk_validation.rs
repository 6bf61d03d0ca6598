//! The official OpenSandbox Python SDK (`opensandbox==1.1.1`) drives the real server and
//! the execd stand-in through its own code paths (`sdk_validation.py`): create with
//! metadata, list by metadata, connect, commands (stdout, stderr, exit code), files (write,
//! read, info, list, move, remove) and kill. This keeps the stand-in honest: it must answer
//! what the provider's client expects.

mod support;

use std::path::Path;
use std::process::Command;

#[test]
fn the_official_sdk_drives_the_server_and_the_execd_standin() {
    let server = support::server();
    let run = hex::encode(rand::random::<[u8; 8]>());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/sdk_validation.py");
    let output = Command::new(server.venv.join("bin/python"))
        .arg(&script)
        .arg(server.port.to_string())
        .arg(&server.api_key)
        .arg(&server.image)
        .arg(&run)
        .output()
        .expect("run the SDK validation script");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "the SDK validation failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("sdk validation: 11 checks passed"), "{stdout}\n{stderr}");
    // The script killed its sandbox; nothing with its label is left.
    let left = support::docker(&["ps", "-aq", "--filter", &format!("label=sdk.berth.test/run={run}")]);
    assert!(left.trim().is_empty(), "the SDK's sandbox is still there: {left}");
}
