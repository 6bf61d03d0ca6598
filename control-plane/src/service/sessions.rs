//! Sessions and workspace records: CreateSession, Get/Close, Get/List/CloseWorkspace.

use std::sync::Arc;
use std::time::Duration;

use berth_proto::convert::{spec_from_proto, spec_to_proto, timestamp_from_unix_ms};
use berth_proto::v1;
use berth_workspace::{WorkspaceId, validate_id};

use crate::auth::Principal;
use crate::authz::{self, Access, Action, Caller};
use crate::binding::{BindRequest, Binder, NewWorkspace};
use crate::config::ControlPlaneConfig;
use crate::error::ControlPlaneError;
use crate::node_client::{NodeClients, node_request};
use crate::policy::{IsolationPolicy, assign_workspace_id};
use crate::records::{Origin, RECORD_VERSION, SessionRecord, StoredState, TombstoneRecord, WorkspaceRecord, now_ms};
use crate::snapshots::{Snapshots, SnapshotsRef};
use crate::store::{LockFence, SessionCreated, WorkspaceStoreRef};
use crate::view::EffectiveState;

// ShareWorkspace / UnshareWorkspace: more `impl Sessions`.
mod sharing;
// SnapshotWorkspace / ListSnapshots / RestoreWorkspace: more `impl Sessions`.
mod snapshots;

/// Most users one workspace may be shared with (the record is read on every access).
pub const MAX_SHARED_WITH: usize = 256;

/// Largest page of ListWorkspaces.
const MAX_PAGE: usize = 1000;

pub struct Sessions {
    binder: Arc<Binder>,
    store: WorkspaceStoreRef,
    nodes: Arc<NodeClients>,
    access: Access,
    isolation: IsolationPolicy,
    node_call_timeout: Duration,
    snapshots: SnapshotsRef,
    /// How long a node may take for an on-demand snapshot.
    snapshot_timeout: Duration,
}

impl Sessions {
    pub fn new(
        binder: Arc<Binder>,
        store: WorkspaceStoreRef,
        nodes: Arc<NodeClients>,
        access: Access,
        config: &ControlPlaneConfig,
    ) -> Self {
        Self {
            binder,
            store,
            nodes,
            access,
            isolation: config.isolation,
            node_call_timeout: config.node_call_timeout,
            snapshots: Arc::new(Snapshots::disabled()),
            snapshot_timeout: config.provision_timeout,
        }
    }

    /// Snapshot calls, and the deletion of a destroyed workspace's snapshots, use `snapshots`.
    pub fn with_snapshots(mut self, snapshots: SnapshotsRef) -> Self {
        self.snapshots = snapshots;
        self
    }

