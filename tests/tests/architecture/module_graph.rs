//! The module graph of one crate and its cycles: module files by path, edges from the
//! references `rust_source` finds, strongly connected components (Tarjan).

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::read_text;
use super::rust_source::{module_references, strip_comments_and_literals, strip_test_items};

/// A crate's module files: module path -> file (relative to the repository root).
pub fn module_files(crate_dir: &str, files: &[String]) -> BTreeMap<Vec<String>, String> {
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
pub fn resolve<'m>(modules: &'m BTreeMap<Vec<String>, String>, path: &[String]) -> Option<&'m String> {
    (0..=path.len()).rev().find_map(|length| modules.get(&path[..length]))
}

/// Strongly connected components (Tarjan, iterative) of a graph over `0..count`.
pub fn strongly_connected(count: usize, edges: &BTreeMap<usize, BTreeSet<usize>>) -> Vec<Vec<usize>> {
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

/// The cycles of one crate, formatted for the failure message.
pub fn crate_cycles(root: &Path, crate_dir: &str, files: &[String]) -> Vec<String> {
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
