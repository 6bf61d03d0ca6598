//! Tar / tar.gz in: parsing on the blocking pool, writing through the backend.
//!
//! The `tar` crate is synchronous, so the archive is parsed on a blocking thread fed from
//! the async input by a bounded channel; every accepted entry goes back to the async side
//! as an [`Item`] (a file carries its own bounded chunk channel) and is written with the
//! backend's primitives. Back-pressure all the way: memory stays at a few chunks whatever
//! the archive size, and the runtime never blocks on tar work.

use std::collections::{HashMap, HashSet};
use std::io::{self, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use berth_workspace::backend::{Backend, ByteStream, DEFAULT_CHUNK_BYTES, FileKind, WriteOptions};
use berth_workspace::error::{Result, WorkspaceError};
use berth_workspace::path::{RelPath, join_path};
use berth_workspace::tree::{ExtractStats, TreeLimits};

/// Prefix of the temporary directories extraction works in (`.berth-tree-<random>`).
pub const TEMP_PREFIX: &str = ".berth-tree-";

/// A fresh temp directory name below `parent`.
fn temp_dir_in(
    parent: &berth_workspace::path::RelPath,
) -> berth_workspace::error::Result<berth_workspace::path::RelPath> {
    parent.join(&format!("{TEMP_PREFIX}{:016x}", rand::random::<u64>()))
}

/// Chunks buffered between the input stream and the parser, and per file between the
/// parser and the backend write.
const CHANNEL_CHUNKS: usize = 4;

/// One accepted entry, in archive order. Paths are below the extraction directory.
enum Item {
    Dir {
        path: RelPath,
    },
    File {
        path: RelPath,
        mode: u32,
        size: u64,
        data: mpsc::Receiver<Result<Bytes>>,
    },
    Symlink {
        path: RelPath,
        target: String,
    },
    /// A hardlink to a file extracted earlier from the same archive: written as a copy.
    Copy {
        path: RelPath,
        from: RelPath,
        mode: u32,
        size: u64,
    },
}

/// Extracts a tar or tar.gz stream (gzip is recognised by its magic bytes) into `dest`,
/// which must not exist yet and is created. On any error `dest` is removed before this
/// returns, so nothing is left behind. See the [module docs](super) for what is refused.
pub async fn extract<B: Backend + ?Sized>(
    backend: &B,
    dest: &RelPath,
    input: ByteStream,
    limits: TreeLimits,
) -> Result<ExtractStats> {
    if dest.is_root() {
        return Err(WorkspaceError::InvalidPath { path: ".".into(), reason: "cannot extract onto the workspace root" });
    }
    if let Some(parent) = dest.parent() {
        backend.mkdir(&parent, true).await?;
    }
    backend.mkdir(dest, false).await?;
    match extract_into(backend, dest, input, limits).await {
        Ok(stats) => Ok(stats),
        Err(error) => {
            if let Err(cleanup) = backend.remove(dest, true).await {
                tracing::warn!(dir = %dest, error = %cleanup, "could not remove a failed extraction");
            }
            Err(error)
        }
    }
}

/// Extracts an archive to `dest`: a directory that does not exist yet appears whole
/// (extracted aside at the workspace root, then renamed into place); into an existing
/// directory, the archive's top-level entries are moved in one by one after the whole
/// archive was extracted and checked, replacing same-named entries only with `overwrite`
/// (otherwise `AlreadyExists` before anything moved).
pub async fn upload<B: Backend + ?Sized>(
    backend: &B,
    dest: &RelPath,
    input: ByteStream,
    limits: TreeLimits,
    overwrite: bool,
) -> Result<ExtractStats> {
    let existing = match backend.stat(dest).await {
        Ok(info) if info.kind == FileKind::Directory => true,
        Ok(info) if info.kind == FileKind::Symlink => {
            // A link to a directory inside the root is fine to fill; list_dir follows it.
            backend.list_dir(dest).await?;
            true
        }
        Ok(_) => return Err(WorkspaceError::NotADirectory { path: dest.as_fs_str().to_owned() }),
        Err(WorkspaceError::NotFound { .. }) => false,
        Err(error) => return Err(error),
    };
    let temp = temp_dir_in(&RelPath::root())?;
    let stats = extract(backend, &temp, input, limits).await?;
    let placed =
        if existing { merge_into(backend, &temp, dest, overwrite).await } else { backend.rename(&temp, dest).await };
    if (existing || placed.is_err())
        && let Err(error) = backend.remove(&temp, true).await
    {
        tracing::warn!(dir = %temp, %error, "could not remove an upload's temp dir");
    }
    placed.map(|()| stats)
}

async fn merge_into<B: Backend + ?Sized>(backend: &B, temp: &RelPath, dest: &RelPath, overwrite: bool) -> Result<()> {
    let entries = backend.list_dir(temp).await?;
    let mut conflicts = Vec::new();
    for entry in &entries {
        let target = dest.join(entry.name())?;
        if backend.exists(&target).await? {
            conflicts.push(target);
        }
    }
    if !overwrite && let Some(first) = conflicts.first() {
        return Err(WorkspaceError::AlreadyExists { path: first.as_fs_str().to_owned() });
    }
    for target in &conflicts {
        backend.remove(target, true).await?;
    }
    for entry in &entries {
        backend.rename(&entry.path, &dest.join(entry.name())?).await?;
    }
    Ok(())
}

async fn extract_into<B: Backend + ?Sized>(
    backend: &B,
    dest: &RelPath,
    mut input: ByteStream,
    limits: TreeLimits,
) -> Result<ExtractStats> {
    let (raw_sender, raw_receiver) = mpsc::channel::<Result<Bytes>>(CHANNEL_CHUNKS);
    let (item_sender, mut items) = mpsc::channel::<Result<Item>>(CHANNEL_CHUNKS);
    // The pump ends when the parser stops reading (its receiver is dropped) or the input ends.
    let pump = tokio::spawn(async move {
        while let Some(chunk) = input.next().await {
            let failed = chunk.is_err();
            if raw_sender.send(chunk).await.is_err() || failed {
                return;
            }
        }
    });
    let parser_dest = dest.clone();
    let parser = tokio::task::spawn_blocking(move || {
        let reader = ChannelReader { receiver: raw_receiver, current: Bytes::new() };
        if let Err(error) = parse(reader, &parser_dest, limits, &item_sender) {
            let _ = item_sender.blocking_send(Err(error));
        }
    });
    let mut stats = ExtractStats::default();
    let outcome = async {
        while let Some(item) = items.recv().await {
            match item? {
                Item::Dir { path } => {
                    backend.mkdir(&path, true).await?;
                    stats.directories += 1;
                }
                Item::File { path, mode, size, data } => {
                    let stream = ReceiverStream::new(data).boxed();
                    let written = backend.write_file(&path, stream, WriteOptions { mode, max_bytes: size }).await?;
                    if written != size {
                        return Err(WorkspaceError::InvalidArgument(format!(
                            "archive entry {path} is {written} bytes, its header says {size}"
                        )));
                    }
                    stats.files += 1;
                    stats.bytes += written;
                }
                Item::Symlink { path, target } => {
                    backend.symlink(&target, &path).await?;
                    stats.symlinks += 1;
                }
                Item::Copy { path, from, mode, size } => {
                    let stream = backend.read_file(&from).await?;
                    let written = backend.write_file(&path, stream, WriteOptions { mode, max_bytes: size }).await?;
                    stats.files += 1;
                    stats.bytes += written;
                }
            }
        }
        Ok(())
    }
    .await;
    // Dropping the receiver stops a parser still working (its next send fails).
    drop(items);
    pump.abort();
    let joined = parser.await;
    outcome?;
    joined.map_err(|error| WorkspaceError::Backend {
        backend: "tree",
        message: format!("archive parser failed: {error}"),
    })?;
    Ok(stats)
}

/// A blocking `Read` over the chunks of the async input.
struct ChannelReader {
    receiver: mpsc::Receiver<Result<Bytes>>,
    current: Bytes,
}

impl Read for ChannelReader {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() {
            match self.receiver.blocking_recv() {
                None => return Ok(0),
                Some(Ok(chunk)) => self.current = chunk,
                Some(Err(error)) => return Err(io::Error::other(StreamFailed(error.to_string()))),
            }
        }
        let length = buffer.len().min(self.current.len());
        buffer[..length].copy_from_slice(&self.current.split_to(length));
        Ok(length)
    }
}

