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
//!   of bollard, rmcp, kube, reqwest, k8s-openapi.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

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
const THIS_FILE: &str = "tests/tests/architecture.rs";

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

/// Blanks comments and string / char literals (keeping newlines, so line numbers hold).
fn strip_comments_and_literals(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |out: &mut String, char: char| out.push(if char == '\n' { '\n' } else { ' ' });
    let mut index = 0;
    while index < chars.len() {
        let char = chars[index];
        let next = chars.get(index + 1).copied();
        let previous_is_ident = index > 0 && (chars[index - 1].is_alphanumeric() || chars[index - 1] == '_');
        if char == '/' && next == Some('/') {
            while index < chars.len() && chars[index] != '\n' {
                index += 1;
            }
            continue;
        }
        if char == '/' && next == Some('*') {
            let mut depth = 0;
            while index < chars.len() {
                if chars[index] == '/' && chars.get(index + 1) == Some(&'*') {
                    depth += 1;
                    blank(&mut out, ' ');
                    blank(&mut out, ' ');
                    index += 2;
                } else if chars[index] == '*' && chars.get(index + 1) == Some(&'/') {
                    depth -= 1;
                    blank(&mut out, ' ');
                    blank(&mut out, ' ');
                    index += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    blank(&mut out, chars[index]);
                    index += 1;
                }
            }
            continue;
        }
        // Raw strings: r"…", r#"…"#, br"…", br#"…"#.
        if !previous_is_ident && (char == 'r' || (char == 'b' && next == Some('r'))) {
            let mut cursor = index + if char == 'b' { 2 } else { 1 };
            let mut hashes = 0;
            while chars.get(cursor) == Some(&'#') {
                hashes += 1;
                cursor += 1;
            }
            if chars.get(cursor) == Some(&'"') {
                cursor += 1;
                loop {
                    match chars.get(cursor) {
                        None => break,
                        Some('"') if (1..=hashes).all(|offset| chars.get(cursor + offset) == Some(&'#')) => {
                            cursor += 1 + hashes;
                            break;
                        }
                        Some(_) => cursor += 1,
                    }
                }
                for &skipped in &chars[index..cursor.min(chars.len())] {
                    blank(&mut out, skipped);
                }
                index = cursor;
                continue;
            }
        }
        if char == '"' {
            blank(&mut out, char);
            index += 1;
            while index < chars.len() {
                let inner = chars[index];
                if inner == '\\' {
                    blank(&mut out, inner);
                    if let Some(&escaped) = chars.get(index + 1) {
                        blank(&mut out, escaped);
                    }
                    index += 2;
                    continue;
                }
                blank(&mut out, inner);
                index += 1;
                if inner == '"' {
                    break;
                }
            }
            continue;
        }
        if char == '\'' {
            // A char literal ('x', '\n', '\u{1F600}', '\''), else a lifetime or label.
            let literal_end = if next == Some('\\') {
                (index + 2..chars.len().min(index + 12)).find(|&end| chars[end] == '\'' && end > index + 2)
            } else if chars.get(index + 2) == Some(&'\'') {
                Some(index + 2)
            } else {
                None
            };
            if let Some(end) = literal_end {
                for &skipped in &chars[index..=end] {
                    blank(&mut out, skipped);
                }
                index = end + 1;
                continue;
            }
        }
        out.push(char);
        index += 1;
    }
    out
}

/// Byte offset just past the item starting at `start`: through its matching `}` when a
/// `{` comes before any `;` at bracket depth 0, else through that `;`.
fn item_end(text: &[u8], start: usize) -> usize {
    let mut depth = 0i32;
    let mut index = start;
    while index < text.len() {
        match text[index] {
            b'(' | b'[' => depth += 1,
            b')' | b']' => depth -= 1,
            b';' if depth <= 0 => return index + 1,
            b'{' if depth <= 0 => {
                let mut braces = 0i32;
                while index < text.len() {
                    match text[index] {
                        b'{' => braces += 1,
                        b'}' => {
                            braces -= 1;
                            if braces == 0 {
                                return index + 1;
                            }
                        }
                        _ => {}
                    }
                    index += 1;
                }
                return text.len();
            }
            _ => {}
        }
        index += 1;
    }
    text.len()
}

