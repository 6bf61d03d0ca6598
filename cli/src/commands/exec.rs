//! `berth exec WORKSPACE -- CMD [ARG...]`: run a command in a workspace as if it ran here.
//!
//! The command's stdout and stderr go to ours byte for byte and its exit status becomes
//! ours, with the conventions of `timeout(1)` and shells: 124 when it timed out,
//! 128 + N when signal N killed it.

use std::time::Duration;

use berth_proto::v1::exec_chunk::Kind;
use berth_proto::v1::{ExecRequest, ExecResult};
use clap::Args;
use tokio::io::AsyncReadExt;

use crate::client::{RpcResultExt, connect};
use crate::commands::{key_values_to_map, parse_key_value};
use crate::global::GlobalArgs;
use crate::io::Io;

/// Exit status when the server killed the command at its timeout (as `timeout(1)`).
pub const EXIT_TIMED_OUT: i32 = 124;

/// Exit status when the server reports an exit the shell convention cannot express
/// (a negative code without a signal): generic failure, never a false success.
const EXIT_UNREPRESENTABLE: i32 = 1;

/// Extra time the gRPC deadline allows beyond the exec timeout. The server answers a
/// timed-out command only after killing it and collecting its output, and may first have
/// to bring an idle workspace back; without this margin the client would give up just
/// before the server's "timed out" answer arrives and the user would see an RPC error
/// instead of exit 124.
pub const DEADLINE_GRACE: Duration = Duration::from_secs(10);

#[derive(Debug, Args)]
pub struct ExecArgs {
    /// Kill the command after this long (e.g. 500ms, 30s, 2m); 0 = server default.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
    /// Working directory, relative to the workspace root.
    #[arg(long, value_name = "DIR")]
    pub cwd: Option<String>,
    /// Environment variable for the command, KEY=VALUE (repeatable).
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub env: Vec<(String, String)>,
    /// Cap on each of stdout and stderr kept by the server; default: server's (1 MiB).
    #[arg(long, value_name = "BYTES")]
    pub max_output: Option<u64>,
    /// Print output as it is produced (ExecStream) instead of when the command ends.
    #[arg(long)]
    pub stream: bool,
    /// Read all of our stdin and pass it to the command (stdin is not read otherwise).
    #[arg(long)]
    pub stdin: bool,
    /// Workspace id.
    pub workspace: String,
    /// Command and arguments, after `--`; no shell is involved unless you run one.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub argv: Vec<String>,
}

impl ExecArgs {
    /// The request without stdin (read separately, only with `--stdin`).
    pub fn to_request(&self) -> ExecRequest {
        ExecRequest {
            workspace_id: self.workspace.clone(),
            argv: self.argv.clone(),
            cwd: self.cwd.clone().unwrap_or_default(),
            env: key_values_to_map(self.env.clone()),
            stdin: Vec::new(),
            timeout_ms: timeout_millis(self.timeout),
            max_output_bytes: self.max_output.unwrap_or(0),
        }
    }
}

/// The timeout in whole milliseconds, rounded up so that a sub-millisecond timeout does
/// not become 0 (which means "server default").
pub fn timeout_millis(timeout: Duration) -> u64 {
    let millis = timeout.as_nanos().div_ceil(1_000_000);
    u64::try_from(millis).unwrap_or(u64::MAX)
}

/// The gRPC deadline for an exec with `timeout`, or `None` for "server default" (whose
/// length we do not know, so any deadline we picked could cut it short).
pub fn rpc_deadline(timeout: Duration) -> Option<Duration> {
    (!timeout.is_zero()).then(|| timeout.saturating_add(DEADLINE_GRACE))
}

/// Maps the server's verdict to our exit status.
pub fn exit_code_of(result: &ExecResult) -> i32 {
    if result.timed_out {
        EXIT_TIMED_OUT
    } else if result.signal > 0 {
        128_i32.saturating_add(result.signal).min(255)
    } else if (0..=255).contains(&result.exit_code) {
        result.exit_code
    } else {
        EXIT_UNREPRESENTABLE
    }
}

pub async fn run(args: ExecArgs, global: &GlobalArgs, io: &mut Io<'_>) -> anyhow::Result<i32> {
    let mut exec_request = args.to_request();
    if args.stdin {
        let mut input = Vec::new();
        io.stdin.read_to_end(&mut input).await.map_err(|error| anyhow::anyhow!("read stdin: {error}"))?;
        exec_request.stdin = input;
    }
    let mut request = tonic::Request::new(exec_request);
    if let Some(deadline) = rpc_deadline(args.timeout) {
        request.set_timeout(deadline);
    }
    let mut client = connect(global).await?.workspace();
    let what = || format!("exec on {}", args.workspace);

    let result = if args.stream {
        let mut stream = client.exec_stream(request).await.rpc_context(what)?.into_inner();
        let mut exit = None;
        while let Some(chunk) = stream.message().await.rpc_context(what)? {
            match chunk.kind {
                Some(Kind::Stdout(bytes)) => {
                    io.write_stdout(&bytes).await?;
                    // Flushed per chunk: streaming exists so output shows up as it happens.
                    io.flush_stdout().await?;
                }
                Some(Kind::Stderr(bytes)) => io.write_stderr(&bytes).await?,
                Some(Kind::Exit(result)) => {
                    exit = Some(result);
                    break;
                }
                // A kind added by a newer server; nothing here knows how to print it.
                None => {}
            }
        }
        exit.ok_or_else(|| anyhow::anyhow!("{}: stream ended without an exit status", what()))?
    } else {
        let result = client.exec(request).await.rpc_context(what)?.into_inner();
        io.write_stdout(&result.stdout).await?;
        io.write_stderr(&result.stderr).await?;
        result
    };

    report_abnormal_end(io, &args, &result).await?;
    Ok(exit_code_of(&result))
}

