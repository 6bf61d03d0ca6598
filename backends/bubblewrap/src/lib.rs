//! The `bubblewrap` backend: workspace files on the host, every process in a fresh
//! [bubblewrap](https://github.com/containers/bubblewrap) sandbox.
//!
//! ```text
//! let driver = BubblewrapDriver::new(BubblewrapConfig::default()).await?; // probes bwrap
//! let backend = driver.provision(ProvisionContext { workspace_id, root, spec }).await?;
//! ```
//!
//! # What a sandboxed process sees
//!
//! Its own pid, mount, network, ipc, uts and user namespaces (`--unshare-all`; the host
//! network only with `spec.network`); `/usr`, `/bin`, `/lib*`, `/sbin` of the host
//! read-only (merged-/usr symlinks recreated as symlinks); an allowlist of `/etc` entries
//! read-only ([`config::DEFAULT_ETC_ENTRIES`]); a fresh `/proc` of its pid namespace; a
//! minimal read-only `/dev` with a size-capped `/dev/shm`; a size-capped `/tmp` of its own;
//! the workspace read-write at `/workspace` (its cwd base and `HOME`). Nothing else of the
//! host: no `/root`, `/home`, `/run`, `/sys`, `/var`, no other workspace, not the node
//! agent's data directory. `/` itself is read-only. The environment is cleared, then
//! `PATH`, `HOME`, `LANG`, the spec's env and the exec's env are set.
//!
//! # Who it runs as
//!
//! When the node agent is root, bwrap is started as an unprivileged host user
//! ([`BubblewrapConfig::sandbox_uid`], default 65534) and the process sees itself as uid
//! 1000 in its user namespace. Not root mapped to root, for two reasons found by testing:
//! the kernel never enforces `RLIMIT_NPROC` for host uid 0 (a fork bomb in a root-mapped
//! sandbox is unlimited whatever `--uid` says inside, since `--uid` only changes the
//! in-namespace id), and a process whose host uid is 0 passes owner checks on root-owned
//! files, so it could read e.g. a 0600 root file under a mounted system dir. The workspace
//! root is therefore owned by the sandbox user ([`ownership`]; HostFs creates files with
//! that owner), and the directories above roots must be searchable by it.
//!
//! # Limits
//!
//! Per process, by util-linux `prlimit` run *inside* the sandbox right before the command
//! (no `pre_exec`: `unsafe` is forbidden): `RLIMIT_AS` (memory), `RLIMIT_NPROC` (pids),
//! `RLIMIT_FSIZE`, `RLIMIT_CPU`. Set after bwrap created the user namespace, the process
//! count is per sandbox: the kernel counts `RLIMIT_NPROC` per (user namespace, uid) and
//! checks the parent level against the limit bwrap had when it created the namespace
//! (unlimited), so concurrent sandboxes of the same host uid do not share one budget.
//! Zeros in the spec fall back to [`ResourceLimits`] defaults (512 pids, rest unlimited).
//! `/tmp` and `/dev/shm` are tmpfs (memory not counted by `RLIMIT_AS`), hence their size cap.
//!
//! # Process tree and kill
//!
//! `setsid` → `bwrap` (new session and process group, no controlling terminal) → the
//! sandbox's pid 1 (bwrap's init, same group) → the command. Killing the group on timeout
//! or drop kills bwrap and the init, and the kernel then kills everything left in the pid
//! namespace, including processes that called `setsid` themselves (see [`process`]). A
//! consequence: background processes never outlive their exec.
//!
//! # What the node agent must do
//!
//! Create each workspace root before `provision` (the driver never creates it), in a
//! directory the sandbox user can search (`chmod o+x` on the parents; `provision` fails with
//! `BackendUnavailable` naming the directory otherwise), and write into roots only through
//! the backend: a file written there as root by other means is read-only to the sandbox
//! until the next `provision` hands it over. Call `spawn`/`exec` from runtime tasks, not
//! from `spawn_blocking` (see [`BubblewrapBackend`]'s `spawn`).
//!
//! # Failure reporting
//!
//! A program that cannot exist inside is refused before spawning with `SpawnFailed`
//! ([`program`]); bwrap reports a command killed by signal n as exit 128+n, which is
//! unfolded back into the signal ([`process::unfold_exit`]).

pub mod backend;
pub mod cgroup;
pub mod config;
pub mod driver;
pub mod holder;
pub mod identity;
pub mod launch;
pub mod ownership;
pub mod process;
pub mod program;
pub mod sandbox;

pub use backend::BubblewrapBackend;
pub use cgroup::CgroupPolicy;
pub use config::{BubblewrapConfig, ExtraBind, ResourceLimits};
pub use driver::BubblewrapDriver;
pub use identity::{UidRange, WorkspaceUsers};
pub use launch::{DEFAULT_PATH, HostUser};
