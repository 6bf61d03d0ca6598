//! A sandbox's filesystem as envd sees it from inside the VM, served from the host.
//!
//! The sandbox's namespace is the host's read-only system directories plus its own
//! writable `/home` and `/tmp` (the sandbox directory's `home/` and `tmp/`), the same view
//! its processes get from bubblewrap (`jail.rs`). Paths are resolved here component by
//! component in that namespace — symlinks followed the way the kernel would inside the
//! sandbox (an absolute target starts again at the sandbox's `/`, 40 hops at most) — so an
//! emulated envd never follows a sandbox's symlink to a host path. The writable part is
//! then reached through a cap-std handle on the sandbox directory, which refuses any
//! symlink leading out of it should one appear after the resolution; the host part only
//! ever reads, and only what any user could read.

use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use cap_std::ambient_authority;
use cap_std::fs::{Dir, MetadataExt as _, OpenOptions};
use serde_json::{Value, json};

use super::gofmt;

/// The user envd runs commands as inside a template, and its home.
pub const USER: &str = "user";
pub const HOME: &str = "/home/user";
/// Its uid inside the sandbox (mapped to the sandbox's host uid).
pub const SANDBOX_UID: u32 = 1000;

/// Why a filesystem call failed.
#[derive(Debug)]
pub enum FsError {
    NotFound(String),
    NotADirectory(String),
    IsADirectory(String),
    Loop(String),
    Permission(String),
    Other(String),
}

impl FsError {
    fn from_io(path: &str, error: io::Error) -> Self {
        match error.kind() {
            io::ErrorKind::NotFound => Self::NotFound(format!("{path}: no such file or directory")),
            io::ErrorKind::NotADirectory => Self::NotADirectory(format!("{path}: not a directory")),
            io::ErrorKind::IsADirectory => Self::IsADirectory(format!("{path}: is a directory")),
            io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem => {
                Self::Permission(format!("{path}: permission denied"))
            }
            _ => Self::Other(format!("{path}: {error}")),
        }
    }
}

pub type FsResult<T> = Result<T, FsError>;

/// What the sandbox's `/` holds.
#[derive(Clone, Debug)]
pub enum Top {
    /// A directory of the sandbox (`home`, `tmp`), writable.
    Own,
    /// A host directory bound read-only at the same path.
    Host,
    /// A symlink (`/bin -> usr/bin` on merged-usr hosts).
    Link(String),
}

/// The top-level entries every sandbox has, read from the host once.
#[derive(Clone, Debug)]
pub struct Layout {
    pub top: Vec<(String, Top)>,
}

impl Layout {
    pub fn from_host() -> Self {
        let mut top = vec![("home".to_owned(), Top::Own), ("tmp".to_owned(), Top::Own)];
        for name in ["usr", "etc", "opt", "bin", "sbin", "lib", "lib64", "lib32"] {
            let host = Path::new("/").join(name);
            match std::fs::symlink_metadata(&host) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    if let Ok(target) = std::fs::read_link(&host) {
                        top.push((name.to_owned(), Top::Link(target.to_string_lossy().into_owned())));
                    }
                }
                Ok(meta) if meta.is_dir() => top.push((name.to_owned(), Top::Host)),
                _ => {}
            }
        }
        top.sort_by(|left, right| left.0.cmp(&right.0));
        Self { top }
    }

    fn get(&self, name: &str) -> Option<&Top> {
        self.top.iter().find(|(entry, _)| entry == name).map(|(_, top)| top)
    }
}

/// Where a resolved sandbox path lives.
#[derive(Clone, Debug)]
enum Place {
    Root,
    /// Relative to the sandbox directory (`home/user/x`).
    Own(PathBuf),
    Host(PathBuf),
}

/// A sandbox path with every symlink resolved (but the last, when not followed).
#[derive(Clone, Debug)]
pub struct Resolved {
    components: Vec<String>,
    place: Place,
    /// lstat of the final component, when it exists.
    meta: Option<Meta>,
}

