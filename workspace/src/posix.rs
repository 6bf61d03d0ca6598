//! Derived file operations through `exec` of POSIX tools inside the sandbox.
//!
//! For backends without a host-side view of the files (docker, cloud sandboxes): `stat`,
//! `list_dir`, `remove` and `mkdir` run one `sh -c SCRIPT` each, with the workspace root
//! as cwd and the client path as a positional argument (never spliced into the script).
//! The tools used — `sh`, `stat -c`, `find -mindepth/-maxdepth/-exec {} +`, `readlink`,
//! `rm`, `rmdir`, `mkdir` — exist with the same options in GNU coreutils and busybox.
//!
//! Confinement: the script resolves the path one component at a time, following symlinks
//! itself (`readlink`), and refuses an absolute target, a `..` above the root or more than
//! 40 hops — the same rules cap-std applies for the host backends — so the tools only ever
//! see a symlink-free path below `.`. This is defence in depth: the sandbox is the real
//! boundary, and a process inside it racing the check can only reach the sandbox's own files.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use async_trait::async_trait;

use crate::error::{Result, WorkspaceError};
use crate::file::{FileInfo, FileKind};
use crate::path::RelPath;
use crate::process::{ExecOutput, ExecSpec, MAX_OUTPUT_BYTES_LIMIT, MAX_STDIN_BYTES};

/// Deadline of one derived file operation (a large `rm -rf` takes a while).
const FILE_OP_TIMEOUT: Duration = Duration::from_secs(300);
/// Output cap of the small operations (stat, remove, mkdir).
const SMALL_OUTPUT_BYTES: usize = 64 * 1024;

/// The helper script; `$1` is the operation, `$2` the path, `$3` a 0/1 flag (`rename`:
/// the new path; `symlink`: the link target).
///
/// Exit codes (kept in sync with [`classify`]): 0 ok, 3 not found, 4 escapes the root (or
/// a symlink loop), 5 not a directory, 6 is a directory, 7 already exists.
const SCRIPT: &str = r#"
set -f
fail() { printf 'berth-posix: %s\n' "$2" >&2; exit "$1"; }

# resolve MODE PATH: sets R to PATH below "." with every symlink resolved inside the root.
#   nofollow          a final symlink is not followed (lstat semantics)
#   follow            a final symlink is followed
#   create[-nofollow] like follow[/nofollow], and missing components of PATH itself are
#                     allowed (appended as they are); missing ones inside a link are not
resolve() {
  mode=$1 cur=. hops=0 missing=0 fromlink=0
  IFS=/
  set -- $2
  unset IFS
  while [ $# -gt 0 ]; do
    c=$1
    shift
    if [ "$fromlink" -gt 0 ]; then fromlink=$((fromlink - 1)); linked=1; else linked=0; fi
    case $c in
      ''|.) continue ;;
      ..)
        [ "$missing" = 1 ] && fail 3 'no such file or directory'
        [ "$cur" = . ] && fail 4 'path escapes the workspace root'
        cur=${cur%/*}
        continue ;;
    esac
    next=$cur/$c
    if [ "$missing" = 1 ]; then cur=$next; continue; fi
    if [ -L "$next" ] && { [ $# -gt 0 ] || [ "$mode" = follow ] || [ "$mode" = create ]; }; then
      hops=$((hops + 1))
      [ "$hops" -gt 40 ] && fail 4 'too many levels of symbolic links'
      target=$(readlink -- "$next" && printf .) || fail 1 'cannot read symbolic link'
      target=${target%??}
      case $target in
        /*) fail 4 'path escapes the workspace root' ;;
      esac
      before=$#
      IFS=/
      set -- $target "$@"
      unset IFS
      fromlink=$((fromlink + $# - before))
      continue
    fi
    if [ ! -e "$next" ] && [ ! -L "$next" ]; then
      case $mode in
        create*) [ "$linked" = 0 ] && missing=1 ;;
      esac
      [ "$missing" = 0 ] && [ $# -gt 0 ] && fail 3 'no such file or directory'
    elif [ $# -gt 0 ] && [ ! -d "$next" ]; then
      fail 5 'not a directory'
    fi
    cur=$next
  done
  R=$cur
}

op=$1
case $op in
  stat)
    resolve nofollow "$2"
    [ -e "$R" ] || [ -L "$R" ] || fail 3 'no such file or directory'
    exec stat -c '%f %s %Y' -- "$R" ;;
  list)
    resolve follow "$2"
    [ -e "$R" ] || fail 3 'no such file or directory'
    [ -d "$R" ] || fail 5 'not a directory'
    cd "$R" || fail 1 'cannot enter the directory'
    # One record per entry: "<hex mode> <size> <mtime> ./<name>/". A name never contains
    # "/", so the trailing "/" ends the record whatever bytes the name holds. Entries that
    # vanish before stat runs are simply missing from the output.
    find . -mindepth 1 -maxdepth 1 -exec stat -c '%f %s %Y %n/' -- '{}' + || :
    exit 0 ;;
  remove)
    resolve nofollow "$2"
    if [ ! -e "$R" ] && [ ! -L "$R" ]; then echo absent; exit 0; fi
    if [ -L "$R" ] || [ ! -d "$R" ]; then rm -f -- "$R" || exit 1
    elif [ "$3" = 1 ]; then rm -rf -- "$R" || exit 1
    else rmdir -- "$R" || exit 1
    fi
    echo removed ;;
  mkdir)
    if [ "$3" = 1 ]; then
      resolve create-nofollow "$2"
      if [ -L "$R" ]; then
        # An existing symlink: fine if it leads to a directory inside the root.
        resolve follow "$2"
        [ -d "$R" ] && exit 0
        fail 7 'file exists'
      fi
      if [ -e "$R" ]; then [ -d "$R" ] && exit 0; fail 7 'file exists'; fi
      exec mkdir -p -- "$R"
    fi
    resolve create-nofollow "$2"
    exec mkdir -- "$R" ;;
  append)
    # stdin is appended to the file; missing parents are created.
    resolve create "$2"
    [ -d "$R" ] && fail 6 'is a directory'
    case $R in */*) mkdir -p -- "${R%/*}" || exit 1 ;; esac
    exec cat >> "$R" ;;
  rename)
    resolve nofollow "$2"
    F=$R
    [ -e "$F" ] || [ -L "$F" ] || fail 3 'no such file or directory'
    resolve create-nofollow "$3"
    if [ -e "$R" ] || [ -L "$R" ]; then fail 7 'file exists'; fi
    case $R in */*) mkdir -p -- "${R%/*}" || exit 1 ;; esac
    exec mv -f -- "$F" "$R" ;;
  symlink)
    # $2 is the link, $3 the target as written.
    resolve create-nofollow "$2"
    if [ -e "$R" ] || [ -L "$R" ]; then fail 7 'file exists'; fi
    case $R in */*) mkdir -p -- "${R%/*}" || exit 1 ;; esac
    exec ln -s -- "$3" "$R" ;;
  *) fail 2 "unknown operation $op" ;;
