//! Reading Rust source just well enough for the cycle check: comments and literals
//! blanked, `#[cfg(test)]` items dropped, and the `crate::` / `super::` / `self::` /
//! child-module paths of what is left (rules in the doc comment of `main.rs`).

use std::collections::BTreeSet;

/// Blanks comments and string / char literals (keeping newlines, so line numbers hold).
pub fn strip_comments_and_literals(source: &str) -> String {
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
pub fn item_end(text: &[u8], start: usize) -> usize {
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
pub fn strip_test_items(code: &str) -> (String, Vec<String>) {
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
pub fn declared_module(item: &str) -> Option<String> {
    let words: Vec<&str> =
        item.split(|char: char| char.is_whitespace() || char == ';').filter(|word| !word.is_empty()).collect();
    let position = words.iter().position(|word| *word == "mod")?;
    let name = words.get(position + 1)?;
    let valid = !name.is_empty() && name.chars().all(|char| char.is_alphanumeric() || char == '_');
    valid.then(|| name.to_string())
}

pub fn is_ident_char(char: char) -> bool {
    char.is_alphanumeric() || char == '_'
}

/// A small cursor over blanked source for reading paths.
pub struct PathReader<'a> {
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
pub struct Reference {
    pub path: Vec<String>,
    pub line: usize,
    pub text: String,
}

/// Every `crate::` / `$crate::` / `super::` / `self::` path in `code`, made absolute for a
/// file whose module path is `module`.
pub fn module_references(code: &str, module: &[String], children: &BTreeSet<String>) -> Vec<Reference> {
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
