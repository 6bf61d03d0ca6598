//! Confinement of client paths in an E2B sandbox, through envd's `Stat`.
//!
//! envd follows symlinks anywhere in the sandbox and reports a link's fully resolved
//! target, not what it says, so a path is resolved here one component at a time with the
//! rules the host backends get from cap-std (and `posix.rs` from its script): an absolute
//! link target, a `..` above the root or more than 40 hops is an escape, and a link's own
//! text is read with `readlink` inside the sandbox (only when a link is met). The result is
//! a symlink-free path below the root that the native call then uses. Like the Docker
//! backend's scripts, this holds exactly for a workspace nobody changes concurrently; a
//! process racing it can only redirect the call to what the sandbox user (the same user
//! envd acts as) can reach anyway — the sandbox is the boundary.

use std::collections::{HashMap, HashSet};

use serde_json::{Value, json};

use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::RelPath;

use super::envd::Envd;
use super::http::Retry;
use super::process::run_internal;
use super::scripts;

/// Most symlinks one resolution follows (Linux's limit).
const MAX_HOPS: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// A final symlink is not followed (lstat semantics).
    NoFollow,
    /// A final symlink is followed.
    Follow,
    /// Like `Follow`, and missing components of the path itself are allowed (created by
    /// the caller); missing ones inside a link's target are not, but its last one.
    Create,
    /// `Create` without following a final symlink.
    CreateNoFollow,
}

/// A resolved path.
#[derive(Clone, Debug)]
pub struct Resolved {
    /// Components below the root, free of symlinks (but the last with a no-follow mode).
    pub components: Vec<String>,
    /// envd's entry of the last component, when it exists.
    pub entry: Option<Value>,
    /// How many leading components existed (the rest are to be created).
    pub existing: usize,
}

impl Resolved {
    pub fn exists(&self) -> bool {
        self.entry.is_some()
    }
    pub fn is_dir(&self) -> bool {
        self.entry.as_ref().is_some_and(|entry| !is_symlink(entry) && entry_type(entry) == "FILE_TYPE_DIRECTORY")
    }
    pub fn is_symlink(&self) -> bool {
        self.entry.as_ref().is_some_and(is_symlink)
    }
}

pub fn entry_type(entry: &Value) -> &str {
    entry.get("type").and_then(Value::as_str).unwrap_or("FILE_TYPE_UNSPECIFIED")
}

/// Whether envd's entry is a symlink (`isSymlink` on newer envd; the `L` of Go's mode
/// string or a `symlinkTarget` on every version).
pub fn is_symlink(entry: &Value) -> bool {
    entry.get("isSymlink").and_then(Value::as_bool).unwrap_or(false)
        || entry.get("permissions").and_then(Value::as_str).is_some_and(|text| text.starts_with('L'))
        || entry.get("symlinkTarget").is_some_and(|target| !target.is_null())
}

pub struct Resolver<'a> {
    pub envd: &'a Envd,
    /// The workspace root inside the sandbox.
    pub root: &'a str,
    links: HashMap<String, String>,
}

impl<'a> Resolver<'a> {
    pub fn new(envd: &'a Envd, root: &'a str) -> Self {
        Self { envd, root, links: HashMap::new() }
    }

    pub fn absolute(&self, components: &[String]) -> String {
        if components.is_empty() { self.root.to_owned() } else { format!("{}/{}", self.root, components.join("/")) }
    }

    fn inside(&self, absolute: &str) -> bool {
        absolute == self.root || absolute.strip_prefix(self.root).is_some_and(|rest| rest.starts_with('/'))
    }

    /// envd's entry of an absolute path (lstat), `None` when it does not exist.
    pub async fn stat(&self, absolute: &str, display: &str) -> Result<Option<Value>> {
        match self.envd.unary("filesystem.Filesystem/Stat", &json!({"path": absolute}), Retry::Idempotent).await {
            Ok(answer) => Ok(answer.get("entry").cloned()),
            Err(error) if error.code() == Some("not_found") => Ok(None),
            Err(error) => Err(error.into_error("stat", display)),
        }
    }