    pub async fn create(
        &self,
        caller: &Caller,
        request: v1::CreateSessionRequest,
    ) -> Result<v1::Session, ControlPlaneError> {
        // The user comes from the principal; only a service acting for users names another.
        let user = authz::user_for(caller.principal(), &request.user_id)?;
        let effective = acting_as(caller.principal(), &user);
        let agent = non_empty_id("agent id", &request.agent_id)?;
        let session_id = if request.session_id.is_empty() { mint_session_id() } else { request.session_id.clone() };
        validate_id("session id", &session_id)?;
        if !request.backend.is_empty() {
            validate_id("backend", &request.backend)?;
        }
        // Before anything is created or joined: the grant is the principal's own (a service
        // acting for a user brings its grant, not the user's).
        authz::require_backend(caller.principal(), &request.backend)?;
        let spec = spec_from_proto(request.spec);
        spec.validate()?;
        let policy = self.isolation;
        let explicit = !request.workspace_id.is_empty();
        let workspace_id = if explicit {
            request.workspace_id.clone()
        } else {
            assign_workspace_id(policy, &user, &agent, &session_id)
        };
        let workspace_id = WorkspaceId::new(workspace_id)?;
        caller.note_workspace(workspace_id.as_str());
        if explicit {
            match self.access.record(&workspace_id).await? {
                // Joining an existing workspace needs access to it.
                Some(record) => authz::authorize(&effective, &record, Action::Use)?,
                // Policy ids are derivable by anyone: creating one explicitly would squat on
                // another user's future workspace.
                None if is_policy_id(workspace_id.as_str()) => {
                    return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()));
                }
                None => {}
            }
        }
        let owner = if policy == IsolationPolicy::Global && !explicit { String::new() } else { user.clone() };
        // A workspace that does not exist yet counts against its owner's quota; the slot is
        // held until the bind has written the record (see `quota.rs` for the window). The
        // view says whether it is new; only a refusal is checked against the registry (a
        // workspace made a moment ago through another replica is not new). A read per call
        // made a first-session storm 1000 linearizable etcd reads that starved its bind.
        let _create_slot = match self.store.cached(&workspace_id) {
            Some(_) => None,
            None => match self.access.create_slot(&owner, &workspace_id) {
                Ok(slot) => slot,
                Err(refused) => match self.access.record(&workspace_id).await? {
                    Some(_) => None,
                    None => return Err(refused),
                },
            },
        };
        let any_backend = caller.principal().may_use_any_backend();
        let create = NewWorkspace { owner, agent: agent.clone(), policy, backend: request.backend, spec, any_backend };
        let mut bind = BindRequest { create: Some(create), ..BindRequest::existing(workspace_id.clone()) };
        let mut attempts = 0;
        let (session, created) = loop {
            attempts += 1;
            let record = self.binder.ensure_ready(bind.clone()).await?;
            // Checked again on what the bind returned: a concurrent create of the same
            // explicit id by someone else wins the record, and then this caller must not get it.
            authz::authorize(&effective, &record, Action::Use)?;
            let session = SessionRecord {
                version: RECORD_VERSION,
                session_id: session_id.clone(),
                user: user.clone(),
                agent: agent.clone(),
                workspace_id: record.id.clone(),
                created_at_ms: now_ms(),
            };
            match self.store.create_session(&session).await? {
                // The view still had a workspace another replica deleted (e.g. right after
                // a partition healed): bind again from the registry, once.
                SessionCreated::WorkspaceGone if attempts == 1 => bind.linearizable = true,
                SessionCreated::WorkspaceGone => {
                    return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()));
                }
                created => break (session, created),
            }
        };
        match created {
            SessionCreated::Created | SessionCreated::WorkspaceGone => Ok(session_to_proto(&session)),
            SessionCreated::Exists(existing) => {
                // Creating a session that exists with the same binding is idempotent.
                if existing.user == session.user
                    && existing.agent == session.agent
                    && existing.workspace_id == session.workspace_id
                {
                    Ok(session_to_proto(&existing))
                } else {
                    Err(ControlPlaneError::SessionConflict { session_id })
                }
            }
        }
    }

    pub async fn get(&self, caller: &Caller, session_id: &str) -> Result<v1::Session, ControlPlaneError> {
        let session = self.read_session(session_id).await?;
        caller.note_workspace(session.workspace_id.as_str());
        authz::authorize_session(caller.principal(), &session)?;
        Ok(session_to_proto(&session))
    }

    async fn read_session(&self, session_id: &str) -> Result<SessionRecord, ControlPlaneError> {
        validate_id("session id", session_id)?;
        let found = self.store.session(session_id).await?;
        found.ok_or_else(|| ControlPlaneError::SessionNotFound(session_id.to_owned()))
    }

    pub async fn close(
        &self,
        caller: &Caller,
        session_id: &str,
    ) -> Result<v1::CloseSessionResponse, ControlPlaneError> {
        let session = self.read_session(session_id).await?;
        caller.note_workspace(session.workspace_id.as_str());
        authz::authorize_session(caller.principal(), &session)?;
        if !self.store.delete_session(session_id).await? {
            return Err(ControlPlaneError::SessionNotFound(session_id.to_owned()));
        }
        Ok(v1::CloseSessionResponse {})
    }

    pub async fn get_workspace(&self, caller: &Caller, workspace_id: &str) -> Result<v1::Workspace, ControlPlaneError> {
        let (_, record) = self.access.workspace(caller, workspace_id, Action::View).await?;
        Ok(self.workspace_for(caller, &record))
    }

    /// Lists what the caller may see, nothing else (not even a count).
    pub fn list_workspaces(
        &self,
        caller: &Caller,
        request: &v1::ListWorkspacesRequest,
    ) -> Result<v1::ListWorkspacesResponse, ControlPlaneError> {
        let page_size = match request.page_size as usize {
            0 => 100,
            size => size.min(MAX_PAGE),
        };
        // A range scan from the page token: paging through the whole view is linear.
        let (matching, more) = self.store.workspace_page(&request.page_token, page_size, |record| {
            (request.user_id.is_empty() || record.owner == request.user_id)
                && (request.agent_id.is_empty() || record.agent == request.agent_id)
                && authz::authorize(caller.principal(), record, Action::View).is_ok()
        });
        let next_page_token =
            if more { matching.last().map(|record| record.id.to_string()).unwrap_or_default() } else { String::new() };
        Ok(v1::ListWorkspacesResponse {
            workspaces: matching.iter().map(|record| self.workspace_for(caller, record)).collect(),
            next_page_token,
        })
    }

    /// Releases (IDLE, data kept) or destroys (runtime, data and record gone) a workspace,
    /// under its bind lock so it cannot race a bind or the sweeper.
    pub async fn close_workspace(
        &self,
        caller: &Caller,
        workspace_id: &str,
        destroy: bool,
    ) -> Result<v1::CloseWorkspaceResponse, ControlPlaneError> {
        let (workspace_id, _) = self.access.workspace(caller, workspace_id, Action::Manage).await?;
        let workspace_id = &workspace_id;
        let Some(fence) = self.store.try_lock(workspace_id).await? else {
            return Err(ControlPlaneError::LockBusy { workspace_id: workspace_id.to_string() });
        };
        let outcome = self.close_locked(workspace_id, destroy, fence).await;
        if outcome.is_err() {
            // On success the fenced write or delete already deleted the lock.
            self.store.release_lock(workspace_id, fence).await;
        }
        outcome
    }

    async fn close_locked(
        &self,
        workspace_id: &WorkspaceId,
        destroy: bool,
        fence: LockFence,
    ) -> Result<v1::CloseWorkspaceResponse, ControlPlaneError> {
        let Some(mut record) = self.store.load(workspace_id).await? else {
            return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()));
        };
        // Every node call names the recorded generation: a node holding a newer copy
        // refuses it, so a replica that lost its lock meanwhile cannot touch that copy.
        let node = record.node_id.as_deref().and_then(|node_id| self.store.node(node_id));
        let timeout = self.node_call_timeout;
        let id = workspace_id.to_string();
        if destroy {
            // The record's delete is the commit point and comes first, with a tombstone in
            // the same fenced transaction: until the node confirms its copy gone, that copy
            // is quarantined when the node reports it, and a new workspace of this id never
            // adopts it. Destroying on the node first left, when the delete then failed (the
            // replica lost etcd), a record whose files were gone: the workspace came back
            // empty saying FRESH.
            let tombstone = record.node_id.as_ref().map(|node_id| TombstoneRecord {
                version: RECORD_VERSION,
                workspace_id: workspace_id.clone(),
                generation: record.generation,
                node_id: Some(node_id.clone()),
                deleted_at_ms: now_ms(),
            });
            let revision = self.store.delete_fenced(workspace_id, fence, tombstone.as_ref()).await?;
            // Its snapshots go with it (their blobs with the sweeper's next collection).
            self.snapshots.delete_workspace(workspace_id.as_str()).await;
            let Some(node) = &node else { return Ok(v1::CloseWorkspaceResponse {}) };
            // The node removes the files at once (an owner's delete); a node that does not
            // answer keeps them until it reports the copy (then they are quarantined).
            let mut client = self.nodes.get(&node.node_id, &node.address)?;
            let request = node_request(v1::DestroyRequest { workspace_id: id }, record.generation, timeout);
            match client.destroy(request).await {
                Ok(_) => {
                    if let Err(error) = self.store.delete_tombstone(workspace_id, revision).await {
                        // A few bytes that the heartbeat reconciliation removes later.
                        tracing::info!(ws_id = %workspace_id, %error, "tombstone kept; the node's next report removes it");
                    }
                }
                Err(status) => {
                    tracing::warn!(ws_id = %workspace_id, node_id = %node.node_id, error = %status.message(),
                        "workspace deleted; its node did not remove the copy now, the tombstone covers it");
                }
            }
        } else {
            if let Some(node) = &node {
                let mut client = self.nodes.get(&node.node_id, &node.address)?;
                let response = client
                    .release(node_request(v1::ReleaseRequest { workspace_id: id }, record.generation, timeout))
                    .await?;
                crate::snapshots::apply_taken(&mut record, &node.node_id, response.into_inner().snapshot);
            }
            record.state = StoredState::Idle;
            record.updated_at_ms = now_ms();
            record.changed_by = self.store.replica_id().to_owned();
            self.store.write_fenced(&record, fence).await?;
        }
        Ok(v1::CloseWorkspaceResponse {})
    }

    /// The workspace as `caller` may see it: the spec's env values (often credentials the
    /// owner handed its agent) only for the owner and admins; anyone else it is shared with,
    /// or who sees a `global` workspace, gets the names with [`REDACTED`] values.
    pub fn workspace_for(&self, caller: &Caller, record: &WorkspaceRecord) -> v1::Workspace {
        let mut workspace = self.workspace_to_proto(record);
        let principal = caller.principal();
        if !principal.is_admin()
            && principal.user() != record.owner
            && let Some(spec) = workspace.spec.as_mut()
        {
            spec.env.values_mut().for_each(|value| *value = REDACTED.to_owned());
        }
        workspace
    }

    pub fn workspace_to_proto(&self, record: &WorkspaceRecord) -> v1::Workspace {
        let state = match self.store.effective_state(record) {
            EffectiveState::Ready => v1::WorkspaceState::Ready,
            EffectiveState::Idle => v1::WorkspaceState::Idle,
            EffectiveState::Lost => v1::WorkspaceState::Lost,
            EffectiveState::Failed => v1::WorkspaceState::Failed,
        };
        v1::Workspace {
            workspace_id: record.id.to_string(),
            owner_user_id: record.owner.clone(),
            agent_id: record.agent.clone(),
            policy: policy_to_proto(record.policy) as i32,
            backend: record.backend.clone(),
            spec: Some(spec_to_proto(&record.spec)),
            state: state as i32,
            node_id: record.node_id.clone().unwrap_or_default(),
            generation: record.generation,
            created_at: Some(timestamp_from_unix_ms(record.created_at_ms)),
            updated_at: Some(timestamp_from_unix_ms(record.updated_at_ms)),
            failure: record.failure.clone().unwrap_or_default(),
            shared_with: record.shared_with.clone(),
            origin_generation: record.origin_generation,
            ..origin_to_proto(&record.origin)
        }
    }
}

