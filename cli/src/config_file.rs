//! `--config FILE`: settings of a server command from a TOML file.
//!
//! Every top-level key is the long name of one of the command's flags (`listen`,
//! `idle-ttl`, `etcd`, `backend`), so the file cannot drift from the flags: there is no
//! second list of settings. A value from the file is handed to clap as if it had been
//! typed on the command line, but only for a flag that neither the command line nor its
//! `BERTH_*` variable set. That gives flag > env > file > built-in default, and it keeps
//! every check in clap's hands: value parsers, `required`, `requires` and `conflicts_with`
//! (a file naming a TLS certificate but no key fails exactly like the flags would).
//!
//! Values are checked here first with the flag's own value parser, so a bad one names its
//! key and the file instead of a flag the operator never typed. Unknown keys are errors.
//! Values are never printed except in the message about a value that failed to parse.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use clap::parser::ValueSource;
use clap::{Arg, ArgAction, Command, Parser};

/// Id of the `--config` flag (see `commands::server::ConfigFlag`); never a key itself.
pub const CONFIG_ARG_ID: &str = "config";

/// A settings file that cannot be used. Every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFileError {
    #[error("reading config file {}: {source}", path.display())]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {}: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("config file {}: unknown key `{key}` for `berth {command}`{}", path.display(), hint(suggestions))]
    UnknownKey { path: PathBuf, key: String, command: String, suggestions: Vec<String> },
    #[error("config file {}: key `{key}` takes {expected}, found {found}", path.display())]
    WrongType { path: PathBuf, key: String, expected: &'static str, found: &'static str },
    #[error("config file {}: key `{key}`: {message}", path.display())]
    InvalidValue { path: PathBuf, key: String, message: String },
}

fn hint(suggestions: &[String]) -> String {
    match suggestions {
        [] => " (keys are the long flags of its --help, without the dashes)".to_owned(),
        [one] => format!("; did you mean `{one}`?"),
        many => {
            let quoted: Vec<String> = many.iter().map(|key| format!("`{key}`")).collect();
            format!("; did you mean one of {}?", quoted.join(", "))
        }
    }
}

