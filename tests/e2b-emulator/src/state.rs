//! The emulator's sandboxes: their records (template, metadata, env, token, times), their
//! lifecycle (running with an init, paused with only files, killed) and their processes.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use rand::Rng;
use rand::distr::Alphanumeric;
use serde_json::{Value, json};
use tokio::process::ChildStdin;

use super::faults::Faults;
use super::jail::{self, Init};
use super::vfs::{Layout, Vfs};

/// The envd version the emulator reports: octet-stream uploads, closing stdin and the
/// default user are there; file metadata (0.6.2) and newer watch features are not.
pub const ENVD_VERSION: &str = "0.5.7";

/// A platform API refusal: HTTP status and message (`{code, message}` on the wire).
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
    Running,
    Paused,
}

/// What changes over a sandbox's life, under one lock.
pub struct Life {
    pub phase: Phase,
    pub end_at: SystemTime,
    pub init: Option<Init>,
    pub killed: bool,
    /// `autoPause`: the timeout pauses instead of killing.
    pub auto_pause: bool,
}

/// One process started through envd.
pub struct ProcHandle {
    /// Its pid on the host (what the emulator signals).
    pub host_pid: u32,
    pub config: Value,
    pub tag: Option<String>,
    pub stdin: tokio::sync::Mutex<Option<ChildStdin>>,
}

pub struct Sandbox {
    pub id: String,
    pub template_id: String,
    pub client_id: String,
    pub metadata: BTreeMap<String, String>,
    pub env: BTreeMap<String, String>,
    /// What the create asked for (`allow_internet_access`); `None` when it did not say.
    /// The emulator runs every sandbox without a network either way.
    pub allow_internet_access: Option<bool>,
    pub envd_token: String,
    pub started_at: SystemTime,
    pub dir: PathBuf,
    pub host_uid: Option<u32>,
    pub vfs: Vfs,
    pub life: tokio::sync::Mutex<Life>,
    /// The bwrap pid of the running init (0 when none), for a synchronous kill on drop.
    pub init_bwrap_pid: AtomicU32,
    pub processes: Mutex<HashMap<u32, Arc<ProcHandle>>>,
}

impl Sandbox {
    /// The listing entry (`ListedSandbox`) of this sandbox.
    pub fn listed(&self, life: &Life) -> Value {
        json!({
            "templateID": self.template_id,
            "sandboxID": self.id,
            "clientID": self.client_id,
            "startedAt": rfc3339(self.started_at),
            "endAt": rfc3339(life.end_at),
            "cpuCount": 2,
            "memoryMB": 512,
            "diskSizeMB": 1024,
            "state": if life.phase == Phase::Running { "running" } else { "paused" },
            "envdVersion": ENVD_VERSION,
            "metadata": self.metadata,
        })
    }

    /// The create / connect answer (`Sandbox`).
    pub fn created(&self) -> Value {
        json!({
            "templateID": self.template_id,
            "sandboxID": self.id,
            "clientID": self.client_id,
            "envdVersion": ENVD_VERSION,
            "envdAccessToken": self.envd_token,
        })
    }

    pub fn process(&self, pid: u32) -> Option<Arc<ProcHandle>> {
        self.processes.lock().unwrap_or_else(|poison| poison.into_inner()).get(&pid).cloned()
    }
}

pub fn rfc3339(time: SystemTime) -> String {
    humantime::format_rfc3339_millis(time).to_string()
}

pub struct StateConfig {
    pub root: PathBuf,
    pub api_key: String,
    pub max_running: Option<usize>,
    pub host_uid_base: Option<u32>,
    pub default_timeout: Duration,
}

pub struct State {
    pub config: StateConfig,
    pub layout: Layout,
    pub faults: Faults,
    sandboxes: Mutex<BTreeMap<String, Arc<Sandbox>>>,
    next_uid: AtomicU32,
}

fn random(length: usize) -> String {
    rand::rng().sample_iter(&Alphanumeric).take(length).map(|byte| (byte as char).to_ascii_lowercase()).collect()
}

impl State {
    pub fn new(config: StateConfig) -> Self {
        Self {
            config,
            layout: Layout::from_host(),
            faults: Faults::default(),
            sandboxes: Mutex::new(BTreeMap::new()),
            next_uid: AtomicU32::new(0),
        }
    }

    pub fn get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.sandboxes.lock().unwrap_or_else(|poison| poison.into_inner()).get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Sandbox>> {
        self.sandboxes.lock().unwrap_or_else(|poison| poison.into_inner()).values().cloned().collect()
    }

    async fn running_count(&self) -> usize {
        let mut count = 0;
        for sandbox in self.all() {
            if sandbox.life.lock().await.phase == Phase::Running {
                count += 1;
            }
        }
        count
    }

