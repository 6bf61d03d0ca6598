//! ShareWorkspace / UnshareWorkspace: the workspace record's `shared_with`, changed under
//! the bind lock and written with the fencing transaction like every record change.

use berth_proto::v1;
use berth_workspace::{WorkspaceId, validate_id};
use tonic::Status;

use super::Sessions;
use crate::authz::{self, Action, Caller};
use crate::error::ControlPlaneError;
use crate::records::now_ms;

/// Most users one workspace may be shared with (the record is read on every access).
pub const MAX_SHARED_WITH: usize = 256;

impl Sessions {
    /// Adds (`share`) or removes `user` from the workspace's `shared_with`. Owner or admin
    /// only; idempotent.
    pub async fn set_shared(
        &self,
        caller: &Caller,
        workspace_id: &str,
        user: &str,
        share: bool,
    ) -> Result<v1::Workspace, Status> {
        let (workspace_id, _) = self.access.workspace(caller, workspace_id, Action::Manage).await?;
        validate_id("user id", user).map_err(ControlPlaneError::from)?;
        let binder = self.router.binder();
        let Some(fence) = binder.try_lock(&workspace_id).await? else {
            return Err(berth_proto::meta::mark_retryable(Status::aborted(format!(
                "workspace {workspace_id} is being bound or swept right now; retry"
            ))));
        };
        let outcome = self.set_shared_locked(caller, &workspace_id, user, share, fence).await;
        if outcome.is_err() {
            // On success the fenced write already deleted the lock.
            binder.release_lock(&binder.keys.lock(&workspace_id), fence).await;
        }
        outcome
    }

    async fn set_shared_locked(
        &self,
        caller: &Caller,
        workspace_id: &WorkspaceId,
        user: &str,
        share: bool,
        fence: i64,
    ) -> Result<v1::Workspace, Status> {
        let binder = self.router.binder();
        let (found, _) = binder.read_record(&binder.keys.workspace(workspace_id)).await?;
        let Some((mut record, _)) = found else {
            return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()).into());
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
                    })
                    .into());
                }
                record.shared_with.push(user.to_owned());
                record.shared_with.sort();
            }
            (false, true) => record.shared_with.retain(|shared| shared != user),
            // Nothing to change: free the lock, answer with the record as it is.
            _ => {
                binder.release_lock(&binder.keys.lock(workspace_id), fence).await;
                return Ok(self.workspace_to_proto(&record));
            }
        }
        record.updated_at_ms = now_ms();
        record.changed_by = binder.config.replica_id.clone();
        binder.write_fenced(workspace_id, &record, fence).await?;
        // Read back into this replica's view, so a revocation holds here at once (other
        // replicas follow through their watch within moments).
        let (found, _) = binder.read_record(&binder.keys.workspace(workspace_id)).await?;
        Ok(self.workspace_to_proto(found.map(|(fresh, _)| fresh).as_ref().unwrap_or(&record)))
    }
}