esac
"#;

/// What the scripts need of a backend: a unary exec inside the sandbox, and a name for
/// errors. Every `Backend` is one (`backend.rs`); kept apart so this module does not depend
/// on the trait it serves.
#[async_trait]
pub trait Runner: Send + Sync {
    fn runner_name(&self) -> &'static str;
    async fn run_exec(&self, spec: &ExecSpec) -> Result<ExecOutput>;
}

async fn run<B: Runner + ?Sized>(
    backend: &B,
    op: &'static str,
    path: &RelPath,
    flag: bool,
    max_output_bytes: usize,
) -> Result<ExecOutput> {
    run_with(backend, op, path, if flag { "1" } else { "0" }, Bytes::new(), max_output_bytes).await
}

/// [`run`] with a free third argument and stdin.
async fn run_with<B: Runner + ?Sized>(
    backend: &B,
    op: &'static str,
    path: &RelPath,
    third: &str,
    stdin: Bytes,
    max_output_bytes: usize,
) -> Result<ExecOutput> {
    let mut spec = ExecSpec::new(vec![
        "sh".into(),
        "-c".into(),
        SCRIPT.into(),
        "berth-posix".into(),
        op.into(),
        path.as_str().into(),
        third.into(),
    ]);
    spec.stdin = stdin;
    // The C locale: byte-wise `stat` names and untranslated error messages to classify.
    spec.spawn.env = BTreeMap::from([("LC_ALL".to_owned(), "C".to_owned())]);
    spec.timeout = FILE_OP_TIMEOUT;
    spec.max_output_bytes = max_output_bytes;
    let output = backend.run_exec(&spec).await?;
    if output.timed_out {
        return Err(WorkspaceError::Timeout { operation: op, millis: FILE_OP_TIMEOUT.as_millis() as u64 });
    }
    if output.exit_code != 0 {
        return Err(classify(backend.runner_name(), op, path, &output));
    }
    Ok(output)
}

