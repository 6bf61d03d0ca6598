//! Native file operations on a host directory, confined to it by cap-std.
//!
//! The root is opened once as a [`cap_std::fs::Dir`] (the only use of ambient authority is
//! [`HostFs::open`]); every later path is resolved by cap-std relative to that handle, which
//! refuses any resolution that leaves it — `..` above the root, absolute symlinks, symlinks
//! whose target climbs out — with a "path led outside of the filesystem" error that
//! [`WorkspaceError::from_io`] maps to `PathEscapesRoot`. Symlinks that stay inside work.
//! Nothing here canonicalizes a host path and compares strings.
//!
//! All disk work runs on tokio's blocking pool: cap-std calls are synchronous.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt, OpenOptions, OpenOptionsExt};
use futures::StreamExt;
use nix::fcntl::{AtFlags, RenameFlags};
use nix::unistd::{Gid, Uid};

use berth_workspace::backend::{ByteStream, FileInfo, FileKind, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use crate::blocks;

/// Most symlinks followed while resolving a write target (the Linux MAXSYMLINKS).
const MAX_SYMLINK_HOPS: usize = 40;
/// Marker in the names of in-flight write temp files: `.<name>.berth-tmp-<random>`.
pub const TEMP_MARKER: &str = ".berth-tmp-";
/// Linux NAME_MAX: a temp name built from a long target name is shortened to fit.
const NAME_MAX_BYTES: usize = 255;
/// Bytes a file read takes from the disk per trip to the blocking pool (the node agent
/// cuts them into the chunk size the caller asked for without copying).
pub const READ_BLOCK_BYTES: usize = 1024 * 1024;
/// Bytes a file write gathers before it takes them to the disk in one trip.
const WRITE_BLOCK_BYTES: usize = 1024 * 1024;

/// A host directory served as a workspace root.
///
/// Cheap to clone; clones share the root handle.
#[derive(Clone, Debug)]
pub struct HostFs {
    root: Arc<Dir>,
    host_root: PathBuf,
    /// Owner given to every file and directory this creates (a container's uid/gid).
    owner: Option<(u32, u32)>,
}

impl HostFs {
    /// Opens `root` (which must exist and be a directory). Blocking; call it at provision
    /// time, off the runtime.
    pub fn open(root: &Path) -> Result<Self> {
        let display = root.display().to_string();
        // The physical path is only used to hand a cwd and HOME to processes; confinement
        // comes from the `Dir` handle, never from comparing it with anything.
        let host_root = std::fs::canonicalize(root)
            .map_err(|error| WorkspaceError::from_io("open workspace root", &display, error))?;
        let dir = Dir::open_ambient_dir(&host_root, ambient_authority())
            .map_err(|error| WorkspaceError::from_io("open workspace root", &display, error))?;
        Ok(Self { root: Arc::new(dir), host_root, owner: None })
    }

    /// Makes every file and directory created from now on owned by `uid:gid`.
    pub fn with_owner(mut self, owner: Option<(u32, u32)>) -> Self {
        self.owner = owner;
        self
    }

    /// The root's physical host path.
    pub fn host_root(&self) -> &Path {
        &self.host_root
    }

    pub fn owner(&self) -> Option<(u32, u32)> {
        self.owner
    }

    /// Streams a regular file in chunks of up to [`READ_BLOCK_BYTES`]. The first block is
    /// read in the same trip to the blocking pool that opens the file, so a file of up to
    /// one block costs one trip; each later block costs one more.
    ///
    /// Errors: `NotFound`, `IsADirectory`, `PathEscapesRoot`, `InvalidArgument` for a
    /// FIFO, socket or device (reading one could block forever).
    pub async fn read_file(&self, path: &RelPath) -> Result<ByteStream> {
        let display = path.as_fs_str().to_owned();
        let relative = path.clone();
        let (file, first, rest, expected) = self
            .blocking(move |root, _owner| {
                let display = relative.as_fs_str();
                let mut options = OpenOptions::new();
                // Non-blocking so that opening a FIFO cannot hang a blocking-pool thread;
                // it makes no difference to regular files.
                options.read(true).custom_flags(nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY);
                let file = root
                    .open_with(display, &options)
                    .map_err(|error| WorkspaceError::from_io("open", display, error))?;
                let metadata = file.metadata().map_err(|error| WorkspaceError::from_io("stat", display, error))?;
                if metadata.is_dir() {
                    return Err(WorkspaceError::IsADirectory { path: display.to_owned() });
                }
                if !metadata.is_file() {
                    return Err(WorkspaceError::InvalidArgument(format!("{display:?} is not a regular file")));
                }
                let mut file = file.into_std();
                let expected = metadata.len();
                let capacity = usize::try_from(expected).unwrap_or(usize::MAX);
                let first = blocks::read_block(&mut file, READ_BLOCK_BYTES, capacity)
                    .map_err(|error| WorkspaceError::from_io("read", display, error))?;
                // A short first block is the whole file; a full one may have more behind it.
                let rest = blocks::more_after(first.len(), READ_BLOCK_BYTES, first.len() as u64, expected);
                Ok((file, Bytes::from(first), rest, expected))
            })
            .await?;
        let first = futures::stream::iter((!first.is_empty()).then_some(Ok(first)));
        if !rest {
            return Ok(first.boxed());
        }
        Ok(first.chain(blocks::after(file, READ_BLOCK_BYTES, READ_BLOCK_BYTES as u64, expected, display)).boxed())
    }

    /// Writes a file atomically: the chunks go to `.<name>.berth-tmp-<random>` in the target's
    /// directory, which is fsynced and renamed over the target. Missing parents are created.
    /// A symlink at the target is followed (inside the root) and its target replaced; an
    /// existing file keeps its permission bits, a new one gets `options.mode`.
    ///
    /// On any error — a failing stream, `options.max_bytes` exceeded (`LimitExceeded
    /// {limit: "file size"}`), a disk error, or the future being dropped — the temp file and
    /// the parents this call created are removed: nothing is left half-written.
    pub async fn write_file(&self, path: &RelPath, mut data: ByteStream, options: WriteOptions) -> Result<u64> {
        let display = path.as_fs_str().to_owned();
        if path.is_root() {
            return Err(WorkspaceError::IsADirectory { path: display });
        }
        let relative = path.clone();
        let (prepared, mut pending) =
            self.blocking(move |root, owner| prepare_write(root, &relative, owner, options.mode)).await?;
        let outcome = async {
            // Chunks are gathered into blocks of about WRITE_BLOCK_BYTES and each block goes
            // to the disk in one trip to the blocking pool (one vectored write, no copy);
            // the last block, the fsync and the rename share one trip.
            let mut file = prepared;
            let mut block = Block::default();
            let mut written: u64 = 0;
            while let Some(chunk) = data.next().await {
                let chunk = chunk?;
                let total = written + chunk.len() as u64;
                if total > options.max_bytes {
                    return Err(WorkspaceError::LimitExceeded {
                        limit: "file size",
                        size: total,
                        max: options.max_bytes,
                    });
                }
                written = total;
                block.push(chunk);
                if block.bytes >= WRITE_BLOCK_BYTES {
                    let full = std::mem::take(&mut block);
                    let write_display = display.clone();
                    file = self
                        .blocking(move |_root, _owner| {
                            let mut open = file;
                            full.write_to(&mut open, &write_display)?;
                            Ok(open)
                        })
                        .await?;
                }
            }
            let commit = pending.commit_parts();
            let commit_display = display.clone();
            self.blocking(move |_root, _owner| {
                let mut open = file;
                block.write_to(&mut open, &commit_display)?;
                // The data is on disk before the rename makes it visible.
                open.sync_all().map_err(|error| WorkspaceError::from_io("fsync", &commit_display, error))?;
                drop(open);
                commit.rename(&commit_display)
            })
            .await?;
            Ok(written)
        }
        .await;
        match outcome {
            Ok(written) => {
                pending.disarm();
                Ok(written)
            }
            Err(error) => {
                // Clean up before answering, so a caller that lists the directory next
                // never sees the temp file.
                pending.clean_up().await;
                Err(error)
            }
        }
    }

    /// Metadata of one entry, not following a final symlink.
    pub async fn stat(&self, path: &RelPath) -> Result<FileInfo> {
        let relative = path.clone();
        self.blocking(move |root, _owner| {
            let display = relative.as_fs_str();
            let metadata = if relative.is_root() { root.dir_metadata() } else { root.symlink_metadata(display) }
                .map_err(|error| WorkspaceError::from_io("stat", display, error))?;
            Ok(file_info(relative.clone(), &metadata))
        })
        .await
    }

    /// Entries of a directory (a symlink to a directory inside the root is followed), sorted
    /// by name. Names that are not UTF-8 cannot be addressed by a client and are skipped.
    pub async fn list_dir(&self, path: &RelPath) -> Result<Vec<FileInfo>> {
        let relative = path.clone();
        self.blocking(move |root, _owner| {
            let display = relative.as_fs_str();
            let listed = |error| WorkspaceError::from_io("list", display, error);
            let dir = root.open_dir(display).map_err(listed)?;
            let mut entries = Vec::new();
            for entry in dir.entries().map_err(listed)? {
                let entry = entry.map_err(listed)?;
                let name = entry.file_name();
                let Some(entry_path) = name.to_str().and_then(|name| relative.join(name).ok()) else {
                    tracing::debug!(dir = %relative, name = ?name, "skipping an entry a client cannot name");
                    continue;
                };
                // lstat of one component inside an open directory: symlinks are reported,
                // not followed.
                match dir.symlink_metadata(&name) {
                    Ok(metadata) => entries.push(file_info(entry_path, &metadata)),
                    // Removed between readdir and lstat: it is simply gone.
                    Err(error) if error.kind() == io::ErrorKind::NotFound => {}
                    Err(error) => return Err(listed(error)),
                }
            }
            entries.sort_by(|left, right| left.path.cmp(&right.path));
            Ok(entries)
        })
        .await
    }

    /// Removes a file, a symlink (never what it points to) or a directory (`recursive`, or
    /// empty). Returns whether it existed. The root itself cannot be removed.
    pub async fn remove(&self, path: &RelPath, recursive: bool) -> Result<bool> {
        if path.is_root() {
            return Err(refuse_root());
        }
        let relative = path.clone();
        self.blocking(move |root, _owner| {
            let display = relative.as_fs_str();
            let metadata = match root.symlink_metadata(display) {
                Ok(metadata) => metadata,
                Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(false),
                Err(error) => return Err(WorkspaceError::from_io("stat", display, error)),
            };
            let removed = if metadata.is_dir() && recursive {
                root.remove_dir_all(display)
            } else if metadata.is_dir() {
                root.remove_dir(display)
            } else {
                root.remove_file(display)
            };
            match removed {
                Ok(()) => Ok(true),
                // Someone else removed it between the lstat and now.
                Err(error) if error.kind() == io::ErrorKind::NotFound => Ok(false),
                Err(error) => Err(WorkspaceError::from_io("remove", display, error)),
            }
        })
        .await
    }

    /// Creates a directory. Without `parents` the parent must exist and the path must not;
    /// with `parents` missing parents are created and an existing directory is fine.
    ///
    /// Errors: `AlreadyExists` (without `parents`, or when the path is not a directory),
    /// `NotFound` (missing parent without `parents`), `NotADirectory`, `PathEscapesRoot`.
    pub async fn mkdir(&self, path: &RelPath, parents: bool) -> Result<()> {
        let relative = path.clone();
        self.blocking(move |root, owner| {
            let display = relative.as_fs_str();
            if relative.is_root() {
                return if parents { Ok(()) } else { Err(WorkspaceError::AlreadyExists { path: display.to_owned() }) };
            }
            let target = Path::new(relative.as_str());
            if parents && let Some(parent) = target.parent() {
                create_dirs(root, parent, owner, display)?;
            }
            match root.create_dir(target) {
                Ok(()) => chown_dir(root, target, owner, display),
                Err(error) if parents && error.kind() == io::ErrorKind::AlreadyExists => {
                    // Follows a final symlink inside the root, refuses one leading out, and
                    // treats a dangling one or a file as "exists, but is not a directory".
                    match root.metadata(target) {
                        Ok(metadata) if metadata.is_dir() => Ok(()),
                        Ok(_) => Err(WorkspaceError::AlreadyExists { path: display.to_owned() }),
                        Err(error) if error.kind() == io::ErrorKind::NotFound => {
                            Err(WorkspaceError::AlreadyExists { path: display.to_owned() })
                        }
                        Err(error) => Err(WorkspaceError::from_io("stat", display, error)),
                    }
                }
                Err(error) => Err(WorkspaceError::from_io("mkdir", display, error)),
            }
        })
        .await
    }

    /// Appends `data` with one write on an `O_APPEND` descriptor (creating the file with
    /// mode 0644, owned like every file this creates, and its parents), then `fdatasync`.
    /// A final symlink inside the root is followed; one leading out is refused.
    pub async fn append_file(&self, path: &RelPath, data: Bytes) -> Result<u64> {
        if path.is_root() {
            return Err(WorkspaceError::IsADirectory { path: ".".into() });
        }
        let relative = path.clone();
        self.blocking(move |root, owner| {
            let display = relative.as_fs_str();
            let target = Path::new(relative.as_str());
            if let Some(parent) = target.parent() {
                create_dirs(root, parent, owner, display)?;
            }
            let mut options = OpenOptions::new();
            options.append(true).create(true).mode(0o644).custom_flags(nix::libc::O_NOCTTY | nix::libc::O_NONBLOCK);
            let file =
                root.open_with(target, &options).map_err(|error| WorkspaceError::from_io("open", display, error))?;
            let metadata = file.metadata().map_err(|error| WorkspaceError::from_io("stat", display, error))?;
            if !metadata.is_file() {
                return Err(WorkspaceError::InvalidArgument(format!("{display:?} is not a regular file")));
            }
            let mut file = file.into_std();
            if let Some((uid, gid)) = owner
                && (metadata.uid() != uid || metadata.gid() != gid)
            {
                nix::unistd::fchown(&file, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
                    .map_err(|errno| WorkspaceError::from_io("chown", display, io::Error::from(errno)))?;
            }
            std::io::Write::write_all(&mut file, &data)
                .map_err(|error| WorkspaceError::from_io("append", display, error))?;
            file.sync_data().map_err(|error| WorkspaceError::from_io("fsync", display, error))?;
            Ok(data.len() as u64)
        })
        .await
    }

    /// Renames with `renameat2(RENAME_NOREPLACE)` between the two parent directories (each
    /// opened through cap-std, so both stay inside the root), creating `to`'s parents.
    /// Atomic, and never replaces: `AlreadyExists` when `to` exists.
    pub async fn rename(&self, from: &RelPath, to: &RelPath) -> Result<()> {
        let (Some(from_name), Some(to_name)) = (from.file_name(), to.file_name()) else {
            return Err(WorkspaceError::InvalidPath {
                path: ".".into(),
                reason: "the workspace root cannot be renamed",
            });
        };
        let (from_name, to_name) = (from_name.to_owned(), to_name.to_owned());
        let (from_parent, to_parent) = (from.parent().unwrap_or_default(), to.parent().unwrap_or_default());
        let (from_display, to_display) = (from.as_fs_str().to_owned(), to.as_fs_str().to_owned());
        self.blocking(move |root, owner| {
            let source_dir = root
                .open_dir(from_parent.as_fs_str())
                .map_err(|error| WorkspaceError::from_io("open", &from_display, error))?;
            create_dirs(root, Path::new(to_parent.as_str()), owner, &to_display)?;
            let target_dir = root
                .open_dir(to_parent.as_fs_str())
                .map_err(|error| WorkspaceError::from_io("open", &to_display, error))?;
            match nix::fcntl::renameat2(
                &source_dir,
                from_name.as_str(),
                &target_dir,
                to_name.as_str(),
                RenameFlags::RENAME_NOREPLACE,
            ) {
                Ok(()) => Ok(()),
                Err(nix::errno::Errno::EEXIST) => Err(WorkspaceError::AlreadyExists { path: to_display.clone() }),
                Err(nix::errno::Errno::ENOENT) => Err(WorkspaceError::NotFound { path: from_display.clone() }),
                Err(errno) => Err(WorkspaceError::from_io("rename", &from_display, io::Error::from(errno))),
            }
        })
        .await
    }

    /// Creates a symlink (owned like every file this creates) and its parents. The target
    /// is stored as given; resolving through it later is confined like any path.
    pub async fn symlink(&self, target: &str, link: &RelPath) -> Result<()> {
        let Some(name) = link.file_name().map(str::to_owned) else {
            return Err(WorkspaceError::AlreadyExists { path: ".".into() });
        };
        if target.is_empty() || target.contains('\0') {
            return Err(WorkspaceError::InvalidArgument("a symlink target must be non-empty and free of NUL".into()));
        }
        let parent = link.parent().unwrap_or_default();
        let display = link.as_fs_str().to_owned();
        let target = target.to_owned();
        self.blocking(move |root, owner| {
            create_dirs(root, Path::new(parent.as_str()), owner, &display)?;
            let parent_dir =
                root.open_dir(parent.as_fs_str()).map_err(|error| WorkspaceError::from_io("open", &display, error))?;
            // A single name inside an opened directory: nothing is resolved on the way.
            nix::unistd::symlinkat(target.as_str(), &parent_dir, name.as_str())
                .map_err(|errno| WorkspaceError::from_io("symlink", &display, io::Error::from(errno)))?;
            if let Some((uid, gid)) = owner {
                nix::unistd::fchownat(
                    &parent_dir,
                    name.as_str(),
                    Some(Uid::from_raw(uid)),
                    Some(Gid::from_raw(gid)),
                    AtFlags::AT_SYMLINK_NOFOLLOW,
                )
                .map_err(|errno| WorkspaceError::from_io("chown", &display, io::Error::from(errno)))?;
            }
            Ok(())
        })
        .await
    }

    /// Checks that `path` is a directory inside the root and returns its physical host
    /// path (symlinks resolved inside the root), for use as a process's cwd.
    pub async fn resolve_dir(&self, path: &RelPath) -> Result<PathBuf> {
        // The root is where every exec runs by default: known without a trip to the
        // blocking pool.
        if path.is_root() {
            return Ok(self.host_root.clone());
        }
        let relative = path.clone();
        let host_root = self.host_root.clone();
        self.blocking(move |root, _owner| {
            let display = relative.as_fs_str();
            let resolved = |error| WorkspaceError::from_io("resolve directory", display, error);
            root.open_dir(display).map_err(resolved)?;
            let canonical = root.canonicalize(display).map_err(resolved)?;
            Ok(host_root.join(canonical))
        })
        .await
    }

    /// Runs blocking disk work on tokio's blocking pool.
    async fn blocking<T, F>(&self, work: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Arc<Dir>, Option<(u32, u32)>) -> Result<T> + Send + 'static,
    {
        let root = self.root.clone();
        let owner = self.owner;
        tokio::task::spawn_blocking(move || work(&root, owner)).await.map_err(|error| WorkspaceError::Backend {
            backend: "hostfs",
            message: format!("blocking file task failed: {error}"),
        })?
    }
}

fn refuse_root() -> WorkspaceError {
    WorkspaceError::InvalidPath { path: ".".into(), reason: "the workspace root itself cannot be removed" }
}

fn file_info(path: RelPath, metadata: &cap_std::fs::Metadata) -> FileInfo {
    let file_type = metadata.file_type();
    let kind = if file_type.is_symlink() {
        FileKind::Symlink
    } else if file_type.is_dir() {
        FileKind::Directory
    } else if file_type.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    };
    FileInfo {
        path,
        kind,
        size: metadata.len(),
        mode: metadata.mode() & 0o7777,
        modified: metadata.modified().ok().map(|time| time.into_std()),
    }
}

/// Creates every missing directory of `relative` (like `mkdir -p`), following symlinks
/// inside the root. Returns the directories it created, outermost first.
fn create_dirs(root: &Dir, relative: &Path, owner: Option<(u32, u32)>, display: &str) -> Result<Vec<PathBuf>> {
    let mut prefix = PathBuf::new();
    let mut created = Vec::new();
    for component in relative.components() {
        match component {
            Component::CurDir => continue,
            // A `..` from a symlink target: the prefix before it exists, so does this.
            Component::ParentDir => {
                prefix.push(component);
                continue;
            }
            Component::Normal(_) => prefix.push(component),
            Component::RootDir | Component::Prefix(_) => {
                return Err(WorkspaceError::PathEscapesRoot { path: display.to_owned() });
            }
        }
        match root.create_dir(&prefix) {
            Ok(()) => {
                chown_dir(root, &prefix, owner, display)?;
                created.push(prefix.clone());
            }
            Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {
                let metadata =
                    root.metadata(&prefix).map_err(|error| WorkspaceError::from_io("stat", display, error))?;
                if !metadata.is_dir() {
                    return Err(WorkspaceError::NotADirectory { path: display.to_owned() });
                }
            }
            Err(error) => return Err(WorkspaceError::from_io("mkdir", display, error)),
        }
    }
    Ok(created)
}

fn chown_dir(root: &Dir, relative: &Path, owner: Option<(u32, u32)>, display: &str) -> Result<()> {
    let Some((uid, gid)) = owner else {
        return Ok(());
    };
    let dir = root.open_dir(relative).map_err(|error| WorkspaceError::from_io("open", display, error))?;
    // cap-std directory handles are O_PATH, which fchown refuses; fchownat with an empty
    // path acts on the handle itself, with no second resolution of the name.
    nix::unistd::fchownat(&dir, "", Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)), AtFlags::AT_EMPTY_PATH)
        .map_err(|errno| WorkspaceError::from_io("chown", display, io::Error::from(errno)))
}

