//! Per-user quotas of a replica: workspaces per user (`--max-workspaces-per-user`) and
//! concurrent execs per user (`--max-execs-per-user`; MCP tool calls and listings count as
//! execs: they run code in the workspace too). A refusal is RESOURCE_EXHAUSTED at
//! once (`ControlPlaneError::QuotaExceeded`), never a wait.
//!
//! **Execs are counted per replica**, in memory: an exec is a forwarded call that never
//! touches the registry, and making it write to etcd twice to count cluster-wide would cost
//! more than the exec. A user spread over R replicas may run up to R × the limit; the node
//! agent's per-workspace cap (`--max-execs-per-workspace`) and output budget bound what
//! that can do to one node.
//!
//! **Workspaces are counted cluster-wide** from the view (which mirrors every record in
//! the registry) plus the distinct workspaces this replica is creating for the user (the
//! callers of one workspace's create share its slot). The window left
//! open: two replicas creating a workspace for the same user at the same moment each count
//! before the other's record reaches their view (the watch lag, milliseconds), so a user
//! racing creates through several replicas can exceed the limit by at most one per replica
//! per such window. The per-replica reservation closes the race within one replica
//! exactly; closing it cluster-wide would take a per-user create lock in the registry held
//! for the bind, with the count taken once the view has caught up to the lock's revision
//! (serializing one user's creates cluster-wide; docs/isolation/policy.md).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::error::ControlPlaneError;
use crate::store::WorkspaceStoreRef;

/// A per-user counter of things in flight on this replica.
#[derive(Default)]
struct Counter {
    by_user: Mutex<HashMap<String, u32>>,
}

impl Counter {
    /// Adds one for `user` when `admit(current)` says so.
    fn take(self: &Arc<Self>, user: &str, admit: impl FnOnce(u32) -> bool) -> Option<Slot> {
        let mut by_user = self.by_user.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let count = by_user.entry(user.to_owned()).or_insert(0);
        if !admit(*count) {
            if *count == 0 {
                by_user.remove(user);
            }
            return None;
        }
        *count += 1;
        Some(Slot(Held::Counted { counter: Arc::clone(self), user: user.to_owned() }))
    }

    fn current(&self, user: &str) -> u32 {
        let by_user = self.by_user.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        by_user.get(user).copied().unwrap_or(0)
    }

    fn release(&self, user: &str) {
        let mut by_user = self.by_user.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(count) = by_user.get_mut(user) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                by_user.remove(user);
            }
        }
    }
}

/// Per user, the workspaces this replica is creating, each with how many callers wait on
/// it: concurrent first sessions of one workspace are one create, not one per caller.
#[derive(Default)]
struct Creating {
    by_user: Mutex<HashMap<String, HashMap<String, u32>>>,
}

impl Creating {
    /// Joins the create of `workspace` when one is in flight, else starts one when the
    /// user's workspaces (`owned`, counted without the lock held: it may walk the whole
    /// view; only a new create counts) plus the distinct creates in flight stay under `max`.
    fn take(self: &Arc<Self>, user: &str, workspace: &str, max: u32, owned: impl FnOnce() -> u64) -> Option<Slot> {
        let slot = || {
            Slot(Held::Create { creating: Arc::clone(self), user: user.to_owned(), workspace: workspace.to_owned() })
        };
        if self.join(user, workspace) {
            return Some(slot());
        }
        let owned = owned();
        let mut by_user = self.by_user.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let creates = by_user.entry(user.to_owned()).or_default();
        if let Some(callers) = creates.get_mut(workspace) {
            *callers += 1;
        } else if owned + (creates.len() as u64) < u64::from(max) {
            creates.insert(workspace.to_owned(), 1);
        } else {
            if creates.is_empty() {
                by_user.remove(user);
            }
            return None;
        }
        Some(slot())
    }

    /// Counts one more caller of a create in flight.
    fn join(&self, user: &str, workspace: &str) -> bool {
        let mut by_user = self.by_user.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match by_user.get_mut(user).and_then(|creates| creates.get_mut(workspace)) {
            Some(callers) => {
                *callers += 1;
                true
            }
            None => false,
        }
    }

    fn release(&self, user: &str, workspace: &str) {
        let mut by_user = self.by_user.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let Some(creates) = by_user.get_mut(user) else { return };
        if let Some(callers) = creates.get_mut(workspace) {
            *callers = callers.saturating_sub(1);
            if *callers == 0 {
                creates.remove(workspace);
            }
        }
        if creates.is_empty() {
            by_user.remove(user);
        }
    }
}

