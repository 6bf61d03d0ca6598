//! `berth fs write | read | ls | rm | stat | mkdir`: files in a workspace.
//!
//! Every PATH is relative to the workspace root; the server refuses escapes. `write` and
//! `read` stream, so a file of any size passes through in bounded memory.

mod tree;
mod upload;

use berth_proto::v1::{
    FileInfo, ListDirRequest, MakeDirRequest, ReadFileRequest, RemovePathRequest, StatRequest, WriteFileHeader,
};
use clap::{Args, Subcommand};
use serde::Serialize;

use crate::client::{RpcResultExt, connect};
use crate::format::{file_kind_name, mode_octal, rfc3339_opt, rfc3339_seconds_cell};
use crate::global::GlobalArgs;
use crate::io::Io;
use crate::output::{Table, emit, emit_message};

#[derive(Debug, Subcommand)]
pub enum FsCommand {
    /// Write stdin to a file (parents created; the file appears atomically at the end).
    Write(WriteArgs),
    /// Print a file to stdout.
    Read(PathArgs),
    /// List a directory.
    Ls {
        /// Workspace id.
        workspace: String,
        /// Directory, relative to the workspace root (default: the root).
        #[arg(default_value = "")]
        path: String,
    },
    /// Remove a file, or a directory with -r.
    Rm {
        /// Remove directories and their contents.
        #[arg(short, long)]
        recursive: bool,
        #[command(flatten)]
        target: PathArgs,
    },
    /// Show one file's kind, size, mode and modification time.
    Stat(PathArgs),
    /// Upload a local directory's contents (as a tar stream) to DEST (default: a directory
    /// named like LOCAL_DIR); a new DEST appears whole.
    Push {
        workspace: String,
        local_dir: std::path::PathBuf,
        dest: Option<String>,
        /// Replace same-named entries of an existing DEST.
        #[arg(long)]
        overwrite: bool,
    },
    /// Download a directory of the workspace (as a tar stream) into LOCAL_DIR.
    Pull { workspace: String, path: String, local_dir: std::path::PathBuf },
    /// Create a directory.
    Mkdir {
        /// Create missing parents too, and succeed if it already exists.
        #[arg(short, long)]
        parents: bool,
        #[command(flatten)]
        target: PathArgs,
    },
}

#[derive(Debug, Args)]
pub struct PathArgs {
    /// Workspace id.
    pub workspace: String,
    /// Path relative to the workspace root.
    pub path: String,
}

impl PathArgs {
    /// `ws:path`, how messages name a file.
    fn display(&self) -> String {
        format!("{}:{}", self.workspace, self.path)
    }
}

#[derive(Debug, Args)]
pub struct WriteArgs {
    /// Permission bits in octal (e.g. 755); default: the server's (0644).
    #[arg(long, value_parser = parse_octal_mode)]
    pub mode: Option<u32>,
    #[command(flatten)]
    pub target: PathArgs,
}

/// clap value parser for an octal mode: `755`, `0755` or `0o755`.
pub fn parse_octal_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    match u32::from_str_radix(digits, 8) {
        Ok(mode) if mode <= 0o7777 => Ok(mode),
        _ => Err(format!("expected octal permission bits like 644, got {text:?}")),
    }
}

/// JSON form of a file's metadata.
#[derive(Debug, Serialize)]
pub struct FileInfoView {
    pub path: String,
    pub name: String,
    pub kind: String,
    pub size: u64,
    /// Octal string ("0644"): the decimal number would be unreadable.
    pub mode: String,
    pub modified: Option<String>,
}

impl From<&FileInfo> for FileInfoView {
    fn from(info: &FileInfo) -> Self {
        FileInfoView {
            path: info.path.clone(),
            name: info.name.clone(),
            kind: file_kind_name(info.kind),
            size: info.size,
            mode: mode_octal(info.mode),
            modified: rfc3339_opt(info.modified.as_ref()),
        }
    }
}

/// One row per file; the last column is `name` for listings and `path` for stat.
pub fn file_table(entries: &[FileInfo], last_column: &str, last: impl Fn(&FileInfo) -> String) -> Table {
    let mut table = Table::new(["KIND", "SIZE", "MODE", "MODIFIED", last_column]).align_right(1);
    for info in entries {
        table.push_row(vec![
            file_kind_name(info.kind),
            info.size.to_string(),
            mode_octal(info.mode),
            rfc3339_seconds_cell(info.modified.as_ref()),
            last(info),
        ]);
    }
    table
}