/// Where a write lands after following symlinks: a directory handle and a single name in it.
struct WriteTarget {
    parent: Dir,
    name: OsString,
    /// Permission bits of the regular file being replaced, if any.
    existing_mode: Option<u32>,
}

/// Resolves the target of a write, creating missing parents. A final symlink is followed
/// (a dangling one inside the root creates its target); each hop's directory is opened
/// through cap-std, so a hop leading out of the root fails with `PathEscapesRoot`.
fn resolve_write_target(
    root: &Dir,
    path: &RelPath,
    owner: Option<(u32, u32)>,
    created: &mut Vec<PathBuf>,
) -> Result<WriteTarget> {
    let display = path.as_fs_str();
    let mut current = PathBuf::from(path.as_str());
    for _ in 0..=MAX_SYMLINK_HOPS {
        let Some(Component::Normal(name)) = current.components().next_back() else {
            // A symlink target ending in `..` or `/` names a directory.
            return Err(WorkspaceError::IsADirectory { path: display.to_owned() });
        };
        let name = name.to_owned();
        let parent = current.parent().map(Path::to_path_buf).unwrap_or_default();
        created.extend(create_dirs(root, &parent, owner, display)?);
        let parent_dir = if parent.as_os_str().is_empty() { root.try_clone() } else { root.open_dir(&parent) }
            .map_err(|error| WorkspaceError::from_io("open", display, error))?;
        match parent_dir.symlink_metadata(&name) {
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Ok(WriteTarget { parent: parent_dir, name, existing_mode: None });
            }
            Err(error) => return Err(WorkspaceError::from_io("stat", display, error)),
            Ok(metadata) if metadata.file_type().is_symlink() => {
                // cap-std's read_link refuses absolute targets as an escape.
                let link =
                    parent_dir.read_link(&name).map_err(|error| WorkspaceError::from_io("readlink", display, error))?;
                current = parent.join(link);
            }
            Ok(metadata) if metadata.is_dir() => {
                return Err(WorkspaceError::IsADirectory { path: display.to_owned() });
            }
            Ok(metadata) => {
                return Ok(WriteTarget {
                    parent: parent_dir,
                    name,
                    existing_mode: metadata.is_file().then(|| metadata.mode() & 0o7777),
                });
            }
        }
    }
    // Like ELOOP: a chain this long is a loop or an attack, either way not followed.
    Err(WorkspaceError::PathEscapesRoot { path: display.to_owned() })
}

