//! One E2B workspace's `Backend`: processes through envd's process service (`process.rs`),
//! file bytes through `/files` (`files.rs`), and the derived file operations natively
//! through envd's filesystem service (`Stat`, `ListDir`, `MakeDir`, `Move`, `Remove`) on
//! paths confined by `resolve.rs`. `append_file` and `symlink` keep the POSIX defaults
//! (envd has no append or symlink call).
//!
//! Fencing: every mutating call first checks the generation recorded in the sandbox (the
//! spawn wrapper does it in the same process start; file calls read the file), so a gateway
//! whose placement was superseded by a newer adoption gets `SandboxFenced`.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use serde_json::{Value, json};
use tokio::sync::Mutex;
use tokio::time::Instant;

use berth_workspace::backend::{
    Backend, ByteStream, Capabilities, FileInfo, FileKind, SpawnRole, SpawnSpec, Spawned, WriteOptions,
};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use super::api::Api;
use super::config::BACKEND_NAME;
use super::envd::{Envd, json_u64};
use super::http::Retry;
use super::process::{self, Launch};
use super::resolve::{Mode, Resolver, entry_type, is_symlink};
use super::{files, generation};

pub struct E2bBackend {
    envd: Envd,
    api: Arc<Api>,
    root: String,
    generation_file: String,
    generation: u64,
    workspace_id: String,
    /// The sandbox timeout pushed forward on use, at most every quarter of it.
    timeout: Duration,
    last_touch: Mutex<Instant>,
}

impl E2bBackend {
    pub fn new(
        envd: Envd,
        api: Arc<Api>,
        root: String,
        generation_file: String,
        generation: u64,
        workspace_id: String,
        timeout: Duration,
    ) -> Self {
        Self {
            envd,
            api,
            root,
            generation_file,
            generation,
            workspace_id,
            timeout,
            last_touch: Mutex::new(Instant::now()),
        }
    }

    pub fn envd(&self) -> &Envd {
        &self.envd
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    pub fn sandbox_id(&self) -> &str {
        self.envd.sandbox_id()
    }

    /// Refuses when a newer placement adopted the sandbox.
    pub async fn check_fence(&self) -> Result<()> {
        self.touch().await;
        let held = generation::read(&self.envd, &self.generation_file).await?;
        match held {
            Some(held) if held > self.generation => Err(WorkspaceError::SandboxFenced {
                workspace_id: self.workspace_id.clone(),
                held,
                asked: self.generation,
            }),
            _ => Ok(()),
        }
    }

    /// Keeps the sandbox from timing out while it is used.
    async fn touch(&self) {
        let mut last = self.last_touch.lock().await;
        if last.elapsed() < self.timeout / 4 {
            return;
        }
        *last = Instant::now();
        if let Err(error) = self.api.set_timeout(self.sandbox_id(), self.timeout).await {
            tracing::warn!(sandbox = self.sandbox_id(), %error, "could not extend the e2b sandbox timeout");
        }
    }

    /// A secret holder's program: with a pin, argv[0] is a workspace path (relative to the
    /// cwd) resolved inside the root and replaced by its absolute path; without one it must
    /// be a system program, never a workspace path. Returns the pin argument (`-`: none).
    async fn holder_program(
        &self,
        resolver: &mut Resolver<'_>,
        spec: &SpawnSpec,
        cwd: &[String],
        argv: &mut [String],
    ) -> Result<String> {
        let program = argv[0].clone();
        let refuse = |reason: &str| WorkspaceError::SpawnFailed { program: program.clone(), reason: reason.to_owned() };
        match &spec.program_sha256 {
            Some(pin) => {
                let mut relative = RelPath::root();
                for component in cwd {
                    relative = relative.join(component)?;
                }
                let path = berth_workspace::path::join_path(&relative, &program)?;
                let resolved = resolver.resolve(&path, Mode::Follow).await?;
                if !resolved.exists() || resolved.is_dir() {
                    return Err(refuse("not found in the workspace"));
                }
                argv[0] = resolver.absolute(&resolved.components);
                Ok(hex::encode(pin))
            }
            None if program.contains('/')
                && (!program.starts_with('/') || program.starts_with(&format!("{}/", self.root))) =>
            {
                Err(refuse("a secret holder's program must be pinned (sha256) when it is a workspace path"))
            }
            None => Ok("-".to_owned()),
        }
    }

    fn resolver(&self) -> Resolver<'_> {
        Resolver::new(&self.envd, &self.root)
    }