/// Drops `#[cfg(test)]` items (blanked, newlines kept). Returns the remaining code and the
/// names of the modules declared as files by dropped items (`#[cfg(test)] mod tests;`).
fn strip_test_items(code: &str) -> (String, Vec<String>) {
    const ATTRIBUTE: &str = "#[cfg(test)]";
    let mut bytes = code.as_bytes().to_vec();
    let mut test_modules = Vec::new();
    let mut search_from = 0;
    while let Some(found) = code[search_from..].find(ATTRIBUTE) {
        let start = search_from + found;
        let end = item_end(code.as_bytes(), start + ATTRIBUTE.len());
        let item = &code[start + ATTRIBUTE.len()..end];
        if item.trim_end().ends_with(';')
            && let Some(name) = declared_module(item)
        {
            test_modules.push(name);
        }
        for byte in &mut bytes[start..end] {
            if *byte != b'\n' {
                *byte = b' ';
            }
        }
        search_from = end;
    }
    (String::from_utf8_lossy(&bytes).into_owned(), test_modules)
}

/// The name in a `[pub[(…)]] mod name;` item, attributes before it allowed.
fn declared_module(item: &str) -> Option<String> {
    let words: Vec<&str> =
        item.split(|char: char| char.is_whitespace() || char == ';').filter(|word| !word.is_empty()).collect();
    let position = words.iter().position(|word| *word == "mod")?;
    let name = words.get(position + 1)?;
    let valid = !name.is_empty() && name.chars().all(|char| char.is_alphanumeric() || char == '_');
    valid.then(|| name.to_string())
}

fn is_ident_char(char: char) -> bool {
    char.is_alphanumeric() || char == '_'
}

/// A small cursor over blanked source for reading paths.
struct PathReader<'a> {
    chars: &'a [char],
    index: usize,
}

impl PathReader<'_> {
    fn skip_space(&mut self) {
        while self.chars.get(self.index).is_some_and(|char| char.is_whitespace()) {
            self.index += 1;
        }
    }

    fn eat(&mut self, text: &str) -> bool {
        self.skip_space();
        let wanted: Vec<char> = text.chars().collect();
        if self.chars[self.index.min(self.chars.len())..].starts_with(&wanted) {
            self.index += wanted.len();
            true
        } else {
            false
        }
    }

    fn ident(&mut self) -> Option<String> {
        self.skip_space();
        let start = self.index;
        if self.chars.get(self.index) == Some(&'r') && self.chars.get(self.index + 1) == Some(&'#') {
            self.index += 2;
        }
        while self.chars.get(self.index).is_some_and(|char| is_ident_char(*char)) {
            self.index += 1;
        }
        let ident: String = self.chars[start..self.index].iter().collect();
        let ident = ident.trim_start_matches("r#").to_owned();
        if ident.is_empty() || ident.starts_with(|char: char| char.is_ascii_digit()) {
            self.index = start;
            None
        } else {
            Some(ident)
        }
    }

    /// Consumes an `as name` rename, if one follows.
    fn skip_rename(&mut self) {
        let saved = self.index;
        if self.ident().as_deref() == Some("as") && self.ident().is_some() {
            return;
        }
        self.index = saved;
    }

    /// Reads the rest of a path after its `prefix::`, pushing every full path (brace groups
    /// expanded) onto `paths`.
    fn rest(&mut self, prefix: Vec<String>, paths: &mut Vec<Vec<String>>) {
        if self.eat("{") {
            loop {
                self.skip_space();
                if self.eat("}") || self.index >= self.chars.len() {
                    return;
                }
                if self.eat(",") {
                    continue;
                }
                if self.eat("*") {
                    paths.push(prefix.clone());
                    continue;
                }
                match self.ident() {
                    Some(segment) if segment == "self" => paths.push(prefix.clone()),
                    Some(segment) => {
                        let mut path = prefix.clone();
                        path.push(segment);
                        if self.eat("::") {
                            self.rest(path, paths);
                        } else {
                            paths.push(path);
                            self.skip_rename();
                        }
                    }
                    // Something that is not a path: skip one char to make progress.
                    None => self.index += 1,
                }
            }
        }
        if self.eat("*") {
            paths.push(prefix);
            return;
        }
        match self.ident() {
            Some(segment) => {
                let mut path = prefix;
                path.push(segment);
                if self.eat("::") {
                    self.rest(path, paths);
                } else {
                    paths.push(path);
                }
            }
            None => paths.push(prefix),
        }
    }
}

/// One reference from a module file: the absolute module path it names and its line.
struct Reference {
    path: Vec<String>,
    line: usize,
    text: String,
}

