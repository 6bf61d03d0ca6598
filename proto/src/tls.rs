//! TLS settings shared by replicas, node agents and the CLI (rustls with ring through
//! tonic's `tls-ring` feature; docs/dependencies.md). Files are PEM.
//!
//! - Public listener: [`server_config`] with a cert and key (`--tls-cert`, `--tls-key`).
//! - Replica -> node agent (mTLS): the node serves with its cert and requires a client cert
//!   signed by the cluster CA ([`server_config`] with `client_ca`); the replica presents its
//!   client cert and verifies the node's against the same CA ([`ClientTls`]).

use std::path::{Path, PathBuf};

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

/// A certificate chain and its private key.
#[derive(Clone, Debug)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl TlsFiles {
    fn identity(&self) -> Result<Identity, String> {
        Ok(Identity::from_pem(read(&self.cert)?, read(&self.key)?))
    }
}

/// How a client verifies a server (and optionally proves who it is).
#[derive(Clone, Debug)]
pub struct ClientTls {
    /// CA that signed the server's certificate.
    pub ca: PathBuf,
    /// Client certificate for mutual TLS.
    pub identity: Option<TlsFiles>,
    /// Name to verify in the server certificate instead of the URL's host.
    pub domain: Option<String>,
}

impl ClientTls {
    pub fn config(&self) -> Result<ClientTlsConfig, String> {
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(&self.ca)?));
        if let Some(identity) = &self.identity {
            config = config.identity(identity.identity()?);
        }
        if let Some(domain) = &self.domain {
            config = config.domain_name(domain.clone());
        }
        Ok(config)
    }
}

/// A server config with `files` as identity; with `client_ca`, clients must present a
/// certificate signed by it (mutual TLS).
pub fn server_config(files: &TlsFiles, client_ca: Option<&Path>) -> Result<ServerTlsConfig, String> {
    let mut config = ServerTlsConfig::new().identity(files.identity()?);
    if let Some(ca) = client_ca {
        config = config.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    Ok(config)
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|error| format!("reading {}: {error}", path.display()))
}