/// Why [`parse_from`] refused a command line.
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// A usage error, `--help` or `--version`: clap prints it and picks the exit code.
    #[error(transparent)]
    Usage(#[from] clap::Error),
    #[error(transparent)]
    ConfigFile(#[from] ConfigFileError),
}

/// `P::try_parse_from(args)`, plus the settings of the chosen subcommand's `--config` file
/// (or its environment variable). Without a config file this is exactly
/// `P::try_parse_from`.
pub fn parse_from<P: Parser>(args: impl IntoIterator<Item = impl Into<OsString>>) -> Result<P, ParseError> {
    let mut args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    // A first, forgiving parse finds the subcommand, its config file and which flags the
    // command line and environment set. Anything wrong with the command line itself is
    // reported by the real parse below.
    let peek = P::command().ignore_errors(true).try_get_matches_from(args.iter());
    let Ok(peek) = peek else { return Ok(P::try_parse_from(args)?) };
    let Some((name, given)) = peek.subcommand() else { return Ok(P::try_parse_from(args)?) };
    let Ok(Some(path)) = given.try_get_one::<PathBuf>(CONFIG_ARG_ID) else { return Ok(P::try_parse_from(args)?) };
    let root = P::command();
    let Some(command) = root.find_subcommand(name) else { return Ok(P::try_parse_from(args)?) };
    let file = ConfigFile::load(path)?;
    let set_elsewhere = |arg: &Arg| {
        matches!(given.value_source(arg.get_id().as_str()), Some(ValueSource::CommandLine | ValueSource::EnvVariable))
    };
    // The subcommand takes no positional arguments, so its flags can follow the user's.
    args.extend(file.arguments(command, set_elsewhere)?);
    P::try_parse_from(args).map_err(|mut error| {
        use clap::error::{ContextKind, ContextValue, ErrorKind};
        if matches!(error.kind(), ErrorKind::ArgumentConflict | ErrorKind::MissingRequiredArgument) {
            let tip = format!("settings from {} count as the flags of the same name", file.path.display());
            error.insert(ContextKind::Suggested, ContextValue::StyledStrs(vec![tip.into()]));
        }
        ParseError::Usage(error)
    })
}

/// The flags of `command` a config file may set: every flag with a long name except
/// `--config`, `--help` and `--version`.
pub fn settable_flags(command: &Command) -> impl Iterator<Item = &Arg> {
    command.get_arguments().filter(|arg| {
        arg.get_long().is_some()
            && arg.get_id() != CONFIG_ARG_ID
            && !matches!(arg.get_action(), ArgAction::Help | ArgAction::HelpShort | ArgAction::HelpLong)
            && !matches!(arg.get_action(), ArgAction::Version)
    })
}

/// A parsed settings file: top-level keys and their values, not yet checked against a
/// command.
#[derive(Debug)]
pub struct ConfigFile {
    path: PathBuf,
    table: toml::Table,
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<Self, ConfigFileError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigFileError::Read { path: path.to_owned(), source })?;
        Self::parse(path, &text)
    }

    /// Parses `text` as the content of the file at `path` (named in errors).
    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigFileError> {
        let table = text.parse::<toml::Table>().map_err(|error| ConfigFileError::Syntax {
            path: path.to_owned(),
            message: error.to_string().trim_end().to_owned(),
        })?;
        Ok(Self { path: path.to_owned(), table })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks every key and value against the flags of `command` and returns the command
    /// line arguments (`--key=value`) for the keys whose flag `set_elsewhere` says is not
    /// already set, in file order.
    pub fn arguments(
        &self,
        command: &Command,
        set_elsewhere: impl Fn(&Arg) -> bool,
    ) -> Result<Vec<OsString>, ConfigFileError> {
        let mut arguments = Vec::new();
        for (key, value) in &self.table {
            let Some(arg) = settable_flags(command).find(|arg| arg.get_long() == Some(key.as_str())) else {
                return Err(ConfigFileError::UnknownKey {
                    path: self.path.clone(),
                    key: key.clone(),
                    command: command.get_name().to_owned(),
                    suggestions: close_keys(key, command),
                });
            };
            let flag_arguments = self.flag_arguments(key, arg, value)?;
            if !set_elsewhere(arg) {
                arguments.extend(flag_arguments);
            }
        }
        Ok(arguments)
    }

    /// `value` as the arguments of one flag, checked by the flag's own value parser.
    fn flag_arguments(&self, key: &str, arg: &Arg, value: &toml::Value) -> Result<Vec<OsString>, ConfigFileError> {
        let wrong_type = |expected| ConfigFileError::WrongType {
            path: self.path.clone(),
            key: key.to_owned(),
            expected,
            found: type_name(value),
        };
        let flag = format!("--{key}");
        match arg.get_action() {
            ArgAction::SetTrue | ArgAction::SetFalse => {
                // `key = true` is the flag given, `false` the flag left out (whichever way the
                // flag turns its field).
                let toml::Value::Boolean(given) = value else { return Err(wrong_type("true or false")) };
                Ok(if *given { vec![flag.into()] } else { Vec::new() })
            }
            ArgAction::Set | ArgAction::Append => {
                let many = matches!(arg.get_action(), ArgAction::Append)
                    || arg.get_num_args().is_some_and(|range| range.max_values() > 1);
                let values = match value {
                    toml::Value::Array(items) if many => items
                        .iter()
                        .map(|item| {
                            scalar(item).ok_or_else(|| ConfigFileError::WrongType {
                                path: self.path.clone(),
                                key: key.to_owned(),
                                expected: "a list of plain values",
                                found: if item.is_table() { "a list holding a table" } else { "a list holding a list" },
                            })
                        })
                        .collect::<Result<Vec<_>, _>>()?,
                    toml::Value::Array(_) => return Err(wrong_type("one value")),
                    other => vec![
                        scalar(other).ok_or_else(|| wrong_type(if many { "a value or a list" } else { "a value" }))?,
                    ],
                };
                if values.is_empty() {
                    // `key = []` sets nothing, like leaving the key out.
                    return Ok(Vec::new());
                }
                self.check_values(key, arg, &values, many)?;
                Ok(values.iter().map(|value| format!("{flag}={value}").into()).collect())
            }
            // No server flag counts or takes extra actions; refuse rather than guess.
            _ => Err(wrong_type("nothing (this flag cannot be set from a file)")),
        }
    }

    /// Runs `values` through a command holding only a copy of `arg`'s parsing (value parser,
    /// delimiter), as one positional argument: the same checks as the real parse, but
    /// without the flag's environment variable or its relations to other flags.
    fn check_values(&self, key: &str, arg: &Arg, values: &[String], many: bool) -> Result<(), ConfigFileError> {
        let mut alone = Arg::new(arg.get_id().clone())
            .value_name(CHECKED_VALUE)
            .required(true)
            .action(if many { ArgAction::Append } else { ArgAction::Set })
            .num_args(if many { clap::builder::ValueRange::new(1..) } else { clap::builder::ValueRange::SINGLE })
            .value_parser(arg.get_value_parser().clone())
            .ignore_case(arg.is_ignore_case_set());
        if let Some(delimiter) = arg.get_value_delimiter() {
            alone = alone.value_delimiter(delimiter);
        }
        let checker = Command::new("berth").no_binary_name(true).disable_help_flag(true).arg(alone);
        // After `--` a value that starts with a dash is still a value.
        let arguments = std::iter::once("--").chain(values.iter().map(String::as_str));
        match checker.try_get_matches_from(arguments) {
            Ok(_) => Ok(()),
            Err(error) => Err(ConfigFileError::InvalidValue {
                path: self.path.clone(),
                key: key.to_owned(),
                message: clap_message(&error),
            }),
        }
    }
}

