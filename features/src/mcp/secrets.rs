//! The node agent's private store of MCP secrets: `<dir>/<ws_id>.json`, mode 0600 in a
//! 0700 directory outside every workspace root (no sandbox mounts it), written atomically
//! (temp + fsync + rename + directory fsync), removed when the workspace is destroyed.
//!
//! Each secret is bound to the declaration it was added with ([`McpServerConfig::binding`]):
//! resolving it for any other declaration fails.
//!
//! Durable: the files. Rebuilt at start: nothing (every call reads the file; secrets are
//! small and calls that need them start a server, which costs far more).
//!
//! [`McpServerConfig::binding`]: super::McpServerConfig::binding

use std::collections::BTreeMap;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::id::WorkspaceId;

const FILE_VERSION: u32 = 1;

#[derive(Default, Serialize, Deserialize)]
struct SecretFile {
    version: u32,
    secrets: BTreeMap<String, StoredSecret>,
    /// The binding of each server as declared through AddMcp (server name -> binding):
    /// what the node may connect to for an HTTP server. Absent in files of older nodes.
    #[serde(default)]
    declared: BTreeMap<String, String>,
}

#[derive(Clone, Serialize, Deserialize)]
struct StoredSecret {
    value: String,
    /// The binding of the declaration the secret was added with.
    binding: String,
}

/// Secrets never reach `Debug` output.
impl std::fmt::Debug for StoredSecret {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("StoredSecret(<redacted>)")
    }
}

/// Per-node secret store. Read-modify-writes are serialised by one lock (adding a server
/// is rare); reads share it too, so a reader never sees a half-replaced file.
#[derive(Debug)]
pub struct SecretStore {
    dir: PathBuf,
    lock: tokio::sync::Mutex<()>,
}

impl SecretStore {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into(), lock: tokio::sync::Mutex::new(()) }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, workspace: &WorkspaceId) -> PathBuf {
        self.dir.join(format!("{workspace}.json"))
    }

    /// Replaces every secret of `server` with `values` (reference -> value), bound to
    /// `binding`, and records `binding` as the server's declaration. An empty `binding`
    /// removes the server's secrets and declaration.
    pub async fn put_server(
        &self,
        workspace: &WorkspaceId,
        server: &str,
        binding: &str,
        values: BTreeMap<String, String>,
    ) -> Result<()> {
        let _guard = self.lock.lock().await;
        let path = self.path(workspace);
        let prefix = format!("mcp/{server}/");
        let binding = binding.to_owned();
        let server_name = server.to_owned();
        blocking(move || {
            let mut file = read(&path)?;
            file.secrets.retain(|reference, _| !reference.starts_with(&prefix));
            for (reference, value) in values {
                file.secrets.insert(reference, StoredSecret { value, binding: binding.clone() });
            }
            if binding.is_empty() {
                file.declared.remove(&server_name);
            } else {
                file.declared.insert(server_name, binding);
            }
            write(&path, &file)
        })
        .await
    }

    /// Removes the secrets of one server.
    pub async fn remove_server(&self, workspace: &WorkspaceId, server: &str) -> Result<()> {
        self.put_server(workspace, server, "", BTreeMap::new()).await
    }

    /// The value of `reference`, if it exists and was added for a declaration with this
    /// `binding`.
    pub async fn resolve(&self, workspace: &WorkspaceId, reference: &str, binding: &str) -> Result<String> {
        let _guard = self.lock.lock().await;
        let path = self.path(workspace);
        let file = blocking(move || read(&path)).await?;
        match file.secrets.get(reference) {
            Some(secret) if secret.binding == binding => Ok(secret.value.clone()),
            Some(_) => Err(WorkspaceError::InvalidArgument(format!(
                "secret {reference:?} belongs to another declaration of its server (was .mcp edited?); add the server again"
            ))),
            None => Err(WorkspaceError::InvalidArgument(format!(
                "secret {reference:?} is not in the node's secret store; add the server again"
            ))),
        }
    }

    /// Whether `server` was declared through AddMcp exactly as `binding` (an edited
    /// declaration has another binding).
    pub async fn is_declared(&self, workspace: &WorkspaceId, server: &str, binding: &str) -> Result<bool> {
        let _guard = self.lock.lock().await;
        let path = self.path(workspace);
        let file = blocking(move || read(&path)).await?;
        Ok(file.declared.get(server).is_some_and(|declared| declared == binding))
    }

    /// Removes the workspace's file (on destroy). Idempotent.
    pub async fn destroy(&self, workspace: &WorkspaceId) -> Result<()> {
        let _guard = self.lock.lock().await;
        let path = self.path(workspace);
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(WorkspaceError::from_io("remove", &path.display().to_string(), error)),
        })
        .await
    }
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work).await.map_err(|error| WorkspaceError::Backend {
        backend: "secret-store",
        message: format!("blocking task failed: {error}"),
    })?
}

fn read(path: &Path) -> Result<SecretFile> {
    let display = path.display().to_string();
    match std::fs::read(path) {
        Ok(bytes) => {
            let file: SecretFile = serde_json::from_slice(&bytes)
                .map_err(|error| WorkspaceError::Corrupt { what: display.clone(), reason: error.to_string() })?;
            if file.version != FILE_VERSION {
                return Err(WorkspaceError::Corrupt { what: display, reason: format!("version {}", file.version) });
            }
            Ok(file)
        }
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            Ok(SecretFile { version: FILE_VERSION, ..SecretFile::default() })
        }
        Err(error) => Err(WorkspaceError::from_io("read", &display, error)),
    }
}

fn write(path: &Path, file: &SecretFile) -> Result<()> {
    let display = path.display().to_string();
    let io = |op| move |error| WorkspaceError::from_io(op, &path.display().to_string(), error);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(io("create"))?;
    if file.secrets.is_empty() && file.declared.is_empty() {
        return match std::fs::remove_file(path) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(io("remove")(error)),
            _ => Ok(()),
        };
    }
    let bytes = serde_json::to_vec(file)
        .map_err(|error| WorkspaceError::Corrupt { what: display.clone(), reason: error.to_string() })?;
    let temporary = path.with_extension(format!("json.tmp-{:016x}", rand::random::<u64>()));
    let written = (|| {
        // 0600 from creation: the value never sits in a file others can read.
        let mut out = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&temporary)?;
        out.write_all(&bytes)?;
        out.sync_all()?;
        std::fs::rename(&temporary, path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if let Err(error) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(io("write")(error));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    #[tokio::test]
    async fn bound_private_and_removable() {
        let dir = tempfile::tempdir().unwrap();
        let store = SecretStore::new(dir.path().join("secrets"));
        let ws = WorkspaceId::new("ws-1").unwrap();
        let values = BTreeMap::from([("mcp/a/env/K".to_owned(), "s3cret".to_owned())]);
        store.put_server(&ws, "a", "bind-1", values).await.unwrap();
        assert_eq!(store.resolve(&ws, "mcp/a/env/K", "bind-1").await.unwrap(), "s3cret");
        assert!(store.resolve(&ws, "mcp/a/env/K", "bind-2").await.is_err());
        assert!(store.resolve(&ws, "mcp/a/env/X", "bind-1").await.is_err());
        let file = dir.path().join("secrets/ws-1.json");
        assert_eq!(std::fs::metadata(&file).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(dir.path().join("secrets")).unwrap().permissions().mode() & 0o777, 0o700);
        store.destroy(&ws).await.unwrap();
        assert!(!file.exists());
        store.destroy(&ws).await.unwrap();
    }
}