/// The client's stream broke (not the archive's fault).
#[derive(Debug)]
struct StreamFailed(String);

impl std::fmt::Display for StreamFailed {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "input stream failed: {}", self.0)
    }
}

impl std::error::Error for StreamFailed {}

/// Stops reading past `remaining` bytes (the decompressed size of an archive is bounded,
/// whatever a gzip bomb expands to).
struct CappedReader<R> {
    inner: R,
    remaining: u64,
    exceeded: Arc<AtomicBool>,
    /// The last block read, to check the end-of-archive marker.
    tail: Vec<u8>,
}

impl<R: Read> CappedReader<R> {
    /// Whether the archive ended with tar's end-of-archive marker: the zero block the
    /// parser stopped at, then a second one. A stream that merely stops — a client that
    /// dropped its call mid-upload looks like a clean end on the wire — must not commit a
    /// partial tree.
    fn ended_with_marker(mut self) -> bool {
        if self.tail.len() != 512 || self.tail.iter().any(|&byte| byte != 0) {
            return false;
        }
        let mut second = [0u8; 512];
        self.read_exact(&mut second).is_ok() && second.iter().all(|&byte| byte == 0)
    }

    fn remember(&mut self, read: &[u8]) {
        self.tail.extend_from_slice(&read[read.len().saturating_sub(512)..]);
        if self.tail.len() > 512 {
            let excess = self.tail.len() - 512;
            self.tail.drain(..excess);
        }
    }
}