/// Resolves the target and creates the temp file beside it, ready for writing. On error
/// everything it created is removed before it returns (it runs on the blocking pool).
fn prepare_write(
    root: &Arc<Dir>,
    path: &RelPath,
    owner: Option<(u32, u32)>,
    mode: u32,
) -> Result<(std::fs::File, PendingWrite)> {
    let mut pending = PendingWrite {
        root: root.clone(),
        parent: None,
        temp_name: None,
        final_name: OsString::new(),
        created: Vec::new(),
    };
    match create_temp(root, path, owner, mode, &mut pending) {
        Ok(file) => Ok((file, pending)),
        Err(error) => {
            if let Some(cleanup) = pending.take_cleanup() {
                cleanup();
            }
            Err(error)
        }
    }
}

fn create_temp(
    root: &Dir,
    path: &RelPath,
    owner: Option<(u32, u32)>,
    mode: u32,
    pending: &mut PendingWrite,
) -> Result<std::fs::File> {
    let display = path.as_fs_str();
    let target = resolve_write_target(root, path, owner, &mut pending.created)?;
    let temp_name = temp_name_for(&target.name);
    let parent = Arc::new(target.parent);
    pending.parent = Some(parent.clone());
    pending.final_name = target.name;
    let mut options = OpenOptions::new();
    // create_new is O_CREAT|O_EXCL: it never follows a symlink planted at the temp name.
    options.write(true).create_new(true).mode(0o600);
    let file =
        parent.open_with(&temp_name, &options).map_err(|error| WorkspaceError::from_io("create", display, error))?;
    pending.temp_name = Some(temp_name);
    let file = file.into_std();
    // fchmod after creation: the exact bits, independent of the process umask.
    let final_mode = target.existing_mode.unwrap_or(mode) & 0o7777;
    file.set_permissions(std::fs::Permissions::from_mode(final_mode))
        .map_err(|error| WorkspaceError::from_io("chmod", display, error))?;
    if let Some((uid, gid)) = owner {
        nix::unistd::fchown(&file, Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)))
            .map_err(|errno| WorkspaceError::from_io("chown", display, io::Error::from(errno)))?;
    }
    Ok(file)
}

