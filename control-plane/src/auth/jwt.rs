//! `--auth jwt`: bearer JWTs signed with HS256 (a shared secret) or RS256 / ES256 (a public
//! key), verified with `jsonwebtoken` (on ring).
//!
//! `sub` is the principal's name. Berth's own claims are namespaced, so an identity
//! provider's claims of the same name mean nothing here: `berth/admin: true` makes an admin,
//! `berth/act_for_users: true` a service that may act for users; neither, an end user.
//! `berth/backends: ["local"]` grants unsandboxed backends, as a token's `backends` does
//! (only unsandboxed names; anything else makes the token invalid). The older bare names
//! (`admin`, `act_for_users`, `berth_backends`) are read only with `--jwt-legacy-claims`;
//! otherwise a token carrying one is refused, naming the new claim.
//!
//! `exp` is required and enforced with a small leeway, and no token may live longer than
//! `--jwt-max-lifetime` (from `iat`, or from now when it has none). `iss` and `aud` are
//! required (`--jwt-issuer`, `--jwt-audience`) unless explicitly waived
//! (`--jwt-any-issuer`, `--jwt-any-audience`). Only the algorithm that matches the
//! configured key is accepted (no `alg: none`, no HS256-with-the-public-key confusion).

use std::path::PathBuf;
use std::time::Duration;

use berth_proto::auth::Secret;
use berth_workspace::validate_id;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde::Deserialize;

use super::error::AuthError;
use super::principal::{Principal, Role};

/// Where the verification key comes from.
#[derive(Clone, Debug)]
pub enum JwtKey {
    /// HS256 with the secret in this file.
    Secret(PathBuf),
    /// RS256 or ES256 (by the key's type) with the PEM public key in this file.
    PublicKey(PathBuf),
}

/// Whether `iss` / `aud` must match a configured value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClaimCheck {
    /// The claim must be this value.
    Required(String),
    /// Explicitly not checked (`--jwt-any-issuer` / `--jwt-any-audience`).
    Waived,
    /// Not configured: refused at start.
    Unset,
}

#[derive(Clone, Debug)]
pub struct JwtConfig {
    pub key: JwtKey,
    /// `iss` every token must carry.
    pub issuer: ClaimCheck,
    /// `aud` every token must carry.
    pub audience: ClaimCheck,
    /// Clock skew tolerated on `exp` / `nbf`.
    pub leeway: Duration,
    /// Longest a token may be valid: `exp - iat` (or `exp - now` without `iat`).
    pub max_lifetime: Duration,
    /// Also read the un-namespaced claims `admin`, `act_for_users`, `berth_backends`.
    pub legacy_claims: bool,
}

impl JwtConfig {
    /// A config that still needs its issuer and audience set (or waived).
    pub fn new(key: JwtKey) -> Self {
        Self {
            key,
            issuer: ClaimCheck::Unset,
            audience: ClaimCheck::Unset,
            leeway: Duration::from_secs(30),
            max_lifetime: Duration::from_secs(24 * 3600),
            legacy_claims: false,
        }
    }
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
    #[serde(default)]
    iat: Option<u64>,
    #[serde(default, rename = "berth/admin")]
    admin: bool,
    #[serde(default, rename = "berth/act_for_users")]
    act_for_users: bool,
    #[serde(default, rename = "berth/backends")]
    backends: Vec<String>,
    #[serde(default, rename = "admin")]
    legacy_admin: Option<serde_json::Value>,
    #[serde(default, rename = "act_for_users")]
    legacy_act_for_users: Option<serde_json::Value>,
    #[serde(default, rename = "berth_backends")]
    legacy_backends: Option<serde_json::Value>,
}

pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
    max_lifetime: Duration,
    leeway: Duration,
    legacy_claims: bool,
}

