//! Credentials on the wire: the redacting [`Secret`] type, `authorization: Bearer` headers
//! and the node credential that replicas and node agents present to each other.
//!
//! Lives here (not in the control plane) because both ends of the replica <-> node channel
//! need it and the node agent does not depend on the control plane.

use std::fmt;
use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tonic::metadata::{MetadataMap, MetadataValue};

/// Request metadata carrying a bearer credential (lowercase: gRPC metadata keys are).
pub const AUTHORIZATION: &str = "authorization";

/// Shortest secret accepted from a file: shorter ones are guessable.
pub const MIN_SECRET_BYTES: usize = 16;

/// A secret string. `Debug` and `Display` print `<redacted>`, so a secret inside a config
/// struct never reaches a log line; the value is reachable only through [`Secret::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// A fresh random secret (hex of 32 random bytes), e.g. for `berth up`'s in-process
    /// node agent.
    pub fn random() -> Self {
        Self(hex_encode(&rand_bytes()))
    }

    /// Reads a secret file: surrounding whitespace is dropped; empty or short secrets are
    /// refused.
    pub fn from_file(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|error| format!("reading secret file {}: {error}", path.display()))?;
        let secret = Self(text.trim().to_owned());
        secret.validate().map_err(|reason| format!("secret file {}: {reason}", path.display()))?;
        Ok(secret)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.0.len() < MIN_SECRET_BYTES {
            return Err(format!("a secret must be at least {MIN_SECRET_BYTES} bytes"));
        }
        if !self.0.bytes().all(|byte| byte.is_ascii_graphic()) {
            return Err("a secret must be printable ASCII without spaces".into());
        }
        Ok(())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// SHA-256 of the secret: comparisons run on digests, so they take the same time
    /// whatever the lengths involved.
    pub fn digest(&self) -> [u8; 32] {
        digest(self.0.as_bytes())
    }

    /// Constant-time comparison with a presented credential.
    pub fn matches(&self, presented: &str) -> bool {
        bool::from(self.digest().ct_eq(&digest(presented.as_bytes())))
    }

    /// `Bearer <secret>` as a metadata value; `None` if the secret is not header-safe.
    pub fn bearer_value(&self) -> Option<MetadataValue<tonic::metadata::Ascii>> {
        format!("Bearer {}", self.0).parse().ok()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("<redacted>")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str("<redacted>")
    }
}

pub fn digest(bytes: &[u8]) -> [u8; 32] {
    Sha256::digest(bytes).into()
}

/// The credential of an `authorization: Bearer <credential>` header, if well formed.
pub fn bearer(metadata: &MetadataMap) -> Option<&str> {
    let value = metadata.get(AUTHORIZATION)?.to_str().ok()?;
    bearer_of(value)
}

/// The credential of an `authorization` header value (`Bearer` is case-insensitive).
pub fn bearer_of(header: &str) -> Option<&str> {
    let (scheme, credential) = header.split_once(' ')?;
    let credential = credential.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !credential.is_empty()).then_some(credential)
}

/// A tonic interceptor that adds `authorization: Bearer <secret>` to every request; used by
/// replicas calling node agents and by node agents heartbeating to replicas.
#[derive(Clone, Debug, Default)]
pub struct BearerInterceptor {
    header: Option<MetadataValue<tonic::metadata::Ascii>>,
}

impl BearerInterceptor {
    /// `None` sends no credential (node authentication off).
    pub fn new(secret: Option<&Secret>) -> Self {
        Self { header: secret.and_then(Secret::bearer_value) }
    }
}

impl tonic::service::Interceptor for BearerInterceptor {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(header) = &self.header {
            request.metadata_mut().insert(AUTHORIZATION, header.clone());
        }
        Ok(request)
    }
}

fn rand_bytes() -> [u8; 32] {
    rand::random()
}

fn hex_encode(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_redacted_and_compared_by_value() {
        let secret = Secret::new("s3cret-s3cret-s3cret");
        assert_eq!(format!("{secret:?} {secret}"), "<redacted> <redacted>");
        assert!(secret.matches("s3cret-s3cret-s3cret"));
        assert!(!secret.matches("s3cret-s3cret-s3cre"));
        assert!(!secret.matches(""));
        assert!(Secret::new("short").validate().is_err());
        assert!(Secret::new("has a space in it, long").validate().is_err());
        assert_eq!(Secret::random().expose().len(), 64);
    }

    #[test]
    fn bearer_headers_parse() {
        assert_eq!(bearer_of("Bearer abc"), Some("abc"));
        assert_eq!(bearer_of("bearer  abc "), Some("abc"));
        assert_eq!(bearer_of("Basic abc"), None);
        assert_eq!(bearer_of("Bearer "), None);
        assert_eq!(bearer_of("Bearer"), None);
    }
}
