//! Processes in a sandbox: one execd `/command` per process, wrapped by `spawn.sh` /
//! `secret.sh` + `run.sh`.
//!
//! Output: the daemon carries stdout and stderr as JSON text, so `run.sh` hex-encodes both
//! with `od` and this module decodes them; the two streams stay separate. The wrapper's
//! first stderr line is a handshake (`berth-NONCE ok` / `berth-NONCE fail KIND`), so a
//! program that cannot start is `SpawnFailed` before any output.
//!
//! Stdin: the execd API has none. A unary exec's stdin is uploaded to a staged file first
//! (`Input::File`); a spawned process (MCP servers) reads a FIFO that later commands, run as
//! the same user, feed with `printf` (`stdin.sh`), one command per chunk, in order.
//!
//! Killing: dropping the command's event stream closes its connection, and the daemon kills
//! the command's whole process group (it started it with `setpgid`); an interrupt is sent
//! too. Exit status: the wrapper exits with the program's, so `128 + n` (as shells report a
//! signal `n`) is read as that signal, exactly like the Docker backend.

use std::collections::BTreeMap;
use std::io;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio_util::io::StreamReader;

use berth_workspace::backend::{ExitInfo, ProcessControl, Spawned};
use berth_workspace::error::{Result, WorkspaceError};

use crate::config::BACKEND_NAME;
use crate::execd::{CommandRequest, Ending, Event, EventStream, Execd};
use crate::scripts::{MAX_COMMAND_BYTES, STDIN_GONE_EXIT_CODE, Scripts};

/// Raw stdin bytes per feeding command (octal escapes make at most four times as many).
const STDIN_CHUNK_BYTES: usize = 16 * 1024;
/// Output chunks buffered per stream between the event reader and a slow consumer.
const OUTPUT_BUFFER: usize = 32;

/// Where a process's stdin comes from.
#[derive(Clone, Debug)]
pub(crate) enum Input {
    Null,
    /// A FIFO fed through [`Spawned::stdin`].
    Fifo,
    /// A staged file (an absolute path inside the sandbox).
    File(String),
}

impl Input {
    fn word(&self) -> &str {
        match self {
            Self::Null => "null",
            Self::Fifo => "fifo",
            Self::File(path) => path,
        }
    }
}

/// One process to start.
pub(crate) struct Launch {
    pub nonce: String,
    /// The whole command line, from [`Scripts::spawn`] or [`Scripts::secret`].
    pub command: String,
    pub user: (u32, u32),
    pub env: BTreeMap<String, String>,
    /// The daemon's own timeout (a safety net under the exec engine's).
    pub timeout: Option<Duration>,
    pub input: Input,
    /// argv[0] and the cwd as the caller named them, for errors.
    pub program: String,
    pub cwd: String,
}

/// A fresh random nonce of 32 hex digits.
pub(crate) fn nonce() -> String {
    hex::encode(rand::random::<[u8; 16]>())
}

pub(crate) fn input_word(input: &Input) -> &str {
    input.word()
}

fn exit_info(code: i64) -> ExitInfo {
    if (129..=192).contains(&code) {
        ExitInfo { code: None, signal: Some((code - 128) as i32) }
    } else {
        ExitInfo { code: Some(code as i32), signal: None }
    }
}

type ExitSlot = watch::Sender<Option<std::result::Result<ExitInfo, String>>>;

