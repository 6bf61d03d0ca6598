//! ShareWorkspace / UnshareWorkspace: the workspace record's `shared_with`, changed under
//! the bind lock and written with the fencing transaction like every record change.

use berth_proto::v1;
use berth_workspace::{WorkspaceId, validate_id};

use super::{MAX_SHARED_WITH, Sessions};
use crate::authz::{self, Action, Caller};
use crate::error::ControlPlaneError;
use crate::records::now_ms;
use crate::store::LockFence;

impl Sessions {
    /// Adds (`share`) or removes `user` from the workspace's `shared_with`. Owner or admin
    /// only; idempotent.
    pub async fn set_shared(
        &self,
        caller: &Caller,
        workspace_id: &str,
        user: &str,
        share: bool,
    ) -> Result<v1::Workspace, ControlPlaneError> {
        let (workspace_id, _) = self.access.workspace(caller, workspace_id, Action::Manage).await?;
        validate_id("user id", user)?;
        let Some(fence) = self.store.try_lock(&workspace_id).await? else {
            return Err(ControlPlaneError::LockBusy { workspace_id: workspace_id.to_string() });
        };
        let outcome = self.set_shared_locked(caller, &workspace_id, user, share, fence).await;
        if outcome.is_err() {
            // On success the fenced write already deleted the lock.
            self.store.release_lock(&workspace_id, fence).await;
        }
        outcome
    }

    async fn set_shared_locked(
        &self,
        caller: &Caller,
        workspace_id: &WorkspaceId,
        user: &str,
        share: bool,
        fence: LockFence,
    ) -> Result<v1::Workspace, ControlPlaneError> {
        let Some(mut record) = self.store.load(workspace_id).await? else {
            return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()));
        };
        // Re-checked on the record read under the lock.
        authz::authorize(caller.principal(), &record, Action::Manage)?;
        let present = record.shared_with.iter().any(|shared| shared == user);
        match (share, present) {
            (true, false) => {
                if record.shared_with.len() >= MAX_SHARED_WITH {
                    return Err(ControlPlaneError::from(berth_workspace::WorkspaceError::LimitExceeded {
                        limit: "users a workspace is shared with",
                        size: record.shared_with.len() as u64 + 1,
                        max: MAX_SHARED_WITH as u64,
                    }));
                }
                record.shared_with.push(user.to_owned());
                record.shared_with.sort();
            }
            (false, true) => record.shared_with.retain(|shared| shared != user),
            // Nothing to change: free the lock, answer with the record as it is.
            _ => {
                self.store.release_lock(workspace_id, fence).await;
                return Ok(self.workspace_for(caller, &record));
            }
        }
        record.updated_at_ms = now_ms();
        record.changed_by = self.store.replica_id().to_owned();
        self.store.write_fenced(&record, fence).await?;
        // Read back into this replica's view, so a revocation holds here at once (other
        // replicas follow through their watch within moments).
        let fresh = self.store.load(workspace_id).await?;
        Ok(self.workspace_for(caller, fresh.as_ref().unwrap_or(&record)))
    }
}
