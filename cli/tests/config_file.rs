//! `--config FILE` of the server commands: the real `berth` binary for precedence and
//! refusals (flag > env > file > default; a bad file stops it before anything starts),
//! the library parser for what every key maps to, and every example config under
//! `deploy/` loaded with the same loader.
//!
//! The binary tests use `berth up` and a `listen` address whose port is not a number: the
//! process fails at its bind with `listening on <address>`, which shows which setting won
//! without binding anything.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use berth::config_file::{ConfigFile, ConfigFileError, parse_from, settable_flags};
use clap::CommandFactory;

const SERVER_COMMANDS: [&str; 3] = ["up", "control-plane", "node-agent"];

struct Run {
    code: Option<i32>,
    stderr: String,
}

/// Runs `berth args…` with only `env` in its environment and waits for it to exit.
fn berth(args: &[&str], env: &[(&str, &str)]) -> Run {
    let child = Command::new(env!("CARGO_BIN_EXE_berth"))
        .args(args)
        .env_clear()
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn berth");
    // The exit is the condition: a thread waits for it, this one gives it 30 s.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).expect("pid fits i32"));
    let (exited, exit) = std::sync::mpsc::channel();
    std::thread::spawn(move || exited.send(child.wait_with_output()));
    let (output, timed_out) = match exit.recv_timeout(Duration::from_secs(30)) {
        Ok(output) => (output, false),
        Err(_) => {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            (exit.recv().expect("the waiting thread answers"), true)
        }
    };
    let output = output.expect("berth output");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!timed_out, "berth {args:?} still running after 30 s; stderr:\n{stderr}");
    Run { code: output.status.code(), stderr }
}

/// A temporary directory with `berth.toml` holding `text` and a `data` path that `berth up`
/// would create first thing if it got as far as starting.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(text: &str) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data");
        let text = format!("data-dir = {:?}\n{text}", data.to_str().expect("utf-8 path"));
        std::fs::write(dir.path().join("berth.toml"), text).expect("write config");
        Self { dir }
    }

    fn config(&self) -> String {
        self.dir.path().join("berth.toml").to_str().expect("utf-8 path").to_owned()
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }
}

#[test]
fn the_file_sets_what_no_flag_or_variable_sets() {
    let setup = Setup::new("listen = \"127.0.0.1:from-file\"");
    let run = berth(&["up", "--config", &setup.config()], &[]);
    assert_eq!(run.code, Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("listening on 127.0.0.1:from-file"), "{}", run.stderr);
    assert!(setup.data_dir().is_dir(), "data-dir came from the file too");
}

#[test]
fn berth_config_names_the_file_too() {
    let setup = Setup::new("listen = \"127.0.0.1:from-file\"");
    let run = berth(&["up"], &[("BERTH_CONFIG", &setup.config())]);
    assert!(run.stderr.contains("listening on 127.0.0.1:from-file"), "{}", run.stderr);
}

#[test]
fn a_variable_beats_the_file_and_a_flag_beats_the_variable() {
    let setup = Setup::new("listen = \"127.0.0.1:from-file\"");
    let variable = [("BERTH_LISTEN", "127.0.0.1:from-env")];
    let run = berth(&["up", "--config", &setup.config()], &variable);
    assert!(run.stderr.contains("listening on 127.0.0.1:from-env"), "{}", run.stderr);
    let run = berth(&["up", "--config", &setup.config(), "--listen", "127.0.0.1:from-flag"], &variable);
    assert!(run.stderr.contains("listening on 127.0.0.1:from-flag"), "{}", run.stderr);
}

