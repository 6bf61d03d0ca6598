//! One module per command group; each exposes its clap arguments and a `run` function
//! returning the exit code.

pub mod archive;
pub mod exec;
pub mod fs;
pub mod health;
pub mod mcp;
pub mod nodes;
pub mod server;
pub mod session;
pub mod skills;
pub mod snapshots;
pub mod status;
pub mod ws;

use std::collections::HashMap;

/// clap value parser for `KEY=VALUE` (`--env`, `--label`). The value may be empty and may
/// itself contain `=`; the key may not be empty.
pub fn parse_key_value(text: &str) -> Result<(String, String), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("expected KEY=VALUE, got {text:?}"));
    };
    if key.is_empty() {
        return Err(format!("empty key in {text:?}, expected KEY=VALUE"));
    }
    Ok((key.to_string(), value.to_string()))
}

/// Collects repeated `KEY=VALUE` flags into a map; a repeated key keeps its last value,
/// like repeated `-e` flags of `docker run`.
pub fn key_values_to_map(pairs: Vec<(String, String)>) -> HashMap<String, String> {
    pairs.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_value_splits_at_the_first_equals_sign() {
        assert_eq!(parse_key_value("A=1"), Ok(("A".into(), "1".into())));
        assert_eq!(parse_key_value("A="), Ok(("A".into(), String::new())));
        assert_eq!(parse_key_value("A=b=c"), Ok(("A".into(), "b=c".into())));
    }

    #[test]
    fn key_value_errors_say_what_was_expected() {
        let missing = parse_key_value("novalue").unwrap_err();
        assert!(missing.contains("expected KEY=VALUE"), "{missing}");
        assert!(missing.contains("novalue"), "{missing}");
        let empty_key = parse_key_value("=v").unwrap_err();
        assert!(empty_key.contains("empty key"), "{empty_key}");
    }

    #[test]
    fn repeated_keys_keep_the_last_value() {
        let map = key_values_to_map(vec![("A".into(), "1".into()), ("A".into(), "2".into())]);
        assert_eq!(map.get("A").map(String::as_str), Some("2"));
    }
}
