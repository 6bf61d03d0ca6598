//! Sessions and workspace records: CreateSession, Get/Close, Get/List/CloseWorkspace.

use std::sync::Arc;

use berth_proto::convert::{spec_from_proto, spec_to_proto, timestamp_from_unix_ms};
use berth_proto::v1;
use berth_workspace::{WorkspaceId, validate_id};
use tonic::Status;

use crate::binding::{BindRequest, NewWorkspace};
use crate::error::ControlPlaneError;
use crate::node_client::node_request;
use crate::policy::{IsolationPolicy, assign_workspace_id};
use crate::records::{self, RECORD_VERSION, SessionRecord, StoredState, WorkspaceRecord, now_ms};
use crate::router::Router;
use crate::view::EffectiveState;

/// Largest page of ListWorkspaces.
const MAX_PAGE: usize = 1000;

pub struct Sessions {
    router: Arc<Router>,
}

impl Sessions {
    pub fn new(router: Arc<Router>) -> Self {
        Self { router }
    }

    pub async fn create(&self, request: v1::CreateSessionRequest) -> Result<v1::Session, Status> {
        let binder = self.router.binder();
        let user = non_empty_id("user id", &request.user_id)?;
        let agent = non_empty_id("agent id", &request.agent_id)?;
        let session_id = if request.session_id.is_empty() { mint_session_id() } else { request.session_id.clone() };
        validate_id("session id", &session_id).map_err(ControlPlaneError::from)?;
        if !request.backend.is_empty() {
            validate_id("backend", &request.backend).map_err(ControlPlaneError::from)?;
        }
        let spec = spec_from_proto(request.spec);
        spec.validate().map_err(ControlPlaneError::from)?;
        let policy = binder.config.isolation;
        let workspace_id = if request.workspace_id.is_empty() {
            assign_workspace_id(policy, &user, &agent, &session_id)
        } else {
            request.workspace_id.clone()
        };
        let workspace_id = WorkspaceId::new(workspace_id).map_err(ControlPlaneError::from)?;
        let owner = if policy == IsolationPolicy::Global && request.workspace_id.is_empty() {
            String::new()
        } else {
            user.clone()
        };
        let create = NewWorkspace { owner, agent: agent.clone(), policy, backend: request.backend, spec };
        let record = binder
            .ensure_ready(BindRequest { create: Some(create), ..BindRequest::existing(workspace_id.clone()) })
            .await?;

        let session = SessionRecord {
            version: RECORD_VERSION,
            session_id: session_id.clone(),
            user,
            agent,
            workspace_id: record.id.clone(),
            created_at_ms: now_ms(),
        };
        let key = binder.keys.session(&session_id);
        match binder
            .registry
            .create_if_absent(&key, records::encode(&session), 0)
            .await
            .map_err(ControlPlaneError::from)?
        {
            Ok(_) => Ok(session_to_proto(&session)),
            Err(existing) => {
                // Creating a session that exists with the same binding is idempotent.
                let existing: SessionRecord =
                    records::decode(&key, &existing.value).map_err(ControlPlaneError::from)?;
                if existing.user == session.user
                    && existing.agent == session.agent
                    && existing.workspace_id == session.workspace_id
                {
                    Ok(session_to_proto(&existing))
                } else {
                    Err(ControlPlaneError::SessionConflict { session_id }.into())
                }
            }
        }
    }

    pub async fn get(&self, session_id: &str) -> Result<v1::Session, Status> {
        Ok(session_to_proto(&self.read_session(session_id).await?))
    }

    async fn read_session(&self, session_id: &str) -> Result<SessionRecord, Status> {
        let binder = self.router.binder();
        validate_id("session id", session_id).map_err(ControlPlaneError::from)?;
        let key = binder.keys.session(session_id);
        let found = binder.registry.get(&key).await.map_err(ControlPlaneError::from)?;
        let kv = found.ok_or_else(|| ControlPlaneError::SessionNotFound(session_id.to_owned()))?;
        Ok(records::decode(&key, &kv.value).map_err(ControlPlaneError::from)?)
    }

    pub async fn close(&self, session_id: &str) -> Result<v1::CloseSessionResponse, Status> {
        let binder = self.router.binder();
        validate_id("session id", session_id).map_err(ControlPlaneError::from)?;
        if !binder.registry.delete(&binder.keys.session(session_id)).await.map_err(ControlPlaneError::from)? {
            return Err(ControlPlaneError::SessionNotFound(session_id.to_owned()).into());
        }
        Ok(v1::CloseSessionResponse {})
    }

