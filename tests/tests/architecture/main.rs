//! Architecture checks of the whole repository: the acceptance checks of the layout
//! described in `docs/design.md` §1. Std only; each test walks the repository from
//! `CARGO_MANIFEST_DIR/..` over the files git knows about (`git ls-files --cached --others
//! --exclude-standard`: tracked plus untracked-not-ignored; listed files missing from the
//! work tree are skipped).
//!
//! - [`no_reference_outside_the_repository`]: no text file names a document or path outside
//!   the repository: `../shared`, `shared/DESIGN.md`, `shared/DEPENDENCIES.md`,
//!   `shared/STYLE.md`, `shared/CLOUD.md`, `/work/`, nor the bare names `DESIGN.md`,
//!   `DEPENDENCIES.md`, `STYLE.md`, `CLOUD.md` unless a file of that name is in the
//!   repository (the design is `docs/design.md`, the library notes `docs/dependencies.md`).
//!   Binary files (a NUL byte in the first 8 KiB) and this file are skipped. Exceptions go
//!   in [`ALLOWED_OUTSIDE_REFERENCES`], which starts empty.
//! - [`no_source_file_over_800_lines`]: every non-test `.rs` file has at most 800 lines. Test
//!   files are those under a `tests/` or `benches/` directory and everything in the `tests/`
//!   and `testkit/` crates and in `fuzz/`.
//! - [`no_module_import_cycle`]: per crate (a directory with a `Cargo.toml` and a `src/`),
//!   the graph of module files has no cycle. Parser rules, deliberately simple:
//!   - A module file's path is its place under `src/`: `lib.rs` / `main.rs` is the root,
//!     `a.rs` and `a/mod.rs` are `a`, `a/b.rs` is `a::b`. (`#[path]` is not supported; a
//!     `main.rs` next to a `lib.rs` is a separate crate root that nothing can name.)
//!   - Comments (line, block, doc), string, raw-string, byte-string and char literals are
//!     blanked before anything else (line numbers are kept).
//!   - Test code is dropped: from each `#[cfg(test)]` attribute through the end of the item
//!     that follows (its matching closing brace, or its `;`). A file declared by such an
//!     item (`#[cfg(test)] mod tests;`) is test-only and left out with its children.
//!   - An edge A -> B for every path in A's remaining code that starts with `crate::` (or
//!     `$crate::`), `super::` (repeatable) or `self::` and resolves to module file B: the
//!     path's segments are looked up from the longest prefix down, so a path naming an item
//!     resolves to the file of the deepest existing module on it (a re-export from the root
//!     resolves to the root). Brace groups (`crate::{a::X, b::{c, d}}`), `as` renames and
//!     globs are handled; `pub(in crate::…)` visibilities are ignored; a path after `::` or
//!     `.` never starts one.
//!   - `mod child;` declarations are not edges (a parent always declares its children), nor
//!     is a file's reference to itself. A path through a child module is an edge, whether
//!     it is written `self::child::X` or `child::X`.
//!   - Every strongly connected component with more than one file is reported, with one
//!     source line per edge inside it.
//! - [`proto_depends_on_no_backend_sdk`]: `cargo tree -p berth-proto -e normal` names none
//!   of bollard, rmcp, kube, reqwest, k8s-openapi (with `berth-workspace-hack`, the cargo
//!   hakari crate that lists every third-party crate for one feature set, pruned).

mod module_graph;
mod rust_source;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use module_graph::crate_cycles;
use rust_source::{module_references, strip_comments_and_literals, strip_test_items};

/// `(file, pattern)` pairs allowed to name something outside the repository. Keep it empty:
/// a doc that points outside the repository is a doc a newcomer cannot follow.
const ALLOWED_OUTSIDE_REFERENCES: &[(&str, &str)] = &[];

/// Strings that name a place outside the repository, wherever they appear.
const OUTSIDE_PATTERNS: &[&str] =
    &["../shared", "shared/DESIGN.md", "shared/DEPENDENCIES.md", "shared/STYLE.md", "shared/CLOUD.md", "/work/"];

/// Documents that only exist outside the repository, named without a path; flagged unless a
/// file of that name exists in the repository.
const OUTSIDE_DOCUMENTS: &[&str] = &["DESIGN.md", "DEPENDENCIES.md", "STYLE.md", "CLOUD.md"];

/// Longest non-test source file, in lines.
const MAX_SOURCE_LINES: usize = 800;

