//! Authorization: what an authenticated [`Principal`] may do. Every check lives here.
//!
//! Rules (docs/design.md §5; the test `tests/authz_matrix.rs` holds the full matrix):
//!
//! | who (as `principal.user()`)           | View | Use (exec, files…) | Manage (close, share) |
//! |---------------------------------------|------|--------------------|-----------------------|
//! | admin (and `--auth none`)             | yes  | yes                | yes                   |
//! | owner                                 | yes  | yes                | yes                   |
//! | a user it was shared with             | yes  | yes                | PERMISSION_DENIED     |
//! | anyone, on a `global` workspace       | yes  | yes                | PERMISSION_DENIED     |
//! | anyone else                           | NOT_FOUND | NOT_FOUND     | NOT_FOUND             |
//!
//! A workspace the caller may not see answers NOT_FOUND with the very message of a missing
//! one, so guessing ids reveals nothing; PERMISSION_DENIED is only given about a workspace
//! the caller can already see. Sessions are visible to the user they belong to and admins.
//! A service acting for a user (`x-berth-act-as`) is checked as that user.
//!
//! Using it from a handler is one line: `let (id, record) = self.access.workspace(&caller,
//! &message.workspace_id, Action::Use).await?;` with `let caller = Caller::of(&request)?;`.

use std::sync::Arc;

use berth_workspace::{WorkspaceId, validate_id};
use tonic::Status;

pub use crate::auth::Caller;
use crate::auth::Principal;
use crate::error::ControlPlaneError;
use crate::quota::{Slot, UserQuotas};
use crate::records::{SessionRecord, WorkspaceRecord};
use crate::store::WorkspaceStoreRef;

/// What a call does to a workspace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Read the record (GetWorkspace, ListWorkspaces).
    View,
    /// Work inside it: exec, files, sessions on it, and everything else an agent does.
    Use,
    /// Change who has it or whether it exists: close, destroy, share, unshare.
    Manage,
}

/// Why a principal may not do something.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The caller may not know the workspace exists: answered exactly like a missing one.
    #[error("workspace {0} not found")]
    Hidden(String),
    #[error("session {0} not found")]
    HiddenSession(String),
    /// The caller can see the object but not do this to it.
    #[error("{principal} may not {what}")]
    Forbidden { principal: String, what: String },
}

impl From<Denied> for ControlPlaneError {
    fn from(denied: Denied) -> ControlPlaneError {
        match denied {
            // The same status as a missing workspace / session, byte for byte.
            Denied::Hidden(id) => ControlPlaneError::WorkspaceNotFound(id),
            Denied::HiddenSession(id) => ControlPlaneError::SessionNotFound(id),
            Denied::Forbidden { principal, what } => ControlPlaneError::PermissionDenied { principal, what },
        }
    }
}

impl From<Denied> for Status {
    fn from(denied: Denied) -> Status {
        ControlPlaneError::from(denied).into()
    }
}

/// The one decision: may `principal` do `action` to the workspace `record`?
pub fn authorize(principal: &Principal, record: &WorkspaceRecord, action: Action) -> Result<(), Denied> {
    if principal.is_admin() {
        return Ok(());
    }
    let user = principal.user();
    if !record.owner.is_empty() && record.owner == user {
        return Ok(());
    }
    let visible = record.owner.is_empty() || record.shared_with.iter().any(|shared| shared == user);
    match (visible, action) {
        (false, _) => Err(Denied::Hidden(record.id.to_string())),
        (true, Action::View | Action::Use) => Ok(()),
        (true, Action::Manage) => Err(Denied::Forbidden {
            principal: principal.label(),
            what: format!("close or share workspace {} (only its owner or an admin may)", record.id),
        }),
    }
}

/// Sessions: the user a session belongs to, and admins.
pub fn authorize_session(principal: &Principal, session: &SessionRecord) -> Result<(), Denied> {
    if principal.is_admin() || session.user == principal.user() {
        Ok(())
    } else {
        Err(Denied::HiddenSession(session.session_id.clone()))
    }
}

/// AdminService and other operator calls.
pub fn require_admin(principal: &Principal) -> Result<(), Denied> {
    if principal.is_admin() {
        Ok(())
    } else {
        Err(Denied::Forbidden { principal: principal.label(), what: "call the admin API".into() })
    }
}

