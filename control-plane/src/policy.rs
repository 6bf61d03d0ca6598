//! Isolation policies: which workspace a `(user, agent, session)` gets (docs/design.md §2, §4.2).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// How `(user_id, agent_id, session_id)` maps to a workspace id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum IsolationPolicy {
    /// One workspace per (user, agent).
    #[default]
    PerAgent,
    /// One workspace per (user, agent, session).
    PerSession,
    /// One workspace per user, shared by all their agents.
    PerUser,
    /// One workspace per agent, shared by all users (opt-in).
    Global,
}

impl IsolationPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::PerAgent => "per-agent",
            Self::PerSession => "per-session",
            Self::PerUser => "per-user",
            Self::Global => "global",
        }
    }
}

impl fmt::Display for IsolationPolicy {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_str())
    }
}

impl FromStr for IsolationPolicy {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        match text.replace('_', "-").to_ascii_lowercase().as_str() {
            "per-agent" => Ok(Self::PerAgent),
            "per-session" => Ok(Self::PerSession),
            "per-user" => Ok(Self::PerUser),
            "global" => Ok(Self::Global),
            _ => Err(format!("unknown isolation policy {text:?} (per-agent, per-session, per-user, global)")),
        }
    }
}

/// The workspace id of `(user, agent, session)` under `policy`: `ws-` + hex SHA-256 of the
/// policy name and the policy's key fields, each prefixed by its length so no two inputs
/// collide by concatenation. A pure function: every replica computes the same id, which is
/// what lets them agree on one workspace without talking to each other first.
///
/// | policy      | key fields              |
/// |-------------|-------------------------|
/// | per-agent   | user, agent             |
/// | per-session | user, agent, session    |
/// | per-user    | user                    |
/// | global      | agent                   |
pub fn assign_workspace_id(policy: IsolationPolicy, user_id: &str, agent_id: &str, session_id: &str) -> String {
    let fields: &[&str] = match policy {
        IsolationPolicy::PerAgent => &[user_id, agent_id],
        IsolationPolicy::PerSession => &[user_id, agent_id, session_id],
        IsolationPolicy::PerUser => &[user_id],
        IsolationPolicy::Global => &[agent_id],
    };
    let mut hasher = Sha256::new();
    hasher.update(policy.as_str().as_bytes());
    for field in fields {
        hasher.update((field.len() as u64).to_be_bytes());
        hasher.update(field.as_bytes());
    }
    format!("ws-{}", hex::encode(hasher.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_follow_the_policy_key_fields() {
        use IsolationPolicy::*;
        let id = |policy, user, agent, session| assign_workspace_id(policy, user, agent, session);
        assert_eq!(id(PerAgent, "u", "a", "s1"), id(PerAgent, "u", "a", "s2"));
        assert_ne!(id(PerAgent, "u", "a", "s"), id(PerAgent, "u", "b", "s"));
        assert_ne!(id(PerSession, "u", "a", "s1"), id(PerSession, "u", "a", "s2"));
        assert_eq!(id(PerUser, "u", "a", "s"), id(PerUser, "u", "b", "t"));
        assert_eq!(id(Global, "u", "a", "s"), id(Global, "v", "a", "t"));
        // Length-prefixing: ("ab", "c") and ("a", "bc") differ.
        assert_ne!(id(PerAgent, "ab", "c", ""), id(PerAgent, "a", "bc", ""));
        // Policies never share ids.
        assert_ne!(id(PerAgent, "u", "a", ""), id(PerSession, "u", "a", ""));
        let sample = id(PerAgent, "alice", "coder", "");
        assert!(sample.starts_with("ws-") && sample.len() == 67, "{sample}");
        assert_eq!(sample, assign_workspace_id(PerAgent, "alice", "coder", "other"));
    }

    #[test]
    fn parses_policy_names() {
        assert_eq!("per-session".parse::<IsolationPolicy>().unwrap(), IsolationPolicy::PerSession);
        assert_eq!("PER_USER".parse::<IsolationPolicy>().unwrap(), IsolationPolicy::PerUser);
        assert!("bogus".parse::<IsolationPolicy>().is_err());
    }
}
