//! Compiles the sandbox supervisor (`src/main.rs`, std only) with plain `rustc` into
//! `$OUT_DIR/berth-supervisor`, which the library embeds as `BINARY`: every binary that
//! links a backend running supervisors (bubblewrap, Docker) carries the supervisor it
//! starts, with no install step and no path to find at run time.
//!
//! Static (`crt-static`), size-optimised, stripped, `panic=abort`: a small binary that
//! runs in any sandbox whatever its libc, and whose idle RSS stays far below 2 MiB.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let source_dir = manifest.join("src");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("berth-supervisor");
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let target = std::env::var("TARGET").expect("cargo sets TARGET");
    for file in ["main.rs", "serve.rs", "shim.rs", "sys.rs", "wire.rs"] {
        println!("cargo:rerun-if-changed={}", source_dir.join(file).display());
    }
    println!("cargo:rerun-if-changed=build.rs");
    let status = Command::new(&rustc)
        .args(["--edition", "2024", "--crate-type", "bin", "--crate-name", "berth_supervisor", "--target", &target])
        .args(["-C", "opt-level=s", "-C", "panic=abort", "-C", "codegen-units=1", "-C", "strip=symbols"])
        .args(["-C", "target-feature=+crt-static", "-C", "relocation-model=static"])
        .arg(source_dir.join("main.rs"))
        .arg("-o")
        .arg(&out)
        .status()
        .expect("run rustc for the sandbox supervisor");
    assert!(status.success(), "compiling the sandbox supervisor failed: {status}");
}