pub async fn run(command: FsCommand, global: &GlobalArgs, io: &mut Io<'_>) -> anyhow::Result<i32> {
    let command = match command {
        FsCommand::Push { workspace, local_dir, dest, overwrite } => {
            return tree::push(global, io, workspace, local_dir, dest, overwrite).await;
        }
        FsCommand::Pull { workspace, path, local_dir } => {
            return tree::pull(global, io, workspace, path, local_dir).await;
        }
        other => other,
    };
    let mut client = connect(global).await?.workspace();
    match command {
        FsCommand::Write(args) => {
            let header = WriteFileHeader {
                workspace_id: args.target.workspace.clone(),
                path: args.target.path.clone(),
                mode: args.mode.unwrap_or(0),
            };
            let response = upload::upload(&client, io.stdin, header)
                .await
                .map_err(|error| error.context(format!("write {}", args.target.display())))?;
            let json = serde_json::json!({ "path": args.target.path, "bytes_written": response.bytes_written });
            let message = format!("wrote {} bytes to {}", response.bytes_written, args.target.display());
            emit_message(io, global.output, &json, &message).await?;
        }
        FsCommand::Read(target) => {
            let request =
                ReadFileRequest { workspace_id: target.workspace.clone(), path: target.path.clone(), chunk_size: 0 };
            let what = || format!("read {}", target.display());
            let mut stream = client.read_file(request).await.rpc_context(what)?.into_inner();
            while let Some(chunk) = stream.message().await.rpc_context(what)? {
                io.write_stdout(&chunk.data).await?;
            }
        }
        FsCommand::Ls { workspace, path } => {
            let request = ListDirRequest { workspace_id: workspace.clone(), path: path.clone() };
            let mut entries =
                client.list_dir(request).await.rpc_context(|| format!("list {workspace}:{path}"))?.into_inner().entries;
            entries.sort_by(|left, right| left.name.cmp(&right.name));
            let views: Vec<FileInfoView> = entries.iter().map(FileInfoView::from).collect();
            emit(io, global.output, &views, || file_table(&entries, "NAME", |info| info.name.clone())).await?;
        }
        FsCommand::Rm { recursive, target } => {
            let request =
                RemovePathRequest { workspace_id: target.workspace.clone(), path: target.path.clone(), recursive };
            let existed = client
                .remove_path(request)
                .await
                .rpc_context(|| format!("remove {}", target.display()))?
                .into_inner()
                .existed;
            let json = serde_json::json!({ "path": target.path, "existed": existed });
            let message = if existed {
                format!("removed {}", target.display())
            } else {
                format!("{} did not exist", target.display())
            };
            emit_message(io, global.output, &json, &message).await?;
        }
        FsCommand::Stat(target) => {
            let request = StatRequest { workspace_id: target.workspace.clone(), path: target.path.clone() };
            let info = client.stat(request).await.rpc_context(|| format!("stat {}", target.display()))?.into_inner();
            emit(io, global.output, &FileInfoView::from(&info), || {
                file_table(std::slice::from_ref(&info), "PATH", |info| info.path.clone())
            })
            .await?;
        }
        FsCommand::Push { .. } | FsCommand::Pull { .. } => unreachable!("handled above"),
        FsCommand::Mkdir { parents, target } => {
            let request = MakeDirRequest { workspace_id: target.workspace.clone(), path: target.path.clone(), parents };
            client.make_dir(request).await.rpc_context(|| format!("mkdir {}", target.display()))?;
            let json = serde_json::json!({ "path": target.path, "created": true });
            emit_message(io, global.output, &json, &format!("created directory {}", target.display())).await?;
        }
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn parse_fs(args: &[&str]) -> Result<FsCommand, clap::Error> {
        let cli = Cli::try_parse_from(["berth", "fs"].into_iter().chain(args.iter().copied()))?;
        match cli.command {
            Command::Fs(command) => Ok(command),
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn every_fs_command_parses() {
        assert!(matches!(parse_fs(&["write", "ws", "a/b.txt"]), Ok(FsCommand::Write(WriteArgs { mode: None, .. }))));
        assert!(matches!(
            parse_fs(&["write", "--mode", "755", "ws", "run.sh"]),
            Ok(FsCommand::Write(WriteArgs { mode: Some(0o755), .. }))
        ));
        assert!(matches!(parse_fs(&["read", "ws", "a"]), Ok(FsCommand::Read(PathArgs { .. }))));
        assert!(matches!(parse_fs(&["ls", "ws"]), Ok(FsCommand::Ls { path, .. }) if path.is_empty()));
        assert!(matches!(parse_fs(&["ls", "ws", "src"]), Ok(FsCommand::Ls { path, .. }) if path == "src"));
        assert!(matches!(parse_fs(&["rm", "-r", "ws", "d"]), Ok(FsCommand::Rm { recursive: true, .. })));
        assert!(matches!(parse_fs(&["rm", "ws", "f"]), Ok(FsCommand::Rm { recursive: false, .. })));
        assert!(matches!(parse_fs(&["stat", "ws", "f"]), Ok(FsCommand::Stat(_))));
        assert!(matches!(parse_fs(&["mkdir", "-p", "ws", "a/b"]), Ok(FsCommand::Mkdir { parents: true, .. })));
        assert!(parse_fs(&["read", "ws"]).is_err());
    }

    #[test]
    fn modes_parse_as_octal() {
        assert_eq!(parse_octal_mode("644"), Ok(0o644));
        assert_eq!(parse_octal_mode("0755"), Ok(0o755));
        assert_eq!(parse_octal_mode("0o700"), Ok(0o700));
        assert!(parse_octal_mode("9").is_err());
        assert!(parse_octal_mode("77777").is_err());
    }

    #[test]
    fn listing_table_shows_kind_size_mode_modified_name() {
        let entries = [FileInfo {
            path: "src/main.rs".into(),
            name: "main.rs".into(),
            kind: berth_proto::v1::FileKind::File as i32,
            size: 1234,
            mode: 0o100644,
            modified: Some(prost_types::Timestamp { seconds: 1_700_000_000, nanos: 0 }),
        }];
        let text = file_table(&entries, "NAME", |info| info.name.clone()).render();
        assert_eq!(
            text,
            "KIND  SIZE  MODE  MODIFIED              NAME\n\
             file  1234  0644  2023-11-14T22:13:20Z  main.rs\n"
        );
    }
}