impl JwtVerifier {
    pub fn new(config: &JwtConfig) -> Result<Self, String> {
        let (key, algorithm) = match &config.key {
            JwtKey::Secret(path) => {
                let secret = Secret::from_file(path)?;
                (DecodingKey::from_secret(secret.expose().as_bytes()), Algorithm::HS256)
            }
            JwtKey::PublicKey(path) => {
                let pem = std::fs::read(path)
                    .map_err(|error| format!("reading JWT public key {}: {error}", path.display()))?;
                if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
                    (key, Algorithm::RS256)
                } else if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
                    (key, Algorithm::ES256)
                } else {
                    return Err(format!("{} is not a PEM RSA or EC (P-256) public key", path.display()));
                }
            }
        };
        let mut validation = Validation::new(algorithm);
        validation.leeway = config.leeway.as_secs();
        validation.validate_exp = true;
        validation.validate_nbf = true;
        let mut required = vec!["exp", "sub"];
        match &config.issuer {
            ClaimCheck::Required(issuer) => {
                validation.set_issuer(&[issuer]);
                required.push("iss");
            }
            ClaimCheck::Waived => validation.iss = None,
            ClaimCheck::Unset => {
                return Err("--auth jwt needs --jwt-issuer (the iss every token must carry), or --jwt-any-issuer \
                            to accept tokens of any issuer signed with this key"
                    .into());
            }
        }
        match &config.audience {
            ClaimCheck::Required(audience) => {
                validation.set_audience(&[audience]);
                required.push("aud");
            }
            ClaimCheck::Waived => validation.validate_aud = false,
            ClaimCheck::Unset => {
                return Err("--auth jwt needs --jwt-audience (the aud every token must carry), or \
                            --jwt-any-audience to accept tokens meant for any service signed with this key"
                    .into());
            }
        }
        validation.set_required_spec_claims(&required);
        if config.max_lifetime.is_zero() {
            return Err("--jwt-max-lifetime must be above 0s".into());
        }
        Ok(Self {
            key,
            validation,
            max_lifetime: config.max_lifetime,
            leeway: config.leeway,
            legacy_claims: config.legacy_claims,
        })
    }

    pub fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|error| match error.kind() {
                ErrorKind::ExpiredSignature => AuthError::Expired,
                ErrorKind::InvalidSignature => AuthError::Invalid,
                other => AuthError::InvalidToken(describe(other)),
            })?;
        let mut claims = data.claims;
        validate_id("subject", &claims.sub).map_err(|error| AuthError::InvalidToken(error.to_string()))?;
        self.check_lifetime(&claims)?;
        self.fold_legacy_claims(&mut claims)?;
        let role = if claims.admin {
            Role::Admin
        } else if claims.act_for_users {
            Role::Service { act_for_users: true }
        } else {
            Role::User
        };
        let granted_backends = super::tokens::granted_backends(claims.backends)
            .map_err(|reason| AuthError::InvalidToken(format!("berth/backends claim: {reason}")))?;
        Ok(Principal { granted_backends, ..Principal::new(claims.sub, role) })
    }
}

