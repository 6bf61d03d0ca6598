//! What the node agent and a supervisor say to each other.
//!
//! Two channels. The **control** socket (`SOCK_STREAM`, one per supervisor, inherited
//! at fd [`CONTROL_FD`]) carries one message per spawn: the byte [`SPAWN`] with four fds
//! attached in one `sendmsg` (read back one byte at a time, so each read returns its fds)
//! — the exec's own connection, then the command's stdin, stdout and stderr. The
//! supervisor answers [`READY`] on it once when it starts. The exec's **connection** (a
//! `SOCK_STREAM` pair made by the node for this exec) then carries the [`Request`] from the
//! node, the [`Reply`]s (`Started`, then `Exited`; or `Failed` / `Retry`) back, and
//! [`KILL`] from the node. The node closing the connection is a kill too.
//!
//! Everything the supervisor reads is checked (sizes, counts, NULs): a request could in
//! principle come from a compromised node-side peer, and a malformed one must end that
//! exec only.

/// The fd the control socket is inherited at.
pub const CONTROL_FD: i32 = 4;
/// The fd the supervisor's own binary (a memfd) is inherited at; closed at start.
pub const BINARY_FD: i32 = 5;
/// Sent by the supervisor on the control socket once it serves.
pub const READY: u8 = b'R';
/// The control message of one spawn.
pub const SPAWN: u8 = b'S';
/// Node → supervisor on an exec's connection: kill the command's tree.
pub const KILL: u8 = b'K';
/// Largest request (argv and env are capped far below this by the workspace contract).
pub const MAX_REQUEST_BYTES: usize = 4 << 20;
const REQUEST_MAGIC: u32 = 0x4253_5631;
const MAX_ITEMS: usize = 1 << 16;
/// Size of every reply.
pub const REPLY_BYTES: usize = 16;

/// One `setrlimit` the command starts with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rlimit {
    /// The Linux resource number (`RLIMIT_CPU` = 0, `RLIMIT_FSIZE` = 1, `RLIMIT_NPROC` = 6,
    /// `RLIMIT_AS` = 9).
    pub resource: u32,
    pub soft: u64,
    pub hard: u64,
}

pub const RLIMIT_CPU: u32 = 0;
pub const RLIMIT_FSIZE: u32 = 1;
pub const RLIMIT_NPROC: u32 = 6;
pub const RLIMIT_AS: u32 = 9;

/// What to start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// argv; argv[0] is looked up in `search_path` when it has no `/` (like `execvp`).
    pub argv: Vec<Vec<u8>>,
    /// The whole environment, `NAME=VALUE` each.
    pub env: Vec<Vec<u8>>,
    /// The sandbox path to start in.
    pub cwd: Vec<u8>,
    /// A relative path resolved below `cwd` to start in instead (empty: `cwd` itself). Its
    /// symlinks are followed, but one leading out of `cwd` (absolute, or `..` above it)
    /// fails the exec at [`Stage::Resolve`]: the sandbox checks a workspace path itself, so
    /// a node without the workspace on its own disk does not need a script for it.
    pub beneath: Vec<u8>,
    pub search_path: Vec<u8>,
    pub rlimits: Vec<Rlimit>,
    /// Fresh `/tmp` and `/dev/shm` of this size for this exec alone (`None`: the
    /// supervisor's own).
    pub private_tmp_bytes: Option<u64>,
}

/// Why a request was refused or could not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(i32)]
pub enum Stage {
    Request = 1,
    Tmp = 2,
    Fork = 3,
    Chdir = 4,
    Rlimit = 5,
    Capabilities = 6,
    Exec = 7,
    Session = 8,
    Stdio = 9,
    Resolve = 10,
}

impl Stage {
    pub fn from_code(code: i32) -> Option<Self> {
        Some(match code {
            1 => Self::Request,
            2 => Self::Tmp,
            3 => Self::Fork,
            4 => Self::Chdir,
            5 => Self::Rlimit,
            6 => Self::Capabilities,
            7 => Self::Exec,
            8 => Self::Session,
            9 => Self::Stdio,
            10 => Self::Resolve,
            _ => return None,
        })
    }

