//! `berth node-credential`: makes one node's own credential from the replicas' node
//! credential key (docs/design.md §5, "Credentials"). The key stays with the replicas; the
//! file this writes goes to that node alone (`berth node-agent --node-credential-file`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

use anyhow::Context;
use berth_proto::credentials::NodeCredentialKey;
use clap::Args;

/// Flags of `berth node-credential`.
#[derive(Debug, Args)]
pub struct NodeCredentialArgs {
    /// The replicas' --node-credential-key-file.
    #[arg(long)]
    pub key_file: PathBuf,
    /// Id of the node the credential is for (its --node-id).
    #[arg(long)]
    pub node_id: String,
    /// Write the credential to this file (mode 0600, replaced if present) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn node_credential(args: NodeCredentialArgs) -> anyhow::Result<i32> {
    berth_workspace::validate_id("node id", &args.node_id)?;
    let key = NodeCredentialKey::from_file(&args.key_file).map_err(anyhow::Error::msg)?;
    let credential = key.node_credential(&args.node_id);
    let line = format!("{}\n", credential.secret().expose());
    match &args.out {
        Some(path) => {
            let mut file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?;
            file.write_all(line.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
        }
        None => std::io::stdout().write_all(line.as_bytes()).context("writing the credential")?,
    }
    Ok(0)
}