pub(crate) async fn start(execd: &Execd, scripts: &Scripts, launch: Launch) -> Result<Spawned> {
    if launch.command.len() > MAX_COMMAND_BYTES {
        return Err(WorkspaceError::LimitExceeded {
            limit: "command line size on opensandbox",
            size: launch.command.len() as u64,
            max: MAX_COMMAND_BYTES as u64,
        });
    }
    let request = CommandRequest {
        command: launch.command,
        cwd: None,
        background: false,
        timeout: launch.timeout.map(|timeout| timeout.as_millis() as u64),
        uid: Some(launch.user.0),
        gid: Some(launch.user.1),
        envs: launch.env,
    };
    let command = execd.run(&request).await?;
    let (stdout_sender, stdout_receiver) = mpsc::channel(OUTPUT_BUFFER);
    let (stderr_sender, stderr_receiver) = mpsc::channel(OUTPUT_BUFFER);
    let (handshake_sender, handshake_receiver) = oneshot::channel();
    let (exit_sender, exit_receiver) = watch::channel(None);
    let exit_sender = Arc::new(exit_sender);
    let pump = tokio::spawn(pump(
        command.events,
        launch.nonce.clone(),
        handshake_sender,
        stdout_sender,
        stderr_sender,
        exit_sender.clone(),
    ));
    let mut control =
        Control { exit: exit_receiver, exit_sender, pump: Some(pump), execd: execd.clone(), id: command.id };
    let handshake = handshake_receiver.await.unwrap_or_else(|_| Handshake::Ended("the event reader stopped".into()));
    match handshake {
        Handshake::Started => {}
        Handshake::Refused(kind) => {
            control.stop();
            return Err(refusal(&kind, launch.program, launch.cwd));
        }
        Handshake::Ended(output) => {
            control.stop();
            return Err(WorkspaceError::SpawnFailed {
                program: launch.program,
                reason: format!("the sandbox did not start it: {}", output.trim()),
            });
        }
    }
    let stdin: berth_workspace::backend::BoxedWriter = match launch.input {
        Input::Fifo => {
            let (writer, reader) = tokio::io::duplex(64 * 1024);
            tokio::spawn(feed_stdin(execd.clone(), scripts.clone(), launch.nonce, launch.user, reader));
            Box::pin(writer)
        }
        Input::Null | Input::File(_) => Box::pin(tokio::io::sink()),
    };
    Ok(Spawned {
        stdin,
        stdout: channel_reader(stdout_receiver),
        stderr: channel_reader(stderr_receiver),
        control: Box::new(control),
    })
}

fn refusal(kind: &str, program: String, path: String) -> WorkspaceError {
    match kind {
        "notfound" => WorkspaceError::NotFound { path },
        "notdir" => WorkspaceError::NotADirectory { path },
        "escape" => WorkspaceError::PathEscapesRoot { path },
        "isdir" => WorkspaceError::IsADirectory { path },
        "notregular" => WorkspaceError::InvalidArgument(format!("{path:?} is not a regular file")),
        "pinmismatch" => WorkspaceError::InvalidArgument(format!(
            "the SHA-256 of {program:?} does not match the pin of the declaration"
        )),
        "inworkspace" => WorkspaceError::SpawnFailed {
            program,
            reason: "a secret-holding process runs a workspace program only with a sha256 pin".into(),
        },
        "notsystem" => WorkspaceError::SpawnFailed {
            program,
            reason: "an unpinned secret-holding program must be owned by root and writable by no one else".into(),
        },
        "noexec" => WorkspaceError::SpawnFailed {
            program,
            reason: "the sandbox's /tmp is mounted noexec, so the checked program copy cannot run".into(),
        },
        "private" | "stdin" => WorkspaceError::Backend {
            backend: BACKEND_NAME,
            message: format!("cannot prepare the process's private files ({kind})"),
        },
        _ => WorkspaceError::SpawnFailed { program, reason: "not found in PATH, or not an executable file".into() },
    }
}

fn channel_reader(receiver: mpsc::Receiver<Bytes>) -> berth_workspace::backend::BoxedReader {
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        let chunk = receiver.recv().await?;
        Some((Ok::<_, io::Error>(chunk), receiver))
    });
    Box::pin(StreamReader::new(stream.boxed()))
}

enum Handshake {
    Started,
    Refused(String),
    Ended(String),
}

/// Decodes `od -An -v -tx1` output: two hex digits per byte, whitespace between; a byte
/// split across two events waits for its second digit.
#[derive(Default)]
pub(crate) struct HexDecoder {
    pending: Option<u8>,
}

