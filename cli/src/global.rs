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
    /// Held as a `Secret`, so `Debug` of the flags never shows it.
    #[arg(long, global = true, env = "BERTH_TOKEN", hide_env_values = true, value_parser = parse_secret)]
    pub token: Option<berth_proto::auth::Secret>,
    /// Act for this user (services allowed to act for users; sent as x-berth-act-as).
    #[arg(long, global = true, env = "BERTH_ACT_AS")]
    pub act_as: Option<String>,
    /// CA certificate (PEM) that signed an https:// endpoint's certificate.
    #[arg(long, global = true, env = "BERTH_CA_CERT")]
    pub ca_cert: Option<std::path::PathBuf>,
}

fn parse_secret(text: &str) -> Result<berth_proto::auth::Secret, String> {
    Ok(berth_proto::auth::Secret::new(text.trim()))
}
