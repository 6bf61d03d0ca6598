//! [`Caller`]: the principal of one request, put in the request extensions by the auth
//! layer and read by every handler (`Caller::of`).

use std::sync::{Arc, Mutex};

use super::principal::Principal;
use crate::error::ControlPlaneError;

/// The authenticated caller of one request, put in the request extensions by the auth
/// layer. Also carries the workspace the call touched back to the layer's audit line.
#[derive(Clone, Debug)]
pub struct Caller(Arc<CallerInner>);

#[derive(Debug)]
struct CallerInner {
    principal: Principal,
    workspace: Mutex<Option<String>>,
}

impl Caller {
    pub fn new(principal: Principal) -> Self {
        Self(Arc::new(CallerInner { principal, workspace: Mutex::new(None) }))
    }

    /// The caller of a request. Fails closed: a request that did not pass the auth layer
    /// (a server built without it) is UNAUTHENTICATED.
    pub fn of<T>(request: &tonic::Request<T>) -> Result<Caller, ControlPlaneError> {
        request.extensions().get::<Caller>().cloned().ok_or(ControlPlaneError::NoCaller)
    }

    pub fn principal(&self) -> &Principal {
        &self.0.principal
    }

    /// Records the workspace this call is about (for the audit line and the request span).
    pub fn note_workspace(&self, workspace_id: &str) {
        berth_proto::trace::record_workspace(workspace_id);
        *self.0.workspace.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(workspace_id.to_owned());
    }

    pub fn workspace(&self) -> Option<String> {
        self.0.workspace.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }
}
