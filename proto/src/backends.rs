//! What a backend name promises, known to both ends: isolation (the node agent refuses
//! to offer an unsandboxed backend without `--allow-unsandboxed`, and a replica lets a
//! caller pick one only when an operator granted it: admin, a token's `backends`, a JWT's
//! `berth_backends`) and portability (where a workspace's files live).

/// Backends that run the caller's commands on the host as the node agent's user, with no
/// sandbox between them and the node's secrets and other tenants' files.
pub const UNSANDBOXED_BACKENDS: &[&str] = &["local"];

/// True when `backend` isolates nothing (see [`UNSANDBOXED_BACKENDS`]).
pub fn is_unsandboxed(backend: &str) -> bool {
    UNSANDBOXED_BACKENDS.contains(&backend)
}

/// Backends whose workspaces live in a provider's sandbox, found by label, not on a node's
/// disk: a gateway that dies or drains leaves the sandbox where another gateway offering
/// the backend adopts it with its files, at once (no lost-node grace).
pub const PORTABLE_BACKENDS: &[&str] = &["e2b", "daytona", "opensandbox", "kubernetes"];

/// True when a workspace on `backend` is portable (see [`PORTABLE_BACKENDS`]).
pub fn is_portable(backend: &str) -> bool {
    PORTABLE_BACKENDS.contains(&backend)
}