/// `.<name>.berth-tmp-<16 hex>`, with `name` shortened (on a char boundary) to fit NAME_MAX.
fn temp_name_for(name: &OsStr) -> OsString {
    let suffix = format!("{TEMP_MARKER}{:016x}", rand::random::<u64>());
    let room = NAME_MAX_BYTES - 1 - suffix.len();
    let name = name.to_string_lossy();
    let mut cut = name.len().min(room);
    while !name.is_char_boundary(cut) {
        cut -= 1;
    }
    OsString::from(format!(".{}{suffix}", &name[..cut]))
}

/// The pieces needed to publish a finished temp file.
/// Chunks of a write waiting for one trip to the disk.
#[derive(Default)]
struct Block {
    chunks: Vec<Bytes>,
    bytes: usize,
}

impl Block {
    fn push(&mut self, chunk: Bytes) {
        // An empty chunk adds nothing, and a vectored write of nothing but empty slices
        // writes 0 bytes, which would read as a full disk.
        if chunk.is_empty() {
            return;
        }
        self.bytes += chunk.len();
        self.chunks.push(chunk);
    }

    /// Writes every chunk, in order, with as few vectored writes as the kernel allows.
    fn write_to(self, file: &mut std::fs::File, display: &str) -> Result<()> {
        let mut slices: Vec<io::IoSlice<'_>> = self.chunks.iter().map(|chunk| io::IoSlice::new(chunk)).collect();
        let mut remaining = &mut slices[..];
        while !remaining.is_empty() {
            let written = io::Write::write_vectored(file, remaining)
                .map_err(|error| WorkspaceError::from_io("write", display, error))?;
            if written == 0 {
                return Err(WorkspaceError::from_io("write", display, io::ErrorKind::WriteZero.into()));
            }
            io::IoSlice::advance_slices(&mut remaining, written);
        }
        Ok(())
    }
}