    pub async fn create(
        &self,
        template_id: &str,
        timeout: Duration,
        metadata: BTreeMap<String, String>,
        env: BTreeMap<String, String>,
        auto_pause: bool,
        allow_internet_access: Option<bool>,
    ) -> Result<Arc<Sandbox>, ApiError> {
        if let Some(max) = self.config.max_running
            && self.running_count().await >= max
        {
            return Err(ApiError::new(
                429,
                format!("You have reached the maximum number of concurrent E2B sandboxes ({max})"),
            ));
        }
        let id = format!("i{}", random(19));
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
            template_id: template_id.to_owned(),
            client_id: "emulator".to_owned(),
            metadata,
            env,
            allow_internet_access,
            envd_token: random(32),
            started_at: now,
            dir,
            host_uid,
            vfs,
            init_bwrap_pid: AtomicU32::new(init.bwrap_pid()),
            life: tokio::sync::Mutex::new(Life {
                phase: Phase::Running,
                end_at: now + timeout,
                init: Some(init),
                killed: false,
                auto_pause,
            }),
            processes: Mutex::new(HashMap::new()),
        });
        self.sandboxes.lock().unwrap_or_else(|poison| poison.into_inner()).insert(id, sandbox.clone());
        Ok(sandbox)
    }

    /// Connect: extends a running sandbox's timeout, or resumes a paused one (201).
    pub async fn connect(&self, id: &str, timeout: Duration) -> Result<(Arc<Sandbox>, bool), ApiError> {
        let sandbox = self.get(id).ok_or_else(|| ApiError::new(404, format!("sandbox \"{id}\" doesn't exist")))?;
        let mut life = sandbox.life.lock().await;
        if life.killed {
            return Err(ApiError::new(404, format!("sandbox \"{id}\" doesn't exist")));
        }
        let end_at = SystemTime::now() + timeout;
        if life.phase == Phase::Running {
            life.end_at = life.end_at.max(end_at);
            drop(life);
            return Ok((sandbox, false));
        }
        let init = Init::start(&sandbox.dir, &self.layout, sandbox.host_uid)
            .await
            .map_err(|error| ApiError::new(500, format!("{error:#}")))?;
        sandbox.init_bwrap_pid.store(init.bwrap_pid(), Ordering::Relaxed);
        life.init = Some(init);
        life.phase = Phase::Running;
        life.end_at = end_at;
        drop(life);
        Ok((sandbox, true))
    }

    /// Pause: every process stops, the files stay. `Ok(false)` when already paused.
    pub async fn pause(&self, id: &str) -> Result<bool, ApiError> {
        let sandbox = self.get(id).ok_or_else(|| ApiError::new(404, format!("sandbox \"{id}\" doesn't exist")))?;
        let mut life = sandbox.life.lock().await;
        if life.phase == Phase::Paused {
            return Ok(false);
        }
        if let Some(init) = life.init.take() {
            init.stop().await;
        }
        sandbox.init_bwrap_pid.store(0, Ordering::Relaxed);
        sandbox.processes.lock().unwrap_or_else(|poison| poison.into_inner()).clear();
        life.phase = Phase::Paused;
        Ok(true)
    }

    pub async fn kill(&self, id: &str) -> Result<(), ApiError> {
        let sandbox = self.sandboxes.lock().unwrap_or_else(|poison| poison.into_inner()).remove(id);
        let sandbox = sandbox.ok_or_else(|| ApiError::new(404, format!("sandbox \"{id}\" doesn't exist")))?;
        let mut life = sandbox.life.lock().await;
        life.killed = true;
        if let Some(init) = life.init.take() {
            init.stop().await;
        }
        sandbox.init_bwrap_pid.store(0, Ordering::Relaxed);
        sandbox.processes.lock().unwrap_or_else(|poison| poison.into_inner()).clear();
        drop(life);
        let dir = sandbox.dir.clone();
        let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(dir)).await;
        Ok(())
    }

    pub async fn set_timeout(&self, id: &str, timeout: Duration) -> Result<(), ApiError> {
        let sandbox = self.get(id).ok_or_else(|| ApiError::new(404, format!("sandbox \"{id}\" doesn't exist")))?;
        sandbox.life.lock().await.end_at = SystemTime::now() + timeout;
        Ok(())
    }

    /// Kills running sandboxes past their end time (E2B's default on timeout), or pauses
    /// those created with `autoPause`.
    pub async fn reap(&self) {
        let now = SystemTime::now();
        for sandbox in self.all() {
            let (expired, auto_pause) = {
                let life = sandbox.life.lock().await;
                (life.phase == Phase::Running && life.end_at < now, life.auto_pause)
            };
            if expired && auto_pause {
                let _ = self.pause(&sandbox.id).await;
            } else if expired {
                let _ = self.kill(&sandbox.id).await;
            }
        }
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
