//! Lifecycle of workspaces on one node: a `BackendDriver` per backend kind creates, stops
//! and removes runtimes; the node agent owns the data directories and the bookkeeping.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;

use crate::backend::BackendRef;
use crate::error::Result;
use crate::id::WorkspaceId;
use crate::spec::WorkspaceSpec;

pub type BackendDriverRef = Arc<dyn BackendDriver>;

/// What a driver needs to bring one workspace up.
#[derive(Clone, Copy, Debug)]
pub struct ProvisionContext<'a> {
    pub workspace_id: &'a WorkspaceId,
    /// Host directory holding the workspace's files (created by the caller).
    pub root: &'a Path,
    pub spec: &'a WorkspaceSpec,
}

/// Creates and tears down the runtime of workspaces of one backend kind.
///
/// Guarantees: `provision` is idempotent per workspace id (a second call returns a handle to
/// the same runtime; a stopped runtime is started again); `release` stops the runtime and
/// keeps the data; `destroy` removes the runtime (the caller removes the data directory).
/// All three are safe to call for a workspace the driver does not know.
#[async_trait]
pub trait BackendDriver: Send + Sync {
    fn name(&self) -> &'static str;

    async fn provision(&self, context: ProvisionContext<'_>) -> Result<BackendRef>;

    async fn release(&self, workspace_id: &WorkspaceId) -> Result<()>;

    async fn destroy(&self, workspace_id: &WorkspaceId) -> Result<()>;

    /// Runtimes that already exist for this node (e.g. containers labelled with its node id),
    /// so a restarted node agent adopts them instead of creating new ones.
    async fn adopt(&self) -> Result<Vec<WorkspaceId>> {
        Ok(Vec::new())
    }

    /// Whether the runtime of a workspace is up (a local workspace always is).
    async fn is_running(&self, _workspace_id: &WorkspaceId) -> bool {
        true
    }
}