/// What a spec env value reads as for callers other than the owner and admins.
pub const REDACTED: &str = "<redacted>";

/// The origin fields of a Workspace answer (every other field default).
pub fn origin_to_proto(origin: &Origin) -> v1::Workspace {
    let (origin, reason, snapshot_id, snapshot_time) = match origin {
        Origin::Unknown => (v1::WorkspaceOrigin::Unspecified, "", "", None),
        Origin::Fresh => (v1::WorkspaceOrigin::Fresh, "", "", None),
        Origin::Resumed => (v1::WorkspaceOrigin::Resumed, "", "", None),
        Origin::Restored { snapshot_id, taken_at_ms } => {
            (v1::WorkspaceOrigin::Restored, "", snapshot_id.as_str(), Some(timestamp_from_unix_ms(*taken_at_ms)))
        }
        Origin::RecreatedEmpty { reason } => (v1::WorkspaceOrigin::RecreatedEmpty, reason.as_str(), "", None),
    };
    v1::Workspace {
        origin: origin as i32,
        origin_reason: reason.to_owned(),
        origin_snapshot_id: snapshot_id.to_owned(),
        origin_snapshot_time: snapshot_time,
        ..Default::default()
    }
}

/// The principal as checked for `user`: a principal acting for users is checked as the
/// user it names (body `user_id` or `x-berth-act-as`).
fn acting_as(principal: &Principal, user: &str) -> Principal {
    if principal.may_act_for_users() {
        Principal { acting_for: Some(user.to_owned()), ..principal.clone() }
    } else {
        principal.clone()
    }
}

