//! One workspace's Pod as a [`Backend`]: processes (`process.rs`) and files (`files.rs`)
//! through `pods/exec`; metadata through the contract's POSIX defaults.
//!
//! Fencing: a handle talks to one Pod, named with its placement's generation. A newer
//! placement deletes older Pods when it adopts the PVC, so an exec of a fenced handle finds
//! its Pod gone (404); the handle then reads the PVC's generation and answers
//! `SandboxFenced` when it is newer than its own (else `BackendUnavailable`: released).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;

use berth_workspace::backend::{Backend, ByteStream, Capabilities, SpawnRole, SpawnSpec, Spawned, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use crate::api::Kube;
use crate::config::BACKEND_NAME;
use crate::files;
use crate::labels;
use crate::process::{self, Launch, nonce};
use crate::remote::{ExecError, ExecResult, Target};
use crate::scripts::{FAILED_EXIT_CODE, Scripts};

/// Largest pinned secret-holder program copied out of the workspace.
const MAX_PROGRAM_BYTES: u64 = 256 * 1024 * 1024;

pub(crate) struct PodHandle {
    pub workspace_id: String,
    pub pod: String,
    pub volume: String,
    pub generation: u64,
    pub kube: Kube,
    pub agent: Target,
    pub holder: Target,
    pub scripts: Scripts,
    pub workspace_dir: String,
    pub state_dir: String,
}

/// A workspace's Pod (cheap to clone).
#[derive(Clone)]
pub struct KubernetesBackend {
    pub(crate) pod: Arc<PodHandle>,
}

impl KubernetesBackend {
    /// The name of the Pod this handle talks to.
    pub fn pod_name(&self) -> &str {
        &self.pod.pod
    }

    /// The name of the workspace's PVC.
    pub fn volume_name(&self) -> &str {
        &self.pod.volume
    }

    pub fn generation(&self) -> u64 {
        self.pod.generation
    }

    /// Turns "the Pod is gone" into fenced or released.
    async fn settle<T>(&self, result: ExecResult<T>) -> Result<T> {
        match result {
            Ok(value) => Ok(value),
            Err(ExecError::Other(error)) => Err(error),
            Err(ExecError::PodGone) => {
                let handle = &self.pod;
                let held = match handle.kube.get_pvc(&handle.volume).await? {
                    Some(pvc) => labels::generation(pvc.metadata.labels.as_ref(), pvc.metadata.annotations.as_ref()),
                    None => 0,
                };
                if held > handle.generation {
                    return Err(WorkspaceError::SandboxFenced {
                        workspace_id: handle.workspace_id.clone(),
                        held,
                        asked: handle.generation,
                    });
                }
                Err(WorkspaceError::BackendUnavailable {
                    backend: BACKEND_NAME,
                    reason: format!("pod {} is gone (released or deleted)", handle.pod),
                })
            }
        }
    }

    /// For a secret holder: the staged program's directory (pinned), or `-`.
    async fn holder_program(&self, spec: &SpawnSpec, argv: &mut [String]) -> Result<String> {
        let program = argv[0].clone();
        let refuse = |reason: &str| WorkspaceError::SpawnFailed { program: program.clone(), reason: reason.to_owned() };
        let Some(pin) = &spec.program_sha256 else {
            let in_workspace = program.contains('/')
                && (!program.starts_with('/') || program.starts_with(&format!("{}/", self.pod.workspace_dir)));
            if in_workspace {
                return Err(refuse("a secret holder's program must be pinned (sha256) when it is a workspace path"));
            }
            return Ok("-".to_owned());
        };
        let path = berth_workspace::path::join_path(&spec.cwd, &program)?;
        let bytes = match self.read_to_bytes(&path, MAX_PROGRAM_BYTES).await {
            Ok(bytes) => bytes,
            Err(WorkspaceError::NotFound { .. } | WorkspaceError::IsADirectory { .. }) => {
                return Err(refuse("not found in the workspace"));
            }
            Err(error) => return Err(error),
        };
        let staged = self
            .settle(self.pod.holder.run(self.pod.scripts.holder_stage(&hex::encode(pin)), Some(bytes)).await)
            .await?;
        match staged.code() {
            Some(0) => {}
            Some(FAILED_EXIT_CODE) if staged.stderr.contains("berth-error pin") => {
                return Err(WorkspaceError::InvalidArgument(format!("{program:?} does not match its pinned sha256")));
            }
            _ => {
                return Err(WorkspaceError::Backend {
                    backend: BACKEND_NAME,
                    message: format!("staging the secret holder's program failed: {}", staged.stderr.trim()),
                });
            }
        }
        let dir = String::from_utf8_lossy(&staged.stdout).trim().to_owned();
        argv[0] = format!("{dir}/program");
        Ok(dir)
    }
}

#[async_trait]
impl Backend for KubernetesBackend {
    fn name(&self) -> &'static str {
        BACKEND_NAME
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::FULL
    }

    async fn spawn(&self, spec: &SpawnSpec) -> Result<Spawned> {
        spec.validate()?;
        let handle = &self.pod;
        let nonce = nonce();
        let program = spec.argv[0].clone();
        let cwd = spec.cwd.as_fs_str().to_owned();
        let (argv, target, holder) = match spec.role {
            SpawnRole::Agent => {
                (handle.scripts.spawn(&nonce, spec.cwd.as_str(), &spec.env, &spec.argv), &handle.agent, false)
            }
            SpawnRole::SecretHolder => {
                let mut program_argv = spec.argv.clone();
                let dir = self.holder_program(spec, &mut program_argv).await?;
                let env: BTreeMap<String, String> = spec.env.clone();
                (handle.scripts.secret(&nonce, &dir, &env, &program_argv), &handle.holder, true)
            }
        };
        let launch = Launch { nonce, argv, program, cwd, holder };
        let spawned = process::spawn(target, target.clone(), handle.scripts.clone(), launch).await;
        self.settle(spawned).await
    }

    async fn read_file(&self, path: &RelPath) -> Result<ByteStream> {
        self.settle(files::read_file(&self.pod.agent, &self.pod.scripts, path).await).await
    }

    async fn write_file(&self, path: &RelPath, data: ByteStream, options: WriteOptions) -> Result<u64> {
        let handle = &self.pod;
        self.settle(files::write_file(&handle.agent, &handle.scripts, &handle.state_dir, path, data, options).await)
            .await
    }
}

impl std::fmt::Debug for KubernetesBackend {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("KubernetesBackend")
            .field("pod", &self.pod.pod)
            .field("generation", &self.pod.generation)
            .finish()
    }
}