    pub fn describe(self) -> &'static str {
        match self {
            Self::Request => "malformed request",
            Self::Tmp => "private /tmp",
            Self::Fork => "fork",
            Self::Chdir => "chdir",
            Self::Rlimit => "setrlimit",
            Self::Capabilities => "dropping capabilities",
            Self::Exec => "exec",
            Self::Session => "setsid",
            Self::Stdio => "stdio",
            Self::Resolve => "working directory below the root",
        }
    }
}

/// Supervisor → node on an exec's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply {
    /// The command runs (its pid inside the sandbox).
    Started { pid: i32 },
    /// It never ran.
    Failed { stage: Stage, errno: i32 },
    /// It ended; everything it started is gone.
    Exited { code: Option<i32>, signal: Option<i32> },
    /// The supervisor is shutting down (idle) and did not look at the request: send it to
    /// a fresh one.
    Retry,
}

impl Reply {
    pub fn encode(self) -> [u8; REPLY_BYTES] {
        let (kind, first, second): (u32, i32, i32) = match self {
            Self::Started { pid } => (1, pid, 0),
            Self::Failed { stage, errno } => (2, stage as i32, errno),
            Self::Exited { code, signal } => (3, code.unwrap_or(-1), signal.unwrap_or(0)),
            Self::Retry => (4, 0, 0),
        };
        let mut bytes = [0u8; REPLY_BYTES];
        bytes[0..4].copy_from_slice(&kind.to_le_bytes());
        bytes[4..8].copy_from_slice(&first.to_le_bytes());
        bytes[8..12].copy_from_slice(&second.to_le_bytes());
        bytes
    }

    pub fn decode(bytes: &[u8; REPLY_BYTES]) -> Option<Self> {
        let word = |at: usize| [bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]];
        let kind = u32::from_le_bytes(word(0));
        let first = i32::from_le_bytes(word(4));
        let second = i32::from_le_bytes(word(8));
        Some(match kind {
            1 => Self::Started { pid: first },
            2 => Self::Failed { stage: Stage::from_code(first)?, errno: second },
            3 if second > 0 => Self::Exited { code: None, signal: Some(second) },
            3 if first >= 0 => Self::Exited { code: Some(first), signal: None },
            4 => Self::Retry,
            _ => return None,
        })
    }
}

impl Request {
    /// The request as sent: magic, body length, body.
    pub fn encode(&self) -> Vec<u8> {
        let mut body = Vec::new();
        put_list(&mut body, &self.argv);
        put_list(&mut body, &self.env);
        put_bytes(&mut body, &self.cwd);
        put_bytes(&mut body, &self.search_path);
        body.extend_from_slice(&(self.rlimits.len() as u32).to_le_bytes());
        for limit in &self.rlimits {
            body.extend_from_slice(&limit.resource.to_le_bytes());
            body.extend_from_slice(&limit.soft.to_le_bytes());
            body.extend_from_slice(&limit.hard.to_le_bytes());
        }
        match self.private_tmp_bytes {
            Some(size) => {
                body.push(1);
                body.extend_from_slice(&size.to_le_bytes());
            }
            None => body.push(0),
        }
        put_bytes(&mut body, &self.beneath);
        let mut message = Vec::with_capacity(8 + body.len());
        message.extend_from_slice(&REQUEST_MAGIC.to_le_bytes());
        message.extend_from_slice(&(body.len() as u32).to_le_bytes());
        message.extend_from_slice(&body);
        message
    }

    /// The body length announced by a header, checked.
    pub fn body_len(header: &[u8; 8]) -> Option<usize> {
        let magic = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
        let len = u32::from_le_bytes([header[4], header[5], header[6], header[7]]) as usize;
        (magic == REQUEST_MAGIC && len <= MAX_REQUEST_BYTES).then_some(len)
    }