/// Crates that must never appear among `berth-proto`'s normal dependencies.
const BACKEND_SDKS: &[&str] = &["bollard", "rmcp", "kube", "reqwest", "k8s-openapi"];

/// This file, relative to the repository root (it spells the patterns out).
const THIS_FILE: &str = "tests/tests/architecture/main.rs";

fn repo_root() -> PathBuf {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf()
}

/// Files git knows about (tracked, and untracked but not ignored), relative to the root,
/// sorted, existing in the work tree.
fn repo_files(root: &Path) -> Vec<String> {
    let output = Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard", "-z"])
        .current_dir(root)
        .output()
        .unwrap_or_else(|error| panic!("running git ls-files in {}: {error}", root.display()));
    assert!(
        output.status.success(),
        "git ls-files failed in {}: {}",
        root.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    let mut files: BTreeSet<String> = BTreeSet::new();
    for name in output.stdout.split(|byte| *byte == 0) {
        if name.is_empty() {
            continue;
        }
        let name = String::from_utf8_lossy(name).into_owned();
        if root.join(&name).is_file() {
            files.insert(name);
        }
    }
    files.into_iter().collect()
}

/// The file's text, or `None` for a binary file (a NUL byte in its first 8 KiB).
fn read_text(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    if bytes.iter().take(8192).any(|byte| *byte == 0) {
        return None;
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

// ---- a. references outside the repository ---------------------------------------------------

#[test]
fn no_reference_outside_the_repository() {
    let root = repo_root();
    let files = repo_files(&root);
    let names_in_repo: BTreeSet<&str> = files.iter().map(|path| file_name(path)).collect();
    let missing_documents: Vec<&str> =
        OUTSIDE_DOCUMENTS.iter().copied().filter(|document| !names_in_repo.contains(document)).collect();
    let mut offences = Vec::new();
    for path in &files {
        if path == THIS_FILE {
            continue;
        }
        let Some(text) = read_text(&root.join(path)) else { continue };
        for (index, line) in text.lines().enumerate() {
            let mut found: Vec<&str> =
                OUTSIDE_PATTERNS.iter().copied().filter(|pattern| line.contains(pattern)).collect();
            found.extend(missing_documents.iter().copied().filter(|document| names_bare_document(line, document)));
            found.retain(|pattern| !ALLOWED_OUTSIDE_REFERENCES.contains(&(path.as_str(), *pattern)));
            if !found.is_empty() {
                offences.push(format!("{path}:{}: [{}] {}", index + 1, found.join(", "), line.trim()));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "{} line(s) refer to documents or paths outside the repository (point them at docs/design.md or \
         docs/dependencies.md, or at a path inside the repository):\n{}",
        offences.len(),
        offences.join("\n")
    );
}

/// Whether `line` names `document` as a whole file name: not as the tail of a longer name
/// (`MY_DESIGN.md`) and not as the file of a path (`docs/DESIGN.md` would name a repository
/// path, which then has to exist; the repository's own names are lowercase).
fn names_bare_document(line: &str, document: &str) -> bool {
    line.match_indices(document).any(|(start, _)| {
        let before = line[..start].chars().next_back();
        let after = line[start + document.len()..].chars().next();
        let joined_before = before.is_some_and(|char| char.is_alphanumeric() || char == '_' || char == '/');
        let joined_after = after.is_some_and(|char| char.is_alphanumeric() || char == '_');
        !joined_before && !joined_after
    })
}

// ---- b. file size -----------------------------------------------------------------------------

/// Whether a `.rs` file is test code: under a `tests/` or `benches/` directory, or in the
/// `tests/` crate, the `testkit/` crate or `fuzz/`.
fn is_test_source(path: &str) -> bool {
    let components: Vec<&str> = path.split('/').collect();
    let directories = &components[..components.len().saturating_sub(1)];
    matches!(components.first(), Some(&"testkit") | Some(&"fuzz") | Some(&"tests"))
        || directories.iter().any(|directory| *directory == "tests" || *directory == "benches")
}

#[test]
fn no_source_file_over_800_lines() {
    let root = repo_root();
    let mut too_long = Vec::new();
    for path in repo_files(&root) {
        if !path.ends_with(".rs") || is_test_source(&path) {
            continue;
        }
        let Some(text) = read_text(&root.join(&path)) else { continue };
        let lines = text.lines().count();
        if lines > MAX_SOURCE_LINES {
            too_long.push((lines, path));
        }
    }
    too_long.sort_by(|left, right| right.cmp(left));
    let listed: Vec<String> = too_long.iter().map(|(lines, path)| format!("{path}: {lines} lines")).collect();
    assert!(
        too_long.is_empty(),
        "{} non-test source file(s) over {MAX_SOURCE_LINES} lines (split them along their seams):\n{}",
        too_long.len(),
        listed.join("\n")
    );
}

// ---- c. module import cycles ------------------------------------------------------------------

/// Directories (relative to the root; "" for the root) holding a crate with a `src/`.
fn crate_dirs(root: &Path, files: &[String]) -> Vec<String> {
    files
        .iter()
        .filter(|path| file_name(path) == "Cargo.toml")
        .map(|path| path.strip_suffix("Cargo.toml").unwrap_or_default().trim_end_matches('/').to_owned())
        .filter(|dir| root.join(dir).join("src").is_dir())
        .collect()
}

#[test]
fn no_module_import_cycle() {
    let root = repo_root();
    let files = repo_files(&root);
    let mut cycles = Vec::new();
    for crate_dir in crate_dirs(&root, &files) {
        cycles.extend(crate_cycles(&root, &crate_dir, &files));
    }
    assert!(
        cycles.is_empty(),
        "{} module import cycle(s) (break each by moving the shared piece down or inverting one edge):\n{}",
        cycles.len(),
        cycles.join("\n")
    );
}

// ---- d. the API boundary's dependencies -------------------------------------------------------

#[test]
fn proto_depends_on_no_backend_sdk() {
    let root = repo_root();
    let cargo = std::env::var("CARGO").ok().or_else(|| option_env!("CARGO").map(str::to_owned));
    let cargo = cargo.unwrap_or_else(|| "cargo".to_owned());
    let output = Command::new(&cargo)
        // The feature-unification crate (cargo hakari) lists every third-party crate of the
        // workspace, SDKs included; code cannot name a crate through it, so it is pruned and
        // the check sees what berth-proto and its own dependencies really pull in.
        .args([
            "tree",
            "-p",
            "berth-proto",
            "-e",
            "normal",
            "--prefix",
            "none",
            "--offline",
            "--prune",
            "berth-workspace-hack",
        ])
        .current_dir(&root)
        .output()
        .unwrap_or_else(|error| panic!("running {cargo} tree: {error}"));
    assert!(output.status.success(), "{cargo} tree failed:\n{}", String::from_utf8_lossy(&output.stderr));
    let tree = String::from_utf8_lossy(&output.stdout);
    let mut found: Vec<&str> =
        tree.lines().filter(|line| BACKEND_SDKS.iter().any(|sdk| line.starts_with(&format!("{sdk} ")))).collect();
    found.sort_unstable();
    found.dedup();
    assert!(
        found.is_empty(),
        "berth-proto (the API boundary) depends on backend SDKs; they belong to the backend crates:\n{}",
        found.join("\n")
    );
}

// ---- the checks' own parsers ------------------------------------------------------------------

#[test]
fn parser_self_check() {
    let source = r####"
//! crate::docs::not_an_edge
use crate::a::B; // crate::comment::not_an_edge
use super::{c, d::{E as Renamed, f}};
use self::child::G;
pub mod child;
pub use child::AlsoAnEdge;
use other_crate::child::NotAnEdge;
const S: &str = "crate::string::not_an_edge";
const R: &str = r#"crate::raw::not_an_edge"#;
const C: char = '{';
pub(in crate::vis) fn visible() {}
fn uses<'a>(x: &'a u8) { crate::h::call(); super::super::top::I; }
#[cfg(test)]
mod tests {
    use crate::test_only::J;
}
#[cfg(test)]
mod more_tests;
"####;
    let (code, test_modules) = strip_test_items(&strip_comments_and_literals(source));
    assert_eq!(test_modules, vec!["more_tests".to_owned()]);
    let module = vec!["x".to_owned(), "y".to_owned()];
    let found: Vec<String> = module_references(&code, &module, &BTreeSet::from(["child".to_owned()]))
        .iter()
        .map(|reference| reference.path.join("::"))
        .collect();
    assert_eq!(
        found,
        ["a::B", "x::c", "x::d::E", "x::d::f", "x::y::child::G", "x::y::child::AlsoAnEdge", "h::call", "top::I"]
    );
    assert!(names_bare_document("see DESIGN.md §4", "DESIGN.md"));
    assert!(!names_bare_document("see docs/DESIGN.md", "DESIGN.md"));
    assert!(!names_bare_document("MY_DESIGN.md", "DESIGN.md"));
}
