//! One Daytona workspace's `Backend`: processes through toolbox sessions (`process.rs`),
//! file bytes through the toolbox's bulk calls (`files.rs`), and the derived file
//! operations (`stat`, `list_dir`, `remove`, `mkdir`, `rename`, `append_file`, `symlink`)
//! as the POSIX defaults over `exec`, whose spawn wrapper resolves and checks every path.
//!
//! Fencing: every spawn (hence every derived mutation) and every write checks the
//! generation recorded in the sandbox in the same toolbox call, so a gateway whose
//! placement was superseded by a newer adoption gets `SandboxFenced`.

use async_trait::async_trait;

use berth_workspace::backend::{Backend, ByteStream, Capabilities, SpawnRole, SpawnSpec, Spawned, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use super::config::BACKEND_NAME;
use super::files::{self, Fence};
use super::process::{self, Launch};
use super::scripts::Scripts;
use super::toolbox::Toolbox;

pub struct DaytonaBackend {
    toolbox: Toolbox,
    scripts: Scripts,
    root: String,
    generation_file: String,
    generation: u64,
    workspace_id: String,
}

impl DaytonaBackend {
    pub fn new(toolbox: Toolbox, root: String, generation_file: String, generation: u64, workspace_id: String) -> Self {
        Self { scripts: Scripts::new(&root), toolbox, root, generation_file, generation, workspace_id }
    }

    pub fn root(&self) -> &str {
        &self.root
    }

    pub fn sandbox_id(&self) -> &str {
        self.toolbox.sandbox_id()
    }

    pub fn toolbox(&self) -> &Toolbox {
        &self.toolbox
    }
}

#[async_trait]
impl Backend for DaytonaBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    /// Both: stdout and stderr are two files in the sandbox, stdin a FIFO fed through the
    /// session's `input` call (see `process.rs`).
    fn capabilities(&self) -> Capabilities {
        Capabilities { separate_stderr: true, streaming_stdin: true }
    }

    async fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned> {
        spec.validate()?;
        if spec.role == SpawnRole::SecretHolder {
            // The toolbox runs every command as the sandbox user: a secret holder would
            // share the agent's uid (its /proc/<pid>/environ readable), so it is refused.
            return Err(WorkspaceError::Unsupported {
                backend: BACKEND_NAME,
                capability: "secret-holding processes (the toolbox runs everything as the sandbox user)",
            });
        }
        let launch = Launch {
            argv: spec.argv.clone(),
            cwd: spec.cwd.as_str().to_owned(),
            env: spec.env.clone(),
            generation: self.generation,
            generation_file: self.generation_file.clone(),
            workspace_id: self.workspace_id.clone(),
        };
        process::spawn(&self.toolbox, &self.scripts.spawn, launch).await
    }

    async fn read_file(&self, path: &RelPath) -> Result<ByteStream> {
        files::read_file(&self.toolbox, &self.scripts.read, &self.root, path).await
    }

    async fn write_file(&self, path: &RelPath, data: ByteStream, options: WriteOptions) -> Result<u64> {
        let fence = Fence {
            generation: self.generation,
            generation_file: &self.generation_file,
            workspace_id: &self.workspace_id,
        };
        files::write_file(&self.toolbox, &self.scripts.write, &self.root, fence, path, data, options).await
    }
}
