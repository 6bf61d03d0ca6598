//! `--auth jwt`: bearer JWTs signed with HS256 (a shared secret) or RS256 / ES256 (a public
//! key), verified with `jsonwebtoken` (on ring).
//!
//! `sub` is the principal's name. Optional claims: `admin: true` makes an admin,
//! `act_for_users: true` a service that may act for users; neither, an end user.
//! `berth_backends: ["local"]` grants unsandboxed backends, as a token's `backends` does
//! (only unsandboxed names; anything else makes the token invalid). `exp` is
//! required and enforced with a small leeway; `iss` / `aud` are checked when configured.
//! Only the algorithm that matches the configured key is accepted (no `alg: none`, no
//! HS256-with-the-public-key confusion).

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

#[derive(Clone, Debug)]
pub struct JwtConfig {
    pub key: JwtKey,
    /// Required `iss`, when set.
    pub issuer: Option<String>,
    /// Required `aud`, when set.
    pub audience: Option<String>,
    /// Clock skew tolerated on `exp` / `nbf`.
    pub leeway: Duration,
}

impl JwtConfig {
    pub fn new(key: JwtKey) -> Self {
        Self { key, issuer: None, audience: None, leeway: Duration::from_secs(30) }
    }
}

#[derive(Deserialize)]
struct Claims {
    sub: String,
    #[serde(default)]
    admin: bool,
    #[serde(default)]
    act_for_users: bool,
    #[serde(default)]
    berth_backends: Vec<String>,
}

pub struct JwtVerifier {
    key: DecodingKey,
    validation: Validation,
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
        validation.set_required_spec_claims(&["exp", "sub"]);
        match &config.issuer {
            Some(issuer) => validation.set_issuer(&[issuer]),
            None => validation.iss = None,
        }
        match &config.audience {
            Some(audience) => validation.set_audience(&[audience]),
            None => validation.validate_aud = false,
        }
        Ok(Self { key, validation })
    }

    pub fn authenticate(&self, token: &str) -> Result<Principal, AuthError> {
        let data =
            jsonwebtoken::decode::<Claims>(token, &self.key, &self.validation).map_err(|error| match error.kind() {
                ErrorKind::ExpiredSignature => AuthError::Expired,
                ErrorKind::InvalidSignature => AuthError::Invalid,
                other => AuthError::InvalidToken(describe(other)),
            })?;
        let claims = data.claims;
        validate_id("subject", &claims.sub).map_err(|error| AuthError::InvalidToken(error.to_string()))?;
        let role = if claims.admin {
            Role::Admin
        } else if claims.act_for_users {
            Role::Service { act_for_users: true }
        } else {
            Role::User
        };
        let granted_backends = super::tokens::granted_backends(claims.berth_backends)
            .map_err(|reason| AuthError::InvalidToken(format!("berth_backends claim: {reason}")))?;
        Ok(Principal { granted_backends, ..Principal::new(claims.sub, role) })
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
        config.issuer = issuer.map(str::to_owned);
        config.audience = audience.map(str::to_owned);
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
        admin["admin"] = true.into();
        assert_eq!(verifier.authenticate(&sign(admin, secret)).unwrap().role, Role::Admin);
        let mut service = good.clone();
        service["act_for_users"] = true.into();
        assert_eq!(verifier.authenticate(&sign(service, secret)).unwrap().role, Role::Service { act_for_users: true });

        let mut granted = good.clone();
        granted["berth_backends"] = serde_json::json!(["local"]);
        assert!(verifier.authenticate(&sign(granted, secret)).unwrap().may_use_backend("local"));
        let mut bad_grant = good.clone();
        bad_grant["berth_backends"] = serde_json::json!(["docker"]);
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
        let mut issuer = good.clone();
        issuer["iss"] = "someone-else".into();
        assert!(matches!(verifier.authenticate(&sign(issuer, secret)), Err(AuthError::InvalidToken(_))));
        let mut audience = good.clone();
        audience["aud"] = "other".into();
        assert!(matches!(verifier.authenticate(&sign(audience, secret)), Err(AuthError::InvalidToken(_))));
        assert_eq!(verifier.authenticate(&sign(good.clone(), "another-secret-0123456789")), Err(AuthError::Invalid));
        assert!(verifier.authenticate("not.a.jwt").is_err());
        let mut bad_sub = good;
        bad_sub["sub"] = "../root".into();
        assert!(matches!(verifier.authenticate(&sign(bad_sub, secret)), Err(AuthError::InvalidToken(_))));
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
            let verifier = JwtVerifier::new(&JwtConfig::new(JwtKey::PublicKey(public.clone()))).unwrap();
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
