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
    /// Host directory holding the workspace's files (created by the caller). A portable
    /// driver (a provider's sandbox holds the files) leaves it alone.
    pub root: &'a Path,
    pub spec: &'a WorkspaceSpec,
    pub placement: Placement<'a>,
}

impl<'a> ProvisionContext<'a> {
    /// A provision outside any placement (tests, tools): generation 0, no owner, not fresh.
    pub fn unplaced(workspace_id: &'a WorkspaceId, root: &'a Path, spec: &'a WorkspaceSpec) -> Self {
        Self { workspace_id, root, spec, placement: Placement::default() }
    }
}

/// Which placement a provision is for. Host drivers ignore it (the node agent fences
/// generations itself); a portable driver writes it to its sandbox's labels and checks the
/// generation there, since another gateway may have adopted the sandbox meanwhile.
#[derive(Clone, Copy, Debug, Default)]
pub struct Placement<'a> {
    /// The bind's generation. A sandbox labelled with a newer one belongs to a newer
    /// placement: `provision` refuses with [`WorkspaceError::SandboxFenced`].
    pub generation: u64,
    /// The workspace's owner (user id), empty for a `global` workspace.
    pub owner: &'a str,
    /// The id had no workspace when the replica placed it: a sandbox found under its labels
    /// is an orphan (a deleted workspace's, or an unrecorded bind's) and is never adopted.
    pub fresh: bool,
}

/// A provider sandbox carrying this cluster's labels, as the janitor sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelledSandbox {
    /// The provider's own id of the sandbox (what `remove_labelled` deletes).
    pub provider_id: String,
    /// The workspace its labels name (`None` when the label is unreadable).
    pub workspace_id: Option<WorkspaceId>,
    /// Its `berth.generation` label (0 when missing).
    pub generation: u64,
    /// When the provider created it, milliseconds since the epoch (0 when unknown).
    pub created_at_ms: i64,
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

    /// [`provision`](Self::provision), also saying whether the workspace's data already
    /// existed (`Some(true)`: an existing sandbox was adopted; `Some(false)`: one was made,
    /// empty). Host drivers answer `None`: their data is a directory the node agent owns and
    /// accounts for itself. Portable drivers override this; the node reports a sandbox made
    /// empty for a workspace that had one, so the workspace says its files were lost.
    async fn provision_reporting(&self, context: ProvisionContext<'_>) -> Result<(BackendRef, Option<bool>)> {
        Ok((self.provision(context).await?, None))
    }

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

    // ---- warm pool ------------------------------------------------------------------------

    /// Brings the warm pool (runtimes made ahead of time for no workspace, which a provision
    /// of a fresh workspace with the pool's spec claims instead of making one) to `target`
    /// ready ones, making or removing some (0 empties it), and says where it stands.
    /// Drivers without a pool answer an empty level.
    async fn fill_pool(&self, _target: usize) -> Result<PoolLevel> {
        Ok(PoolLevel::default())
    }

    // ---- portable (cloud) drivers -----------------------------------------------------

    /// Whether a workspace's files live outside this node, in a provider's sandbox found by
    /// its labels: when this node (a gateway) goes, another gateway adopts the sandbox with
    /// its data, without the data-node grace period. Host drivers: `false`.
    fn portable(&self) -> bool {
        false
    }

    /// Drops this node's handles to a workspace that a newer placement adopted elsewhere,
    /// without touching the sandbox (it is the newer gateway's now). Only called for
    /// portable drivers; the default does nothing.
    async fn forget(&self, _workspace_id: &WorkspaceId) -> Result<()> {
        Ok(())
    }

    /// Every sandbox at the provider carrying this cluster's labels (the cluster's key
    /// prefix), for the janitor that removes those without a registry record.
    async fn list_labelled(&self) -> Result<Vec<LabelledSandbox>> {
        Ok(Vec::new())
    }

    /// Deletes one sandbox `list_labelled` returned (and, where the provider keeps them
    /// apart, its volume). Safe on a sandbox that is already gone.
    async fn remove_labelled(&self, _sandbox: &LabelledSandbox) -> Result<()> {
        Ok(())
    }
}

/// A driver's warm pool, as [`BackendDriver::fill_pool`] left it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolLevel {
    /// Runtimes ready to be claimed.
    pub ready: usize,
    /// Provisions served from the pool since the driver started.
    pub claimed: u64,
}