impl<R: Read> Read for CappedReader<R> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            // One byte more tells a stream that is exactly at the cap from a longer one.
            let mut probe = [0u8; 1];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => {
                    self.exceeded.store(true, Ordering::Relaxed);
                    Err(io::Error::other("decompressed archive exceeds its size limit"))
                }
            };
        }
        let allowed = buffer.len().min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let read = self.inner.read(&mut buffer[..allowed])?;
        self.remaining -= read as u64;
        self.remember(&buffer[..read]);
        Ok(read)
    }
}

/// The archive-relative bookkeeping of one extraction.
#[derive(Default)]
struct Seen {
    /// Every path so far, and whether it was a directory.
    paths: HashMap<String, bool>,
    /// Symlinks created: no later entry may go through one.
    links: HashSet<String>,
    /// Regular files created, with their sizes: the only valid hardlink targets.
    files: HashMap<String, u64>,
    entries: u64,
    bytes: u64,
}

fn refuse(path: &str, reason: &str) -> WorkspaceError {
    WorkspaceError::InvalidArgument(format!("archive entry {path:?} refused: {reason}"))
}

fn parse(reader: ChannelReader, dest: &RelPath, limits: TreeLimits, items: &mpsc::Sender<Result<Item>>) -> Result<()> {
    let exceeded = Arc::new(AtomicBool::new(false));
    let classify = |error: io::Error| -> WorkspaceError {
        if exceeded.load(Ordering::Relaxed) {
            return WorkspaceError::LimitExceeded {
                limit: "archive size (decompressed)",
                size: limits.max_bytes.saturating_add(limits.framing_allowance()).saturating_add(1),
                max: limits.max_bytes.saturating_add(limits.framing_allowance()),
            };
        }
        if let Some(failed) = error.get_ref().and_then(|inner| inner.downcast_ref::<StreamFailed>()) {
            return WorkspaceError::InvalidArgument(failed.to_string());
        }
        WorkspaceError::InvalidArgument(format!("malformed or truncated archive: {error}"))
    };
    // Peek the magic bytes without losing them.
    let mut reader = reader;
    let mut magic = Vec::with_capacity(2);
    while magic.len() < 2 {
        let mut byte = [0u8; 1];
        match reader.read(&mut byte).map_err(&classify)? {
            0 => break,
            _ => magic.push(byte[0]),
        }
    }
    let gzip = magic == [0x1f, 0x8b];
    let joined = io::Cursor::new(magic).chain(reader);
    let decoded: Box<dyn Read> = if gzip { Box::new(flate2::read::GzDecoder::new(joined)) } else { Box::new(joined) };
    let capped = CappedReader {
        inner: decoded,
        remaining: limits.max_bytes.saturating_add(limits.framing_allowance()),
        exceeded: exceeded.clone(),
        tail: Vec::with_capacity(512),
    };
    let mut archive = tar::Archive::new(capped);
    let mut seen = Seen::default();
    for entry in archive.entries().map_err(&classify)? {
        let mut entry = entry.map_err(&classify)?;
        let Some(item) = accept(&mut entry, dest, limits, &mut seen)? else {
            continue;
        };
        match item {
            Accepted::Item(item) => {
                if items.blocking_send(Ok(item)).is_err() {
                    return Ok(());
                }
            }
            Accepted::File { path, mode, size } => {
                let (data_sender, data) = mpsc::channel(CHANNEL_CHUNKS);
                if items.blocking_send(Ok(Item::File { path, mode, size, data })).is_err() {
                    return Ok(());
                }
                let mut buffer = vec![0u8; DEFAULT_CHUNK_BYTES];
                loop {
                    let read = match entry.read(&mut buffer) {
                        Ok(read) => read,
                        Err(error) => {
                            let error = classify(error);
                            let _ = data_sender.blocking_send(Err(WorkspaceError::InvalidArgument(error.to_string())));
                            return Err(error);
                        }
                    };
                    if read == 0 {
                        break;
                    }
                    if data_sender.blocking_send(Ok(Bytes::copy_from_slice(&buffer[..read]))).is_err() {
                        // The write failed; the async side reports why.
                        return Ok(());
                    }
                }
            }
        }
    }
    if !archive.into_inner().ended_with_marker() {
        return Err(WorkspaceError::InvalidArgument(
            "the archive ended without its end-of-archive marker (truncated or interrupted upload)".into(),
        ));
    }
    Ok(())
}