/// May `principal` create a workspace on `backend` (empty: the node's default, which
/// placement keeps sandboxed for callers without the grant)? An unsandboxed backend runs
/// commands as the node agent's user, so it needs an admin or an explicit grant.
pub fn require_backend(principal: &Principal, backend: &str) -> Result<(), Denied> {
    if backend.is_empty() || principal.may_use_backend(backend) {
        return Ok(());
    }
    Err(Denied::Forbidden {
        principal: principal.label(),
        what: format!(
            "use the unsandboxed backend {backend:?}: it runs commands as the node agent's user; an operator \
             grants it with `backends = [\"{backend}\"]` on the token or the `berth/backends` JWT claim"
        ),
    })
}

/// The user a CreateSession-like call is made for. `requested` is the request body's
/// `user_id` (empty = none). A principal that may act for users names the user (body or
/// `x-berth-act-as`); any other principal is its own user and may only repeat its name.
pub fn user_for(principal: &Principal, requested: &str) -> Result<String, ControlPlaneError> {
    let user = if principal.may_act_for_users() {
        match (&principal.acting_for, requested) {
            (Some(acting), "") => acting.clone(),
            (Some(acting), requested) if acting != requested => {
                return Err(ControlPlaneError::ActAsMismatch {
                    requested: requested.to_owned(),
                    acting: acting.clone(),
                });
            }
            (_, requested) => requested.to_owned(),
        }
    } else if requested.is_empty() || requested == principal.user() {
        principal.user().to_owned()
    } else {
        return Err(
            Denied::Forbidden { principal: principal.label(), what: format!("act for user {requested}") }.into()
        );
    };
    validate_id("user id", &user)?;
    Ok(user)
}

/// Record lookup + [`authorize`] for handlers, and the per-user quotas they admit work
/// under.
#[derive(Clone)]
pub struct Access {
    store: WorkspaceStoreRef,
    quotas: Arc<UserQuotas>,
}

impl Access {
    pub fn new(store: WorkspaceStoreRef, quotas: Arc<UserQuotas>) -> Self {
        Self { store, quotas }
    }

    /// Admits one exec of the caller's user (`--max-execs-per-user`); hold the slot for the
    /// exec's life.
    pub fn exec_slot(&self, caller: &Caller) -> Result<Option<Slot>, ControlPlaneError> {
        self.quotas.exec(caller.principal().user())
    }

    /// Admits `workspace`, new and owned by `owner` (`--max-workspaces-per-user`); hold the
    /// slot until the bind has written the record.
    pub fn create_slot(&self, owner: &str, workspace: &WorkspaceId) -> Result<Option<Slot>, ControlPlaneError> {
        self.quotas.create_workspace(&self.store, owner, workspace.as_str())
    }

    /// Validates the id, loads the record and checks `action`. A missing workspace and an
    /// invisible one give the same NOT_FOUND.
    pub async fn workspace(
        &self,
        caller: &Caller,
        workspace_id: &str,
        action: Action,
    ) -> Result<(WorkspaceId, Arc<WorkspaceRecord>), ControlPlaneError> {
        let id = WorkspaceId::new(workspace_id)?;
        caller.note_workspace(id.as_str());
        let record = self.record(&id).await?.ok_or_else(|| ControlPlaneError::WorkspaceNotFound(id.to_string()))?;
        match authorize(caller.principal(), &record, action) {
            Ok(()) => Ok((id, record)),
            // The view may predate a share made through another replica: before saying
            // NOT_FOUND, look at the registry itself (denials are rare; grants are not).
            Err(Denied::Hidden(_)) => {
                let Some(fresh) = self.store.load(&id).await? else {
                    return Err(ControlPlaneError::WorkspaceNotFound(id.to_string()));
                };
                authorize(caller.principal(), &fresh, action)?;
                Ok((id, Arc::new(fresh)))
            }
            Err(denied) => Err(denied.into()),
        }
    }

