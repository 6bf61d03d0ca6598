//! `berth skills add | rm | ls | show`: skills of a workspace.

use std::path::PathBuf;

use berth_proto::v1::{
    AddSkillHeader, AddSkillRequest, GetSkillRequest, ListSkillsRequest, RemoveSkillRequest, add_skill_request,
};
use clap::Subcommand;
use tokio::sync::mpsc;

use crate::client::{RpcError, RpcResultExt, connect};
use crate::commands::archive::{CHUNK_BYTES, pack_dir, stream_upload};
use crate::global::GlobalArgs;
use crate::io::Io;
use crate::output::{Table, emit, emit_message};

#[derive(Debug, Subcommand)]
pub enum SkillsCommand {
    /// Add a skill from a directory (holding SKILL.md) or a .tar / .tar.gz file.
    Add {
        workspace: String,
        path: PathBuf,
        /// Skill name (default: `name:` in SKILL.md's front matter).
        #[arg(long)]
        name: Option<String>,
        /// Replace a skill of the same name.
        #[arg(long)]
        replace: bool,
    },
    /// Remove a skill.
    Rm { workspace: String, name: String },
    /// List skills with their descriptions.
    Ls { workspace: String },
    /// Print a skill's SKILL.md body.
    Show { workspace: String, name: String },
}

pub async fn run(command: SkillsCommand, global: &GlobalArgs, io: &mut Io<'_>) -> anyhow::Result<i32> {
    let mut client = connect(global).await?.contract();
    match command {
        SkillsCommand::Add { workspace, path, name, replace } => {
            let (sender, chunks) = mpsc::channel::<anyhow::Result<Vec<u8>>>(4);
            if path.is_dir() {
                pack_dir(path.clone(), sender);
            } else {
                // A tar or tar.gz file as it is (the server recognises gzip).
                let data = std::fs::read(&path).map_err(|error| anyhow::anyhow!("read {}: {error}", path.display()))?;
                tokio::spawn(async move {
                    for chunk in data.chunks(CHUNK_BYTES) {
                        if sender.send(Ok(chunk.to_vec())).await.is_err() {
                            return;
                        }
                    }
                });
            }
            let header =
                AddSkillHeader { workspace_id: workspace.clone(), name: name.clone().unwrap_or_default(), replace };
            let response = stream_upload(
                AddSkillRequest { msg: Some(add_skill_request::Msg::Header(header)) },
                chunks,
                |chunk| AddSkillRequest { msg: Some(add_skill_request::Msg::Chunk(chunk)) },
                |outbound| client.add_skill(outbound),
            )
            .await?;
            let added = response
                .map_err(|status| anyhow::Error::new(RpcError::from(status)))
                .map_err(|error| error.context(format!("add skill {} to {workspace}", path.display())))?
                .into_inner();
            let skill = added.skill.unwrap_or_default();
            let json = serde_json::json!({"name": skill.name, "description": skill.description, "sha256": skill.sha256,
                "files": added.files, "bytes": added.bytes});
            emit_message(io, global.output, &json, &format!("added skill {} ({} files)", skill.name, added.files))
                .await?;
        }
        SkillsCommand::Rm { workspace, name } => {
            let existed = client
                .remove_skill(RemoveSkillRequest { workspace_id: workspace.clone(), name: name.clone() })
                .await
                .rpc_context(|| format!("remove skill {name} from {workspace}"))?
                .into_inner()
                .existed;
            let json = serde_json::json!({"name": name, "existed": existed});
            let message = if existed { format!("removed skill {name}") } else { format!("skill {name} did not exist") };
            emit_message(io, global.output, &json, &message).await?;
        }
        SkillsCommand::Ls { workspace } => {
            let skills = client
                .list_skills(ListSkillsRequest { workspace_id: workspace.clone() })
                .await
                .rpc_context(|| format!("list skills of {workspace}"))?
                .into_inner()
                .skills;
            let json: Vec<serde_json::Value> = skills
                .iter()
                .map(|skill| {
                    serde_json::json!({"name": skill.name, "description": skill.description,
                    "sha256": skill.sha256, "path": skill.path})
                })
                .collect();
            emit(io, global.output, &json, || {
                let mut table = Table::new(["NAME", "DESCRIPTION"]);
                for skill in &skills {
                    table.push_row(vec![skill.name.clone(), skill.description.clone()]);
                }
                table
            })
            .await?;
        }
        SkillsCommand::Show { workspace, name } => {
            let got = client
                .get_skill(GetSkillRequest { workspace_id: workspace.clone(), name: name.clone() })
                .await
                .rpc_context(|| format!("show skill {name} of {workspace}"))?
                .into_inner();
            match global.output {
                crate::output::OutputFormat::Json => {
                    let skill = got.skill.unwrap_or_default();
                    let json = serde_json::json!({"name": skill.name, "description": skill.description,
                        "sha256": skill.sha256, "body": got.body});
                    io.write_stdout(crate::output::json_text(&json)?.as_bytes()).await?;
                }
                crate::output::OutputFormat::Table => io.write_stdout(got.body.as_bytes()).await?,
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    #[test]
    fn skills_commands_parse() {
        let parse = |args: &[&str]| {
            let cli = Cli::try_parse_from(["berth", "skills"].into_iter().chain(args.iter().copied())).unwrap();
            match cli.command {
                Command::Skills(command) => command,
                other => panic!("parsed as {other:?}"),
            }
        };
        assert!(matches!(
            parse(&["add", "ws", "./skill", "--name", "pdf", "--replace"]),
            SkillsCommand::Add { name: Some(name), replace: true, .. } if name == "pdf"
        ));
        assert!(matches!(parse(&["ls", "ws"]), SkillsCommand::Ls { .. }));
        assert!(matches!(parse(&["show", "ws", "pdf"]), SkillsCommand::Show { .. }));
        assert!(matches!(parse(&["rm", "ws", "pdf"]), SkillsCommand::Rm { .. }));
    }
}