    async fn read_link(&mut self, absolute: &str, display: &str) -> Result<String> {
        if let Some(target) = self.links.get(absolute) {
            return Ok(target.clone());
        }
        let (exit, stdout, stderr) =
            run_internal(self.envd, &["/bin/sh", "-c", scripts::READLINK, "berth-readlink", absolute], "/").await?;
        if exit.code != Some(0) || stdout.len() < 2 {
            return Err(WorkspaceError::Backend {
                backend: super::config::BACKEND_NAME,
                message: format!("readlink {display:?}: {}", String::from_utf8_lossy(&stderr).trim()),
            });
        }
        let target = String::from_utf8_lossy(&stdout[..stdout.len() - 2]).into_owned();
        self.links.insert(absolute.to_owned(), target.clone());
        Ok(target)
    }

    pub async fn resolve(&mut self, path: &RelPath, mode: Mode) -> Result<Resolved> {
        let display = path.as_fs_str().to_owned();
        let escape = || WorkspaceError::PathEscapesRoot { path: display.clone() };
        let follow_last = matches!(mode, Mode::Follow | Mode::Create);
        let create = matches!(mode, Mode::Create | Mode::CreateNoFollow);
        // (component, came from a link's target)
        let mut pending: Vec<(String, bool)> = path
            .components()
            .map(|component| (component.to_owned(), false))
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        let mut current: Vec<String> = Vec::new();
        let mut hops = 0;
        // (link, components still to resolve): seen twice is a loop.
        let mut visited: HashSet<(String, usize)> = HashSet::new();
        let mut missing = false;
        let mut existing = 0;
        let mut entry = if path.is_root() { self.stat(self.root, &display).await? } else { None };
        while let Some((component, linked)) = pending.pop() {
            let more = !pending.is_empty();
            match component.as_str() {
                "" | "." => {
                    if !more {
                        entry = self.stat(&self.absolute(&current), &display).await?;
                    }
                    continue;
                }
                ".." => {
                    if missing {
                        return Err(WorkspaceError::NotFound { path: display });
                    }
                    if current.pop().is_none() {
                        return Err(escape());
                    }
                    existing = current.len();
                    if !more {
                        entry = self.stat(&self.absolute(&current), &display).await?;
                    }
                    continue;
                }
                _ => {}
            }
            current.push(component);
            if missing {
                entry = None;
                continue;
            }
            let absolute = self.absolute(&current);
            let found = self.stat(&absolute, &display).await?;
            match &found {
                Some(info) if is_symlink(info) && (more || follow_last) => {
                    hops += 1;
                    if hops > MAX_HOPS || !visited.insert((absolute.clone(), pending.len())) {
                        return Err(escape());
                    }
                    // envd reports where the link finally leads (or the link itself when it
                    // leads nowhere): a place outside the root is an escape whatever the
                    // link says, without reading it.
                    if let Some(resolved) = info.get("symlinkTarget").and_then(Value::as_str)
                        && resolved != absolute
                        && resolved.starts_with('/')
                        && !self.inside(resolved)
                    {
                        return Err(escape());
                    }
                    let target = self.read_link(&absolute, &display).await?;
                    if target.starts_with('/') || target.is_empty() {
                        return Err(escape());
                    }
                    current.pop();
                    pending.extend(target.split('/').rev().map(|part| (part.to_owned(), true)));
                    continue;
                }
                None => {
                    if create && !linked {
                        missing = true;
                    } else if more {
                        return Err(WorkspaceError::NotFound { path: display });
                    }
                }
                Some(info) if more && entry_type(info) != "FILE_TYPE_DIRECTORY" => {
                    return Err(WorkspaceError::NotADirectory { path: display });
                }
                Some(_) => existing = current.len(),
            }
            entry = found;
        }
        Ok(Resolved { components: current, entry, existing })
    }
}