impl Resolved {
    pub fn path(&self) -> String {
        format!("/{}", self.components.join("/"))
    }
    pub fn exists(&self) -> bool {
        self.meta.is_some()
    }
    pub fn is_dir(&self) -> bool {
        self.meta.as_ref().is_some_and(|meta| meta.mode & 0o170000 == 0o040000)
    }
}

#[derive(Clone, Debug)]
struct Meta {
    mode: u32,
    size: u64,
    uid: u32,
    modified: Option<SystemTime>,
}

impl Meta {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self { mode: meta.mode(), size: meta.size(), uid: meta.uid(), modified: meta.modified().ok() }
    }
    fn dir() -> Self {
        Self { mode: 0o040755, size: 4096, uid: 0, modified: None }
    }
    fn is_symlink(&self) -> bool {
        self.mode & 0o170000 == 0o120000
    }
}

/// One sandbox's files.
pub struct Vfs {
    dir: Dir,
    dir_path: PathBuf,
    layout: Layout,
    /// Host uid and gid that own the sandbox's files (when the emulator can chown).
    owner: Option<(u32, u32)>,
}

impl Vfs {
    pub fn open(dir_path: &Path, layout: Layout, owner: Option<(u32, u32)>) -> io::Result<Self> {
        let dir = Dir::open_ambient_dir(dir_path, ambient_authority())?;
        Ok(Self { dir, dir_path: dir_path.to_owned(), layout, owner })
    }

    /// envd's path expansion: `~` is the user's home, a relative path is relative to it.
    pub fn expand(path: &str) -> String {
        if path == "~" {
            HOME.to_owned()
        } else if let Some(rest) = path.strip_prefix("~/") {
            format!("{HOME}/{rest}")
        } else if path.starts_with('/') {
            path.to_owned()
        } else {
            format!("{HOME}/{path}")
        }
    }

    fn lstat(&self, components: &[String]) -> FsResult<(Place, Option<Meta>)> {
        let display = format!("/{}", components.join("/"));
        let Some(first) = components.first() else {
            return Ok((Place::Root, Some(Meta::dir())));
        };
        let place = match self.layout.get(first) {
            None => return Ok((Place::Own(PathBuf::from("nonexistent")), None)),
            Some(Top::Link(target)) if components.len() == 1 => {
                let meta = Meta { mode: 0o120777, size: target.len() as u64, uid: 0, modified: None };
                return Ok((Place::Root, Some(meta)));
            }
            Some(Top::Link(_)) => return Err(FsError::Other(format!("{display}: unresolved top-level link"))),
            Some(Top::Own) => Place::Own(components.iter().collect()),
            Some(Top::Host) => Place::Host(Path::new("/").join(components.iter().collect::<PathBuf>())),
        };
        let meta = match &place {
            Place::Own(relative) => self.dir.symlink_metadata(relative).map(|meta| Meta {
                mode: meta.mode(),
                size: meta.size(),
                uid: SANDBOX_UID,
                modified: meta.modified().ok().map(|time| time.into_std()),
            }),
            Place::Host(host) => std::fs::symlink_metadata(host).map(|meta| Meta::of(&meta)),
            Place::Root => return Ok((place, Some(Meta::dir()))),
        };
        match meta {
            Ok(meta) => Ok((place, Some(meta))),
            Err(error) if error.kind() == io::ErrorKind::NotFound => Ok((place, None)),
            Err(error) => Err(FsError::from_io(&display, error)),
        }
    }

    fn read_link(&self, components: &[String], place: &Place) -> FsResult<String> {
        let display = format!("/{}", components.join("/"));
        let target = match place {
            Place::Root => match self.layout.get(&components[0]) {
                Some(Top::Link(target)) => return Ok(target.clone()),
                _ => return Err(FsError::Other(format!("{display}: not a link"))),
            },
            Place::Own(relative) => self.dir.read_link_contents(relative),
            Place::Host(host) => std::fs::read_link(host),
        };
        target.map(|target| target.to_string_lossy().into_owned()).map_err(|error| FsError::from_io(&display, error))
    }

