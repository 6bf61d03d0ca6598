//! One pair of host uids per workspace, from a configured range.
//!
//! A workspace's agent processes run as its *agent* uid, its secret holders (MCP servers
//! with secrets, [`berth_workspace::SpawnRole::SecretHolder`]) as the *holder* uid right
//! after it: `first + 2k` and `first + 2k + 1`. gid = uid. Two workspaces never share a
//! uid, so a process of one (even one that escaped its namespaces) cannot open the other's
//! `0700` root, signal or trace its processes, or read their `/proc/<pid>/environ`.
//!
//! The allocation record is the owner of the workspace root itself: durable with the
//! files, survives a node-agent restart, and needs no table to get out of step. A root
//! owned by an agent uid of the range keeps it; a new one takes the lowest agent uid that
//! owns no sibling root, under a lock (in-process mutex + `flock` on the parent directory),
//! and is chowned before the lock is released.
//!
//! Blocking: run on the blocking pool.

use std::collections::BTreeSet;
use std::io;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::Mutex;

use nix::fcntl::{Flock, FlockArg};

use berth_workspace::error::WorkspaceError;

/// Default range of sandbox uids (and gids): 0x70000000 and up, a block no distribution
/// hands out (above the login ranges, the `/etc/subuid` ranges `useradd` assigns from
/// 100000, and the container ranges systemd uses up to 0x6FFFFFFF; below 2^31, which some
/// tools misread as negative). 32768 workspaces per node.
pub const DEFAULT_UID_RANGE: UidRange = UidRange { first: 1_879_048_192, last: 1_879_113_727 };

/// Serializes allocations of this process (the `flock` covers other processes; two
/// threads of one process would share it).
static ALLOCATION: Mutex<()> = Mutex::new(());

/// A host uid and gid a sandbox runs as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostUser {
    pub uid: u32,
    pub gid: u32,
}

/// An inclusive range of host uids for sandboxes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

/// The host users of one workspace's sandboxes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkspaceUsers {
    /// The workspace's own processes; owns the workspace root.
    pub agent: HostUser,
    /// Its secret holders: no access to the root, not signalable by the agent uid.
    pub holder: HostUser,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error(
        "no free sandbox uid left in {first}-{last}: {taken} workspace roots already hold one \
         (each workspace takes two uids; widen --sandbox-uid-range or remove workspaces)"
    )]
    RangeExhausted { first: u32, last: u32, taken: usize },
    #[error("{op} {path}: {source}")]
    Io { op: &'static str, path: String, source: io::Error },
}

impl From<IdentityError> for WorkspaceError {
    fn from(error: IdentityError) -> Self {
        match error {
            // Another node may still have room: the caller's retry can go elsewhere.
            exhausted @ IdentityError::RangeExhausted { .. } => {
                WorkspaceError::BackendUnavailable { backend: "bubblewrap", reason: exhausted.to_string() }
            }
            IdentityError::Io { op, path, source } => WorkspaceError::Io { op, path, source },
        }
    }
}

