//! Why authentication failed. Mapped to a status with every other control-plane error,
//! in `crate::error`.

use berth_proto::meta::ACT_AS;

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