    /// Resolves an absolute sandbox path; a missing last component is fine (`exists()`
    /// tells), a missing directory on the way is `NotFound`.
    pub fn resolve(&self, path: &str, follow_last: bool) -> FsResult<Resolved> {
        let mut pending: Vec<String> = split(path).into_iter().rev().collect();
        let mut current: Vec<String> = Vec::new();
        let mut hops = 0;
        let mut last = (Place::Root, Some(Meta::dir()));
        while let Some(component) = pending.pop() {
            match component.as_str() {
                "" | "." => continue,
                ".." => {
                    current.pop();
                    last = self.lstat(&current)?;
                    continue;
                }
                _ => {}
            }
            current.push(component);
            let (place, meta) = self.lstat(&current)?;
            let more = pending.iter().any(|rest| !rest.is_empty() && rest != ".");
            match &meta {
                Some(meta) if meta.is_symlink() && (more || follow_last) => {
                    hops += 1;
                    if hops > 40 {
                        return Err(FsError::Loop(format!("{path}: too many levels of symbolic links")));
                    }
                    let target = self.read_link(&current, &place)?;
                    current.pop();
                    if target.starts_with('/') {
                        current.clear();
                    }
                    pending.extend(split(&target).into_iter().rev());
                    last = self.lstat(&current)?;
                    continue;
                }
                None if more => return Err(FsError::NotFound(format!("{path}: no such file or directory"))),
                Some(meta) if more && meta.mode & 0o170000 != 0o040000 => {
                    return Err(FsError::NotADirectory(format!("{path}: not a directory")));
                }
                _ => {}
            }
            last = (place, meta);
        }
        Ok(Resolved { components: current, place: last.0, meta: last.1 })
    }

    fn own(&self, resolved: &Resolved) -> FsResult<PathBuf> {
        match &resolved.place {
            Place::Own(relative) => Ok(relative.clone()),
            _ => Err(FsError::Permission(format!("{}: permission denied (read-only)", resolved.path()))),
        }
    }

    fn chown(&self, relative: &Path) {
        if let Some((uid, gid)) = self.owner {
            let _ = std::os::unix::fs::lchown(self.dir_path.join(relative), Some(uid), Some(gid));
        }
    }

    /// envd's `EntryInfo` of a path (lstat; a symlink's type and mode are its target's).
    pub fn entry_info(&self, path: &str) -> FsResult<Value> {
        let resolved = self.resolve(path, false)?;
        let Some(meta) = &resolved.meta else {
            return Err(FsError::NotFound(format!("{path}: no such file or directory")));
        };
        let name = resolved.components.last().cloned().unwrap_or_else(|| "/".to_owned());
        let shown = clean(path);
        let mut entry = json!({
            "name": name,
            "path": shown,
            "size": meta.size.to_string(),
            "permissions": gofmt::file_mode(meta.mode),
            "owner": owner_name(meta.uid),
            "group": owner_name(meta.uid),
        });
        let (kind, mode) = if meta.is_symlink() {
            entry["isSymlink"] = json!(true);
            match self.resolve(path, true) {
                Ok(target) if target.exists() => {
                    entry["symlinkTarget"] = json!(target.path());
                    let target_meta = target.meta.as_ref().map_or(0, |meta| meta.mode);
                    (file_type(target_meta), target_meta & 0o777)
                }
                _ => {
                    entry["symlinkTarget"] = json!(shown);
                    ("FILE_TYPE_UNSPECIFIED", 0)
                }
            }
        } else {
            (file_type(meta.mode), meta.mode & 0o777)
        };
        entry["type"] = json!(kind);
        entry["mode"] = json!(mode);
        if let Some(modified) = meta.modified {
            entry["modifiedTime"] = json!(humantime::format_rfc3339_nanos(modified).to_string());
        }
        Ok(entry)
    }