    async fn call(&self, method: &str, message: Value, retry: Retry, what: &str, display: &str) -> Result<Value> {
        self.envd.unary(method, &message, retry).await.map_err(|error| error.into_error(what, display))
    }
}

fn info(path: RelPath, entry: &Value) -> FileInfo {
    let kind = if is_symlink(entry) {
        FileKind::Symlink
    } else {
        match entry_type(entry) {
            "FILE_TYPE_FILE" => FileKind::File,
            "FILE_TYPE_DIRECTORY" => FileKind::Directory,
            _ => FileKind::Other,
        }
    };
    let mode = if kind == FileKind::Symlink { 0o777 } else { json_u64(entry.get("mode")).unwrap_or(0) as u32 & 0o7777 };
    let modified = entry
        .get("modifiedTime")
        .and_then(Value::as_str)
        .and_then(|text| humantime::parse_rfc3339_weak(text).ok())
        .filter(|time| *time > SystemTime::UNIX_EPOCH);
    FileInfo { path, kind, size: json_u64(entry.get("size")).unwrap_or(0), mode, modified }
}

#[async_trait]
impl Backend for E2bBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities { separate_stderr: true, streaming_stdin: true }
    }

    async fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned> {
        spec.validate()?;
        self.touch().await;
        let display = spec.cwd.as_fs_str().to_owned();
        let mut resolver = self.resolver();
        let cwd = resolver.resolve(&spec.cwd, Mode::Follow).await?;
        if !cwd.exists() {
            return Err(WorkspaceError::NotFound { path: display });
        }
        if !cwd.is_dir() {
            return Err(WorkspaceError::NotADirectory { path: display });
        }
        let cwd_absolute = resolver.absolute(&cwd.components);
        let mut argv = spec.argv.clone();
        let secret_holder = match spec.role {
            SpawnRole::Agent => None,
            SpawnRole::SecretHolder => {
                Some(self.holder_program(&mut resolver, spec, &cwd.components, &mut argv).await?)
            }
        };
        let launch = Launch {
            argv,
            cwd: if secret_holder.is_some() { "/".to_owned() } else { cwd_absolute },
            env: spec.env.clone(),
            generation: self.generation,
            generation_file: self.generation_file.clone(),
            secret_holder,
        };
        process::spawn(&self.envd, launch).await.map_err(|error| match error {
            WorkspaceError::SandboxFenced { held, asked, .. } => {
                WorkspaceError::SandboxFenced { workspace_id: self.workspace_id.clone(), held, asked }
            }
            other => other,
        })
    }

    async fn read_file(&self, path: &RelPath) -> Result<ByteStream> {
        self.touch().await;
        files::read_file(&self.envd, &self.root, path).await
    }

    async fn write_file(&self, path: &RelPath, data: ByteStream, options: WriteOptions) -> Result<u64> {
        self.check_fence().await?;
        files::write_file(&self.envd, &self.root, path, data, options).await
    }

    async fn stat(&self, path: &RelPath) -> Result<FileInfo> {
        let resolved = self.resolver().resolve(path, Mode::NoFollow).await?;
        match &resolved.entry {
            Some(entry) => Ok(info(path.clone(), entry)),
            None => Err(WorkspaceError::NotFound { path: path.as_fs_str().to_owned() }),
        }
    }

    async fn list_dir(&self, path: &RelPath) -> Result<Vec<FileInfo>> {
        self.touch().await;
        let display = path.as_fs_str().to_owned();
        let mut resolver = self.resolver();
        let resolved = resolver.resolve(path, Mode::Follow).await?;
        if !resolved.exists() {
            return Err(WorkspaceError::NotFound { path: display });
        }
        if !resolved.is_dir() {
            return Err(WorkspaceError::NotADirectory { path: display });
        }
        let absolute = resolver.absolute(&resolved.components);
        let answer = self
            .call(
                "filesystem.Filesystem/ListDir",
                json!({"path": absolute, "depth": 1}),
                Retry::Idempotent,
                "list",
                &display,
            )
            .await?;
        let mut entries = Vec::new();
        for entry in answer.get("entries").and_then(Value::as_array).into_iter().flatten() {
            let Some(name) = entry.get("name").and_then(Value::as_str) else { continue };
            // A name a client cannot address is skipped, as on the host backends.
            let Ok(child) = path.join(name) else { continue };
            entries.push(info(child, entry));
        }
        entries.sort_by(|left, right| left.path.cmp(&right.path));
        Ok(entries)
    }

    async fn remove(&self, path: &RelPath, recursive: bool) -> Result<bool> {
        let display = path.as_fs_str().to_owned();
        if path.is_root() {
            return Err(WorkspaceError::InvalidPath {
                path: ".".into(),
                reason: "the workspace root itself cannot be removed",
            });
        }
        self.check_fence().await?;
        let mut resolver = self.resolver();
        let resolved = match resolver.resolve(path, Mode::NoFollow).await {
            Ok(resolved) => resolved,
            Err(WorkspaceError::NotFound { .. }) => return Ok(false),
            Err(error) => return Err(error),
        };
        if !resolved.exists() {
            return Ok(false);
        }
        let absolute = resolver.absolute(&resolved.components);
        if resolved.is_dir() && !recursive {
            let answer = self
                .call(
                    "filesystem.Filesystem/ListDir",
                    json!({"path": absolute, "depth": 1}),
                    Retry::Idempotent,
                    "remove",
                    &display,
                )
                .await?;
            if answer.get("entries").and_then(Value::as_array).is_some_and(|entries| !entries.is_empty()) {
                return Err(WorkspaceError::DirectoryNotEmpty { path: display });
            }
        }
        self.call("filesystem.Filesystem/Remove", json!({"path": absolute}), Retry::Idempotent, "remove", &display)
            .await?;
        Ok(true)
    }

    async fn mkdir(&self, path: &RelPath, parents: bool) -> Result<()> {
        let display = path.as_fs_str().to_owned();
        if path.is_root() {
            return if parents { Ok(()) } else { Err(WorkspaceError::AlreadyExists { path: ".".into() }) };
        }
        self.check_fence().await?;
        let mut resolver = self.resolver();
        let resolved = resolver.resolve(path, Mode::CreateNoFollow).await?;
        if resolved.is_symlink() {
            // An existing symlink: fine with `parents` if it leads to a directory inside.
            let followed = resolver.resolve(path, Mode::Follow).await?;
            return if parents && followed.is_dir() {
                Ok(())
            } else {
                Err(WorkspaceError::AlreadyExists { path: display })
            };
        }
        if resolved.exists() {
            return if parents && resolved.is_dir() {
                Ok(())
            } else {
                Err(WorkspaceError::AlreadyExists { path: display })
            };
        }
        if !parents && resolved.existing + 1 < resolved.components.len() {
            return Err(WorkspaceError::NotFound { path: display });
        }
        let absolute = resolver.absolute(&resolved.components);
        match self.envd.unary("filesystem.Filesystem/MakeDir", &json!({"path": absolute}), Retry::Idempotent).await {
            Ok(_) => Ok(()),
            Err(error) if error.code() == Some("already_exists") && parents => Ok(()),
            Err(error) => Err(error.into_error("mkdir", &display)),
        }
    }

    async fn rename(&self, from: &RelPath, to: &RelPath) -> Result<()> {
        if from.is_root() || to.is_root() {
            return Err(WorkspaceError::InvalidPath {
                path: ".".into(),
                reason: "the workspace root cannot be renamed",
            });
        }
        self.check_fence().await?;
        let mut resolver = self.resolver();
        let source = resolver.resolve(from, Mode::NoFollow).await?;
        if !source.exists() {
            return Err(WorkspaceError::NotFound { path: from.as_fs_str().to_owned() });
        }
        let target = resolver.resolve(to, Mode::CreateNoFollow).await?;
        if target.exists() {
            return Err(WorkspaceError::AlreadyExists { path: to.as_fs_str().to_owned() });
        }
        let message = json!({"source": resolver.absolute(&source.components), "destination": resolver.absolute(&target.components)});
        self.call("filesystem.Filesystem/Move", message, Retry::Refused, "rename", from.as_fs_str()).await?;
        Ok(())
    }
}