enum Accepted {
    Item(Item),
    File { path: RelPath, mode: u32, size: u64 },
}

/// Checks one entry against every rule; `None` for entries that carry nothing to write
/// (the root directory, PAX global headers).
fn accept<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    dest: &RelPath,
    limits: TreeLimits,
    seen: &mut Seen,
) -> Result<Option<Accepted>> {
    use tar::EntryType as T;
    let kind = entry.header().entry_type();
    if kind == T::XGlobalHeader {
        return Ok(None);
    }
    seen.entries += 1;
    if seen.entries > limits.max_files {
        return Err(WorkspaceError::LimitExceeded {
            limit: "archive entry count",
            size: seen.entries,
            max: limits.max_files,
        });
    }
    let raw = entry.path_bytes();
    let text =
        std::str::from_utf8(&raw).map_err(|_| refuse(&String::from_utf8_lossy(&raw), "the path is not UTF-8"))?;
    let text = text.to_owned();
    if text.starts_with('/') {
        return Err(refuse(&text, "absolute paths are not allowed"));
    }
    let relative = RelPath::parse(&text).map_err(|error| refuse(&text, &error.to_string()))?;
    if relative.is_root() {
        return if kind == T::Directory { Ok(None) } else { Err(refuse(&text, "an entry names the archive root")) };
    }
    let key = relative.as_str().to_owned();
    // No entry may be written through a symlink of this archive.
    let mut prefix = String::new();
    for component in relative.components() {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(component);
        if prefix.len() < key.len() && seen.links.contains(&prefix) {
            return Err(refuse(&text, "the path goes through a symlink of the archive"));
        }
    }
    let is_dir = kind == T::Directory;
    match seen.paths.get(&key) {
        Some(true) if is_dir => return Ok(None),
        Some(_) => return Err(refuse(&text, "duplicate entry")),
        None => {}
    }
    seen.paths.insert(key.clone(), is_dir);
    let path = join_path(dest, relative.as_str())?;
    let mode = match entry.header().mode().unwrap_or(0o644) & 0o777 {
        0 => 0o644,
        bits => bits,
    };
    let accepted = match kind {
        T::Directory => Accepted::Item(Item::Dir { path }),
        T::Regular | T::Continuous => {
            let size = entry.size();
            charge(seen, limits, size)?;
            seen.files.insert(key, size);
            Accepted::File { path, mode, size }
        }
        T::Symlink => {
            let target = link_name(entry, &text)?;
            check_symlink_target(&relative, &target).map_err(|reason| refuse(&text, reason))?;
            seen.links.insert(key);
            Accepted::Item(Item::Symlink { path, target })
        }
        T::Link => {
            let target = link_name(entry, &text)?;
            let target_path = RelPath::parse(&target)
                .map_err(|_| refuse(&text, "a hardlink must name a file of the same archive"))?;
            // The size is the source's; the entry itself carries no data.
            let Some(&size) = seen.files.get(target_path.as_str()) else {
                return Err(refuse(
                    &text,
                    "a hardlink must name a regular file extracted earlier from the same archive",
                ));
            };
            let source = join_path(dest, target_path.as_str())?;
            charge(seen, limits, size)?;
            seen.files.insert(key, size);
            Accepted::Item(Item::Copy { path, from: source, mode, size })
        }
        T::Char | T::Block => return Err(refuse(&text, "device files are not allowed")),
        T::Fifo => return Err(refuse(&text, "fifos are not allowed")),
        T::GNUSparse => return Err(refuse(&text, "sparse files are not supported")),
        other => return Err(refuse(&text, &format!("entry type {other:?} is not supported"))),
    };
    Ok(Some(accepted))
}