    /// Entries below a directory (symlinks to directories followed only for the listed
    /// directory itself), to `depth` levels.
    pub fn list_dir(&self, path: &str, depth: u32) -> FsResult<Vec<Value>> {
        let resolved = self.resolve(path, true)?;
        if !resolved.exists() {
            return Err(FsError::NotFound(format!("{path}: directory not found")));
        }
        if !resolved.is_dir() {
            return Err(FsError::NotADirectory(format!("path is not a directory: {path}")));
        }
        let mut entries = Vec::new();
        self.walk(&resolved, &clean(path), depth.max(1), &mut entries)?;
        Ok(entries)
    }

    fn walk(&self, dir: &Resolved, shown: &str, depth: u32, entries: &mut Vec<Value>) -> FsResult<()> {
        let names = self.names(dir)?;
        for name in names {
            let child_shown = if shown == "/" { format!("/{name}") } else { format!("{shown}/{name}") };
            let child_real =
                if dir.components.is_empty() { format!("/{name}") } else { format!("{}/{name}", dir.path()) };
            let Ok(mut entry) = self.entry_info(&child_real) else { continue };
            entry["path"] = json!(child_shown);
            let is_real_dir = entry["type"] == "FILE_TYPE_DIRECTORY" && entry.get("isSymlink").is_none();
            entries.push(entry);
            if depth > 1 && is_real_dir {
                let child = self.resolve(&child_real, false)?;
                self.walk(&child, &child_shown, depth - 1, entries)?;
            }
        }
        Ok(())
    }

    fn names(&self, dir: &Resolved) -> FsResult<Vec<String>> {
        let display = dir.path();
        let mut names: Vec<String> = match &dir.place {
            Place::Root => self.layout.top.iter().map(|(name, _)| name.clone()).collect(),
            Place::Own(relative) => {
                let reader =
                    if relative.as_os_str().is_empty() { self.dir.entries() } else { self.dir.read_dir(relative) };
                reader
                    .map_err(|error| FsError::from_io(&display, error))?
                    .filter_map(|entry| entry.ok().map(|entry| entry.file_name().to_string_lossy().into_owned()))
                    .collect()
            }
            Place::Host(host) => std::fs::read_dir(host)
                .map_err(|error| FsError::from_io(&display, error))?
                .filter_map(|entry| entry.ok().map(|entry| entry.file_name().to_string_lossy().into_owned()))
                .collect(),
        };
        names.sort();
        Ok(names)
    }

    /// `mkdir -p` with the user as owner; `Ok(false)` when it already was a directory.
    pub fn make_dirs(&self, path: &str) -> FsResult<bool> {
        let resolved = self.resolve(path, true);
        if let Ok(resolved) = &resolved
            && resolved.exists()
        {
            return if resolved.is_dir() {
                Ok(false)
            } else {
                Err(FsError::NotADirectory(format!("path already exists but it is not a directory: {path}")))
            };
        }
        // Create from the deepest existing ancestor down.
        let components = split(&clean(path));
        for end in 1..=components.len() {
            let prefix = format!("/{}", components[..end].join("/"));
            let step = self.resolve(&prefix, true)?;
            if step.exists() {
                if !step.is_dir() {
                    return Err(FsError::NotADirectory(format!("{prefix}: not a directory")));
                }
                continue;
            }
            let relative = self.own(&step)?;
            match self.dir.create_dir(&relative) {
                Ok(()) => self.chown(&relative),
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(FsError::from_io(&prefix, error)),
            }
        }
        Ok(true)
    }

    /// Renames (replacing a file at the destination), creating the destination's parents.
    pub fn rename(&self, source: &str, destination: &str) -> FsResult<()> {
        let from = self.resolve(source, false)?;
        if !from.exists() {
            return Err(FsError::NotFound(format!("source file not found: {source}")));
        }
        let parent = parent_of(&clean(destination));
        self.make_dirs(&parent)?;
        let to = self.resolve(destination, false)?;
        let (from_rel, to_rel) = (self.own(&from)?, self.own(&to)?);
        self.dir.rename(&from_rel, &self.dir, &to_rel).map_err(|error| FsError::from_io(destination, error))
    }