struct Commit {
    parent: Arc<Dir>,
    temp_name: OsString,
    final_name: OsString,
}

impl Commit {
    fn rename(&self, display: &str) -> Result<()> {
        self.parent
            .rename(&self.temp_name, &self.parent, &self.final_name)
            .map_err(|error| WorkspaceError::from_io("rename", display, error))?;
        // Make the rename itself durable. The `Dir` handle is O_PATH (no fsync on it), so
        // the directory is opened for reading once more, relative to that handle.
        let sync_dir = |error| WorkspaceError::from_io("fsync directory", display, error);
        self.parent.open(".").and_then(|dir| dir.sync_all()).map_err(sync_dir)
    }
}

/// An in-flight write: until disarmed, dropping it removes the temp file and the parent
/// directories the write created (newest first, only while empty).
struct PendingWrite {
    root: Arc<Dir>,
    parent: Option<Arc<Dir>>,
    temp_name: Option<OsString>,
    final_name: OsString,
    created: Vec<PathBuf>,
}

impl PendingWrite {
    fn commit_parts(&self) -> Commit {
        Commit {
            parent: self.parent.clone().unwrap_or_else(|| self.root.clone()),
            temp_name: self.temp_name.clone().unwrap_or_default(),
            final_name: self.final_name.clone(),
        }
    }