    /// The record from the view, else a linearizable read (a workspace created a moment ago
    /// through another replica may not be in this replica's view yet).
    pub async fn record(&self, workspace_id: &WorkspaceId) -> Result<Option<Arc<WorkspaceRecord>>, ControlPlaneError> {
        if let Some(record) = self.store.cached(workspace_id) {
            return Ok(Some(record));
        }
        Ok(self.store.load(workspace_id).await?.map(Arc::new))
    }
}

#[cfg(test)]
mod tests {
    use berth_workspace::WorkspaceSpec;

    use super::*;
    use crate::auth::Role;
    use crate::policy::IsolationPolicy;
    use crate::records::{RECORD_VERSION, StoredState};

    fn record(owner: &str, shared: &[&str]) -> WorkspaceRecord {
        WorkspaceRecord {
            version: RECORD_VERSION,
            id: WorkspaceId::new("ws-x").unwrap(),
            owner: owner.into(),
            agent: "a".into(),
            policy: IsolationPolicy::PerAgent,
            backend: String::new(),
            spec: WorkspaceSpec::default(),
            state: StoredState::Ready,
            node_id: None,
            generation: 1,
            created_at_ms: 0,
            updated_at_ms: 0,
            failure: None,
            changed_by: String::new(),
            shared_with: shared.iter().map(|user| (*user).to_owned()).collect(),
            origin: Default::default(),
            origin_generation: 0,
            snapshot: None,
        }
    }

    fn acting(name: &str, user: &str) -> Principal {
        Principal { acting_for: Some(user.into()), ..Principal::new(name, Role::Service { act_for_users: true }) }
    }

    #[test]
    fn owner_shared_global_admin_and_strangers() {
        let owned = record("alice", &["bob"]);
        let alice = Principal::new("alice", Role::User);
        let bob = Principal::new("bob", Role::User);
        let eve = Principal::new("eve", Role::User);
        for action in [Action::View, Action::Use, Action::Manage] {
            assert_eq!(authorize(&alice, &owned, action), Ok(()));
            assert_eq!(authorize(&Principal::new("ops", Role::Admin), &owned, action), Ok(()));
            assert_eq!(authorize(&acting("svc", "alice"), &owned, action), Ok(()));
            assert_eq!(authorize(&eve, &owned, action), Err(Denied::Hidden("ws-x".into())));
            assert_eq!(authorize(&acting("svc", "eve"), &owned, action), Err(Denied::Hidden("ws-x".into())));
            // A service without act-as is itself, not its users.
            assert!(authorize(&Principal::new("svc", Role::Service { act_for_users: true }), &owned, action).is_err());
        }
        assert_eq!(authorize(&bob, &owned, Action::Use), Ok(()));
        assert!(matches!(authorize(&bob, &owned, Action::Manage), Err(Denied::Forbidden { .. })));
        let global = record("", &[]);
        assert_eq!(authorize(&eve, &global, Action::Use), Ok(()));
        assert!(matches!(authorize(&eve, &global, Action::Manage), Err(Denied::Forbidden { .. })));
    }

    #[test]
    fn hidden_is_the_same_status_as_missing() {
        let hidden: Status = Denied::Hidden("ws-x".into()).into();
        let missing: Status = ControlPlaneError::WorkspaceNotFound("ws-x".into()).into();
        assert_eq!((hidden.code(), hidden.message()), (missing.code(), missing.message()));
    }

    #[test]
    fn users_come_from_the_principal() {
        let alice = Principal::new("alice", Role::User);
        assert_eq!(user_for(&alice, "").unwrap(), "alice");
        assert_eq!(user_for(&alice, "alice").unwrap(), "alice");
        assert_eq!(Status::from(user_for(&alice, "bob").unwrap_err()).code(), tonic::Code::PermissionDenied);
        assert_eq!(user_for(&acting("svc", "bob"), "").unwrap(), "bob");
        assert_eq!(
            Status::from(user_for(&acting("svc", "bob"), "carol").unwrap_err()).code(),
            tonic::Code::InvalidArgument
        );
        let service = Principal::new("svc", Role::Service { act_for_users: true });
        assert_eq!(user_for(&service, "carol").unwrap(), "carol");
        assert_eq!(Status::from(user_for(&service, "").unwrap_err()).code(), tonic::Code::InvalidArgument);
        assert_eq!(user_for(&Principal::local(), "dave").unwrap(), "dave");
    }
}