impl JwtVerifier {
    /// A token valid for longer than the maximum is refused, however it was signed: a
    /// leaked long-lived token would otherwise outlive any rotation.
    fn check_lifetime(&self, claims: &Claims) -> Result<(), AuthError> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|since| since.as_secs())
            .unwrap_or(0);
        let start = claims.iat.map_or(now, |iat| iat.min(now));
        let lifetime = claims.exp.saturating_sub(start);
        let allowed = self.max_lifetime.as_secs() + self.leeway.as_secs();
        if lifetime > allowed {
            return Err(AuthError::InvalidToken(format!(
                "valid for {lifetime} s, longer than the {} s this replica accepts (--jwt-max-lifetime)",
                self.max_lifetime.as_secs()
            )));
        }
        Ok(())
    }

    /// The bare claim names of older tokens: read with `--jwt-legacy-claims`, else refused
    /// with the name to use instead (never silently ignored: an admin token would quietly
    /// become a user's).
    fn fold_legacy_claims(&self, claims: &mut Claims) -> Result<(), AuthError> {
        let legacy = [
            ("admin", "berth/admin", claims.legacy_admin.take()),
            ("act_for_users", "berth/act_for_users", claims.legacy_act_for_users.take()),
            ("berth_backends", "berth/backends", claims.legacy_backends.take()),
        ];
        for (old, new, value) in legacy {
            let Some(value) = value else { continue };
            if !self.legacy_claims {
                return Err(AuthError::InvalidToken(format!(
                    "claim {old:?} is no longer read; use {new:?} (or start the replica with --jwt-legacy-claims)"
                )));
            }
            let bad = || AuthError::InvalidToken(format!("claim {old:?} has the wrong type"));
            match old {
                "admin" => claims.admin |= value.as_bool().ok_or_else(bad)?,
                "act_for_users" => claims.act_for_users |= value.as_bool().ok_or_else(bad)?,
                _ => claims.backends.extend(serde_json::from_value::<Vec<String>>(value).map_err(|_| bad())?),
            }
        }
        Ok(())
    }
}

