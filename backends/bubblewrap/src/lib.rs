//! The `bubblewrap` backend: workspace files on the host, processes in
//! [bubblewrap](https://github.com/containers/bubblewrap) sandboxes.
//!
//! By default an agent process is forked inside the workspace's one sandbox by its
//! resident supervisor ([`supervised`]): the sandbox is built once with the options below
//! and each command gets the same confinement a fresh sandbox would give it (its own
//! `/tmp`, its process tree killed at its end). With `BubblewrapConfig::supervisor` off,
//! and always for secret holders, every process gets a fresh sandbox as described here.
//!
//! ```text
//! let driver = BubblewrapDriver::new(BubblewrapConfig::default()).await?; // probes bwrap
//! let backend = driver.provision(ProvisionContext::unplaced(workspace_id, root, spec)).await?;
//! ```
//!
//! # What a sandboxed process sees
//!
//! Its own pid, mount, network, ipc, uts and user namespaces (`--unshare-all`; with
//! `spec.network` the workspace's own network namespace behind pasta, never the host's:
//! [`network`]); `/usr`, `/bin`, `/lib*`, `/sbin` of the host
//! read-only (merged-/usr symlinks recreated as symlinks); an allowlist of `/etc` entries
//! read-only ([`config::DEFAULT_ETC_ENTRIES`]); a fresh `/proc` of its pid namespace; a
//! minimal read-only `/dev` with a size-capped `/dev/shm`; a size-capped `/tmp` of its own;
//! the workspace read-write at `/workspace` (its cwd base and `HOME`). Nothing else of the
//! host: no `/root`, `/home`, `/run`, `/sys`, `/var`, no other workspace, not the node
//! agent's data directory. `/` itself is read-only. The environment is exactly `PATH`,
//! `HOME`, `LANG`, the spec's env and the exec's env, set by bwrap itself from a memfd
//! (`--args 3`): no host-side process (`setsid`, `setpriv`, `bwrap`) ever has the caller's
//! env, and no value shows in a host argv ([`launch`]).
//!
//! # Who it runs as
//!
//! When the node agent is root, each workspace gets two host uids of its own from
//! [`BubblewrapConfig::sandbox_uid_range`] ([`identity`]): its processes run as the first,
//! its secret holders ([`holder`]) as the second, and the root chain drops to them with
//! `setpriv` right before bwrap. The process sees itself as uid 1000 in its user namespace.
//! The workspace root is `0700` and owned by the workspace's uid (the owner *is* the
//! allocation record; [`ownership`] hands the content over, HostFs creates files with that
//! owner), so no other workspace's uid can enter it; the directories above roots must be
//! searchable. Not root mapped to root, for two reasons found by testing: the kernel never
//! enforces `RLIMIT_NPROC` for host uid 0, and a process whose host uid is 0 passes owner
//! checks on root-owned files.
//!
//! # Limits
//!
//! Per workspace, when the agent is root and cgroups are writable ([`cgroup`], v1 or v2):
//! memory (and memory+swap), a CFS quota from `cpu_millis`, `pids.max`, for all its
//! sandboxes together; joined by the host chain before anything of the sandbox runs.
//! Per process, by util-linux `prlimit` run *inside* the sandbox right before the command
//! (no `pre_exec`: `unsafe` is forbidden): `RLIMIT_NPROC` (pids), `RLIMIT_FSIZE`,
//! `RLIMIT_CPU`, and `RLIMIT_AS` (memory) only without a cgroup. Set after bwrap created
//! the user namespace, the `RLIMIT_NPROC` count is per sandbox. Zeros in the spec fall back
//! to [`ResourceLimits`] defaults (512 pids, rest unlimited). `/tmp` and `/dev/shm` are
//! tmpfs (memory not counted by `RLIMIT_AS`), hence their size cap.
//!
//! # Process tree and kill
//!
//! `[sh (join cgroup)] → setsid → [nsenter --net=<workspace netns>] → [setpriv] → bwrap`
//! (each execs the next: one pid, a new session and process group, no controlling
//! terminal) → the sandbox's pid 1 (bwrap's init, same group) → the command. Killing the group on timeout
//! or drop kills bwrap and the init, and the kernel then kills everything left in the pid
//! namespace, including processes that called `setsid` themselves (see [`process`]). A
//! consequence: background processes never outlive their exec.
//!
//! # What the node agent must do
//!
//! Create each workspace root before `provision` (the driver never creates it; a
//! node's roots must be siblings: a new root takes a uid no sibling owns), in a
//! directory the sandbox users can search (`chmod o+x` on the parents; `provision` fails with
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
pub mod network;
pub mod ownership;
pub mod process;
pub mod program;
pub mod sandbox;
pub mod supervised;

pub use backend::BubblewrapBackend;
pub use cgroup::CgroupPolicy;
pub use config::{BubblewrapConfig, ExtraBind, ResourceLimits};
pub use driver::BubblewrapDriver;
pub use identity::{HostUser, UidRange, WorkspaceUsers};
pub use launch::DEFAULT_PATH;
