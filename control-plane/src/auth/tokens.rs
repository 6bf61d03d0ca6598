//! `--auth token`: static bearer tokens from a TOML file, re-read on SIGHUP.
//!
//! ```toml
//! [[token]]
//! secret = "…at least 16 printable bytes…"
//! user = "alice"                 # an end user
//!
//! [[token]]
//! secret = "…"
//! service = "agent-platform"     # a service…
//! act_for_users = true           # …that may act for its users (x-berth-act-as)
//!
//! [[token]]
//! secret = "…"
//! admin = true                   # an operator
//! name = "ops"                   # optional, for audit lines (default "admin")
//!
//! [[token]]
//! secret = "…"
//! user = "trusted-dev"
//! backends = ["local"]           # may pick these unsandboxed backends (any role but admin)
//! ```
//!
//! Every token has exactly one role. `backends` grants unsandboxed backends
//! (`berth_proto::backends::UNSANDBOXED_BACKENDS`); naming a sandboxed or unknown one is
//! an error (sandboxed backends need no grant, and a typo must not pass silently). A presented token is compared with *every* stored
//! one, on SHA-256 digests with `subtle`'s constant-time equality, so neither the time
//! taken nor an early exit tells which token (or how much of one) matched. A reload that
//! fails to parse keeps the previous set and logs why.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use berth_proto::auth::{Secret, digest};
use berth_workspace::validate_id;
use serde::Deserialize;
use subtle::{ConditionallySelectable, ConstantTimeEq};
use tokio_util::sync::CancellationToken;

use super::error::AuthError;
use super::principal::{Principal, Role};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    secret: String,
    user: Option<String>,
    service: Option<String>,
    #[serde(default)]
    act_for_users: bool,
    #[serde(default)]
    admin: bool,
    name: Option<String>,
    #[serde(default)]
    backends: Vec<String>,
}

struct StoredToken {
    digest: [u8; 32],
    principal: Principal,
}

/// The current token set, swappable on reload.
pub struct TokenStore {
    path: PathBuf,
    tokens: RwLock<Arc<Vec<StoredToken>>>,
}

impl TokenStore {
    pub fn load(path: &Path) -> Result<Self, String> {
        let tokens = parse_file(path)?;
        Ok(Self { path: path.to_owned(), tokens: RwLock::new(Arc::new(tokens)) })
    }

    /// A store from tokens-file text (tests, fuzzing, `--check` tooling); never reloads.
    pub fn from_text(text: &str) -> Result<Self, String> {
        Ok(Self { path: PathBuf::new(), tokens: RwLock::new(Arc::new(parse(text)?)) })
    }

    /// Re-reads the file; on any error the previous set stays in force.
    pub fn reload(&self) -> Result<usize, String> {
        let tokens = parse_file(&self.path)?;
        let count = tokens.len();
        *self.tokens.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = Arc::new(tokens);
        Ok(count)
    }

    /// Re-reads the file on every SIGHUP until `cancel` fires.
    pub fn reload_on_sighup(self: &Arc<Self>, cancel: CancellationToken) {
        let store = Arc::clone(self);
        tokio::spawn(async move {
            let Ok(mut hangups) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
                tracing::warn!("cannot listen for SIGHUP; the tokens file is read only at start");
                return;
            };
            loop {
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = hangups.recv() => match store.reload() {
                        Ok(count) => tracing::info!(file = %store.path.display(), tokens = count, "tokens file reloaded"),
                        Err(error) => tracing::error!(%error, "tokens file reload failed; keeping the previous tokens"),
                    },
                }
            }
        });
    }

    pub fn authenticate(&self, presented: &str) -> Result<Principal, AuthError> {
        let tokens = Arc::clone(&self.tokens.read().unwrap_or_else(|poisoned| poisoned.into_inner()));
        let presented = digest(presented.as_bytes());
        // Constant time over the whole set: no early exit, no data-dependent branch.
        let mut found = subtle::Choice::from(0);
        let mut index = 0u64;
        for (position, token) in tokens.iter().enumerate() {
            let equal = token.digest.ct_eq(&presented);
            index.conditional_assign(&(position as u64), equal);
            found |= equal;
        }
        if bool::from(found) {
            tokens.get(index as usize).map(|token| token.principal.clone()).ok_or(AuthError::Invalid)
        } else {
            Err(AuthError::Invalid)
        }
    }
}

fn parse_file(path: &Path) -> Result<Vec<StoredToken>, String> {
    let text =
        std::fs::read_to_string(path).map_err(|error| format!("reading tokens file {}: {error}", path.display()))?;
    parse(&text).map_err(|error| format!("tokens file {}: {error}", path.display()))
}

/// Parses and validates a tokens file.
fn parse(text: &str) -> Result<Vec<StoredToken>, String> {
    let file: TokensFile = toml::from_str(text).map_err(|error| error.to_string())?;
    let mut seen = HashSet::new();
    let mut tokens = Vec::with_capacity(file.token.len());
    for (index, entry) in file.token.into_iter().enumerate() {
        let at = |reason: String| format!("token #{}: {reason}", index + 1);
        let secret = Secret::new(entry.secret);
        secret.validate().map_err(at)?;
        if !seen.insert(secret.digest()) {
            return Err(at("the same secret appears twice".into()));
        }
        let principal = match (entry.user, entry.service, entry.admin) {
            (Some(user), None, false) => {
                if entry.act_for_users || entry.name.is_some() {
                    return Err(at("act_for_users and name belong to service and admin tokens".into()));
                }
                Principal::new(user, Role::User)
            }
            (None, Some(service), false) => {
                if entry.name.is_some() {
                    return Err(at("name belongs to admin tokens".into()));
                }
                Principal::new(service, Role::Service { act_for_users: entry.act_for_users })
            }
            (None, None, true) => {
                if entry.act_for_users {
                    return Err(at("act_for_users belongs to service tokens (admins may act for anyone)".into()));
                }
                Principal::new(entry.name.unwrap_or_else(|| "admin".into()), Role::Admin)
            }
            _ => return Err(at("exactly one role is needed: user = \"…\", service = \"…\" or admin = true".into())),
        };
        validate_id("principal name", &principal.name).map_err(|error| at(error.to_string()))?;
        let principal = Principal { granted_backends: granted_backends(entry.backends).map_err(at)?, ..principal };
        tokens.push(StoredToken { digest: secret.digest(), principal });
    }
    Ok(tokens)
}