impl UidRange {
    /// `FIRST-LAST`, e.g. `200000-265535`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (first, last) = text.split_once('-').ok_or_else(|| format!("uid range {text:?} is not FIRST-LAST"))?;
        let number = |part: &str| part.trim().parse::<u32>().map_err(|_| format!("uid range {text:?}: {part:?}"));
        let range = Self { first: number(first)?, last: number(last)? };
        range.validate()?;
        Ok(range)
    }

    /// Not root, at least one pair, and not the overflow id 65534 shown for unmapped owners.
    pub fn validate(&self) -> Result<(), String> {
        if self.first == 0 || self.last < self.first.saturating_add(1) {
            return Err(format!(
                "sandbox uid range {}-{} must exclude 0 and hold at least two uids",
                self.first, self.last
            ));
        }
        if (self.first..=self.last).contains(&65534) || self.last == u32::MAX {
            return Err(format!("sandbox uid range {}-{} must not contain 65534 or 2^32-1", self.first, self.last));
        }
        Ok(())
    }

    /// The users of the workspace whose agent uid is `uid`, if `uid` is one.
    pub fn users_of(&self, uid: u32) -> Option<WorkspaceUsers> {
        let is_agent = uid >= self.first && uid < self.last && (uid - self.first).is_multiple_of(2);
        is_agent.then_some(WorkspaceUsers {
            agent: HostUser { uid, gid: uid },
            holder: HostUser { uid: uid + 1, gid: uid + 1 },
        })
    }

    /// The first pair (the start-up probe runs as its agent).
    pub fn first_users(&self) -> WorkspaceUsers {
        WorkspaceUsers {
            agent: HostUser { uid: self.first, gid: self.first },
            holder: HostUser { uid: self.first + 1, gid: self.first + 1 },
        }
    }

    fn agent_uids(&self) -> impl Iterator<Item = u32> + '_ {
        (self.first..self.last).step_by(2)
    }
}

/// Refuses a range that overlaps ids the host already hands out: users and groups of
/// `/etc/passwd` and `/etc/group`, and the subordinate ranges of `/etc/subuid` and
/// `/etc/subgid` (a rootless container of that user could own workspace files). Missing
/// files are fine; directory services (LDAP) cannot be checked here.
pub fn check_against_host(range: UidRange) -> Result<(), String> {
    for (file, subordinate) in
        [("/etc/passwd", false), ("/etc/group", false), ("/etc/subuid", true), ("/etc/subgid", true)]
    {
        let Ok(text) = std::fs::read_to_string(file) else { continue };
        if let Some(line) = overlapping_line(range, &text, subordinate) {
            return Err(format!(
                "sandbox uid range {}-{} overlaps ids in use on this host ({file}: {line}); \
                 choose another --sandbox-uid-range",
                range.first, range.last
            ));
        }
    }
    Ok(())
}

/// The first line of a passwd/group (`name:x:id:…`) or subuid/subgid (`name:start:count`)
/// file whose ids meet `range`.
fn overlapping_line(range: UidRange, text: &str, subordinate: bool) -> Option<String> {
    text.lines().find_map(|line| {
        let fields: Vec<&str> = line.split(':').collect();
        let (start, count) = if subordinate {
            (fields.get(1)?.parse::<u64>().ok()?, fields.get(2)?.parse::<u64>().ok()?)
        } else {
            (fields.get(2)?.parse::<u64>().ok()?, 1)
        };
        let end = start + count.max(1) - 1;
        (start <= u64::from(range.last) && end >= u64::from(range.first)).then(|| line.to_owned())
    })
}