/// A TOML scalar as the text a flag would be given; `None` for tables and nested lists.
fn scalar(value: &toml::Value) -> Option<String> {
    match value {
        toml::Value::String(text) => Some(text.clone()),
        toml::Value::Integer(number) => Some(number.to_string()),
        toml::Value::Float(number) => Some(number.to_string()),
        toml::Value::Boolean(on) => Some(on.to_string()),
        toml::Value::Datetime(datetime) => Some(datetime.to_string()),
        toml::Value::Array(_) | toml::Value::Table(_) => None,
    }
}

fn type_name(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a date",
        toml::Value::Array(_) => "a list",
        toml::Value::Table(_) => "a table",
    }
}

/// Placeholder name of the value in [`ConfigFile::check_values`], cut from its errors.
const CHECKED_VALUE: &str = "VALUE";

/// The first paragraph of a clap error (what was wrong, with any possible values), on
/// one line and without the `error:` prefix or the usage that follows.
fn clap_message(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first = rendered.split("\n\n").next().unwrap_or_default();
    let text = first.strip_prefix("error: ").unwrap_or(first).replace(&format!(" for '<{CHECKED_VALUE}>'"), "");
    text.lines().map(str::trim).filter(|line| !line.is_empty()).collect::<Vec<_>>().join(" ")
}

/// Keys of `command` within a small edit distance of `key` (typos, `_` for `-`, plurals),
/// closest first.
fn close_keys(key: &str, command: &Command) -> Vec<String> {
    let wanted = key.replace('_', "-");
    let mut close: Vec<(usize, String)> = settable_flags(command)
        .filter_map(|arg| arg.get_long())
        .map(|long| (edit_distance(&wanted, long), long.to_owned()))
        .filter(|(distance, long)| *distance <= (long.len() / 4).max(2))
        .collect();
    close.sort();
    close.into_iter().take(3).map(|(_, long)| long).collect()
}