/// Warns about what the exit code alone does not say: output was cut, or the command
/// was killed at its timeout.
async fn report_abnormal_end(io: &mut Io<'_>, args: &ExecArgs, result: &ExecResult) -> anyhow::Result<()> {
    for (stream_name, truncated) in [("stdout", result.stdout_truncated), ("stderr", result.stderr_truncated)] {
        if truncated {
            io.warn(&format!(
                "{stream_name} of the command was truncated by the server; raise --max-output to see more"
            ))
            .await?;
        }
    }
    if result.timed_out {
        io.warn(&format!("command timed out after {} and was killed", humantime::format_duration(args.timeout)))
            .await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn parse_exec(args: &[&str]) -> Result<ExecArgs, clap::Error> {
        let cli = Cli::try_parse_from(std::iter::once("berth").chain(args.iter().copied()))?;
        match cli.command {
            Command::Exec(exec) => Ok(exec),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn argv_after_double_dash_is_the_command_even_with_flags() {
        let args = parse_exec(&[
            "exec",
            "--timeout",
            "2m",
            "--cwd",
            "src",
            "--env",
            "A=1",
            "--max-output",
            "4096",
            "--stream",
            "ws-1",
            "--",
            "ls",
            "-la",
            "-o",
            "--stdin",
        ])
        .unwrap();
        assert_eq!(args.workspace, "ws-1");
        assert_eq!(args.argv, ["ls", "-la", "-o", "--stdin"]);
        assert_eq!(args.timeout, Duration::from_secs(120));
        assert!(args.stream);
        assert!(!args.stdin, "--stdin after -- belongs to the command");
        let request = args.to_request();
        assert_eq!(request.cwd, "src");
        assert_eq!(request.timeout_ms, 120_000);
        assert_eq!(request.max_output_bytes, 4096);
        assert_eq!(request.env.get("A").map(String::as_str), Some("1"));
    }

    #[test]
    fn defaults_are_thirty_seconds_and_no_stdin() {
        let args = parse_exec(&["exec", "ws-1", "--", "true"]).unwrap();
        assert_eq!(args.timeout, Duration::from_secs(30));
        assert!(!args.stdin && !args.stream);
        assert_eq!(args.to_request().max_output_bytes, 0);
    }

    #[test]
    fn command_is_required() {
        assert!(parse_exec(&["exec", "ws-1"]).is_err());
        assert!(parse_exec(&["exec", "ws-1", "--"]).is_err());
    }

    #[test]
    fn bad_timeout_is_a_usage_error() {
        let error = parse_exec(&["exec", "--timeout", "soon", "ws-1", "--", "true"]).unwrap_err();
        assert_eq!(error.exit_code(), 2);
    }

    #[test]
    fn deadline_exceeds_the_exec_timeout() {
        assert_eq!(rpc_deadline(Duration::from_secs(1)), Some(Duration::from_secs(11)));
        assert_eq!(rpc_deadline(Duration::ZERO), None);
        assert_eq!(rpc_deadline(Duration::MAX), Some(Duration::MAX));
    }

    #[test]
    fn sub_millisecond_timeouts_round_up() {
        assert_eq!(timeout_millis(Duration::from_micros(1)), 1);
        assert_eq!(timeout_millis(Duration::from_millis(1500)), 1500);
        assert_eq!(timeout_millis(Duration::ZERO), 0);
    }

    #[test]
    fn exit_codes_follow_shell_conventions() {
        let exited = |exit_code| ExecResult { exit_code, ..ExecResult::default() };
        assert_eq!(exit_code_of(&exited(0)), 0);
        assert_eq!(exit_code_of(&exited(7)), 7);
        assert_eq!(exit_code_of(&exited(255)), 255);
        assert_eq!(exit_code_of(&exited(-1)), 1);
        assert_eq!(exit_code_of(&exited(256)), 1);
        let timed_out = ExecResult { exit_code: -1, timed_out: true, signal: 9, ..ExecResult::default() };
        assert_eq!(exit_code_of(&timed_out), 124);
        let killed = ExecResult { exit_code: -1, signal: 9, ..ExecResult::default() };
        assert_eq!(exit_code_of(&killed), 137);
        let odd_signal = ExecResult { exit_code: -1, signal: 200, ..ExecResult::default() };
        assert_eq!(exit_code_of(&odd_signal), 255);
    }
}
