//! Archives for the tree tests: well-formed ones, and a hostile corpus generated on the fly
//! (raw headers, so `..`, absolute paths and odd types can be written at all).

use bytes::Bytes;
use futures::StreamExt;

use berth_features::tree::TreeLimits;
use berth_workspace::backend::ByteStream;

const BLOCK: usize = 512;

/// One raw tar header (old-style name field, or a GNU long-name record first when `name`
/// is longer than 100 bytes).
pub fn header(name: &str, kind: tar::EntryType, size: u64, link: &str) -> Vec<u8> {
    let mut out = Vec::new();
    if name.len() > 100 {
        let mut long = tar::Header::new_gnu();
        long.as_gnu_mut().expect("gnu").name[..13].copy_from_slice(b"././@LongLink");
        long.set_mode(0o644);
        long.set_size(name.len() as u64 + 1);
        long.set_entry_type(tar::EntryType::GNULongName);
        long.set_cksum();
        out.extend_from_slice(long.as_bytes());
        out.extend_from_slice(name.as_bytes());
        out.push(0);
        pad(&mut out);
    }
    let mut header = tar::Header::new_gnu();
    let cut = name.len().min(100);
    header.as_gnu_mut().expect("gnu").name[..cut].copy_from_slice(&name.as_bytes()[..cut]);
    let link_cut = link.len().min(100);
    header.as_gnu_mut().expect("gnu").linkname[..link_cut].copy_from_slice(&link.as_bytes()[..link_cut]);
    header.set_mode(if kind == tar::EntryType::Directory { 0o755 } else { 0o644 });
    header.set_size(size);
    header.set_mtime(1_700_000_000);
    header.set_entry_type(kind);
    header.set_cksum();
    out.extend_from_slice(header.as_bytes());
    out
}

fn pad(out: &mut Vec<u8>) {
    let rest = out.len() % BLOCK;
    if rest != 0 {
        out.resize(out.len() + BLOCK - rest, 0);
    }
}

/// A regular file entry with its data.
pub fn file(name: &str, data: &[u8]) -> Vec<u8> {
    let mut out = header(name, tar::EntryType::Regular, data.len() as u64, "");
    out.extend_from_slice(data);
    pad(&mut out);
    out
}

pub fn dir(name: &str) -> Vec<u8> {
    header(name, tar::EntryType::Directory, 0, "")
}

pub fn symlink(name: &str, target: &str) -> Vec<u8> {
    header(name, tar::EntryType::Symlink, 0, target)
}

pub fn hardlink(name: &str, target: &str) -> Vec<u8> {
    header(name, tar::EntryType::Link, 0, target)
}

/// Entries followed by the end-of-archive blocks.
pub fn archive(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut out: Vec<u8> = entries.concat();
    out.extend_from_slice(&[0u8; 2 * BLOCK]);
    out
}

pub fn gzip(data: &[u8]) -> Vec<u8> {
    use std::io::Write as _;
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    encoder.write_all(data).expect("gzip in memory");
    encoder.finish().expect("gzip in memory")
}

/// A byte stream in chunks of `chunk` bytes.
pub fn stream(data: Vec<u8>, chunk: usize) -> ByteStream {
    let chunks: Vec<berth_workspace::error::Result<Bytes>> =
        data.chunks(chunk.max(1)).map(|part| Ok(Bytes::copy_from_slice(part))).collect();
    futures::stream::iter(chunks).boxed()
}

/// One hostile archive: a name, its bytes as a stream, and the limits it is tried with.
pub struct Hostile {
    pub name: &'static str,
    pub input: ByteStream,
    pub limits: TreeLimits,
}

/// Limits of the corpus: small enough that the bounded cases stay quick.
pub const CORPUS_LIMITS: TreeLimits = TreeLimits { max_bytes: 8 * 1024 * 1024, max_files: 1000 };

