//! Authentication of public calls (docs/design.md §5): who is calling, as a [`Principal`].
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

pub(crate) mod authenticator;
pub(crate) mod caller;
pub(crate) mod error;
pub mod jwt;
pub mod layer;
pub mod node;
pub(crate) mod principal;
pub mod tokens;

pub use authenticator::{AuthConfig, Authenticator};
pub use caller::Caller;
pub use error::AuthError;
pub use jwt::JwtConfig;
pub use layer::AuthLayer;
pub use node::{AuthenticatedNode, NodeAuth};
pub use principal::{Principal, Role};