/// The users of the workspace at `root` (a directory the caller created): the ones its
/// owner already names, or a fresh pair, recorded by chowning `root` (not its content) and
/// making it `0700`.
pub fn allocate(root: &Path, range: UidRange) -> Result<WorkspaceUsers, IdentityError> {
    let display = root.display().to_string();
    let io_error = |op: &'static str, path: &str| {
        let path = path.to_owned();
        move |source: io::Error| IdentityError::Io { op, path, source }
    };
    let owner = |path: &Path| std::fs::symlink_metadata(path).map(|metadata| metadata.uid());
    if let Some(users) = range.users_of(owner(root).map_err(io_error("stat", &display))?) {
        restrict(root).map_err(io_error("chmod", &display))?;
        return Ok(users);
    }
    let parent = root.parent().unwrap_or(Path::new("/"));
    let parent_display = parent.display().to_string();
    let _in_process = ALLOCATION.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let parent_handle = std::fs::File::open(parent).map_err(io_error("open", &parent_display))?;
    let _across_processes = Flock::lock(parent_handle, FlockArg::LockExclusive)
        .map_err(|(_, errno)| IdentityError::Io { op: "flock", path: parent_display.clone(), source: errno.into() })?;
    // Taken by a concurrent provision of the same root meanwhile.
    if let Some(users) = range.users_of(owner(root).map_err(io_error("stat", &display))?) {
        restrict(root).map_err(io_error("chmod", &display))?;
        return Ok(users);
    }
    let mut taken = BTreeSet::new();
    for entry in std::fs::read_dir(parent).map_err(io_error("list", &parent_display))? {
        let entry = entry.map_err(io_error("list", &parent_display))?;
        if entry.path() == root {
            continue;
        }
        match entry.metadata() {
            Ok(metadata) if range.users_of(metadata.uid()).is_some() => {
                taken.insert(metadata.uid());
            }
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error("stat", &entry.path().display().to_string())(error)),
        }
    }
    let Some(uid) = range.agent_uids().find(|uid| !taken.contains(uid)) else {
        return Err(IdentityError::RangeExhausted { first: range.first, last: range.last, taken: taken.len() });
    };
    std::os::unix::fs::lchown(root, Some(uid), Some(uid)).map_err(io_error("chown", &display))?;
    restrict(root).map_err(io_error("chmod", &display))?;
    range.users_of(uid).ok_or_else(|| IdentityError::Io {
        op: "allocate",
        path: display,
        source: io::Error::other("allocated uid outside the range"),
    })
}

/// Only the owner may enter the root (re-applied at every provision: the workspace's own
/// processes own it and could have opened it up).
fn restrict(root: &Path) -> io::Result<()> {
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_and_pair() {
        let range = UidRange::parse("200000-200005").unwrap();
        assert_eq!(range.users_of(200002).unwrap().holder.uid, 200003);
        assert!(range.users_of(200001).is_none(), "a holder uid is not an agent uid");
        assert!(range.users_of(200005).is_none(), "no room for its holder");
        assert_eq!(range.agent_uids().collect::<Vec<_>>(), [200000, 200002, 200004]);
        for bad in ["0-10", "10-10", "10", "60000-70000", "a-b"] {
            assert!(UidRange::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn ranges_in_use_on_the_host_are_found() {
        let range = UidRange { first: 200_000, last: 265_535 };
        let passwd = "root:x:0:0::/root:/bin/sh\nnobody:x:65534:65534::/:/bin/false\n";
        assert_eq!(overlapping_line(range, passwd, false), None);
        let taken = "ldap:x:200123:200123::/:/bin/sh\n";
        assert!(overlapping_line(range, taken, false).is_some());
        // The second user's subordinate range of a default Debian /etc/subuid.
        let subuid = "alice:100000:65536\nbob:165536:65536\n";
        assert_eq!(overlapping_line(range, subuid, true).as_deref(), Some("bob:165536:65536"));
        assert_eq!(overlapping_line(range, "alice:100000:65536\n", true), None);
    }

    #[test]
    fn roots_get_distinct_uids_that_persist_and_run_out() {
        let parent = tempfile::tempdir().unwrap();
        let range = UidRange { first: 300_000, last: 300_003 };
        let [a, b, c] = ["a", "b", "c"].map(|name| {
            let root = parent.path().join(name);
            std::fs::create_dir(&root).unwrap();
            root
        });
        let users_a = allocate(&a, range).unwrap();
        let users_b = allocate(&b, range).unwrap();
        assert_ne!(users_a, users_b);
        assert_eq!(allocate(&a, range).unwrap(), users_a, "the owner is the record");
        let metadata = std::fs::metadata(&a).unwrap();
        assert_eq!((metadata.uid(), metadata.mode() & 0o7777), (users_a.agent.uid, 0o700));
        let error = allocate(&c, range).unwrap_err();
        assert!(matches!(error, IdentityError::RangeExhausted { taken: 2, .. }), "{error}");
        std::fs::remove_dir(&b).unwrap();
        assert_eq!(allocate(&c, range).unwrap(), users_b, "a removed root frees its uid");
    }
}
