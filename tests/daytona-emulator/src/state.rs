//! The emulator's sandboxes: their records (name, labels, env, times), their lifecycle
//! (started with an init, stopped with only files, deleted) and their toolbox sessions.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use rand::Rng;
use rand::distr::Alphanumeric;
use serde_json::{Value, json};
use tokio::process::ChildStdin;

use berth_e2b_emulator::faults::Faults;
use berth_e2b_emulator::jail::{self, Init};
use berth_e2b_emulator::vfs::{Layout, Vfs};

/// A refusal: HTTP status and message (`{statusCode, message, error}` on the wire).
#[derive(Debug)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
}

impl ApiError {
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        Self { status, message: message.into() }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Started,
    Stopped,
}

impl Phase {
    pub fn name(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Stopped => "stopped",
        }
    }
}

/// What changes over a sandbox's life, under one lock.
pub struct Life {
    pub phase: Phase,
    pub init: Option<Init>,
    pub deleted: bool,
    pub updated_at: SystemTime,
}

/// One command of a session: its output so far and, once it ended, its exit code.
pub struct SessionCommand {
    pub id: String,
    pub command: String,
    pub stdout: Mutex<Vec<u8>>,
    pub stderr: Mutex<Vec<u8>>,
    /// stdout and stderr interleaved as they arrived.
    pub output: Mutex<Vec<u8>>,
    pub exit_code: Mutex<Option<i32>>,
    /// Host pid of the command's shell (what a session delete kills).
    pub host_pid: AtomicU32,
    pub stdin: tokio::sync::Mutex<Option<ChildStdin>>,
}

#[derive(Default)]
pub struct Session {
    pub commands: Mutex<Vec<Arc<SessionCommand>>>,
}

pub struct Sandbox {
    pub id: String,
    pub name: String,
    pub organization_id: String,
    pub snapshot: String,
    pub labels: Mutex<BTreeMap<String, String>>,
    pub env: BTreeMap<String, String>,
    /// What the create asked for (`networkBlockAll`, default false). The emulator runs
    /// every sandbox without a network either way.
    pub network_block_all: bool,
    pub created_at: SystemTime,
    pub dir: PathBuf,
    pub host_uid: Option<u32>,
    pub vfs: Vfs,
    pub life: tokio::sync::Mutex<Life>,
    /// The bwrap pid of the running init (0 when none), for a synchronous kill on drop.
    pub init_bwrap_pid: AtomicU32,
    pub sessions: Mutex<HashMap<String, Arc<Session>>>,
}

pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

impl Sandbox {
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.labels.lock().unwrap_or_else(|poison| poison.into_inner()).clone()
    }

    /// The `Sandbox` DTO (the list item has the same required fields).
    pub fn dto(&self, life: &Life, toolbox_url: &str) -> Value {
        json!({
            "id": self.id,
            "organizationId": self.organization_id,
            "name": self.name,
            "snapshot": self.snapshot,
            "user": "daytona",
            "env": self.env,
            "labels": self.labels(),
            "public": false,
            "networkBlockAll": self.network_block_all,
            "kvm": false,
            "target": "emulator",
            "cpu": 1,
            "gpu": 0,
            "memory": 1,
            "disk": 3,
            "state": life.phase.name(),
            "desiredState": life.phase.name(),
            "autoStopInterval": 0,
            "autoArchiveInterval": 0,
            "autoDeleteInterval": -1,
            "createdAt": rfc3339(self.created_at),
            "updatedAt": rfc3339(life.updated_at),
            "lastActivityAt": rfc3339(life.updated_at),
            "daemonVersion": "emulator",
            "runnerId": "emulator",
            "toolboxProxyUrl": toolbox_url,
        })
    }

    pub fn session(&self, id: &str) -> Option<Arc<Session>> {
        self.sessions.lock().unwrap_or_else(|poison| poison.into_inner()).get(id).cloned()
    }

    /// SIGKILLs every session command (their processes die with the init anyway).
    pub fn kill_sessions(&self) {
        let sessions: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .unwrap_or_else(|poison| poison.into_inner())
            .drain()
            .map(|(_, session)| session)
            .collect();
        for session in sessions {
            kill_session(&session);
        }
    }
}

