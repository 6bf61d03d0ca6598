//! The check in front of every workspace call on a node: the node must not be fenced (lost
//! lease), must hold the workspace, and at the generation the replica names
//! (`x-berth-generation`); otherwise a typed status tells the replica to re-read and retry.

use std::sync::Arc;

use berth_proto::convert::status_from_workspace_error;
use berth_proto::meta::{self, ErrorKind};
use berth_workspace::{BackendRef, WorkspaceId};
use tonic::Status;
use tonic::metadata::MetadataMap;

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
            return Err(ErrorKind::NodeFenced.attach(Status::unavailable("node has lost its lease and is not serving")));
        }
        Ok(())
    }

    /// Admits a call about `workspace_id` carrying `metadata`: not fenced, the workspace
    /// held here at the generation the caller expects (when it names one) and running.
    pub fn admit(&self, metadata: &MetadataMap, workspace_id: &str) -> Result<Admitted, Status> {
        self.check_serving()?;
        let id = WorkspaceId::new(workspace_id).map_err(|error| status_from_workspace_error(&error))?;
        berth_proto::trace::record_workspace(id.as_str());
        let expected = metadata
            .get(meta::GENERATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.parse::<u64>().ok());
        let wrong = |detail: String| ErrorKind::WrongGeneration.attach(Status::failed_precondition(detail));
        let entry =
            self.workspaces.get(&id).ok_or_else(|| wrong(format!("workspace {id} is not provisioned on this node")))?;
        if let Some(expected) = expected
            && expected != entry.generation
        {
            return Err(wrong(format!(
                "workspace {id} is at generation {} on this node, not {expected}",
                entry.generation
            )));
        }
        let backend = entry.backend.clone().ok_or_else(|| wrong(format!("workspace {id} is released on this node")))?;
        entry.touch();
        Ok(Admitted { entry, backend })
    }
}