/// Every `crate::` / `$crate::` / `super::` / `self::` path in `code`, made absolute for a
/// file whose module path is `module`.
fn module_references(code: &str, module: &[String], children: &BTreeSet<String>) -> Vec<Reference> {
    let chars: Vec<char> = code.chars().collect();
    let mut references = Vec::new();
    let mut line = 1;
    let mut index = 0;
    while index < chars.len() {
        if chars[index] == '\n' {
            line += 1;
            index += 1;
            continue;
        }
        let at_boundary = index == 0 || !(is_ident_char(chars[index - 1]) || matches!(chars[index - 1], ':' | '.'));
        if !at_boundary || !is_ident_char(chars[index]) {
            index += 1;
            continue;
        }
        let word_end = (index..chars.len()).find(|&end| !is_ident_char(chars[end])).unwrap_or(chars.len());
        let word: String = chars[index..word_end].iter().collect();
        let mut base: Vec<String> = match word.as_str() {
            "crate" => Vec::new(),
            "self" => module.to_vec(),
            "super" => module[..module.len().saturating_sub(1)].to_vec(),
            // `child::X` names the child module `child` of this file (2018 paths).
            child if children.contains(child) => {
                let mut base = module.to_vec();
                base.push(child.to_owned());
                base
            }
            _ => {
                index = word_end;
                continue;
            }
        };
        // `pub(in crate::a)` is a visibility, not a use.
        let before: String = chars[index.saturating_sub(8)..index].iter().collect();
        let is_visibility = before.trim_end().strip_suffix("in").is_some_and(|rest| rest.trim_end().ends_with('('));
        let mut reader = PathReader { chars: &chars, index: word_end };
        if !reader.eat("::") || is_visibility {
            index = word_end;
            continue;
        }
        if word == "super" {
            loop {
                let saved = reader.index;
                if reader.ident().as_deref() == Some("super") && reader.eat("::") {
                    base.pop();
                } else {
                    reader.index = saved;
                    break;
                }
            }
        }
        let mut paths = Vec::new();
        reader.rest(base, &mut paths);
        let end = reader.index.min(chars.len());
        let text: String =
            chars[index..end].iter().collect::<String>().split_whitespace().collect::<Vec<_>>().join(" ");
        for path in paths {
            references.push(Reference { path, line, text: text.clone() });
        }
        // Count the lines the path spanned, then go on after it.
        line += chars[index..end].iter().filter(|char| **char == '\n').count();
        index = end.max(word_end);
    }
    references
}

/// A crate's module files: module path -> file (relative to the repository root).
fn module_files(crate_dir: &str, files: &[String]) -> BTreeMap<Vec<String>, String> {
    let source_prefix = if crate_dir.is_empty() { "src/".to_owned() } else { format!("{crate_dir}/src/") };
    let mut modules = BTreeMap::new();
    let mut binary_root = None;
    for path in files {
        let Some(relative) = path.strip_prefix(&source_prefix) else { continue };
        let Some(without_extension) = relative.strip_suffix(".rs") else { continue };
        if relative.starts_with("bin/") {
            continue;
        }
        let mut segments: Vec<String> = without_extension.split('/').map(str::to_owned).collect();
        match segments.last().map(String::as_str) {
            Some("mod") => {
                segments.pop();
            }
            Some("lib") if segments.len() == 1 => segments.clear(),
            Some("main") if segments.len() == 1 => {
                binary_root = Some(path.clone());
                continue;
            }
            _ => {}
        }
        modules.insert(segments, path.clone());
    }
    // A binary crate's root; next to a lib.rs it is a separate crate root, kept under a
    // path no reference can resolve to.
    if let Some(main) = binary_root {
        let key = if modules.contains_key(&Vec::new()) { vec!["<main.rs>".to_owned()] } else { Vec::new() };
        modules.insert(key, main);
    }
    modules
}

/// The file of the deepest existing module on `path`.
fn resolve<'m>(modules: &'m BTreeMap<Vec<String>, String>, path: &[String]) -> Option<&'m String> {
    (0..=path.len()).rev().find_map(|length| modules.get(&path[..length]))
}

