//! The resident sandbox supervisor: one small process per live sandbox that forks
//! commands inside the already-built sandbox on request, so an exec costs a fork and an
//! exec instead of building namespaces and mounts again.
//!
//! This library is the node agent's side: the wire format ([`wire`]) and the few socket
//! calls std lacks ([`client`]). The binary (`main.rs`, [`wire`] plus `serve.rs`,
//! `shim.rs`, `sys.rs`) depends on nothing but std, so the backends' build scripts compile
//! it with plain `rustc` and embed it.
//!
//! # Shape
//!
//! ```text
//! node agent ──control (STREAM, fd 4)──▶ supervisor ──fork──▶ shim ──fork──▶ command
//!            ◀──────── per-exec connection (STREAM) ─────────────┘
//! ```
//!
//! The supervisor only receives spawn messages and forks one **shim** per exec. The shim
//! owns the exec: it reads the request from the exec's connection, optionally gives the
//! exec a private `/tmp` and `/dev/shm` (a mount namespace of its own), forks the command
//! (new session, stdio = the fds the node passed, rlimits, no capabilities, exact env),
//! reports `Started`, waits, and when the command ends or a kill arrives kills the
//! command's process group and every process left below the shim (it is a child
//! subreaper, so whatever the command started, `setsid` or not, is reparented to it), then
//! reports `Exited` and exits. The supervisor and its shims are undumpable: a command of
//! the same uid cannot ptrace them or open their fds.

pub mod client;
mod sys;
pub mod wire;