/// Checks a `backends` grant: only unsandboxed backend names, each once.
pub(super) fn granted_backends(names: Vec<String>) -> Result<Vec<String>, String> {
    let mut granted: Vec<String> = Vec::with_capacity(names.len());
    for name in names {
        if !berth_proto::backends::is_unsandboxed(&name) {
            return Err(format!(
                "backends: {name:?} is not an unsandboxed backend (grantable: {}); sandboxed backends need no grant",
                berth_proto::backends::UNSANDBOXED_BACKENDS.join(", ")
            ));
        }
        if !granted.contains(&name) {
            granted.push(name);
        }
    }
    Ok(granted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(text: &str) -> TokenStore {
        TokenStore::from_text(text).unwrap()
    }

    #[test]
    fn roles_parse_and_authenticate() {
        let store = store(
            r#"
            [[token]]
            secret = "alice-secret-0123456789"
            user = "alice"
            [[token]]
            secret = "service-secret-0123456789"
            service = "platform"
            act_for_users = true
            [[token]]
            secret = "admin-secret-0123456789"
            admin = true
            "#,
        );
        assert_eq!(store.authenticate("alice-secret-0123456789").unwrap(), Principal::new("alice", Role::User));
        assert_eq!(
            store.authenticate("service-secret-0123456789").unwrap().role,
            Role::Service { act_for_users: true }
        );
        assert_eq!(store.authenticate("admin-secret-0123456789").unwrap(), Principal::new("admin", Role::Admin));
        assert_eq!(store.authenticate("alice-secret-012345678"), Err(AuthError::Invalid));
        assert_eq!(store.authenticate(""), Err(AuthError::Invalid));
    }

    #[test]
    fn backends_grant_unsandboxed_backends_only() {
        let store = store(
            r#"
            [[token]]
            secret = "trusted-secret-0123456789"
            user = "trusted"
            backends = ["local"]
            [[token]]
            secret = "plain-secret-0123456789"
            user = "plain"
            "#,
        );
        let trusted = store.authenticate("trusted-secret-0123456789").unwrap();
        assert_eq!(trusted.granted_backends, vec!["local".to_owned()]);
        assert!(trusted.may_use_backend("local"));
        let plain = store.authenticate("plain-secret-0123456789").unwrap();
        assert!(!plain.may_use_backend("local") && plain.may_use_backend("bubblewrap"));
        let error = parse("[[token]]\nsecret = \"0123456789abcdef\"\nuser = \"a\"\nbackends = [\"bubblewrap\"]")
            .err()
            .unwrap_or_default();
        assert!(error.contains("not an unsandboxed backend"), "{error}");
    }

    #[test]
    fn bad_files_are_refused_with_the_reason() {
        let cases = [
            ("[[token]]\nsecret = \"short\"\nuser = \"a\"", "at least 16"),
            ("[[token]]\nsecret = \"0123456789abcdef\"\nuser = \"a\"\nadmin = true", "exactly one role"),
            ("[[token]]\nsecret = \"0123456789abcdef\"", "exactly one role"),
            ("[[token]]\nsecret = \"0123456789abcdef\"\nuser = \"a\"\ncolour = 1", "unknown field"),
            ("[[token]]\nsecret = \"0123456789abcdef\"\nuser = \"a/b\"", "principal name"),
            ("[[token]]\nsecret = \"0123456789abcdef\"\nuser = \"a\"\nact_for_users = true", "act_for_users"),
            (
                "[[token]]\nsecret = \"0123456789abcdef\"\nuser = \"a\"\n[[token]]\nsecret = \"0123456789abcdef\"\nuser = \"b\"",
                "twice",
            ),
        ];
        for (text, expected) in cases {
            let error = parse(text).err().unwrap_or_default();
            assert!(error.contains(expected), "{text:?}: {error:?} lacks {expected:?}");
        }
    }

    #[test]
    fn a_failed_reload_keeps_the_old_tokens() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokens.toml");
        std::fs::write(&path, "[[token]]\nsecret = \"first-secret-0123456789\"\nuser = \"alice\"\n").unwrap();
        let store = TokenStore::load(&path).unwrap();
        std::fs::write(&path, "[[token]]\nsecret = \"second-secret-0123456789\"\nuser = \"bob\"\n").unwrap();
        assert_eq!(store.reload(), Ok(1));
        assert_eq!(store.authenticate("second-secret-0123456789").unwrap().name, "bob");
        assert!(store.authenticate("first-secret-0123456789").is_err());
        std::fs::write(&path, "not toml [").unwrap();
        assert!(store.reload().is_err());
        assert_eq!(store.authenticate("second-secret-0123456789").unwrap().name, "bob");
    }
}
