//! The configured authentication mode and the one function that turns request headers
//! into a [`Principal`].

use std::path::PathBuf;
use std::sync::Arc;

use berth_proto::meta::ACT_AS;
use berth_workspace::validate_id;
use http::HeaderMap;

use super::error::AuthError;
use super::jwt::{self, JwtConfig};
use super::principal::Principal;
use super::tokens;

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