/// Maps a failed helper run to an error: the script's own exit codes first, then the
/// (C-locale) strerror text the tools print, then a backend error carrying stderr.
fn classify(backend: &'static str, op: &'static str, path: &RelPath, output: &ExecOutput) -> WorkspaceError {
    let path = path.as_fs_str().to_owned();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lowered = stderr.to_ascii_lowercase();
    match output.exit_code {
        3 => return WorkspaceError::NotFound { path },
        4 => return WorkspaceError::PathEscapesRoot { path },
        5 => return WorkspaceError::NotADirectory { path },
        6 => return WorkspaceError::IsADirectory { path },
        7 => return WorkspaceError::AlreadyExists { path },
        _ => {}
    }
    if lowered.contains("no such file") {
        WorkspaceError::NotFound { path }
    } else if lowered.contains("not empty") {
        WorkspaceError::DirectoryNotEmpty { path }
    } else if lowered.contains("file exists") {
        WorkspaceError::AlreadyExists { path }
    } else if lowered.contains("not a directory") {
        WorkspaceError::NotADirectory { path }
    } else if lowered.contains("is a directory") {
        WorkspaceError::IsADirectory { path }
    } else if lowered.contains("too many levels of symbolic links") {
        WorkspaceError::PathEscapesRoot { path }
    } else {
        WorkspaceError::Backend {
            backend,
            message: format!("{op} {path:?}: exit code {}: {}", output.exit_code, stderr.trim()),
        }
    }
}

pub async fn stat<B: Runner + ?Sized>(backend: &B, path: &RelPath) -> Result<FileInfo> {
    let output = run(backend, "stat", path, false, SMALL_OUTPUT_BYTES).await?;
    let line = std::str::from_utf8(&output.stdout)
        .ok()
        .and_then(|text| parse_stat_fields(text.trim_end()))
        .ok_or_else(|| unparsable(backend.runner_name(), "stat", &output.stdout))?;
    Ok(line.into_info(path.clone()))
}

pub async fn list_dir<B: Runner + ?Sized>(backend: &B, path: &RelPath) -> Result<Vec<FileInfo>> {
    let output = run(backend, "list", path, false, MAX_OUTPUT_BYTES_LIMIT).await?;
    if output.stdout_truncated {
        return Err(WorkspaceError::LimitExceeded {
            limit: "directory listing size",
            size: output.stdout.len() as u64,
            max: MAX_OUTPUT_BYTES_LIMIT as u64,
        });
    }
    let records =
        parse_listing(&output.stdout).ok_or_else(|| unparsable(backend.runner_name(), "list", &output.stdout))?;
    let mut entries = Vec::with_capacity(records.len());
    for (fields, name) in records {
        // Names a client cannot address (not UTF-8) are skipped, as the host backends do.
        let Some(entry_path) = std::str::from_utf8(name).ok().and_then(|name| path.join(name).ok()) else {
            tracing::debug!(dir = %path, "skipping an entry a client cannot name");
            continue;
        };
        entries.push(fields.into_info(entry_path));
    }
    entries.sort_by(|left, right| left.path.cmp(&right.path));
    Ok(entries)
}

pub async fn remove<B: Runner + ?Sized>(backend: &B, path: &RelPath, recursive: bool) -> Result<bool> {
    if path.is_root() {
        return Err(WorkspaceError::InvalidPath {
            path: ".".into(),
            reason: "the workspace root itself cannot be removed",
        });
    }
    match run(backend, "remove", path, recursive, SMALL_OUTPUT_BYTES).await {
        Ok(output) => Ok(output.stdout.starts_with(b"removed")),
        // A missing parent: nothing was there to remove.
        Err(WorkspaceError::NotFound { .. }) => Ok(false),
        Err(error) => Err(error),
    }
}

pub async fn mkdir<B: Runner + ?Sized>(backend: &B, path: &RelPath, parents: bool) -> Result<()> {
    if path.is_root() {
        return if parents { Ok(()) } else { Err(WorkspaceError::AlreadyExists { path: ".".into() }) };
    }
    run(backend, "mkdir", path, parents, SMALL_OUTPUT_BYTES).await?;
    Ok(())
}

pub async fn append<B: Runner + ?Sized>(backend: &B, path: &RelPath, data: Bytes) -> Result<u64> {
    if path.is_root() {
        return Err(WorkspaceError::IsADirectory { path: ".".into() });
    }
    if data.len() > MAX_STDIN_BYTES {
        return Err(WorkspaceError::LimitExceeded {
            limit: "append size",
            size: data.len() as u64,
            max: MAX_STDIN_BYTES as u64,
        });
    }
    let length = data.len() as u64;
    run_with(backend, "append", path, "", data, SMALL_OUTPUT_BYTES).await?;
    Ok(length)
}

pub async fn rename<B: Runner + ?Sized>(backend: &B, from: &RelPath, to: &RelPath) -> Result<()> {
    if from.is_root() || to.is_root() {
        return Err(WorkspaceError::InvalidPath { path: ".".into(), reason: "the workspace root cannot be renamed" });
    }
    run_with(backend, "rename", from, to.as_str(), Bytes::new(), SMALL_OUTPUT_BYTES).await.map_err(
        |error| match error {
            // The script names the source in its errors; "exists" is about the target.
            WorkspaceError::AlreadyExists { .. } => WorkspaceError::AlreadyExists { path: to.as_fs_str().to_owned() },
            other => other,
        },
    )?;
    Ok(())
}

