//! Authentication of public calls (DESIGN.md §5): who is calling, as a [`Principal`].
//!
//! One [`layer::AuthLayer`] wraps the whole gRPC router of a replica, so every service on
//! it — including ones added later — is authenticated by construction. The layer turns the
//! request headers into a `Principal` (or refuses the call with UNAUTHENTICATED), puts it in
//! the request extensions as a [`crate::authz::Caller`], and writes the audit line. What
//! a principal may do is decided in [`crate::authz`].
//!
//! Modes (`--auth`): `none` (everyone is a trusted local operator; loopback listeners
//! only), `token` (a TOML file of static bearer tokens, re-read on SIGHUP) and `jwt`
//! (HS256 / RS256 / ES256 bearer JWTs).

pub mod jwt;
pub mod layer;
pub mod tokens;

use std::path::PathBuf;
use std::sync::Arc;

use berth_proto::meta::ACT_AS;
use berth_workspace::validate_id;
use http::HeaderMap;

pub use jwt::JwtConfig;
pub use layer::AuthLayer;

/// How a replica authenticates public callers.
#[derive(Clone, Debug, Default)]
pub enum AuthConfig {
    /// No credentials: every caller is a trusted local operator. Allowed only when every
    /// listener is on loopback (`berth up`'s default).
    #[default]
    None,
    /// Static bearer tokens from a TOML file (see [`tokens`]).
    Tokens { file: PathBuf },
    /// Bearer JWTs.
    Jwt(JwtConfig),
}

impl AuthConfig {
    pub fn name(&self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Tokens { .. } => "token",
            Self::Jwt(_) => "jwt",
        }
    }
}

/// What a principal is allowed to be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// An end user; its name is its user id.
    User,
    /// A service (agent platform). With `act_for_users` it may name the user it acts for
    /// (`x-berth-act-as`, or `user_id` on CreateSession); without, it is a user of its own.
    Service { act_for_users: bool },
    /// An operator: AdminService, and every workspace.
    Admin,
    /// `--auth none`: the local operator of a loopback-only deployment; may do anything
    /// and act for anyone.
    Local,
}

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// User id, service name or admin name (`sub` of a JWT).
    pub name: String,
    pub role: Role,
    /// The user this call is made for (`x-berth-act-as`); only principals that may act for
    /// users carry one.
    pub acting_for: Option<String>,
}

impl Principal {
    pub fn new(name: impl Into<String>, role: Role) -> Self {
        Self { name: name.into(), role, acting_for: None }
    }

    /// The trusted local operator of `--auth none`.
    pub fn local() -> Self {
        Self::new("local", Role::Local)
    }

    pub fn may_act_for_users(&self) -> bool {
        matches!(self.role, Role::Service { act_for_users: true } | Role::Admin | Role::Local)
    }

    pub fn is_admin(&self) -> bool {
        matches!(self.role, Role::Admin | Role::Local)
    }

    /// The user id the call is made as: the acted-for user, else the principal's own name.
    pub fn user(&self) -> &str {
        self.acting_for.as_deref().unwrap_or(&self.name)
    }

    /// `role:name[ as user]`, for audit lines and messages.
    pub fn label(&self) -> String {
        let role = match self.role {
            Role::User => "user",
            Role::Service { .. } => "service",
            Role::Admin => "admin",
            Role::Local => "local",
        };
        match &self.acting_for {
            Some(user) => format!("{role}:{} as {user}", self.name),
            None => format!("{role}:{}", self.name),
        }
    }
}

/// Why a call was not authenticated. Messages say what was wrong without echoing secrets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("missing credentials: send `authorization: Bearer <token>`")]
    Missing,
    #[error("invalid credentials")]
    Invalid,
    #[error("invalid token: {0}")]
    InvalidToken(String),
    #[error("token expired")]
    Expired,
    /// Authenticated, but asked to act for a user it may not act for.
    #[error("principal {principal} may not act for other users")]
    MayNotActAs { principal: String },
    #[error("invalid {ACT_AS} header: {0}")]
    BadActAs(String),
}

impl From<AuthError> for tonic::Status {
    fn from(error: AuthError) -> Self {
        match error {
            AuthError::MayNotActAs { .. } => tonic::Status::permission_denied(error.to_string()),
            AuthError::BadActAs(_) => tonic::Status::invalid_argument(error.to_string()),
            _ => tonic::Status::unauthenticated(error.to_string()),
        }
    }
}

/// Turns request headers into a principal, for the configured mode.
pub enum Authenticator {
    None,
    Tokens(Arc<tokens::TokenStore>),
    Jwt(Box<jwt::JwtVerifier>),
}

impl Authenticator {
    /// Builds the authenticator of `config` (reads key and token files).
    pub fn from_config(config: &AuthConfig) -> Result<Self, String> {
        Ok(match config {
            AuthConfig::None => Self::None,
            AuthConfig::Tokens { file } => Self::Tokens(Arc::new(tokens::TokenStore::load(file)?)),
            AuthConfig::Jwt(jwt) => Self::Jwt(Box::new(jwt::JwtVerifier::new(jwt)?)),
        })
    }

    /// Authenticates one call from its headers.
    pub fn authenticate(&self, headers: &HeaderMap) -> Result<Principal, AuthError> {
        let mut principal = match self {
            Self::None => Principal::local(),
            Self::Tokens(store) => store.authenticate(bearer(headers)?)?,
            Self::Jwt(verifier) => verifier.authenticate(bearer(headers)?)?,
        };
        if let Some(value) = headers.get(ACT_AS) {
            let user = value.to_str().map_err(|_| AuthError::BadActAs("not ASCII".into()))?;
            validate_id("user id", user).map_err(|error| AuthError::BadActAs(error.to_string()))?;
            if !principal.may_act_for_users() {
                // Acting as oneself is harmless and lets a CLI always send --act-as.
                if user != principal.name {
                    return Err(AuthError::MayNotActAs { principal: principal.label() });
                }
            } else {
                principal.acting_for = Some(user.to_owned());
            }
        }
        Ok(principal)
    }
}

fn bearer(headers: &HeaderMap) -> Result<&str, AuthError> {
    let value = headers.get(berth_proto::auth::AUTHORIZATION).ok_or(AuthError::Missing)?;
    let text = value.to_str().map_err(|_| AuthError::Invalid)?;
    berth_proto::auth::bearer_of(text).ok_or(AuthError::Invalid)
}