    /// The workspace record: from the view, else a linearizable read (a workspace created
    /// a moment ago through another replica may not be in our view yet).
    pub async fn record(&self, workspace_id: &WorkspaceId) -> Result<Arc<WorkspaceRecord>, Status> {
        let binder = self.router.binder();
        if let Some(entry) = binder.view.workspace(workspace_id.as_str()) {
            return Ok(entry.record);
        }
        let (found, _) = binder.read_record(&binder.keys.workspace(workspace_id)).await?;
        match found {
            Some((record, _)) => Ok(Arc::new(record)),
            None => Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()).into()),
        }
    }

    pub async fn get_workspace(&self, workspace_id: &WorkspaceId) -> Result<v1::Workspace, Status> {
        let record = self.record(workspace_id).await?;
        Ok(self.workspace_to_proto(&record))
    }

    pub fn list_workspaces(&self, request: &v1::ListWorkspacesRequest) -> Result<v1::ListWorkspacesResponse, Status> {
        let binder = self.router.binder();
        let page_size = match request.page_size as usize {
            0 => 100,
            size => size.min(MAX_PAGE),
        };
        let mut matching: Vec<Arc<WorkspaceRecord>> = binder
            .view
            .workspaces
            .all()
            .into_iter()
            .map(|entry| entry.record)
            .filter(|record| request.user_id.is_empty() || record.owner == request.user_id)
            .filter(|record| request.agent_id.is_empty() || record.agent == request.agent_id)
            .filter(|record| request.page_token.is_empty() || record.id.as_str() > request.page_token.as_str())
            .collect();
        matching.sort_by(|left, right| left.id.cmp(&right.id));
        let more = matching.len() > page_size;
        matching.truncate(page_size);
        let next_page_token =
            if more { matching.last().map(|record| record.id.to_string()).unwrap_or_default() } else { String::new() };
        Ok(v1::ListWorkspacesResponse {
            workspaces: matching.iter().map(|record| self.workspace_to_proto(record)).collect(),
            next_page_token,
        })
    }

    /// Releases (IDLE, data kept) or destroys (runtime, data and record gone) a workspace,
    /// under its bind lock so it cannot race a bind or the sweeper.
    pub async fn close_workspace(
        &self,
        workspace_id: &WorkspaceId,
        destroy: bool,
    ) -> Result<v1::CloseWorkspaceResponse, Status> {
        let binder = self.router.binder();
        let Some(fence) = binder.try_lock(workspace_id).await? else {
            return Err(berth_proto::meta::mark_retryable(Status::aborted(format!(
                "workspace {workspace_id} is being bound or swept right now; retry"
            ))));
        };
        let lock_key = binder.keys.lock(workspace_id);
        let outcome = self.close_locked(workspace_id, destroy, fence).await;
        if outcome.is_err() || destroy {
            binder.release_lock(&lock_key, fence).await;
        }
        outcome
    }

    async fn close_locked(
        &self,
        workspace_id: &WorkspaceId,
        destroy: bool,
        fence: i64,
    ) -> Result<v1::CloseWorkspaceResponse, Status> {
        let binder = self.router.binder();
        let key = binder.keys.workspace(workspace_id);
        let (found, _) = binder.read_record(&key).await?;
        let Some((mut record, _)) = found else {
            return Err(ControlPlaneError::WorkspaceNotFound(workspace_id.to_string()).into());
        };
        if let Some(node) = record.node_id.as_deref().and_then(|node_id| binder.view.node(node_id)) {
            let mut client = binder.nodes.get(&node.address)?;
            let timeout = binder.config.node_call_timeout;
            let id = workspace_id.to_string();
            if destroy {
                client
                    .destroy(node_request(v1::DestroyRequest { workspace_id: id }, record.generation, timeout))
                    .await?;
            } else {
                client
                    .release(node_request(v1::ReleaseRequest { workspace_id: id }, record.generation, timeout))
                    .await?;
            }
        }
        if destroy {
            // The record goes; the lock is released by the caller.
            binder.registry.delete(&key).await.map_err(ControlPlaneError::from)?;
        } else {
            record.state = StoredState::Idle;
            record.updated_at_ms = now_ms();
            record.changed_by = binder.config.replica_id.clone();
            binder.write_fenced(workspace_id, &record, fence).await?;
        }
        Ok(v1::CloseWorkspaceResponse {})
    }

    pub fn workspace_to_proto(&self, record: &WorkspaceRecord) -> v1::Workspace {
        let state = match self.router.binder().view.effective_state(record) {
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
        }
    }
}

fn non_empty_id(kind: &'static str, value: &str) -> Result<String, Status> {
    validate_id(kind, value).map_err(ControlPlaneError::from)?;
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