impl HexDecoder {
    pub fn feed(&mut self, text: &str) -> Vec<u8> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        for byte in text.bytes() {
            let nibble = match byte {
                b'0'..=b'9' => byte - b'0',
                b'a'..=b'f' => byte - b'a' + 10,
                b'A'..=b'F' => byte - b'A' + 10,
                _ => {
                    self.pending = None;
                    continue;
                }
            };
            match self.pending.take() {
                Some(high) => out.push(high << 4 | nibble),
                None => self.pending = Some(nibble),
            }
        }
        out
    }
}

/// The handshake line of `nonce` in the early stderr text, and what follows it.
fn find_handshake<'a>(text: &'a str, nonce: &str) -> Option<(Handshake, &'a str)> {
    let marker = format!("berth-{nonce} ");
    let start = text.find(&marker)?;
    let line_end = text[start..].find('\n')? + start;
    let words: Vec<&str> = text[start + marker.len()..line_end].split_whitespace().collect();
    let handshake = match words.as_slice() {
        ["ok", ..] => Handshake::Started,
        ["fail", kind, ..] => Handshake::Refused((*kind).to_owned()),
        _ => Handshake::Ended(text.to_owned()),
    };
    Some((handshake, &text[line_end + 1..]))
}

async fn pump(
    mut events: EventStream,
    nonce: String,
    handshake: oneshot::Sender<Handshake>,
    stdout: mpsc::Sender<Bytes>,
    stderr: mpsc::Sender<Bytes>,
    exit: Arc<ExitSlot>,
) {
    let mut handshake = Some(handshake);
    let mut early_stderr = String::new();
    let mut early_stdout: Vec<Bytes> = Vec::new();
    let (mut out_hex, mut err_hex) = (HexDecoder::default(), HexDecoder::default());
    let outcome = loop {
        let event: Event = match events.next().await {
            Ok(Some(event)) => event,
            Ok(None) => break Err("the command stream ended without an exit".to_owned()),
            Err(error) => break Err(error.to_string()),
        };
        let text = event.text.as_deref().unwrap_or_default();
        match event.kind.as_str() {
            "stdout" => {
                let bytes = Bytes::from(out_hex.feed(text));
                if bytes.is_empty() {
                    continue;
                }
                if handshake.is_some() {
                    early_stdout.push(bytes);
                } else {
                    let _ = stdout.send(bytes).await;
                }
            }
            "stderr" if handshake.is_some() => {
                early_stderr.push_str(text);
                if let Some((found, rest)) = find_handshake(&early_stderr, &nonce) {
                    let started = matches!(found, Handshake::Started);
                    let rest = rest.to_owned();
                    if let Some(sender) = handshake.take() {
                        let _ = sender.send(found);
                    }
                    if !started {
                        break Err("refused".into());
                    }
                    for chunk in early_stdout.drain(..) {
                        let _ = stdout.send(chunk).await;
                    }
                    let bytes = err_hex.feed(&rest);
                    if !bytes.is_empty() {
                        let _ = stderr.send(Bytes::from(bytes)).await;
                    }
                }
            }
            "stderr" => {
                let bytes = err_hex.feed(text);
                if !bytes.is_empty() {
                    let _ = stderr.send(Bytes::from(bytes)).await;
                }
            }
            _ => match event.ending() {
                Some(Ending::Exited(code)) => break Ok(code),
                Some(Ending::Failed(message)) => break Err(message),
                None => {}
            },
        }
    };
    if let Some(sender) = handshake.take() {
        let output = match &outcome {
            Ok(code) => format!("exit status {code}: {early_stderr}"),
            Err(message) => format!("{message}: {early_stderr}"),
        };
        let _ = sender.send(Handshake::Ended(output));
    }
    // Output is all sent before the exit is known: the exec engine reads exit, then drains.
    drop(stdout);
    drop(stderr);
    exit.send_if_modified(|slot| {
        if slot.is_some() {
            return false;
        }
        *slot = Some(outcome.map(exit_info));
        true
    });
}

