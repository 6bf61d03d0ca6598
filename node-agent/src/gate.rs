//! The check in front of every workspace call on a node: the node must not be fenced (lost
//! lease), must hold the workspace, and at the generation the replica names
//! (`x-berth-generation`); otherwise a typed status tells the replica to re-read and retry.

use std::sync::Arc;

use berth_proto::meta;
use berth_workspace::{BackendRef, WorkspaceId};
use tonic::Status;
use tonic::metadata::MetadataMap;

use crate::error::{NodeError, status};
use crate::fence::Fence;
use crate::state::{Entry, Workspaces};

/// A workspace call that passed the gate: the workspace, held here at the generation the
/// replica expects, and its running backend.
pub struct Admitted {
    pub entry: Arc<Entry>,
    pub backend: BackendRef,
}

impl Admitted {
    pub fn id(&self) -> &WorkspaceId {
        &self.entry.id
    }
}

pub struct Gate {
    workspaces: Arc<Workspaces>,
    fence: Arc<Fence>,
}

impl Gate {
    pub fn new(workspaces: Arc<Workspaces>, fence: Arc<Fence>) -> Self {
        Self { workspaces, fence }
    }

    pub fn workspaces(&self) -> &Arc<Workspaces> {
        &self.workspaces
    }

    /// Fails while the node is fenced: its lease may be gone, another node may hold its
    /// workspaces by now.
    pub fn check_serving(&self) -> Result<(), Status> {
        if self.fence.is_fenced() {
            return Err(NodeError::Fenced.into());
        }
        Ok(())
    }

    /// Admits a call about `workspace_id` carrying `metadata`: not fenced, the workspace
    /// held here at the generation the caller expects (when it names one) and running.
    pub fn admit(&self, metadata: &MetadataMap, workspace_id: &str) -> Result<Admitted, Status> {
        self.check_serving()?;
        let id = WorkspaceId::new(workspace_id).map_err(status)?;
        berth_proto::trace::record_workspace(id.as_str());
        let expected = metadata
            .get(meta::GENERATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        let entry = self.workspaces.get(&id).ok_or_else(|| NodeError::NotHeld { workspace_id: id.clone() })?;
        if let Some(expected) = expected
            && expected != entry.generation
        {
            return Err(NodeError::WrongGeneration { workspace_id: id, held: entry.generation, expected }.into());
        }
        let backend = entry.backend.clone().ok_or_else(|| NodeError::Released { workspace_id: id.clone() })?;
        entry.touch();
        Ok(Admitted { entry, backend })
    }
}
