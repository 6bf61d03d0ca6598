//! Start-up: the trees of restores a killed node left unfinished removed, the state files
//! read back into entries, the runtimes of the workspaces marked running brought back, and
//! the generation floors reloaded.

use std::path::Path;
use std::sync::atomic::{AtomicI64, AtomicU32};

use berth_workspace::{Placement, ProvisionContext, WorkspaceError, WorkspaceId};

use super::{Entry, Meta, Workspaces, now_ms};
use crate::limits::NodeLimits;

impl Workspaces {
    /// Loads the state files and brings back the runtimes that should run, under today's
    /// defaults and ceilings (`limits`): a spec stored before the operator lowered a
    /// ceiling is brought down to it (and logged), not left above it.
    pub async fn restore(&self, limits: &NodeLimits) -> Result<(), WorkspaceError> {
        let state_dir = self.data_dir.join("state");
        tokio::fs::create_dir_all(&state_dir).await.map_err(|source| WorkspaceError::Io {
            op: "create",
            path: state_dir.display().to_string(),
            source,
        })?;
        // 0700: state files hold workspace specs, their env (API keys...) included; no
        // sandbox uid may read them, even one that got out of its sandbox.
        tokio::fs::set_permissions(&state_dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .await
            .map_err(|source| WorkspaceError::Io { op: "chmod 0700", path: state_dir.display().to_string(), source })?;
        tokio::fs::create_dir_all(self.data_dir.join("workspaces")).await.map_err(|source| WorkspaceError::Io {
            op: "create",
            path: "workspaces".into(),
            source,
        })?;
        self.remove_unfinished_restores().await;
        let mut listing = tokio::fs::read_dir(&state_dir).await.map_err(|source| WorkspaceError::Io {
            op: "list",
            path: state_dir.display().to_string(),
            source,
        })?;
        while let Ok(Some(file)) = listing.next_entry().await {
            let path = file.path();
            if path.extension().and_then(|extension| extension.to_str()) == Some("floor") {
                self.restore_floor(&path).await;
                continue;
            }
            if path.extension().and_then(|extension| extension.to_str()) != Some("json") {
                continue;
            }
            match self.restore_one(&path, limits).await {
                Ok(id) => tracing::info!(ws_id = %id, "restored workspace"),
                Err(error) => tracing::warn!(path = %path.display(), %error, "skipping a workspace state file"),
            }
        }
        Ok(())
    }

    /// A restore from a snapshot writes beside the workspace (`.ID.restore-…`) and renames
    /// into place only when complete, so a node killed mid-restore leaves that partial tree
    /// behind. Nothing restores while the node starts: each one found is removed.
    async fn remove_unfinished_restores(&self) {
        let workspaces = self.data_dir.join("workspaces");
        let Ok(mut listing) = tokio::fs::read_dir(&workspaces).await else { return };
        while let Ok(Some(item)) = listing.next_entry().await {
            let name = item.file_name();
            let named = name
                .to_str()
                .and_then(berth_snapshot::staging_target)
                .is_some_and(|target| WorkspaceId::new(target).is_ok());
            if !named || !item.file_type().await.is_ok_and(|kind| kind.is_dir()) {
                continue;
            }
            let path = item.path();
            match tokio::fs::remove_dir_all(&path).await {
                Ok(()) => tracing::warn!(path = %path.display(), "removed the tree of a restore that never finished"),
                Err(error) => {
                    tracing::warn!(path = %path.display(), %error, "could not remove the tree of an unfinished restore")
                }
            }
        }
    }

    async fn restore_floor(&self, path: &Path) {
        let id = path.file_stem().and_then(|stem| stem.to_str()).and_then(|stem| WorkspaceId::new(stem).ok());
        let floor = tokio::fs::read_to_string(path).await.ok().and_then(|text| text.trim().parse::<u64>().ok());
        match (id, floor) {
            (Some(id), Some(floor)) => {
                self.floors.write().unwrap_or_else(|poisoned| poisoned.into_inner()).insert(id, floor);
            }
            _ => tracing::warn!(path = %path.display(), "skipping an unreadable generation floor"),
        }
    }

    async fn restore_one(&self, path: &Path, limits: &NodeLimits) -> Result<WorkspaceId, WorkspaceError> {
        let bytes = tokio::fs::read(path).await.map_err(|source| WorkspaceError::Io {
            op: "read",
            path: path.display().to_string(),
            source,
        })?;
        let mut meta: Meta = serde_json::from_slice(&bytes)
            .map_err(|error| WorkspaceError::Corrupt { what: path.display().to_string(), reason: error.to_string() })?;
        let lowered = limits.clamp_spec(&mut meta.spec);
        if !lowered.is_empty() {
            tracing::warn!(ws_id = %meta.workspace_id, ?lowered, "restored workspace brought under today's ceilings");
        }
        let backend = if meta.running {
            let driver = self.driver(&meta.backend)?;
            let root = self.root_of(&meta.workspace_id);
            let placement = Placement { generation: meta.generation, owner: &meta.owner, fresh: false };
            let context =
                ProvisionContext { workspace_id: &meta.workspace_id, root: &root, spec: &meta.spec, placement };
            Some(driver.provision(context).await?)
        } else {
            None
        };
        let id = meta.workspace_id.clone();
        self.insert(Entry {
            id: meta.workspace_id,
            generation: meta.generation,
            backend_name: meta.backend,
            spec: meta.spec,
            owner: meta.owner,
            backend,
            last_access_ms: AtomicI64::new(now_ms()),
            execs_in_flight: AtomicU32::new(0),
            last_snapshot_ms: AtomicI64::new(0),
        });
        Ok(id)
    }
}