struct Control {
    exit: watch::Receiver<Option<std::result::Result<ExitInfo, String>>>,
    exit_sender: Arc<ExitSlot>,
    pump: Option<JoinHandle<()>>,
    execd: Execd,
    id: String,
}

impl Control {
    fn exited(&self) -> bool {
        self.exit.borrow().is_some()
    }

    /// Closes the command's stream (the daemon kills its group) and interrupts it.
    fn stop(&mut self) {
        if let Some(pump) = self.pump.take() {
            pump.abort();
        }
        let newly = self.exit_sender.send_if_modified(|slot| {
            if slot.is_some() {
                return false;
            }
            *slot = Some(Ok(ExitInfo { code: None, signal: Some(9) }));
            true
        });
        if newly && let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (execd, id) = (self.execd.clone(), self.id.clone());
            runtime.spawn(async move {
                if let Err(error) = execd.interrupt(&id).await {
                    tracing::debug!(%error, "interrupting a killed opensandbox command failed");
                }
            });
        }
    }
}

#[async_trait]
impl ProcessControl for Control {
    async fn wait(&mut self) -> Result<ExitInfo> {
        loop {
            if let Some(outcome) = self.exit.borrow().clone() {
                return outcome.map_err(|message| WorkspaceError::Backend { backend: BACKEND_NAME, message });
            }
            if self.exit.changed().await.is_err() {
                return Err(WorkspaceError::Backend {
                    backend: BACKEND_NAME,
                    message: "the process's reader vanished".into(),
                });
            }
        }
    }

    async fn kill(&mut self) -> Result<()> {
        self.stop();
        Ok(())
    }
}

impl Drop for Control {
    fn drop(&mut self) {
        if !self.exited() {
            self.stop();
        }
    }
}

/// Feeds what is written to a spawned process's stdin to its FIFO, chunk by chunk, then
/// ends its input when the writer is closed or dropped.
async fn feed_stdin(
    execd: Execd,
    scripts: Scripts,
    nonce: String,
    user: (u32, u32),
    mut reader: tokio::io::DuplexStream,
) {
    let request = |command: String| CommandRequest {
        command,
        uid: Some(user.0),
        gid: Some(user.1),
        timeout: Some(600_000),
        ..CommandRequest::default()
    };
    let mut buffer = vec![0u8; STDIN_CHUNK_BYTES];
    loop {
        let count = match reader.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(count) => count,
        };
        let command = scripts.stdin(&nonce, Some(&buffer[..count]));
        match execd.run_collect(&request(command)).await {
            Ok(collected) if collected.ending == Ending::Exited(0) => {}
            Ok(collected) => {
                if collected.ending != Ending::Exited(STDIN_GONE_EXIT_CODE) {
                    tracing::debug!(?collected, "feeding stdin of an opensandbox process failed");
                }
                return;
            }
            Err(error) => {
                tracing::debug!(%error, "feeding stdin of an opensandbox process failed");
                return;
            }
        }
    }
    if let Err(error) = execd.run_collect(&request(scripts.stdin(&nonce, None))).await {
        tracing::debug!(%error, "closing stdin of an opensandbox process failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_od_output_split_anywhere() {
        let mut decoder = HexDecoder::default();
        let mut bytes = decoder.feed(" 00 01 f");
        bytes.extend(decoder.feed("f 7a\n 41"));
        assert_eq!(bytes, [0x00, 0x01, 0xff, 0x7a, 0x41]);
        assert_eq!(exit_info(137), ExitInfo { code: None, signal: Some(9) });
        assert_eq!(exit_info(3), ExitInfo { code: Some(3), signal: None });
    }

    #[test]
    fn finds_the_handshake() {
        let (found, rest) = find_handshake("noise\nberth-abc ok\n 41 42", "abc").unwrap();
        assert!(matches!(found, Handshake::Started));
        assert_eq!(rest, " 41 42");
        assert!(
            matches!(find_handshake("berth-abc fail noprogram\n", "abc").unwrap().0, Handshake::Refused(kind) if kind == "noprogram")
        );
        assert!(find_handshake("berth-abc o", "abc").is_none());
    }
}
