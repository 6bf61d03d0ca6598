//! The resident sandbox supervisor: one small process per live sandbox that forks
//! commands inside the already-built sandbox on request, so an exec costs a fork and an
//! exec instead of building namespaces and mounts again.
//!
//! This library is the node agent's side: the wire format ([`wire`]), the few socket
//! calls std lacks ([`client`]), one exec over a control socket ([`node`]) and the
//! binary itself ([`BINARY`]). The binary (`main.rs`, [`wire`] plus `serve.rs`,
//! `shim.rs`, `sys.rs`) depends on nothing but std, so the backends' build scripts compile
//! it with plain `rustc` and embed it.
//!
//! # Shape
//!
//! ```text
//! node agent ──control (STREAM, fd 4)──▶ supervisor ──fork──▶ shim ──vfork──▶ command
//!            ◀──────── per-exec connection (STREAM) ─────────────┘
//! ```
//!
//! The supervisor only receives spawn messages and forks one **shim** per exec. The shim
//! owns the exec: it reads the request from the exec's connection, optionally gives the
//! exec a private `/tmp` and `/dev/shm` (a mount namespace of its own), starts the command
//! (new session, stdio = the fds the node passed, rlimits, no capabilities, exact env) from
//! a child that shares the shim's memory until its `execve` (`clone` with `CLONE_VM |
//! CLONE_VFORK`, as `posix_spawn` does: no page tables copied, no page faulted in twice),
//! reports `Started`, waits, and when the command ends or a kill arrives kills the
//! command's process group and every process left below the shim (it is a child
//! subreaper, so whatever the command started, `setsid` or not, is reparented to it), then
//! reports `Exited` and exits. The supervisor and its shims are undumpable: a command of
//! the same uid cannot ptrace them or open their fds.

pub mod client;
pub mod node;
mod sys;
pub mod wire;

/// The supervisor binary, compiled by `build.rs` (static, stripped, std only): every
/// binary that links a backend which runs supervisors carries the one it starts, with no
/// install step and no path to find at run time.
pub static BINARY: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/berth-supervisor"));
