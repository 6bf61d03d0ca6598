//! What every call on one sandbox needs (its execd, scripts, paths and users), shared by the
//! backend, its files and its processes.

use std::collections::BTreeMap;

use crate::execd::Execd;
use crate::scripts::Scripts;

/// What every call on one sandbox needs.
pub(crate) struct Sandbox {
    pub sandbox_id: String,
    pub execd: Execd,
    pub scripts: Scripts,
    pub workspace_dir: String,
    pub state_dir: String,
    pub agent_user: (u32, u32),
    pub secret_holder_user: (u32, u32),
    /// The workspace spec's env, given to every agent process.
    pub env: BTreeMap<String, String>,
}