    fn disarm(&mut self) {
        self.temp_name = None;
        self.created.clear();
    }

    /// Takes the cleanup work out (disarming the guard); `None` when there is nothing to do.
    fn take_cleanup(&mut self) -> Option<impl FnOnce() + Send + 'static> {
        if self.temp_name.is_none() && self.created.is_empty() {
            return None;
        }
        let root = self.root.clone();
        let parent = self.parent.take();
        let temp_name = self.temp_name.take();
        let created = std::mem::take(&mut self.created);
        Some(move || {
            if let (Some(parent), Some(temp_name)) = (&parent, &temp_name)
                && let Err(error) = parent.remove_file(temp_name)
                && error.kind() != io::ErrorKind::NotFound
            {
                tracing::warn!(temp = ?temp_name, %error, "could not remove the temp file of a failed write");
            }
            for dir in created.iter().rev() {
                // Fails harmlessly when something else was put there meanwhile.
                let _ = root.remove_dir(dir);
            }
        })
    }

    /// Cleans up now on the blocking pool and waits for it.
    async fn clean_up(&mut self) {
        if let Some(cleanup) = self.take_cleanup() {
            let _ = tokio::task::spawn_blocking(cleanup).await;
        }
    }
}

impl Drop for PendingWrite {
    /// Only reached armed when the write future was dropped mid-way (a cancelled request):
    /// the cleanup then runs in the background.
    fn drop(&mut self) {
        let Some(cleanup) = self.take_cleanup() else {
            return;
        };
        // Unlinking is disk work: keep it off the async worker when there is a runtime.
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                handle.spawn_blocking(cleanup);
            }
            Err(_) => cleanup(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temp_names_fit_name_max() {
        let long = "é".repeat(127);
        let temp = temp_name_for(OsStr::new(&long));
        assert!(temp.len() <= NAME_MAX_BYTES, "{}", temp.len());
        let short = temp_name_for(OsStr::new("a.txt"));
        let short = short.to_string_lossy();
        assert!(short.starts_with(".a.txt.berth-tmp-"), "{short}");
    }
}