/// Strongly connected components (Tarjan, iterative) of a graph over `0..count`.
fn strongly_connected(count: usize, edges: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<Vec<usize>> {
    let mut index_of = vec![usize::MAX; count];
    let mut low = vec![0; count];
    let mut on_stack = vec![false; count];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next_index = 0;
    let empty = BTreeSet::new();
    for start in 0..count {
        if index_of[start] != usize::MAX {
            continue;
        }
        // (node, its successors, position in them)
        let mut work: Vec<(usize, Vec<usize>, usize)> = Vec::new();
        index_of[start] = next_index;
        low[start] = next_index;
        next_index += 1;
        stack.push(start);
        on_stack[start] = true;
        work.push((start, edges.get(&start).unwrap_or(&empty).iter().copied().collect(), 0));
        while let Some((node, successors, position)) = work.last_mut() {
            let node = *node;
            if *position < successors.len() {
                let next = successors[*position];
                *position += 1;
                if index_of[next] == usize::MAX {
                    index_of[next] = next_index;
                    low[next] = next_index;
                    next_index += 1;
                    stack.push(next);
                    on_stack[next] = true;
                    work.push((next, edges.get(&next).unwrap_or(&empty).iter().copied().collect(), 0));
                } else if on_stack[next] {
                    low[node] = low[node].min(index_of[next]);
                }
                continue;
            }
            work.pop();
            if let Some((parent, _, _)) = work.last() {
                low[*parent] = low[*parent].min(low[node]);
            }
            if low[node] == index_of[node] {
                let mut component = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    component.push(member);
                    if member == node {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

/// Directories (relative to the root; "" for the root) holding a crate with a `src/`.
fn crate_dirs(root: &Path, files: &[String]) -> Vec<String> {
    files
        .iter()
        .filter(|path| file_name(path) == "Cargo.toml")
        .map(|path| path.strip_suffix("Cargo.toml").unwrap_or_default().trim_end_matches('/').to_owned())
        .filter(|dir| root.join(dir).join("src").is_dir())
        .collect()
}

/// The cycles of one crate, formatted for the failure message.
fn crate_cycles(root: &Path, crate_dir: &str, files: &[String]) -> Vec<String> {
    let modules = module_files(crate_dir, files);
    // Read and strip every file; collect test-only module paths.
    let mut code_of: BTreeMap<Vec<String>, String> = BTreeMap::new();
    let mut test_only: Vec<Vec<String>> = Vec::new();
    for (module, path) in &modules {
        let Some(source) = read_text(&root.join(path)) else { continue };
        let (code, test_modules) = strip_test_items(&strip_comments_and_literals(&source));
        for name in test_modules {
            let mut child = module.clone();
            child.push(name);
            test_only.push(child);
        }
        code_of.insert(module.clone(), code);
    }
    let is_test_only = |module: &[String]| test_only.iter().any(|prefix| module.starts_with(prefix));
    let modules: BTreeMap<Vec<String>, String> =
        modules.into_iter().filter(|(module, _)| !is_test_only(module)).collect();
    let files_by_index: Vec<&String> = modules.values().collect();
    let index_of: BTreeMap<&String, usize> =
        files_by_index.iter().enumerate().map(|(index, file)| (*file, index)).collect();
    let mut edges: BTreeMap<usize, BTreeSet<usize>> = BTreeMap::new();
    // First source line of each edge, for the report.
    let mut evidence: BTreeMap<(usize, usize), String> = BTreeMap::new();
    for (module, path) in &modules {
        let Some(code) = code_of.get(module) else { continue };
        let from = index_of[path];
        let children: BTreeSet<String> = modules
            .keys()
            .filter(|other| other.len() == module.len() + 1 && other.starts_with(module))
            .filter_map(|other| other.last().cloned())
            .collect();
        for reference in module_references(code, module, &children) {
            let Some(target) = resolve(&modules, &reference.path) else { continue };
            let to = index_of[target];
            if to == from {
                continue;
            }
            edges.entry(from).or_default().insert(to);
            evidence.entry((from, to)).or_insert_with(|| format!("{path}:{}: {}", reference.line, reference.text));
        }
    }
    let mut cycles = Vec::new();
    for mut component in strongly_connected(files_by_index.len(), &edges) {
        if component.len() < 2 {
            continue;
        }
        component.sort_unstable();
        let members: BTreeSet<usize> = component.iter().copied().collect();
        let names: Vec<&str> = component.iter().map(|index| files_by_index[*index].as_str()).collect();
        let mut report = format!("cycle of {} files: {}", component.len(), names.join(", "));
        for ((from, to), line) in &evidence {
            if members.contains(from) && members.contains(to) {
                report.push_str(&format!("\n    {} -> {}  ({line})", files_by_index[*from], files_by_index[*to]));
            }
        }
        cycles.push(report);
    }
    cycles
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
        .args(["tree", "-p", "berth-proto", "-e", "normal", "--prefix", "none", "--offline"])
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