/// The hostile corpus: each archive must be refused (or bounded) with nothing left behind.
pub fn hostile_corpus() -> Vec<Hostile> {
    let limits = CORPUS_LIMITS;
    let plain =
        |name: &'static str, entries: Vec<Vec<u8>>| Hostile { name, input: stream(archive(&entries), 700), limits };
    let mut corpus = vec![
        plain("traversal", vec![file("ok.txt", b"fine"), file("../escaped.txt", b"x")]),
        plain("traversal-nested", vec![file("a/../../escaped.txt", b"x")]),
        plain("absolute", vec![file("/etc/berth-escaped", b"x")]),
        plain("symlink-absolute-then-write", vec![symlink("esc", "/etc"), file("esc/berth-escaped", b"x")]),
        plain("symlink-relative-escape", vec![symlink("esc", "../.."), file("esc/escaped.txt", b"x")]),
        plain(
            "symlink-inside-then-write-through",
            vec![dir("sub/"), symlink("sub/up", ".."), file("sub/up/x.txt", b"x")],
        ),
        plain("symlink-chain", vec![symlink("a/x", ".."), symlink("b", "a/x/..")]),
        plain("hardlink-absolute", vec![hardlink("hl", "/etc/passwd")]),
        plain("hardlink-relative-escape", vec![hardlink("hl", "../escaped.txt")]),
        plain("hardlink-to-nothing", vec![file("a.txt", b"a"), hardlink("hl", "b.txt")]),
        plain("device-node", vec![header("dev-null", tar::EntryType::Char, 0, "")]),
        plain("block-device", vec![header("sda", tar::EntryType::Block, 0, "")]),
        plain("fifo", vec![header("pipe", tar::EntryType::Fifo, 0, "")]),
        plain("duplicate-names", vec![file("same.txt", b"first"), file("same.txt", b"second")]),
        plain("long-component", vec![file(&format!("{}.txt", "n".repeat(300)), b"x")]),
        plain("long-path", vec![file(&vec!["d"; 70].join("/"), b"x")]),
    ];
    // A header claiming 2 GiB, followed by a few bytes: refused by the byte cap from the
    // header alone (reading 2 GiB would take long and the stream does not have them).
    let mut huge = header("huge.bin", tar::EntryType::Regular, 2 << 30, "");
    huge.extend_from_slice(&[7u8; 4096]);
    corpus.push(Hostile { name: "2gib-size-claim", input: stream(huge, 4096), limits });
    // 100 000 tiny files, generated lazily: the entry cap stops it early.
    let tiny = futures::stream::iter((0..100_000u32).map(|index| Ok(Bytes::from(file(&format!("f{index}"), b"t")))))
        .chain(futures::stream::once(async { Ok(Bytes::from(vec![0u8; 2 * BLOCK])) }))
        .boxed();
    // The count cap is what refuses it; a lower cap for this case keeps the files written
    // before the refusal few on backends where each write is an exec (Docker: ~75 ms).
    let count_capped = TreeLimits { max_files: 100, ..limits };
    corpus.push(Hostile { name: "100k-tiny-files", input: tiny, limits: count_capped });
    // A gzip bomb: a PAX record of 64 MiB of zeros compresses to ~64 KiB; the
    // decompressed-size cap cuts it off.
    let mut bomb = header("././@PaxHeader", tar::EntryType::XHeader, 64 << 20, "");
    bomb.extend(std::iter::repeat_n(0u8, 64 << 20));
    bomb.extend_from_slice(&file("after.txt", b"x"));
    corpus.push(Hostile { name: "gzip-bomb", input: stream(gzip(&bomb), 64 * 1024), limits });
    // Content over the byte cap in many small compressed files.
    let zeros = vec![0u8; 1 << 20];
    let many: Vec<Vec<u8>> = (0..16).map(|index| file(&format!("z{index}"), &zeros)).collect();
    corpus.push(Hostile { name: "content-over-cap", input: stream(gzip(&archive(&many)), 64 * 1024), limits });
    // A valid archive cut in the middle of a file.
    let whole = archive(&[file("big.bin", &vec![1u8; 100_000])]);
    corpus.push(Hostile { name: "truncated", input: stream(whole[..50_000].to_vec(), 4096), limits });
    // A stream that stops cleanly between two entries, without the end marker (a client
    // that dropped its call looks like this on the wire).
    let mut cut = file("first.txt", b"1");
    cut.extend_from_slice(&file("second.txt", b"2"));
    corpus.push(Hostile { name: "no-end-marker", input: stream(cut, 512), limits });
    // A stream that breaks mid-way (the client went away).
    let broken = futures::stream::iter(vec![
        Ok(Bytes::from(file("a.txt", b"a"))),
        Err(berth_workspace::error::WorkspaceError::InvalidArgument("client stream broke".into())),
    ])
    .boxed();
    corpus.push(Hostile { name: "broken-stream", input: broken, limits });
    corpus
}