#[test]
fn an_unknown_key_stops_berth_before_it_starts_anything() {
    let setup = Setup::new("lisen = \"127.0.0.1:from-file\"");
    let run = berth(&["up", "--config", &setup.config()], &[]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    let expected = format!("error: config file {}: unknown key `lisen` for `berth up`", setup.config());
    assert!(run.stderr.starts_with(&expected), "{}", run.stderr);
    assert!(run.stderr.contains("did you mean `listen`?"), "{}", run.stderr);
    assert!(!setup.data_dir().exists(), "berth up got as far as creating its data dir");
    // The same key is fine for the command that has it, and wrong for one that does not.
    let setup = Setup::new("etcd = [\"http://127.0.0.1:2379\"]");
    let run = berth(&["node-agent", "--config", &setup.config()], &[]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("unknown key `etcd` for `berth node-agent`"), "{}", run.stderr);
}

#[test]
fn a_wrong_typed_value_names_the_key_and_the_file() {
    for (text, expected) in [
        ("idle-ttl = 30", "key `idle-ttl`: invalid value '30'"),
        ("max-message-bytes = \"big\"", "key `max-message-bytes`: invalid value 'big'"),
        ("isolation = \"per-planet\"", "key `isolation`: invalid value 'per-planet': unknown isolation policy"),
        ("listen = [\"127.0.0.1:1\", \"127.0.0.1:2\"]", "key `listen` takes one value, found a list"),
    ] {
        let setup = Setup::new(text);
        let run = berth(&["up", "--config", &setup.config()], &[]);
        assert_eq!(run.code, Some(2), "{text}: {}", run.stderr);
        assert!(run.stderr.contains(&format!("config file {}: ", setup.config())), "{text}: {}", run.stderr);
        assert!(run.stderr.contains(expected), "{text}: {}", run.stderr);
        assert!(!setup.data_dir().exists(), "{text}: berth up started");
    }
}

#[test]
fn a_file_naming_a_certificate_without_its_key_fails_like_the_flag() {
    let setup = Setup::new("tls-cert = \"/etc/berth/cert.pem\"");
    let run = berth(&["up", "--config", &setup.config()], &[]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("--tls-key"), "{}", run.stderr);
    assert!(run.stderr.contains("count as the flags of the same name"), "{}", run.stderr);
}

#[test]
fn a_missing_file_is_an_error() {
    let run = berth(&["up", "--config", "/nonexistent/berth.toml"], &[]);
    assert_eq!(run.code, Some(2), "{}", run.stderr);
    assert!(run.stderr.contains("reading config file /nonexistent/berth.toml"), "{}", run.stderr);
}

/// Values one of which every server flag without a default accepts (durations, numbers,
/// key=value, URLs, paths, address ranges); a flag's default and possible values are tried
/// first.
const CANDIDATES: [&str; 7] = ["1s", "1", "zone=a", "docker=1", "http://127.0.0.1:1", "/etc/berth/x", "10.0.0.0/8"];

#[test]
fn every_flag_of_every_server_command_is_a_key() {
    let cli = berth::Cli::command();
    for name in SERVER_COMMANDS {
        let command = cli.find_subcommand(name).expect("server subcommand");
        let flags: Vec<_> = settable_flags(command).collect();
        assert!(flags.len() > 10, "{name}: only {} flags", flags.len());
        for arg in flags {
            let long = arg.get_long().expect("settable flags have long names");
            if matches!(arg.get_action(), clap::ArgAction::SetTrue | clap::ArgAction::SetFalse) {
                // A switch is a TOML boolean: `true` gives the bare flag.
                let file = ConfigFile::parse(Path::new("berth.toml"), &format!("{long} = true")).expect("valid TOML");
                let arguments = file.arguments(command, |_| false).unwrap_or_else(|error| panic!("{name}: {error}"));
                assert_eq!(arguments, vec![std::ffi::OsString::from(format!("--{long}"))], "{name}: {long}");
                continue;
            }
            // A flag's own default and possible values are valid by definition.
            let own: Vec<String> = arg
                .get_default_values()
                .iter()
                .filter_map(|value| value.to_str().map(str::to_owned))
                .chain(arg.get_possible_values().iter().map(|value| value.get_name().to_owned()))
                .collect();
            let candidates = own.iter().map(String::as_str).chain(CANDIDATES);
            let accepted = candidates.map(|value| toml_line(long, value)).find_map(|line| {
                let file = ConfigFile::parse(Path::new("berth.toml"), &line).expect("valid TOML");
                match file.arguments(command, |_| false) {
                    Ok(arguments) => Some(arguments),
                    Err(ConfigFileError::InvalidValue { .. }) => None,
                    Err(other) => panic!("{name}: key `{long}`: {other}"),
                }
            });
            let arguments = accepted.unwrap_or_else(|| panic!("{name}: key `{long}` accepts none of {CANDIDATES:?}"));
            assert!(arguments[0].to_str().is_some_and(|text| text.starts_with(&format!("--{long}="))), "{arguments:?}");
        }
    }
}

fn toml_line(key: &str, value: &str) -> String {
    format!("{key} = {value:?}")
}

#[test]
fn the_config_flag_itself_is_not_a_key() {
    let cli = berth::Cli::command();
    for name in SERVER_COMMANDS {
        let command = cli.find_subcommand(name).expect("server subcommand");
        assert!(command.get_arguments().any(|arg| arg.get_long() == Some("config")), "{name} has --config");
        let file = ConfigFile::parse(Path::new("berth.toml"), "config = \"other.toml\"").expect("valid TOML");
        assert!(matches!(file.arguments(command, |_| false), Err(ConfigFileError::UnknownKey { .. })), "{name}");
    }
}

#[test]
fn lists_fill_repeatable_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("node-agent.toml");
    let text = r#"
        control-plane = ["http://10.0.0.1:7070", "10.0.0.2:7070"]
        data-dir = "/var/lib/berth"
        backend = ["bubblewrap", "local"]
        label = ["zone=a", "disk=ssd"]
        warm-pool = ["docker=4"]
    "#;
    std::fs::write(&path, text).expect("write config");
    assert!(
        ["BERTH_CONTROL_PLANE", "BERTH_BACKENDS", "BERTH_DATA_DIR"].iter().all(|name| std::env::var_os(name).is_none()),
        "this test reads the process environment: unset BERTH_CONTROL_PLANE, BERTH_BACKENDS and BERTH_DATA_DIR"
    );
    let cli =
        parse_from::<berth::Cli>(["berth", "node-agent", "--config", path.to_str().expect("utf-8")]).expect("parse");
    let berth::Command::NodeAgent(args) = cli.command else { panic!("not node-agent: {:?}", cli.command) };
    assert_eq!(args.control_planes, ["http://10.0.0.1:7070", "10.0.0.2:7070"]);
    assert_eq!(args.common.backends, ["bubblewrap", "local"]);
    let labels: Vec<(&str, &str)> =
        args.common.labels.iter().map(|(key, value)| (key.as_str(), value.as_str())).collect();
    assert_eq!(labels, [("zone", "a"), ("disk", "ssd")]);
    assert_eq!(args.common.warm_pool, [("docker".to_owned(), 4)]);
    assert_eq!(args.data_dir, Path::new("/var/lib/berth"));
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every `*.toml` under `deploy/` except generated secrets.
fn example_configs(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap_or_else(|error| panic!("{}: {error}", dir.display())) {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|name| name != "secrets") {
                example_configs(&path, found);
            }
        } else if path.extension().is_some_and(|extension| extension == "toml") {
            found.push(path);
        }
    }
}

