//! `berth fs push | pull`: directory trees to and from a workspace as tar streams.

use std::path::{Path, PathBuf};

use berth_proto::v1::{DownloadTreeRequest, UploadTreeHeader, UploadTreeRequest, upload_tree_request};
use futures::StreamExt;
use tokio::sync::mpsc;

use crate::client::{RpcError, RpcResultExt, connect};
use crate::commands::archive::{ChunkReader, pack_dir, stream_upload, unpack_into};
use crate::global::GlobalArgs;
use crate::io::Io;
use crate::output::emit_message;

/// Where a pushed directory lands by default: a directory of the same name at the root.
pub fn default_destination(local_dir: &Path) -> String {
    local_dir.file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default()
}

pub async fn push(
    global: &GlobalArgs,
    io: &mut Io<'_>,
    workspace: String,
    local_dir: PathBuf,
    dest: Option<String>,
    overwrite: bool,
) -> anyhow::Result<i32> {
    if !local_dir.is_dir() {
        anyhow::bail!("{} is not a directory", local_dir.display());
    }
    let dest = dest.unwrap_or_else(|| default_destination(&local_dir));
    let mut client = connect(global).await?.contract();
    let (sender, chunks) = mpsc::channel(4);
    pack_dir(local_dir.clone(), sender);
    let header = UploadTreeHeader { workspace_id: workspace.clone(), path: dest.clone(), overwrite };
    let response = stream_upload(
        UploadTreeRequest { msg: Some(upload_tree_request::Msg::Header(header)) },
        chunks,
        |chunk| UploadTreeRequest { msg: Some(upload_tree_request::Msg::Chunk(chunk)) },
        |outbound| client.upload_tree(outbound),
    )
    .await?;
    let what = || format!("push {} to {workspace}:{dest}", local_dir.display());
    let stats = response.map_err(RpcError::from).map_err(anyhow::Error::new).map_err(|error| error.context(what()))?;
    let stats = stats.into_inner();
    let json = serde_json::json!({"path": dest, "files": stats.files, "directories": stats.directories,
        "symlinks": stats.symlinks, "bytes": stats.bytes});
    let message = format!("pushed {} files ({} bytes) to {workspace}:{dest}", stats.files, stats.bytes);
    emit_message(io, global.output, &json, &message).await?;
    Ok(0)
}

pub async fn pull(
    global: &GlobalArgs,
    io: &mut Io<'_>,
    workspace: String,
    path: String,
    local_dir: PathBuf,
) -> anyhow::Result<i32> {
    let mut client = connect(global).await?.contract();
    let what = || format!("pull {workspace}:{path}");
    let request = DownloadTreeRequest { workspace_id: workspace.clone(), path: path.clone() };
    let mut stream = client.download_tree(request).await.rpc_context(what)?.into_inner();
    let (sender, receiver) = mpsc::channel::<Vec<u8>>(4);
    let target = local_dir.clone();
    let unpacker = tokio::task::spawn_blocking(move || {
        unpack_into(ChunkReader { receiver, current: Vec::new(), offset: 0 }, &target)
    });
    let mut received = 0u64;
    let mut failure = None;
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) => {
                received += chunk.data.len() as u64;
                if sender.send(chunk.data).await.is_err() {
                    break;
                }
            }
            Err(status) => {
                failure = Some(status);
                break;
            }
        }
    }
    drop(sender);
    let entries = unpacker.await??;
    if let Some(status) = failure {
        return Err(status).rpc_context(what);
    }
    let json = serde_json::json!({"path": path, "entries": entries, "bytes": received});
    let message = format!("pulled {entries} entries from {workspace}:{path} into {}", local_dir.display());
    emit_message(io, global.output, &json, &message).await?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pushed_directories_keep_their_name() {
        assert_eq!(default_destination(Path::new("/home/me/project")), "project");
        assert_eq!(default_destination(Path::new("project/")), "project");
    }

    #[tokio::test]
    async fn pack_and_unpack_round_trip() {
        let source = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(source.path().join("a/b")).unwrap();
        std::fs::write(source.path().join("a/b/f.txt"), b"hello").unwrap();
        let (sender, mut chunks) = mpsc::channel(4);
        pack_dir(source.path().to_path_buf(), sender);
        let (forward, receiver) = mpsc::channel(4);
        let target = tempfile::tempdir().unwrap();
        let dir = target.path().join("out");
        let unpack = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || unpack_into(ChunkReader { receiver, current: Vec::new(), offset: 0 }, &dir)
        });
        while let Some(chunk) = chunks.recv().await {
            forward.send(chunk.unwrap()).await.unwrap();
        }
        drop(forward);
        unpack.await.unwrap().unwrap();
        assert_eq!(std::fs::read(dir.join("a/b/f.txt")).unwrap(), b"hello");
    }
}