/// Levenshtein distance over chars.
fn edit_distance(left: &str, right: &str) -> usize {
    let right: Vec<char> = right.chars().collect();
    let mut previous: Vec<usize> = (0..=right.len()).collect();
    for (row, left_char) in left.chars().enumerate() {
        let mut current = vec![row + 1];
        for (column, right_char) in right.iter().enumerate() {
            let substitution = previous[column] + usize::from(left_char != *right_char);
            current.push(substitution.min(previous[column + 1] + 1).min(current[column] + 1));
        }
        previous = current;
    }
    previous[right.len()]
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::{CommandFactory, Subcommand};

    use super::*;

    /// A stand-in for a server command with every kind of flag the loader maps.
    #[derive(Debug, Parser)]
    struct TestCli {
        #[arg(long, global = true)]
        endpoint: Option<String>,
        #[command(subcommand)]
        command: TestCommand,
    }

    #[derive(Debug, Subcommand)]
    enum TestCommand {
        Serve(ServeArgs),
        Other,
    }

    #[derive(Debug, clap::Args)]
    struct ServeArgs {
        #[arg(long)]
        config: Option<PathBuf>,
        #[arg(long, default_value = "127.0.0.1:1")]
        listen: String,
        #[arg(long, required = true, value_delimiter = ',')]
        etcd: Vec<String>,
        #[arg(long, default_value = "1h", value_parser = crate::commands::server::parse_duration_arg)]
        idle_ttl: Duration,
        #[arg(long, default_value_t = 0)]
        capacity: u32,
        #[arg(long)]
        verbose: bool,
        #[arg(long = "keep-going", action = ArgAction::SetFalse)]
        stop_on_error: bool,
        #[arg(long, value_enum, default_value = "none")]
        auth: Mode,
        #[arg(long, requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        #[arg(long, requires = "tls_cert")]
        tls_key: Option<PathBuf>,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
    enum Mode {
        None,
        Token,
    }

    /// Parses `argv` after `test serve --config <file with text>`.
    fn serve(text: &str, argv: &[&str]) -> Result<ServeArgs, ParseError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("berth.toml");
        std::fs::write(&path, text).unwrap();
        let args = ["test", "serve", "--config", path.to_str().unwrap()].into_iter().chain(argv.iter().copied());
        match parse_from::<TestCli>(args)?.command {
            TestCommand::Serve(args) => Ok(args),
            TestCommand::Other => unreachable!(),
        }
    }

    fn message(error: ParseError) -> String {
        match error {
            ParseError::Usage(error) => error.render().to_string(),
            ParseError::ConfigFile(error) => error.to_string(),
        }
    }

    #[test]
    fn file_values_fill_flags_the_command_line_did_not_set() {
        let text = r#"
            listen = "0.0.0.0:9"
            etcd = ["http://a:1", "http://b:2"]
            idle-ttl = "30s"
            capacity = 7
            auth = "token"
        "#;
        let args = serve(text, &[]).unwrap();
        assert_eq!(args.listen, "0.0.0.0:9");
        assert_eq!(args.etcd, ["http://a:1", "http://b:2"]);
        assert_eq!(args.idle_ttl, Duration::from_secs(30));
        assert_eq!(args.capacity, 7);
        assert_eq!(args.auth, Mode::Token);

        let flagged = serve(text, &["--listen", "127.0.0.1:5", "--etcd=http://c:3", "--capacity=1"]).unwrap();
        assert_eq!(flagged.listen, "127.0.0.1:5");
        assert_eq!(flagged.etcd, ["http://c:3"], "a flag replaces the file's list, it does not add to it");
        assert_eq!(flagged.capacity, 1);
        assert_eq!(flagged.idle_ttl, Duration::from_secs(30));
    }

    #[test]
    fn a_comma_separated_string_is_a_list_too() {
        let args = serve(r#"etcd = "http://a:1,http://b:2""#, &[]).unwrap();
        assert_eq!(args.etcd, ["http://a:1", "http://b:2"]);
    }

    #[test]
    fn built_in_defaults_stay_when_the_file_is_silent() {
        let args = serve(r#"etcd = ["http://a:1"]"#, &[]).unwrap();
        assert_eq!(args.listen, "127.0.0.1:1");
        assert_eq!(args.idle_ttl, Duration::from_secs(3600));
        assert!(!args.verbose && args.stop_on_error);
    }

    #[test]
    fn an_empty_list_sets_nothing() {
        let error = message(serve("etcd = []", &[]).unwrap_err());
        assert!(error.contains("required") && error.contains("--etcd"), "{error}");
        assert_eq!(serve("etcd = []", &["--etcd", "a"]).unwrap().etcd, ["a"]);
    }

    #[test]
    fn booleans_switch_flags_on_and_off() {
        let on = serve("etcd = [\"x\"]\nverbose = true\nkeep-going = true", &[]).unwrap();
        assert!(on.verbose);
        assert!(!on.stop_on_error, "keep-going = true is the SetFalse flag given");
        let off = serve("etcd = [\"x\"]\nverbose = false\nkeep-going = false", &[]).unwrap();
        assert!(!off.verbose && off.stop_on_error);
        let error = message(serve("etcd = [\"x\"]\nverbose = \"yes\"", &[]).unwrap_err());
        assert!(error.contains("key `verbose` takes true or false, found a string"), "{error}");
    }

    #[test]
    fn unknown_keys_are_errors_with_close_matches() {
        let error = message(serve("etcd = [\"x\"]\nidle_ttl = \"1s\"", &[]).unwrap_err());
        assert!(error.contains("berth.toml: unknown key `idle_ttl` for `berth serve`"), "{error}");
        assert!(error.contains("did you mean `idle-ttl`?"), "{error}");
        let error = message(serve("etcd = [\"x\"]\nzzzzzz = 1", &[]).unwrap_err());
        assert!(error.contains("unknown key `zzzzzz`") && error.contains("long flags"), "{error}");
    }

    #[test]
    fn config_help_and_global_flags_are_not_keys() {
        for key in ["config", "help", "version", "endpoint"] {
            let error = message(serve(&format!("etcd = [\"x\"]\n{key} = \"x\""), &[]).unwrap_err());
            assert!(error.contains(&format!("unknown key `{key}`")), "{key}: {error}");
        }
    }

    #[test]
    fn bad_values_name_the_key_and_the_file() {
        for (text, expected) in [
            ("idle-ttl = 30", "key `idle-ttl`: invalid value '30'"),
            ("idle-ttl = \"soon\"", "use units"),
            ("capacity = \"lots\"", "key `capacity`: invalid value 'lots'"),
            ("capacity = -1", "key `capacity`: invalid value '-1'"),
            ("auth = \"magic\"", "possible values: none, token"),
            ("listen = [\"a\", \"b\"]", "key `listen` takes one value, found a list"),
            ("listen = { host = \"a\" }", "key `listen` takes a value, found a table"),
            ("auth = \"magic\"", "key `auth`: invalid value 'magic' [possible values"),
            ("etcd = [[\"nested\"]]", "key `etcd` takes a list of plain values, found a list holding a list"),
        ] {
            let text = if text.starts_with("etcd") { text.to_owned() } else { format!("etcd = [\"x\"]\n{text}") };
            let error = message(serve(&text, &[]).unwrap_err());
            assert!(error.contains("config file ") && error.contains("berth.toml"), "{text}: {error}");
            assert!(error.contains(expected), "{text}: {error}");
        }
    }

    #[test]
    fn a_bad_value_is_an_error_even_when_a_flag_overrides_it() {
        let error = message(serve("etcd = [\"x\"]\ncapacity = \"lots\"", &["--capacity", "2"]).unwrap_err());
        assert!(error.contains("key `capacity`"), "{error}");
    }

    #[test]
    fn syntax_errors_and_missing_files_name_the_file() {
        let error = message(serve("listen = ", &[]).unwrap_err());
        assert!(error.contains("berth.toml") && error.contains("line 1"), "{error}");
        let missing = parse_from::<TestCli>(["test", "serve", "--config", "/nonexistent/berth.toml"]).unwrap_err();
        assert!(message(missing).contains("reading config file /nonexistent/berth.toml"));
    }

    #[test]
    fn relations_between_flags_hold_for_file_values() {
        let error = message(serve("etcd = [\"x\"]\ntls-cert = \"/c.pem\"", &[]).unwrap_err());
        assert!(error.contains("--tls-key"), "{error}");
        assert!(error.contains("count as the flags of the same name"), "{error}");
        let both = serve("etcd = [\"x\"]\ntls-cert = \"/c.pem\"\ntls-key = \"/k.pem\"", &[]).unwrap();
        assert_eq!(both.tls_key, Some(PathBuf::from("/k.pem")));
        let missing = message(serve("listen = \"a:1\"", &[]).unwrap_err());
        assert!(missing.contains("--etcd"), "{missing}");
    }

    #[test]
    fn without_a_config_file_parsing_is_unchanged() {
        let cli = parse_from::<TestCli>(["test", "serve", "--etcd", "a,b"]).unwrap();
        assert!(matches!(cli.command, TestCommand::Serve(ServeArgs { ref etcd, .. }) if etcd == &["a", "b"]));
        assert!(matches!(parse_from::<TestCli>(["test", "other"]).unwrap().command, TestCommand::Other));
        let error = parse_from::<TestCli>(["test", "serve", "--bogus"]).unwrap_err();
        assert!(
            matches!(error, ParseError::Usage(ref error) if error.kind() == clap::error::ErrorKind::UnknownArgument)
        );
    }

    #[test]
    fn every_flag_of_the_test_command_is_a_key() {
        let root = TestCli::command();
        let command = root.find_subcommand("serve").unwrap();
        let keys: Vec<&str> = settable_flags(command).filter_map(Arg::get_long).collect();
        assert_eq!(
            keys,
            ["listen", "etcd", "idle-ttl", "capacity", "verbose", "keep-going", "auth", "tls-cert", "tls-key"]
        );
    }

    #[test]
    fn edit_distance_counts_single_char_edits() {
        assert_eq!(edit_distance("idle-ttl", "idle-ttl"), 0);
        assert_eq!(edit_distance("backends", "backend"), 1);
        assert_eq!(edit_distance("lisen", "listen"), 1);
        assert_eq!(edit_distance("", "abc"), 3);
    }
}
