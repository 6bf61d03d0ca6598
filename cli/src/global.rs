//! The flags every client command accepts, before or after its subcommand.

use crate::output::OutputFormat;

/// Endpoint used when neither `--endpoint` nor `BERTH_ENDPOINT` is given; `berth up`
/// listens here by default.
pub const DEFAULT_ENDPOINT: &str = "http://127.0.0.1:7070";

/// Flags accepted before or after any subcommand.
#[derive(Debug, Clone, clap::Args)]
pub struct GlobalArgs {
    /// Control-plane gRPC endpoint (a bare host:port means http://host:port).
    #[arg(long, global = true, env = "BERTH_ENDPOINT", default_value = DEFAULT_ENDPOINT)]
    pub endpoint: String,
    /// Output format of commands that print records.
    #[arg(short, long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Bearer token sent on every request (control planes running --auth token / jwt).
    /// Held as a `Secret`, so `Debug` of the flags never shows it. On the command line it
    /// is visible to every user of the host (`ps`): prefer --token-file or BERTH_TOKEN.
    #[arg(long, global = true, env = "BERTH_TOKEN", hide_env_values = true, value_parser = parse_secret)]
    pub token: Option<berth_proto::auth::Secret>,
    /// File holding the bearer token (surrounding whitespace dropped); wins over --token.
    #[arg(long, global = true, env = "BERTH_TOKEN_FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Act for this user (services allowed to act for users; sent as x-berth-act-as).
    #[arg(long, global = true, env = "BERTH_ACT_AS")]
    pub act_as: Option<String>,
    /// CA certificate (PEM) that signed an https:// endpoint's certificate.
    #[arg(long, global = true, env = "BERTH_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
}

impl GlobalArgs {
    /// The bearer token: from --token-file when given, else --token / BERTH_TOKEN.
    pub fn token(&self) -> anyhow::Result<Option<berth_proto::auth::Secret>> {
        match &self.token_file {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|error| anyhow::anyhow!("reading --token-file {}: {error}", path.display()))?;
                let token = text.trim();
                anyhow::ensure!(!token.is_empty(), "--token-file {} is empty", path.display());
                Ok(Some(berth_proto::auth::Secret::new(token)))
            }
            None => Ok(self.token.clone()),
        }
    }
}

/// Flags whose value is a secret: given on the command line it shows in `ps` and shell
/// history. Returns a warning for each one found in `args` (the process's argv).
pub fn secrets_on_the_command_line<I, S>(args: I) -> Vec<String>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    const SECRET_FLAGS: [(&str, &str); 3] = [
        ("--token", "--token-file FILE or BERTH_TOKEN"),
        ("--secret-env", "--secret-env-file FILE or --secret-env-from VAR"),
        ("--secret-header", "--secret-header-file FILE"),
    ];
    let mut warnings = Vec::new();
    for arg in args {
        let arg = arg.as_ref().to_string_lossy();
        if arg == "--" {
            break;
        }
        let flag = arg.split_once('=').map_or(arg.as_ref(), |(flag, _)| flag);
        if let Some((flag, instead)) = SECRET_FLAGS.iter().find(|(name, _)| *name == flag)
            && !warnings.iter().any(|warning: &String| warning.starts_with(&format!("{flag} ")))
        {
            warnings.push(format!(
                "{flag} puts a secret on the command line, where every user of this host can read it (ps); use {instead}"
            ));
        }
    }
    warnings
}

fn parse_secret(text: &str) -> Result<berth_proto::auth::Secret, String> {
    Ok(berth_proto::auth::Secret::new(text.trim()))
}
