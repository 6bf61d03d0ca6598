//! The YAML-ish front matter of a `SKILL.md`:
//!
//! ```text
//! ---
//! name: pdf-tools
//! description: Fill and merge PDF forms
//! ---
//! (body)
//! ```
//!
//! Only `key: value` lines are read (values may be quoted); anything else in the block is
//! ignored. A file without a front matter block is all body.

/// The fields Berth uses, and the body after the block.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FrontMatter {
    pub name: Option<String>,
    pub description: Option<String>,
}

/// Splits `text` into its front matter and its body.
pub fn parse(text: &str) -> (FrontMatter, &str) {
    let mut front = FrontMatter::default();
    let Some(rest) = text.strip_prefix("---\n").or_else(|| text.strip_prefix("---\r\n")) else {
        return (front, text);
    };
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        offset += line.len();
        let trimmed = line.trim_end_matches(['\n', '\r']);
        if trimmed.trim_end() == "---" {
            return (front, &rest[offset..]);
        }
        let Some((key, value)) = trimmed.split_once(':') else { continue };
        let value = unquote(value.trim()).to_owned();
        match key.trim() {
            "name" => front.name = Some(value),
            "description" => front.description = Some(value),
            _ => {}
        }
    }
    // No closing line: not a front matter block after all.
    (FrontMatter::default(), text)
}

fn unquote(value: &str) -> &str {
    for quote in ['"', '\''] {
        if value.len() >= 2 && value.starts_with(quote) && value.ends_with(quote) {
            return &value[1..value.len() - 1];
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_front_matter() {
        let (front, body) = parse("---\nname: pdf\ndescription: \"Fill: forms\"\nother: x\n---\n# Body\n");
        assert_eq!(front.name.as_deref(), Some("pdf"));
        assert_eq!(front.description.as_deref(), Some("Fill: forms"));
        assert_eq!(body, "# Body\n");
        let (front, body) = parse("# no front matter\n");
        assert_eq!(front, FrontMatter::default());
        assert_eq!(body, "# no front matter\n");
        let (front, body) = parse("---\nname: x\nnever closed\n");
        assert_eq!(front, FrontMatter::default());
        assert_eq!(body, "---\nname: x\nnever closed\n");
        let (front, _) = parse("---\r\nname: crlf\r\n---\r\nbody");
        assert_eq!(front.name.as_deref(), Some("crlf"));
    }
}