/// Whether `id` has the form of an id the isolation policy assigns (`ws-` + 64 hex digits).
pub fn is_policy_id(id: &str) -> bool {
    id.strip_prefix("ws-").is_some_and(|hash| hash.len() == 64 && hash.bytes().all(|byte| byte.is_ascii_hexdigit()))
}

fn non_empty_id(kind: &'static str, value: &str) -> Result<String, ControlPlaneError> {
    validate_id(kind, value)?;
    Ok(value.to_owned())
}

fn mint_session_id() -> String {
    format!("sess-{}", hex::encode(rand::random::<[u8; 16]>()))
}

fn session_to_proto(session: &SessionRecord) -> v1::Session {
    v1::Session {
        session_id: session.session_id.clone(),
        workspace_id: session.workspace_id.to_string(),
        user_id: session.user.clone(),
        agent_id: session.agent.clone(),
        created_at: Some(timestamp_from_unix_ms(session.created_at_ms)),
    }
}

pub fn policy_to_proto(policy: IsolationPolicy) -> v1::IsolationPolicy {
    match policy {
        IsolationPolicy::PerAgent => v1::IsolationPolicy::PerAgent,
        IsolationPolicy::PerSession => v1::IsolationPolicy::PerSession,
        IsolationPolicy::PerUser => v1::IsolationPolicy::PerUser,
        IsolationPolicy::Global => v1::IsolationPolicy::Global,
    }
}
