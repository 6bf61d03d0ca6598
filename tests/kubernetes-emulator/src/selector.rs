//! Label selectors as the API server parses them (`labelSelector=`): `k=v`, `k==v`, `k!=v`,
//! `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, joined by commas; and the one field selector
//! kubectl sends (`metadata.name=X`).

use std::collections::BTreeMap;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

/// Splits on commas outside parentheses.
fn terms(text: &str) -> Vec<String> {
    let (mut out, mut current, mut depth) = (Vec::new(), String::new(), 0usize);
    for character in text.chars() {
        match character {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(std::mem::take(&mut current));
                continue;
            }
            _ => {}
        }
        current.push(character);
    }
    out.push(current);
    out.into_iter().map(|term| term.trim().to_owned()).filter(|term| !term.is_empty()).collect()
}

fn set(text: &str) -> Result<Vec<String>, String> {
    let inner = text
        .trim()
        .strip_prefix('(')
        .and_then(|rest| rest.strip_suffix(')'))
        .ok_or_else(|| format!("bad set {text:?}"))?;
    Ok(inner.split(',').map(|value| value.trim().to_owned()).filter(|value| !value.is_empty()).collect())
}

impl Selector {
    pub fn parse(text: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for term in terms(text) {
            let requirement = if let Some((key, values)) = term.split_once(" notin ") {
                Requirement::NotIn(key.trim().to_owned(), set(values)?)
            } else if let Some((key, values)) = term.split_once(" in ") {
                Requirement::In(key.trim().to_owned(), set(values)?)
            } else if let Some((key, value)) = term.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = term.split_once("==") {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = term.split_once('=') {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some(key) = term.strip_prefix('!') {
                Requirement::Absent(key.trim().to_owned())
            } else {
                Requirement::Exists(term.clone())
            };
            let key = match &requirement {
                Requirement::Equals(key, _)
                | Requirement::NotEquals(key, _)
                | Requirement::Exists(key)
                | Requirement::Absent(key)
                | Requirement::In(key, _)
                | Requirement::NotIn(key, _) => key,
            };
            if key.is_empty() || key.contains(char::is_whitespace) {
                return Err(format!("unable to parse requirement {term:?}"));
            }
            requirements.push(requirement);
        }
        Ok(Self(requirements))
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(key, value) => labels.get(key) == Some(value),
            Requirement::NotEquals(key, value) => labels.get(key) != Some(value),
            Requirement::Exists(key) => labels.contains_key(key),
            Requirement::Absent(key) => !labels.contains_key(key),
            Requirement::In(key, values) => labels.get(key).is_some_and(|value| values.contains(value)),
            Requirement::NotIn(key, values) => labels.get(key).is_none_or(|value| !values.contains(value)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selectors_match_like_the_api_server() {
        let labels = BTreeMap::from([("a".to_owned(), "1".to_owned()), ("b".to_owned(), "x".to_owned())]);
        for (text, expected) in [
            ("", true),
            ("a=1", true),
            ("a==1,b=x", true),
            ("a!=1", false),
            ("c!=1", true),
            ("a", true),
            ("!a", false),
            ("!c", true),
            ("b in (x, y)", true),
            ("b notin (x)", false),
            ("c notin (x)", true),
            ("a=2", false),
        ] {
            assert_eq!(Selector::parse(text).unwrap().matches(&labels), expected, "{text}");
        }
        assert!(Selector::parse("a b").is_err());
    }
}
