//! What a backend name promises about isolation, known to both ends: the node agent refuses
//! to offer an unsandboxed backend without `--allow-unsandboxed`, and a replica lets a
//! caller pick one only when an operator granted it (admin, a token's `backends`, a JWT's
//! `berth_backends`).

/// Backends that run the caller's commands on the host as the node agent's user, with no
/// sandbox between them and the node's secrets and other tenants' files.
pub const UNSANDBOXED_BACKENDS: &[&str] = &["local"];

/// True when `backend` isolates nothing (see [`UNSANDBOXED_BACKENDS`]).
pub fn is_unsandboxed(backend: &str) -> bool {
    UNSANDBOXED_BACKENDS.contains(&backend)
}