/// A short reason without token contents.
fn describe(kind: &ErrorKind) -> String {
    match kind {
        ErrorKind::InvalidIssuer => "wrong issuer".into(),
        ErrorKind::InvalidAudience => "wrong audience".into(),
        ErrorKind::ImmatureSignature => "not valid yet (nbf)".into(),
        ErrorKind::InvalidAlgorithm => "algorithm not accepted".into(),
        ErrorKind::MissingRequiredClaim(claim) => format!("missing claim {claim}"),
        ErrorKind::InvalidToken | ErrorKind::Base64(_) | ErrorKind::Json(_) | ErrorKind::Utf8(_) => {
            "malformed token".into()
        }
        _ => "rejected".into(),
    }
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{EncodingKey, Header};

    use super::*;

    fn now() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs()
    }

    fn verifier(dir: &std::path::Path, issuer: Option<&str>, audience: Option<&str>) -> JwtVerifier {
        let path = dir.join("jwt.secret");
        std::fs::write(&path, "jwt-secret-0123456789abcdef\n").unwrap();
        let mut config = JwtConfig::new(JwtKey::Secret(path));
        config.issuer = issuer.map_or(ClaimCheck::Waived, |issuer| ClaimCheck::Required(issuer.to_owned()));
        config.audience = audience.map_or(ClaimCheck::Waived, |audience| ClaimCheck::Required(audience.to_owned()));
        config.leeway = Duration::from_secs(5);
        JwtVerifier::new(&config).unwrap()
    }

    fn sign(claims: serde_json::Value, secret: &str) -> String {
        jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(secret.as_bytes()))
            .unwrap()
    }

    #[test]
    fn hs256_roles_expiry_issuer_audience() {
        let dir = tempfile::tempdir().unwrap();
        let verifier = verifier(dir.path(), Some("berth-test"), Some("berth"));
        let secret = "jwt-secret-0123456789abcdef";
        let good = serde_json::json!({"sub": "alice", "exp": now() + 60, "iss": "berth-test", "aud": "berth"});
        assert_eq!(verifier.authenticate(&sign(good.clone(), secret)).unwrap(), Principal::new("alice", Role::User));
        let mut admin = good.clone();
        admin["berth/admin"] = true.into();
        assert_eq!(verifier.authenticate(&sign(admin, secret)).unwrap().role, Role::Admin);
        let mut service = good.clone();
        service["berth/act_for_users"] = true.into();
        assert_eq!(verifier.authenticate(&sign(service, secret)).unwrap().role, Role::Service { act_for_users: true });

        let mut granted = good.clone();
        granted["berth/backends"] = serde_json::json!(["local"]);
        assert!(verifier.authenticate(&sign(granted, secret)).unwrap().may_use_backend("local"));
        let mut bad_grant = good.clone();
        bad_grant["berth/backends"] = serde_json::json!(["docker"]);
        assert!(matches!(verifier.authenticate(&sign(bad_grant, secret)), Err(AuthError::InvalidToken(_))));
        assert!(!verifier.authenticate(&sign(good.clone(), secret)).unwrap().may_use_backend("local"));

        let mut expired = good.clone();
        expired["exp"] = (now() - 60).into();
        assert_eq!(verifier.authenticate(&sign(expired, secret)), Err(AuthError::Expired));
        let mut within_leeway = good.clone();
        within_leeway["exp"] = (now() - 2).into();
        assert!(verifier.authenticate(&sign(within_leeway, secret)).is_ok());
        let mut no_exp = good.clone();
        no_exp.as_object_mut().unwrap().remove("exp");
        assert!(matches!(verifier.authenticate(&sign(no_exp, secret)), Err(AuthError::InvalidToken(_))));
        for (claim, value) in [("iss", "someone-else"), ("aud", "other")] {
            let mut wrong = good.clone();
            wrong[claim] = value.into();
            let refused = verifier.authenticate(&sign(wrong.clone(), secret)).unwrap_err();
            assert!(matches!(refused, AuthError::InvalidToken(_)), "wrong {claim}: {refused:?}");
            wrong.as_object_mut().unwrap().remove(claim);
            let refused = verifier.authenticate(&sign(wrong, secret)).unwrap_err();
            assert!(matches!(refused, AuthError::InvalidToken(_)), "missing {claim}: {refused:?}");
        }
        assert_eq!(verifier.authenticate(&sign(good.clone(), "another-secret-0123456789")), Err(AuthError::Invalid));
        assert!(verifier.authenticate("not.a.jwt").is_err());
        let mut bad_sub = good;
        bad_sub["sub"] = "../root".into();
        assert!(matches!(verifier.authenticate(&sign(bad_sub, secret)), Err(AuthError::InvalidToken(_))));
    }

    #[test]
    fn issuer_and_audience_are_required_unless_waived() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("jwt.secret");
        std::fs::write(&path, "jwt-secret-0123456789abcdef\n").unwrap();
        let mut config = JwtConfig::new(JwtKey::Secret(path));
        assert!(JwtVerifier::new(&config).err().unwrap().contains("--jwt-issuer"));
        config.issuer = ClaimCheck::Waived;
        assert!(JwtVerifier::new(&config).err().unwrap().contains("--jwt-audience"));
        config.audience = ClaimCheck::Required("berth".into());
        assert!(JwtVerifier::new(&config).is_ok());
    }

    #[test]
    fn tokens_living_longer_than_the_maximum_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut verifier = verifier(dir.path(), None, None);
        verifier.max_lifetime = Duration::from_secs(3600);
        let secret = "jwt-secret-0123456789abcdef";
        let within = serde_json::json!({"sub": "alice", "iat": now(), "exp": now() + 3600});
        assert!(verifier.authenticate(&sign(within, secret)).is_ok());
        for too_long in [
            serde_json::json!({"sub": "alice", "iat": now(), "exp": now() + 7200}),
            // Without iat the lifetime counts from now.
            serde_json::json!({"sub": "alice", "exp": now() + 7200}),
            // An iat in the future does not shorten it.
            serde_json::json!({"sub": "alice", "iat": now() + 3600, "exp": now() + 7200}),
            // Issued long ago for a long time: refused although little of it is left.
            serde_json::json!({"sub": "alice", "iat": now() - 86400 * 30, "exp": now() + 60}),
        ] {
            let refused = verifier.authenticate(&sign(too_long.clone(), secret)).unwrap_err();
            assert!(
                matches!(&refused, AuthError::InvalidToken(reason) if reason.contains("--jwt-max-lifetime")),
                "{too_long}: {refused:?}"
            );
        }
    }

    #[test]
    fn bare_claim_names_are_refused_unless_legacy_claims_are_on() {
        let dir = tempfile::tempdir().unwrap();
        let mut verifier = verifier(dir.path(), None, None);
        let secret = "jwt-secret-0123456789abcdef";
        let old_admin = serde_json::json!({"sub": "root", "exp": now() + 60, "admin": true});
        let refused = verifier.authenticate(&sign(old_admin.clone(), secret)).unwrap_err();
        assert!(
            matches!(&refused, AuthError::InvalidToken(reason) if reason.contains("\"berth/admin\"")),
            "{refused:?}"
        );
        let old_backends = serde_json::json!({"sub": "a", "exp": now() + 60, "berth_backends": ["local"]});
        assert!(verifier.authenticate(&sign(old_backends.clone(), secret)).is_err());
        verifier.legacy_claims = true;
        assert_eq!(verifier.authenticate(&sign(old_admin, secret)).unwrap().role, Role::Admin);
        assert!(verifier.authenticate(&sign(old_backends, secret)).unwrap().may_use_backend("local"));
        let service = serde_json::json!({"sub": "svc", "exp": now() + 60, "act_for_users": true});
        assert_eq!(verifier.authenticate(&sign(service, secret)).unwrap().role, Role::Service { act_for_users: true });
    }

    #[test]
    fn alg_none_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let verifier = verifier(dir.path(), None, None);
        // header {"alg":"none","typ":"JWT"}, payload {"sub":"alice","exp":9999999999}
        let token = "eyJhbGciOiJub25lIiwidHlwIjoiSldUIn0.eyJzdWIiOiJhbGljZSIsImV4cCI6OTk5OTk5OTk5OX0.";
        assert!(verifier.authenticate(token).is_err());
    }

    fn openssl(args: &[&str]) {
        let output = std::process::Command::new("openssl").args(args).output().expect("openssl");
        assert!(output.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&output.stderr));
    }

    #[test]
    fn rs256_and_es256_with_public_keys_and_no_algorithm_confusion() {
        let dir = tempfile::tempdir().unwrap();
        for (kind, options, algorithm) in
            [("RSA", "rsa_keygen_bits:2048", Algorithm::RS256), ("EC", "ec_paramgen_curve:P-256", Algorithm::ES256)]
        {
            let private = dir.path().join(format!("{kind}.key"));
            let public = dir.path().join(format!("{kind}.pub"));
            let (private_text, public_text) = (private.display().to_string(), public.display().to_string());
            openssl(&["genpkey", "-algorithm", kind, "-pkeyopt", options, "-out", &private_text]);
            openssl(&["pkey", "-in", &private_text, "-pubout", "-out", &public_text]);
            let mut config = JwtConfig::new(JwtKey::PublicKey(public.clone()));
            config.issuer = ClaimCheck::Waived;
            config.audience = ClaimCheck::Waived;
            let verifier = JwtVerifier::new(&config).unwrap();
            let pem = std::fs::read(&private).unwrap();
            let key = match algorithm {
                Algorithm::RS256 => EncodingKey::from_rsa_pem(&pem).unwrap(),
                _ => EncodingKey::from_ec_pem(&pem).unwrap(),
            };
            let claims = serde_json::json!({"sub": "alice", "exp": now() + 60});
            let token = jsonwebtoken::encode(&Header::new(algorithm), &claims, &key).unwrap();
            assert_eq!(verifier.authenticate(&token).unwrap().name, "alice", "{kind}");
            // The public key used as an HMAC secret must not verify (algorithm confusion).
            let public_pem = std::fs::read(&public).unwrap();
            let confused =
                jsonwebtoken::encode(&Header::new(Algorithm::HS256), &claims, &EncodingKey::from_secret(&public_pem))
                    .unwrap();
            assert!(verifier.authenticate(&confused).is_err(), "{kind}: HS256 with the public key accepted");
        }
    }
}