    /// Decodes a body; `None` for anything malformed (an empty argv, a NUL inside a
    /// string, trailing bytes).
    pub fn decode(body: &[u8]) -> Option<Self> {
        let mut reader = Reader { bytes: body };
        let argv = reader.list()?;
        let env = reader.list()?;
        let cwd = reader.bytes()?.to_vec();
        let search_path = reader.bytes()?.to_vec();
        let count = reader.u32()? as usize;
        if count > 16 {
            return None;
        }
        let mut rlimits = Vec::with_capacity(count);
        for _ in 0..count {
            rlimits.push(Rlimit { resource: reader.u32()?, soft: reader.u64()?, hard: reader.u64()? });
        }
        let private_tmp_bytes = match reader.take(1)?[0] {
            0 => None,
            1 => Some(reader.u64()?),
            _ => return None,
        };
        let beneath = reader.bytes()?.to_vec();
        let no_nul = |item: &Vec<u8>| !item.contains(&0);
        let valid = reader.bytes.is_empty()
            && !argv.is_empty()
            && !argv[0].is_empty()
            && argv.iter().all(no_nul)
            && env.iter().all(|item| no_nul(item) && item.contains(&b'='))
            && no_nul(&cwd)
            && cwd.starts_with(b"/")
            && no_nul(&search_path)
            && no_nul(&beneath)
            && !beneath.starts_with(b"/");
        valid.then_some(Self { argv, env, cwd, beneath, search_path, rlimits, private_tmp_bytes })
    }
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
    out.extend_from_slice(bytes);
}

fn put_list(out: &mut Vec<u8>, items: &[Vec<u8>]) {
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for item in items {
        put_bytes(out, item);
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, len: usize) -> Option<&'a [u8]> {
        if self.bytes.len() < len {
            return None;
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Some(head)
    }

    fn u32(&mut self) -> Option<u32> {
        let bytes = self.take(4)?;
        Some(u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]))
    }

    fn u64(&mut self) -> Option<u64> {
        let bytes = self.take(8)?;
        let mut word = [0u8; 8];
        word.copy_from_slice(bytes);
        Some(u64::from_le_bytes(word))
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let len = self.u32()? as usize;
        self.take(len)
    }

    fn list(&mut self) -> Option<Vec<Vec<u8>>> {
        let count = self.u32()? as usize;
        if count > MAX_ITEMS {
            return None;
        }
        (0..count).map(|_| self.bytes().map(<[u8]>::to_vec)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> Request {
        Request {
            argv: vec![b"sh".to_vec(), b"-c".to_vec(), b"true".to_vec()],
            env: vec![b"PATH=/usr/bin:/bin".to_vec(), b"EMPTY=".to_vec()],
            cwd: b"/workspace".to_vec(),
            beneath: b"sub/dir".to_vec(),
            search_path: b"/usr/bin:/bin".to_vec(),
            rlimits: vec![Rlimit { resource: RLIMIT_NPROC, soft: 512, hard: 512 }],
            private_tmp_bytes: Some(1 << 20),
        }
    }

    #[test]
    fn a_request_survives_the_wire() {
        let encoded = request().encode();
        let header: [u8; 8] = encoded[..8].try_into().unwrap();
        assert_eq!(Request::body_len(&header), Some(encoded.len() - 8));
        assert_eq!(Request::decode(&encoded[8..]), Some(request()));
    }

    #[test]
    fn malformed_requests_are_refused() {
        let encoded = request().encode();
        for cut in 0..encoded.len() - 8 {
            assert_eq!(Request::decode(&encoded[8..8 + cut]), None, "a prefix of {cut} bytes was accepted");
        }
        let mut trailing = encoded[8..].to_vec();
        trailing.push(0);
        assert_eq!(Request::decode(&trailing), None);
        for broken in [
            Request { argv: vec![], ..request() },
            Request { argv: vec![b"a\0b".to_vec()], ..request() },
            Request { env: vec![b"NOEQUALS".to_vec()], ..request() },
            Request { cwd: b"relative".to_vec(), ..request() },
            Request { beneath: b"/etc".to_vec(), ..request() },
            Request { beneath: b"a\0b".to_vec(), ..request() },
        ] {
            assert_eq!(Request::decode(&broken.encode()[8..]), None, "{broken:?} accepted");
        }
        let mut bad_magic: [u8; 8] = encoded[..8].try_into().unwrap();
        bad_magic[0] ^= 1;
        assert_eq!(Request::body_len(&bad_magic), None);
    }

    #[test]
    fn replies_survive_the_wire() {
        for reply in [
            Reply::Started { pid: 7 },
            Reply::Failed { stage: Stage::Exec, errno: 2 },
            Reply::Exited { code: Some(3), signal: None },
            Reply::Exited { code: None, signal: Some(9) },
            Reply::Retry,
        ] {
            assert_eq!(Reply::decode(&reply.encode()), Some(reply));
        }
        assert_eq!(Reply::decode(&[0xff; REPLY_BYTES]), None);
    }
}