pub fn kill_session(session: &Session) {
    for command in session.commands.lock().unwrap_or_else(|poison| poison.into_inner()).iter() {
        let pid = command.host_pid.load(Ordering::Relaxed);
        if pid > 0 {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

pub struct StateConfig {
    pub root: PathBuf,
    pub api_key: String,
    pub organization_id: String,
    pub max_started: Option<usize>,
    pub host_uid_base: Option<u32>,
}

pub struct State {
    pub config: StateConfig,
    pub layout: Layout,
    pub faults: Faults,
    /// `http://127.0.0.1:PORT/toolbox`, set once the listener is bound.
    pub toolbox_url: Mutex<String>,
    sandboxes: Mutex<BTreeMap<String, Arc<Sandbox>>>,
    next_uid: AtomicU32,
}

pub fn random(length: usize) -> String {
    rand::rng().sample_iter(&Alphanumeric).take(length).map(|byte| (byte as char).to_ascii_lowercase()).collect()
}

fn uuid() -> String {
    let hex = format!("{:032x}", rand::random::<u128>());
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

impl State {
    pub fn new(config: StateConfig) -> Self {
        Self {
            config,
            layout: Layout::from_host(),
            faults: Faults::default(),
            toolbox_url: Mutex::new(String::new()),
            sandboxes: Mutex::new(BTreeMap::new()),
            next_uid: AtomicU32::new(0),
        }
    }

    pub fn toolbox_url(&self) -> String {
        self.toolbox_url.lock().unwrap_or_else(|poison| poison.into_inner()).clone()
    }

    pub fn get(&self, id_or_name: &str) -> Option<Arc<Sandbox>> {
        let sandboxes = self.sandboxes.lock().unwrap_or_else(|poison| poison.into_inner());
        sandboxes
            .get(id_or_name)
            .cloned()
            .or_else(|| sandboxes.values().find(|sandbox| sandbox.name == id_or_name).cloned())
    }

    pub fn all(&self) -> Vec<Arc<Sandbox>> {
        self.sandboxes.lock().unwrap_or_else(|poison| poison.into_inner()).values().cloned().collect()
    }

    async fn started_count(&self) -> usize {
        let mut count = 0;
        for sandbox in self.all() {
            if sandbox.life.lock().await.phase == Phase::Started {
                count += 1;
            }
        }
        count
    }

    async fn check_quota(&self) -> Result<(), ApiError> {
        if let Some(max) = self.config.max_started
            && self.started_count().await >= max
        {
            return Err(ApiError::new(
                403,
                format!(
                    "Total CPU limit exceeded. Maximum allowed: {max}. To increase concurrency limits, upgrade your organization's Tier"
                ),
            ));
        }
        Ok(())
    }

    pub async fn create(
        &self,
        name: Option<String>,
        snapshot: String,
        labels: BTreeMap<String, String>,
        env: BTreeMap<String, String>,
        network_block_all: bool,
    ) -> Result<Arc<Sandbox>, ApiError> {
        if let Some(name) = &name
            && self.get(name).is_some()
        {
            return Err(ApiError::new(409, format!("Sandbox with name {name} already exists")));
        }
        self.check_quota().await?;
        let id = uuid();
        let dir = jail::sandbox_dir(&self.config.root, &id);
        let host_uid = self.config.host_uid_base.map(|base| base + self.next_uid.fetch_add(1, Ordering::Relaxed) % 50);
        jail::create_dirs(&dir, host_uid).map_err(|error| ApiError::new(500, format!("{error:#}")))?;
        let vfs = Vfs::open(&dir, self.layout.clone(), host_uid.map(|uid| (uid, uid)))
            .map_err(|error| ApiError::new(500, error.to_string()))?;
        let init = Init::start(&dir, &self.layout, host_uid)
            .await
            .map_err(|error| ApiError::new(500, format!("{error:#}")))?;
        let now = SystemTime::now();
        let sandbox = Arc::new(Sandbox {
            id: id.clone(),
            name: name.unwrap_or_else(|| id.clone()),
            organization_id: self.config.organization_id.clone(),
            snapshot,
            labels: Mutex::new(labels),
            env,
            network_block_all,
            created_at: now,
            dir,
            host_uid,
            vfs,
            init_bwrap_pid: AtomicU32::new(init.bwrap_pid()),
            life: tokio::sync::Mutex::new(Life {
                phase: Phase::Started,
                init: Some(init),
                deleted: false,
                updated_at: now,
            }),
            sessions: Mutex::new(HashMap::new()),
        });
        self.sandboxes.lock().unwrap_or_else(|poison| poison.into_inner()).insert(id, sandbox.clone());
        Ok(sandbox)
    }

    fn found(&self, id: &str) -> Result<Arc<Sandbox>, ApiError> {
        self.get(id).ok_or_else(|| ApiError::new(404, format!("Sandbox with ID or name {id} not found")))
    }

    /// Start: a fresh init over the same files; a started sandbox stays as it is.
    pub async fn start(&self, id: &str) -> Result<Arc<Sandbox>, ApiError> {
        let sandbox = self.found(id)?;
        if sandbox.life.lock().await.phase == Phase::Started {
            return Ok(sandbox);
        }
        self.check_quota().await?;
        let mut life = sandbox.life.lock().await;
        if life.deleted {
            return Err(ApiError::new(404, format!("Sandbox with ID or name {id} not found")));
        }
        if life.phase == Phase::Started {
            return Ok(sandbox.clone());
        }
        let init = Init::start(&sandbox.dir, &self.layout, sandbox.host_uid)
            .await
            .map_err(|error| ApiError::new(500, format!("{error:#}")))?;
        sandbox.init_bwrap_pid.store(init.bwrap_pid(), Ordering::Relaxed);
        life.init = Some(init);
        life.phase = Phase::Started;
        life.updated_at = SystemTime::now();
        drop(life);
        Ok(sandbox)
    }

    /// Stop: every process ends, the files stay. A stopped sandbox stays as it is.
    pub async fn stop(&self, id: &str) -> Result<Arc<Sandbox>, ApiError> {
        let sandbox = self.found(id)?;
        let mut life = sandbox.life.lock().await;
        if life.phase == Phase::Stopped {
            drop(life);
            return Ok(sandbox);
        }
        sandbox.kill_sessions();
        if let Some(init) = life.init.take() {
            init.stop().await;
        }
        sandbox.init_bwrap_pid.store(0, Ordering::Relaxed);
        life.phase = Phase::Stopped;
        life.updated_at = SystemTime::now();
        drop(life);
        Ok(sandbox)
    }

    pub async fn delete(&self, id: &str) -> Result<Arc<Sandbox>, ApiError> {
        let sandbox = self.found(id)?;
        self.sandboxes.lock().unwrap_or_else(|poison| poison.into_inner()).remove(&sandbox.id);
        let mut life = sandbox.life.lock().await;
        life.deleted = true;
        sandbox.kill_sessions();
        if let Some(init) = life.init.take() {
            init.stop().await;
        }
        sandbox.init_bwrap_pid.store(0, Ordering::Relaxed);
        drop(life);
        let dir = sandbox.dir.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
        Ok(sandbox)
    }

    /// Synchronous best effort for drop: SIGKILL every init.
    pub fn kill_all_now(&self) {
        for sandbox in self.all() {
            let pid = sandbox.init_bwrap_pid.load(Ordering::Relaxed);
            if pid > 0 {
                let _ =
                    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
            }
        }
    }
}
