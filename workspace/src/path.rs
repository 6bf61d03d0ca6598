//! The one way to name a place inside a workspace.
//!
//! Every path from a client is parsed by [`join_path`] into a [`RelPath`]: relative,
//! normalised, free of `..`, NUL and absolute forms. A `RelPath` is only a *lexical*
//! guarantee; symlinks are resolved by the backend inside the root (the host backends open
//! it through a cap-std `Dir`, which refuses any resolution that leaves the root), never by
//! comparing strings after `canonicalize`.

use std::fmt;

use crate::error::{Result, WorkspaceError};

/// Longest client path accepted, in bytes.
pub const MAX_PATH_BYTES: usize = 4096;
/// Deepest client path accepted, in components.
pub const MAX_PATH_DEPTH: usize = 64;
/// Longest single path component, in bytes (the Linux NAME_MAX).
pub const MAX_COMPONENT_BYTES: usize = 255;

/// A normalised path relative to a workspace root. The root itself is the empty path.
///
/// Invariant: components are non-empty, never `.` or `..`, contain no `/` or NUL; joined by
/// single `/`; no leading or trailing `/`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RelPath(String);

impl RelPath {
    /// The workspace root.
    pub fn root() -> Self {
        Self(String::new())
    }

    /// Parses a client path (see [`join_path`]).
    pub fn parse(client_path: &str) -> Result<Self> {
        join_path(&Self::root(), client_path)
    }

    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The path as a relative string; `.` for the root (what `openat`-style APIs expect).
    pub fn as_fs_str(&self) -> &str {
        if self.0.is_empty() { "." } else { &self.0 }
    }

    /// The path as stored: empty for the root.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub fn components(&self) -> impl Iterator<Item = &str> {
        self.0.split('/').filter(|component| !component.is_empty())
    }

    pub fn depth(&self) -> usize {
        self.components().count()
    }

    /// The parent directory; `None` for the root.
    pub fn parent(&self) -> Option<RelPath> {
        if self.0.is_empty() {
            return None;
        }
        Some(match self.0.rfind('/') {
            Some(index) => Self(self.0[..index].to_owned()),
            None => Self::root(),
        })
    }

    /// The last component; `None` for the root.
    pub fn file_name(&self) -> Option<&str> {
        if self.0.is_empty() {
            return None;
        }
        Some(match self.0.rfind('/') {
            Some(index) => &self.0[index + 1..],
            None => &self.0,
        })
    }

    /// Joins a client-supplied relative path below this one (same rules as [`join_path`]).
    pub fn join(&self, child: &str) -> Result<RelPath> {
        join_path(self, child)
    }

    /// Absolute form inside a sandbox whose root is mounted at `mount` (e.g. `/workspace`).
    pub fn under(&self, mount: &str) -> String {
        if self.0.is_empty() { mount.to_owned() } else { format!("{mount}/{}", self.0) }
    }
}

impl fmt::Debug for RelPath {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "{:?}", self.as_fs_str())
    }
}

impl fmt::Display for RelPath {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(self.as_fs_str())
    }
}

/// Builds the path `child` below `base`, refusing anything that is not a plain relative path.
///
/// Refused with [`WorkspaceError::InvalidPath`]: absolute paths, any `..` component (also
/// `a/../b`: there is no lexical normalisation of parents, so no corner of it can be
/// wrong), NUL bytes, components longer than [`MAX_COMPONENT_BYTES`], and results longer than
/// [`MAX_PATH_BYTES`] or deeper than [`MAX_PATH_DEPTH`] (`LimitExceeded`). Empty components
/// and `.` are dropped, so `a//./b/` is `a/b` and `""` is the root.
pub fn join_path(base: &RelPath, child: &str) -> Result<RelPath> {
    let invalid = |reason| WorkspaceError::InvalidPath { path: child.to_owned(), reason };
    if child.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    if child.starts_with('/') {
        return Err(invalid("absolute paths are not allowed; paths are relative to the workspace root"));
    }
    if child.len() > MAX_PATH_BYTES {
        return Err(WorkspaceError::LimitExceeded {
            limit: "path length",
            size: child.len() as u64,
            max: MAX_PATH_BYTES as u64,
        });
    }
    let mut joined = base.0.clone();
    let mut depth = base.depth();
    for component in child.split('/') {
        match component {
            "" | "." => continue,
            ".." => return Err(invalid("parent components (..) are not allowed")),
            _ if component.len() > MAX_COMPONENT_BYTES => {
                return Err(invalid("a path component is longer than 255 bytes"));
            }
            _ => {}
        }
        depth += 1;
        if depth > MAX_PATH_DEPTH {
            return Err(WorkspaceError::LimitExceeded {
                limit: "path depth",
                size: depth as u64,
                max: MAX_PATH_DEPTH as u64,
            });
        }
        if !joined.is_empty() {
            joined.push('/');
        }
        joined.push_str(component);
    }
    if joined.len() > MAX_PATH_BYTES {
        return Err(WorkspaceError::LimitExceeded {
            limit: "path length",
            size: joined.len() as u64,
            max: MAX_PATH_BYTES as u64,
        });
    }
    Ok(RelPath(joined))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_plain_paths() {
        assert_eq!(RelPath::parse("a//./b/").unwrap().as_str(), "a/b");
        assert!(RelPath::parse("").unwrap().is_root());
        assert!(RelPath::parse("./").unwrap().is_root());
        assert_eq!(RelPath::parse("a/b").unwrap().parent().unwrap().as_str(), "a");
        assert_eq!(RelPath::parse("a/b").unwrap().file_name(), Some("b"));
        assert_eq!(RelPath::parse("a").unwrap().under("/workspace"), "/workspace/a");
    }

    #[test]
    fn refuses_escapes() {
        for bad in ["..", "a/../../b", "a/../b", "/etc/passwd", "a\0b", "../", "./.."] {
            assert!(matches!(RelPath::parse(bad), Err(WorkspaceError::InvalidPath { .. })), "{bad:?} was accepted");
        }
    }

    #[test]
    fn enforces_limits() {
        let deep = vec!["d"; MAX_PATH_DEPTH + 1].join("/");
        assert!(matches!(RelPath::parse(&deep), Err(WorkspaceError::LimitExceeded { limit: "path depth", .. })));
        let long = "x".repeat(MAX_PATH_BYTES + 1);
        assert!(matches!(RelPath::parse(&long), Err(WorkspaceError::LimitExceeded { limit: "path length", .. })));
        assert!(RelPath::parse(&"y".repeat(256)).is_err());
    }
}