    /// `rm -rf` (a symlink itself, never its target); a missing path is fine.
    pub fn remove_all(&self, path: &str) -> FsResult<()> {
        let resolved = match self.resolve(path, false) {
            Ok(resolved) => resolved,
            Err(FsError::NotFound(_)) => return Ok(()),
            Err(error) => return Err(error),
        };
        let Some(meta) = &resolved.meta else { return Ok(()) };
        let relative = self.own(&resolved)?;
        let result = if meta.mode & 0o170000 == 0o040000 {
            self.dir.remove_dir_all(&relative)
        } else {
            self.dir.remove_file(&relative)
        };
        result.map_err(|error| FsError::from_io(path, error))
    }

    /// Opens a regular file for reading (the last symlink followed).
    pub fn open_read(&self, path: &str) -> FsResult<std::fs::File> {
        let resolved = self.resolve(path, true)?;
        let Some(meta) = &resolved.meta else {
            return Err(FsError::NotFound(format!("path '{path}' does not exist")));
        };
        if meta.mode & 0o170000 == 0o040000 {
            return Err(FsError::IsADirectory(format!("path '{path}' is a directory")));
        }
        match &resolved.place {
            Place::Own(relative) => {
                self.dir.open(relative).map(|file| file.into_std()).map_err(|error| FsError::from_io(path, error))
            }
            Place::Host(host) if meta.mode & 0o004 != 0 => {
                std::fs::File::open(host).map_err(|error| FsError::from_io(path, error))
            }
            _ => Err(FsError::Permission(format!("{path}: permission denied"))),
        }
    }

    /// Opens a file for writing (created, truncated), creating its parents (envd's upload).
    pub fn open_write(&self, path: &str) -> FsResult<std::fs::File> {
        let clean_path = clean(path);
        self.make_dirs(&parent_of(&clean_path))?;
        let resolved = self.resolve(&clean_path, true)?;
        if resolved.is_dir() {
            return Err(FsError::IsADirectory(format!("path is a directory: {path}")));
        }
        let relative = self.own(&resolved)?;
        let mut options = OpenOptions::new();
        options.write(true).create(true).truncate(true);
        let file = self.dir.open_with(&relative, &options).map_err(|error| FsError::from_io(path, error))?;
        if !resolved.exists() {
            self.chown(&relative);
            let _ = self
                .dir
                .set_permissions(&relative, cap_std::fs::Permissions::from_std(std::fs::Permissions::from_mode(0o644)));
        }
        Ok(file.into_std())
    }

    /// Whether a sandbox path is an existing directory (a process's cwd).
    pub fn is_dir(&self, path: &str) -> bool {
        self.resolve(path, true).is_ok_and(|resolved| resolved.is_dir())
    }
}

fn file_type(mode: u32) -> &'static str {
    match mode & 0o170000 {
        0o100000 => "FILE_TYPE_FILE",
        0o040000 => "FILE_TYPE_DIRECTORY",
        0o120000 => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    }
}

fn owner_name(uid: u32) -> String {
    match uid {
        0 => "root".to_owned(),
        SANDBOX_UID => USER.to_owned(),
        other => other.to_string(),
    }
}

fn split(path: &str) -> Vec<String> {
    path.split('/').filter(|component| !component.is_empty()).map(str::to_owned).collect()
}

/// Lexical clean of an absolute path (Go's `filepath.Clean`).
pub fn clean(path: &str) -> String {
    let mut out: Vec<&str> = Vec::new();
    for component in path.split('/') {
        match component {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    format!("/{}", out.join("/"))
}

fn parent_of(path: &str) -> String {
    match path.rfind('/') {
        Some(0) | None => "/".to_owned(),
        Some(index) => path[..index].to_owned(),
    }
}
