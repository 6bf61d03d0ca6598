//! Empty on purpose. `berth-workspace-hack` exists for its Cargo.toml: every package of the
//! workspace depends on it, and it depends on each third-party crate with the union of the
//! features the whole workspace uses, so `cargo build -p berth`, `cargo build --workspace`,
//! the tests and `cargo run -p berth-bench` all compile each crate once, with one feature set.
//! The dependency list is written by `cargo hakari generate` (`.config/hakari.toml`).