pub async fn symlink<B: Runner + ?Sized>(backend: &B, target: &str, link: &RelPath) -> Result<()> {
    if link.is_root() {
        return Err(WorkspaceError::AlreadyExists { path: ".".into() });
    }
    if target.is_empty() || target.contains('\0') {
        return Err(WorkspaceError::InvalidArgument("a symlink target must be non-empty and free of NUL".into()));
    }
    run_with(backend, "symlink", link, target, Bytes::new(), SMALL_OUTPUT_BYTES).await?;
    Ok(())
}

fn unparsable(backend: &'static str, op: &str, stdout: &[u8]) -> WorkspaceError {
    let preview: String = String::from_utf8_lossy(stdout).chars().take(200).collect();
    WorkspaceError::Backend { backend, message: format!("unexpected {op} output: {preview:?}") }
}

/// The numbers `stat -c '%f %s %Y'` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StatFields {
    raw_mode: u32,
    size: u64,
    modified_secs: i64,
}

impl StatFields {
    fn into_info(self, path: RelPath) -> FileInfo {
        // The S_IFMT bits; `%f` is portable where `%F`'s wording differs between tools
        // ("regular empty file", ...).
        let kind = match self.raw_mode & 0o170000 {
            0o100000 => FileKind::File,
            0o040000 => FileKind::Directory,
            0o120000 => FileKind::Symlink,
            _ => FileKind::Other,
        };
        let modified =
            u64::try_from(self.modified_secs).ok().map(|secs| SystemTime::UNIX_EPOCH + Duration::from_secs(secs));
        FileInfo { path, kind, size: self.size, mode: self.raw_mode & 0o7777, modified }
    }
}

fn parse_stat_fields(line: &str) -> Option<StatFields> {
    let mut fields = line.split(' ');
    let parsed = StatFields {
        raw_mode: u32::from_str_radix(fields.next()?, 16).ok()?,
        size: fields.next()?.parse().ok()?,
        modified_secs: fields.next()?.parse().ok()?,
    };
    fields.next().is_none().then_some(parsed)
}

/// Parses `<hex> <size> <mtime> ./<name>/\n` records; `None` if the output is malformed.
fn parse_listing(output: &[u8]) -> Option<Vec<(StatFields, &[u8])>> {
    let mut records = Vec::new();
    let mut rest = output;
    while !rest.is_empty() {
        let mut fields = [0usize; 3];
        let mut cursor = 0;
        for field_end in &mut fields {
            let space = rest[cursor..].iter().position(|&byte| byte == b' ')?;
            *field_end = cursor + space;
            cursor += space + 1;
        }
        let text = std::str::from_utf8(&rest[..fields[2]]).ok()?;
        let stat = parse_stat_fields(text)?;
        let after = rest[cursor..].strip_prefix(b"./")?;
        let slash = after.iter().position(|&byte| byte == b'/')?;
        records.push((stat, &after[..slash]));
        rest = after[slash + 1..].strip_prefix(b"\n")?;
    }
    Some(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_listing_with_odd_names() {
        let output = b"81a4 1 1700000000 ./a b/\n41ed 4096 1700000001 ./line\nbreak/\na1ff 4 3 ./-x/\n";
        let records = parse_listing(output).unwrap();
        assert_eq!(records.len(), 3);
        assert_eq!(records[0].1, b"a b");
        assert_eq!(records[1].1, b"line\nbreak");
        assert_eq!(records[2].1, b"-x");
        let info = records[1].0.into_info(RelPath::parse("line").unwrap());
        assert_eq!(info.kind, FileKind::Directory);
        assert_eq!(info.mode, 0o755);
        assert_eq!(records[2].0.into_info(RelPath::root()).kind, FileKind::Symlink);
        assert!(parse_listing(b"").unwrap().is_empty());
    }

    #[test]
    fn refuses_malformed_output() {
        assert!(parse_listing(b"81a4 1 ./x/\n").is_none());
        assert!(parse_listing(b"81a4 1 2 x/\n").is_none());
        assert!(parse_listing(b"81a4 1 2 ./x").is_none());
        assert!(parse_stat_fields("zz 1 2").is_none());
        assert!(parse_stat_fields("81a4 1 2 3").is_none());
        assert_eq!(parse_stat_fields("81a4 10 5"), Some(StatFields { raw_mode: 0o100644, size: 10, modified_secs: 5 }));
    }
}