fn charge(seen: &mut Seen, limits: TreeLimits, size: u64) -> Result<()> {
    let total = seen.bytes.saturating_add(size);
    if total > limits.max_bytes {
        return Err(WorkspaceError::LimitExceeded {
            limit: "archive content size",
            size: total,
            max: limits.max_bytes,
        });
    }
    seen.bytes = total;
    Ok(())
}

fn link_name<R: Read>(entry: &tar::Entry<'_, R>, path: &str) -> Result<String> {
    let Some(raw) = entry.link_name_bytes() else {
        return Err(refuse(path, "a link without a target"));
    };
    let target = std::str::from_utf8(&raw).map_err(|_| refuse(path, "the link target is not UTF-8"))?;
    if target.is_empty() || target.contains('\0') {
        return Err(refuse(path, "the link target is empty or has a NUL byte"));
    }
    Ok(target.to_owned())
}

/// A symlink target must stay inside the archive's root whatever the other links of the
/// archive are: relative, with `..` only as leading components, and no more of them than
/// the link's directory is deep. Then resolving it climbs only through real directories
/// (entries never go through links) and descends through names that, by the same rule,
/// each stay inside — so no chain of links leads out.
fn check_symlink_target(link: &RelPath, target: &str) -> std::result::Result<(), &'static str> {
    if target.starts_with('/') {
        return Err("a symlink must not point to an absolute path");
    }
    let depth = link.depth().saturating_sub(1);
    let mut climbing = true;
    let mut ups = 0;
    for component in target.split('/') {
        match component {
            "" | "." => continue,
            ".." if climbing => ups += 1,
            ".." => return Err("a symlink target may use .. only at its start"),
            _ => climbing = false,
        }
    }
    if ups > depth {
        return Err("the symlink points outside the archive");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn symlink_targets() {
        let link = RelPath::parse("a/b/link").unwrap();
        for good in ["x", "../x", "../../x", "./x/y", "../c/d"] {
            assert!(check_symlink_target(&link, good).is_ok(), "{good}");
        }
        for bad in ["/etc", "../../../x", "x/../y", "../x/../../y"] {
            assert!(check_symlink_target(&link, bad).is_err(), "{bad}");
        }
        let top = RelPath::parse("link").unwrap();
        assert!(check_symlink_target(&top, "..").is_err());
        assert!(check_symlink_target(&top, "sub/file").is_ok());
    }
}