#[test]
fn every_example_config_under_deploy_loads_for_its_command() {
    let mut configs = Vec::new();
    example_configs(&repo_root().join("deploy"), &mut configs);
    configs.sort();
    assert!(configs.len() >= 6, "compose, kubernetes and systemd each have two: {configs:?}");
    for path in configs {
        // The file is named after the command it configures.
        let command = path.file_stem().and_then(|stem| stem.to_str()).expect("file name");
        assert!(
            SERVER_COMMANDS.contains(&command),
            "{}: name it after its command {SERVER_COMMANDS:?}",
            path.display()
        );
        let parsed = parse_from::<berth::Cli>(["berth", command, "--config", path.to_str().expect("utf-8")]);
        if let Err(error) = parsed {
            panic!("{}: {error}", path.display());
        }
    }
}

#[test]
fn the_systemd_units_read_the_example_configs() {
    let dir = repo_root().join("deploy/systemd");
    for (unit, command) in
        [("berth-control-plane.service", "control-plane"), ("berth-node-agent.service", "node-agent")]
    {
        let text = std::fs::read_to_string(dir.join(unit)).expect("unit file");
        let exec = text.lines().find(|line| line.starts_with("ExecStart=")).expect("ExecStart");
        let expected = format!("ExecStart=/usr/local/bin/berth {command} --config /etc/berth/{command}.toml");
        assert_eq!(exec, expected, "{unit}");
        assert!(dir.join(format!("{command}.toml")).is_file(), "deploy/systemd/{command}.toml");
    }
}

/// The node agent's own start-up checks (`NodeAgentConfig::validate`) on a node-agent
/// config file: what `berth node-agent --config <file>` would refuse before serving.
fn node_agent_config_check(path: &Path) -> Result<(), String> {
    let cli = parse_from::<berth::Cli>(["berth", "node-agent", "--config", path.to_str().expect("utf-8")])
        .map_err(|error| error.to_string())?;
    let berth::Command::NodeAgent(args) = cli.command else { panic!("not node-agent: {:?}", cli.command) };
    let mut config = berth_node_agent::NodeAgentConfig::new("node-check", &args.data_dir);
    args.common.apply(&mut config).map_err(|error| error.to_string())?;
    config.control_planes = args.control_planes.clone();
    config.validate()
}

/// The shipped node-agent configs start: none offers `local` without allow-unsandboxed,
/// none makes it the default next to a sandbox. Taking the switch out of one that offers
/// `local` makes it refuse, naming the flag.
#[test]
fn every_example_node_agent_config_passes_the_node_agents_checks() {
    let mut configs = Vec::new();
    example_configs(&repo_root().join("deploy"), &mut configs);
    let node_configs: Vec<PathBuf> =
        configs.into_iter().filter(|path| path.file_stem().is_some_and(|stem| stem == "node-agent")).collect();
    assert!(node_configs.len() >= 3, "{node_configs:?}");
    let scratch = tempfile::tempdir().expect("temp dir");
    for path in node_configs {
        node_agent_config_check(&path).unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        let text = std::fs::read_to_string(&path).expect("config text");
        if text.lines().any(|line| line == "allow-unsandboxed = true") {
            let stripped = scratch.path().join("node-agent.toml");
            let without: Vec<&str> = text.lines().filter(|line| *line != "allow-unsandboxed = true").collect();
            std::fs::write(&stripped, without.join("\n")).expect("write");
            let error = node_agent_config_check(&stripped).expect_err("local without the switch passed");
            assert!(error.contains("--allow-unsandboxed"), "{}: {error}", path.display());
        }
    }
}