/// One counted exec or create; released when dropped.
pub struct Slot(Held);

enum Held {
    Counted { counter: Arc<Counter>, user: String },
    Create { creating: Arc<Creating>, user: String, workspace: String },
}

impl Drop for Slot {
    fn drop(&mut self) {
        match &self.0 {
            Held::Counted { counter, user } => counter.release(user),
            Held::Create { creating, user, workspace } => creating.release(user, workspace),
        }
    }
}

/// The quotas of this replica; `0` = unlimited.
pub struct UserQuotas {
    max_workspaces_per_user: u32,
    max_execs_per_user: u32,
    execs: Arc<Counter>,
    creating: Arc<Creating>,
}

impl UserQuotas {
    pub fn new(max_workspaces_per_user: u32, max_execs_per_user: u32) -> Self {
        Self { max_workspaces_per_user, max_execs_per_user, execs: Arc::default(), creating: Arc::default() }
    }

    /// Admits one exec of `user` (held until the slot drops: the end of a unary exec, the
    /// drop of a streamed exec's stream).
    pub fn exec(&self, user: &str) -> Result<Option<Slot>, ControlPlaneError> {
        let max = self.max_execs_per_user;
        if max == 0 {
            return Ok(None);
        }
        self.execs.take(user, |running| running < max).map(Some).ok_or_else(|| ControlPlaneError::QuotaExceeded {
            user: user.to_owned(),
            quota: "concurrent execs",
            max,
            flag: "--max-execs-per-user",
        })
    }

    /// Admits the creation of `workspace`, new and owned by `user`: the workspaces the view
    /// holds for them plus this replica's distinct creates in flight must stay under the
    /// limit (a caller of a workspace already being created joins that create). Hold the
    /// slot until the bind has written the record.
    pub fn create_workspace(
        &self,
        store: &WorkspaceStoreRef,
        user: &str,
        workspace: &str,
    ) -> Result<Option<Slot>, ControlPlaneError> {
        let max = self.max_workspaces_per_user;
        if max == 0 || user.is_empty() {
            return Ok(None);
        }
        let owned = || store.workspaces().iter().filter(|record| record.owner == user).count() as u64;
        self.creating.take(user, workspace, max, owned).map(Some).ok_or_else(|| ControlPlaneError::QuotaExceeded {
            user: user.to_owned(),
            quota: "workspaces",
            max,
            flag: "--max-workspaces-per-user",
        })
    }

    /// Execs of `user` running through this replica (tests, metrics).
    pub fn execs_running(&self, user: &str) -> u32 {
        self.execs.current(user)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Concurrent first sessions of one workspace are one create against the quota; only
    /// distinct workspaces count, and a create's slot is free once its last caller is done.
    #[test]
    fn callers_of_one_workspace_share_its_create_slot() {
        let creating = Arc::new(Creating::default());
        let owned = || 1;
        // max 3, one owned: two distinct creates fit.
        let storm: Vec<Slot> = (0..100).map(|_| creating.take("alice", "ws-a", 3, owned).expect("joins")).collect();
        let second = creating.take("alice", "ws-b", 3, owned).expect("a second workspace fits");
        assert!(creating.take("alice", "ws-c", 3, owned).is_none(), "a third is over the quota");
        assert!(creating.take("bob", "ws-c", 3, owned).is_some(), "quotas are per user");
        drop(storm);
        let third = creating.take("alice", "ws-c", 3, owned).expect("ws-a's create is over");
        drop((second, third));
        assert!(creating.by_user.lock().unwrap().is_empty(), "nothing left counted");
    }

    #[test]
    fn exec_slots_refuse_past_the_limit_and_come_back_on_drop() {
        let quotas = UserQuotas::new(0, 2);
        let first = quotas.exec("alice").unwrap();
        let second = quotas.exec("alice").unwrap();
        let error = quotas.exec("alice").err().map(|error| error.to_string()).unwrap_or_default();
        assert!(error.contains("--max-execs-per-user") && error.contains("alice"), "{error}");
        assert!(quotas.exec("bob").unwrap().is_some(), "quotas are per user");
        drop(first);
        assert_eq!(quotas.execs_running("alice"), 1);
        assert!(quotas.exec("alice").unwrap().is_some());
        drop(second);
        assert_eq!(quotas.execs_running("alice"), 0);
        assert!(UserQuotas::new(0, 0).exec("alice").unwrap().is_none(), "0 is unlimited");
    }
}
