//! Derived exec: drives a [`Spawned`] process to completion (stdin, timeout, output caps).
//!
//! One engine serves both faces. [`stream_events`] spawns a pump task that feeds stdin,
//! reads stdout and stderr concurrently, enforces the timeout and the per-stream caps, and
//! sends [`ExecEvent`]s into a bounded channel. [`run_to_completion`] consumes that stream
//! into buffers, so unary and streamed exec cannot drift apart in semantics.
//!
//! Requirement on backends: [`ProcessControl::wait`] must be cancel-safe (the pump polls it
//! inside `select!` next to the pipes); `tokio::process::Child::wait` is.

use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};

use crate::error::{Result, WorkspaceError};
use crate::process::{BoxedReader, BoxedWriter, ExecEvent, ExecOutput, ExecSpec, ExitInfo, ProcessControl, Spawned};

/// Size of one read from a pipe, and so the largest output chunk.
const READ_CHUNK_BYTES: usize = 64 * 1024;
/// After the process exits, how long output is still read. An orphan that inherited the pipe
/// would otherwise keep the call open for as long as it lives.
pub const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(500);
/// How long a killed process may take to be reaped before the exec gives up on it.
const KILL_GRACE: Duration = Duration::from_secs(10);
/// Events buffered between the pump and a slow consumer; past it the pump stops reading and
/// the child blocks on its pipe (back-pressure, not unbounded memory).
const EVENT_BUFFER: usize = 8;

/// Runs a spawned process to completion and collects its capped output.
///
/// Errors: only when the backend fails (`wait`/`kill`/pipe read errors); a non-zero exit, a
/// signal or a timeout are results, not errors.
pub async fn run_to_completion(spawned: Spawned, spec: &ExecSpec) -> Result<ExecOutput> {
    // The pump runs in this task, beside the collector, rather than as a task of its own:
    // a unary exec then costs no task spawn and no cross-task wake-ups. Dropping this future
    // drops the pump, and with it the process tree, as dropping the stream does.
    let (sender, mut events) = mpsc::channel(EVENT_BUFFER);
    let collect = async move {
        // The pump already caps each stream, so these buffers are bounded by max_output_bytes.
        let mut stdout = BytesMut::new();
        let mut stderr = BytesMut::new();
        while let Some(event) = events.recv().await {
            match event? {
                ExecEvent::Stdout(chunk) => stdout.extend_from_slice(&chunk),
                ExecEvent::Stderr(chunk) => stderr.extend_from_slice(&chunk),
                ExecEvent::Exit(mut output) => {
                    output.stdout = stdout.freeze();
                    output.stderr = stderr.freeze();
                    return Ok(output);
                }
            }
        }
        Err(WorkspaceError::Backend { backend: "exec", message: "process output ended without an exit status".into() })
    };
    let ((), output) = futures::future::join(pump(spawned, spec.clone(), sender), collect).await;
    output
}

/// Streams a spawned process's output as events, then exactly one `Exit` (see
/// [`ExecEvent`]). Must be called inside a tokio runtime.
///
/// Dropping the stream drops the pump's [`ProcessControl`] without a completed `wait`,
/// which kills the process tree (the `ProcessControl` drop contract).
pub fn stream_events(spawned: Spawned, spec: ExecSpec) -> BoxStream<'static, Result<ExecEvent>> {
    let (sender, receiver) = mpsc::channel(EVENT_BUFFER);
    tokio::spawn(pump(spawned, spec, sender));
    futures::stream::unfold(receiver, |mut receiver| async move {
        let event = receiver.recv().await?;
        Some((event, receiver))
    })
    .boxed()
}

/// Why the pump stopped early.
enum Stop {
    /// The consumer dropped the stream; nobody is left to tell.
    ConsumerGone,
    Failed(WorkspaceError),
}

/// State of one running exec. Progress lives here, not in future locals, so every
/// `select!` arm of the loop is cancel-safe.
struct Pump {
    control: Box<dyn ProcessControl>,
    events: mpsc::Sender<Result<ExecEvent>>,
    started: Instant,
    deadline: Instant,
    timeout: Duration,
    timed_out: bool,
    exit: Option<ExitInfo>,
}

async fn pump(spawned: Spawned, spec: ExecSpec, events: mpsc::Sender<Result<ExecEvent>>) {
    let Spawned { stdin, stdout, stderr, control } = spawned;
    let started = Instant::now();
    let mut state = Pump {
        control,
        events,
        started,
        deadline: started + spec.timeout,
        timeout: spec.timeout,
        timed_out: false,
        exit: None,
    };
    let mut stdout = OutputPipe::new(stdout, spec.max_output_bytes);
    let mut stderr = OutputPipe::new(stderr, spec.max_output_bytes);
    // The writer is polled beside the readers, not after them: a child that reads stdin only
    // after filling its stdout pipe would otherwise deadlock against us.
    match while_feeding(state.run(&mut stdout, &mut stderr), feed_stdin(stdin, spec.stdin.clone())).await {
        Ok(()) => {
            let exit = state.exit.unwrap_or_default();
            let output = ExecOutput {
                exit_code: if state.timed_out { -1 } else { exit.code.unwrap_or(-1) },
                signal: exit.signal,
                stdout: Bytes::new(),
                stderr: Bytes::new(),
                timed_out: state.timed_out,
                stdout_truncated: stdout.truncated,
                stderr_truncated: stderr.truncated,
                duration: state.started.elapsed(),
            };
            // If the consumer left meanwhile there is nobody to tell; the process is reaped.
            let _ = state.deliver(Ok(ExecEvent::Exit(output))).await;
        }
        Err(Stop::ConsumerGone) => {}
        Err(Stop::Failed(error)) => {
            let _ = state.deliver(Err(error)).await;
        }
    }
    // `state.control` drops here: if `wait` never returned, that kills the process tree.
}

impl Pump {
    async fn run(&mut self, stdout: &mut OutputPipe, stderr: &mut OutputPipe) -> Result<(), Stop> {
        // Output is still read for DRAIN_AFTER_EXIT after the exit, not counting time spent
        // waiting for a slow consumer: that wait is not the orphan's fault, and cutting the
        // drain short there would lose output the process wrote before it exited.
        let mut drain_deadline: Option<Instant> = None;
        loop {
            if self.exit.is_some() && stdout.is_done() && stderr.is_done() {
                return Ok(());
            }
            let kill_deadline = self.deadline + KILL_GRACE;
            // Not `biased`: a chatty stdout must not starve stderr (or the other way round).
            tokio::select! {
                _ = self.events.closed() => return Err(Stop::ConsumerGone),
                _ = sleep_until(self.deadline), if self.exit.is_none() && !self.timed_out => {
                    self.kill_for_timeout().await?;
                }
                _ = sleep_until(kill_deadline), if self.exit.is_none() && self.timed_out => {
                    return Err(Stop::Failed(WorkspaceError::Timeout {
                        operation: "reaping a killed exec",
                        millis: KILL_GRACE.as_millis() as u64,
                    }));
                }
                status = self.control.wait(), if self.exit.is_none() => {
                    self.exit = Some(status.map_err(Stop::Failed)?);
                    drain_deadline = Some(Instant::now() + DRAIN_AFTER_EXIT);
                }
                _ = sleep_until(drain_deadline.unwrap_or(self.deadline)), if drain_deadline.is_some() => {
                    // An orphan still holds a pipe; what it writes from now on is not ours.
                    stdout.abandon();
                    stderr.abandon();
                }
                read = stdout.next_chunk(), if !stdout.is_done() => {
                    if let Some(chunk) = read.map_err(|error| pipe_error("stdout", error))? {
                        self.deliver_output(ExecEvent::Stdout(chunk), &mut drain_deadline).await?;
                    }
                }
                read = stderr.next_chunk(), if !stderr.is_done() => {
                    if let Some(chunk) = read.map_err(|error| pipe_error("stderr", error))? {
                        self.deliver_output(ExecEvent::Stderr(chunk), &mut drain_deadline).await?;
                    }
                }
            }
        }
    }

    /// Delivers an output chunk; the time the consumer kept us waiting extends the drain.
    async fn deliver_output(&mut self, event: ExecEvent, drain_deadline: &mut Option<Instant>) -> Result<(), Stop> {
        let started = Instant::now();
        self.deliver(Ok(event)).await?;
        if let Some(deadline) = drain_deadline.as_mut() {
            *deadline += started.elapsed();
        }
        Ok(())
    }

    /// Sends one event, waiting for room in the channel while still enforcing the timeout.
    async fn deliver(&mut self, event: Result<ExecEvent>) -> Result<(), Stop> {
        // A clone, so the pending reservation does not borrow `self` while a kill needs it.
        let events = self.events.clone();
        let permit = loop {
            tokio::select! {
                biased;
                permit = events.reserve() => match permit {
                    Ok(permit) => break permit,
                    Err(_) => return Err(Stop::ConsumerGone),
                },
                _ = sleep_until(self.deadline), if self.exit.is_none() && !self.timed_out => {
                    self.kill_for_timeout().await?;
                }
            }
        };
        permit.send(event);
        Ok(())
    }

    async fn kill_for_timeout(&mut self) -> Result<(), Stop> {
        tracing::debug!(timeout_ms = self.timeout.as_millis() as u64, "exec timed out, killing its process tree");
        self.timed_out = true;
        self.control.kill().await.map_err(Stop::Failed)
    }
}

fn pipe_error(stream: &'static str, source: std::io::Error) -> Stop {
    Stop::Failed(WorkspaceError::Io { op: "read exec output", path: stream.to_owned(), source })
}

/// Runs `work` to its end while `feed` makes progress beside it; `feed` is dropped when
/// `work` ends, finished or not.
async fn while_feeding<T>(work: impl Future<Output = T>, feed: impl Future<Output = ()>) -> T {
    let mut work = std::pin::pin!(work);
    let mut feed = std::pin::pin!(feed);
    let mut fed = false;
    loop {
        tokio::select! {
            biased;
            output = &mut work => return output,
            () = &mut feed, if !fed => fed = true,
        }
    }
}

/// Writes stdin, then closes it so the child sees EOF. Write errors are expected and
/// ignored: a child that exits (or closes stdin) without reading it is not a failure.
async fn feed_stdin(mut stdin: BoxedWriter, data: Bytes) {
    if !data.is_empty() {
        let _ = stdin.write_all(&data).await;
    }
    let _ = stdin.shutdown().await;
    // `stdin` drops here, closing the pipe.
}

/// One output pipe with its cap: bytes past `remaining` are read and dropped, so the child
/// never blocks on a full pipe.
struct OutputPipe {
    reader: Option<BoxedReader>,
    /// Read into without being zeroed first; a chunk is split off it (no copy) or, when
    /// small, copied out so the buffer is reused.
    buffer: BytesMut,
    remaining: usize,
    truncated: bool,
}

/// Chunks up to this size are copied out of the read buffer, which is then reused; larger
/// ones are split off it without a copy.
const COPY_OUT_BYTES: usize = 4 * 1024;

impl OutputPipe {
    fn new(reader: BoxedReader, cap: usize) -> Self {
        Self { reader: Some(reader), buffer: BytesMut::new(), remaining: cap, truncated: false }
    }

    fn is_done(&self) -> bool {
        self.reader.is_none()
    }

    /// Stops reading (the pipe is closed by dropping the reader).
    fn abandon(&mut self) {
        self.reader = None;
    }

    /// Reads once. `Some(chunk)` is output within the cap; `None` means EOF (the pipe is then
    /// done) or that everything read was past the cap. Cancel-safe: the only await is the
    /// read itself, and `read_buf` keeps nothing when cancelled.
    async fn next_chunk(&mut self) -> std::io::Result<Option<Bytes>> {
        let Some(reader) = self.reader.as_mut() else {
            return Ok(None);
        };
        self.buffer.clear();
        self.buffer.reserve(READ_CHUNK_BYTES);
        // At most one chunk's worth, whatever room a reused buffer has.
        let read = reader.read_buf(&mut (&mut self.buffer).limit(READ_CHUNK_BYTES)).await?;
        if read == 0 {
            self.reader = None;
            return Ok(None);
        }
        let kept = read.min(self.remaining);
        if kept < read {
            self.truncated = true;
        }
        self.remaining -= kept;
        Ok(match kept {
            0 => None,
            small if small <= COPY_OUT_BYTES => Some(Bytes::copy_from_slice(&self.buffer[..small])),
            large => Some(self.buffer.split_to(large).freeze()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use async_trait::async_trait;
    use tokio::io::{AsyncWriteExt, duplex};

    /// A process whose "exit" is driven by a oneshot, for engine tests without spawning.
    struct FakeControl {
        exit: Option<tokio::sync::oneshot::Receiver<ExitInfo>>,
        killed: std::sync::Arc<std::sync::atomic::AtomicBool>,
        status: Option<ExitInfo>,
    }

    #[async_trait]
    impl ProcessControl for FakeControl {
        async fn wait(&mut self) -> Result<ExitInfo> {
            if let Some(status) = self.status {
                return Ok(status);
            }
            let status = match self.exit.as_mut() {
                Some(receiver) => receiver.await.unwrap_or(ExitInfo { code: None, signal: Some(9) }),
                None => std::future::pending().await,
            };
            self.status = Some(status);
            Ok(status)
        }
        async fn kill(&mut self) -> Result<()> {
            self.killed.store(true, std::sync::atomic::Ordering::SeqCst);
            // A kill makes the process exit with SIGKILL.
            self.status = Some(ExitInfo { code: None, signal: Some(9) });
            Ok(())
        }
    }

    /// A fake process on these pipes that exits when `exit` says so.
    fn exiting_on(
        exit: tokio::sync::oneshot::Receiver<ExitInfo>,
        stdin: tokio::io::DuplexStream,
        stdout: tokio::io::DuplexStream,
        stderr: tokio::io::DuplexStream,
    ) -> Spawned {
        let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        Spawned {
            stdin: Box::pin(stdin),
            stdout: Box::pin(stdout),
            stderr: Box::pin(stderr),
            control: Box::new(FakeControl { exit: Some(exit), killed, status: None }),
        }
    }

    #[tokio::test]
    async fn caps_and_orders_output() {
        let (stdin_writer, _stdin_reader) = duplex(1024);
        let (mut out_writer, out_reader) = duplex(1024);
        let (err_writer, err_reader) = duplex(1024);
        let (exit_sender, exit_receiver) = tokio::sync::oneshot::channel();
        let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spawned = Spawned {
            stdin: Box::pin(stdin_writer),
            stdout: Box::pin(out_reader),
            stderr: Box::pin(err_reader),
            control: Box::new(FakeControl { exit: Some(exit_receiver), killed: killed.clone(), status: None }),
        };
        let mut spec = ExecSpec::new(vec!["fake".into()]);
        spec.max_output_bytes = 5;
        let task = tokio::spawn(async move { run_to_completion(spawned, &spec).await });
        out_writer.write_all(b"hello world").await.unwrap();
        drop(out_writer);
        drop(err_writer);
        exit_sender.send(ExitInfo { code: Some(3), signal: None }).unwrap();
        let output = task.await.unwrap().unwrap();
        assert_eq!(output.exit_code, 3);
        assert_eq!(&output.stdout[..], b"hello");
        assert!(output.stdout_truncated);
        assert!(!output.stderr_truncated);
        assert!(!killed.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[tokio::test(start_paused = true)]
    async fn timeout_kills_and_reports() {
        let (stdin_writer, _stdin_reader) = duplex(1024);
        let (_out_writer, out_reader) = duplex(1024);
        let (_err_writer, err_reader) = duplex(1024);
        let killed = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spawned = Spawned {
            stdin: Box::pin(stdin_writer),
            stdout: Box::pin(out_reader),
            stderr: Box::pin(err_reader),
            control: Box::new(FakeControl { exit: None, killed: killed.clone(), status: None }),
        };
        let mut spec = ExecSpec::new(vec!["fake".into()]);
        spec.timeout = Duration::from_secs(2);
        // The writers stay open (an orphan holding the pipes): the drain bound ends the call.
        let output = run_to_completion(spawned, &spec).await.unwrap();
        assert!(output.timed_out);
        assert_eq!(output.exit_code, -1);
        assert_eq!(output.signal, Some(9));
        assert!(killed.load(std::sync::atomic::Ordering::SeqCst));
        assert!(output.duration >= Duration::from_secs(2));
        assert!(output.duration < Duration::from_secs(2) + DRAIN_AFTER_EXIT * 2);
    }

    #[tokio::test(start_paused = true)]
    async fn slow_consumer_does_not_lose_output_written_before_exit() {
        let (stdin_writer, _stdin_reader) = duplex(1024);
        let (mut out_writer, out_reader) = duplex(4 * 1024 * 1024);
        let (_err_writer, err_reader) = duplex(1024);
        let (exit_sender, exit_receiver) = tokio::sync::oneshot::channel();
        // More than the event channel holds, all written before the exit; the writer stays
        // open afterwards like an orphan holding the pipe.
        let payload = vec![b'o'; 2 * 1024 * 1024];
        out_writer.write_all(&payload).await.unwrap();
        exit_sender.send(ExitInfo { code: Some(0), signal: None }).unwrap();
        let spawned = exiting_on(exit_receiver, stdin_writer, out_reader, err_reader);
        let mut spec = ExecSpec::new(vec!["fake".into()]);
        spec.max_output_bytes = payload.len();
        let mut events = stream_events(spawned, spec);
        let mut received = 0;
        let mut exits = 0;
        while let Some(event) = events.next().await {
            match event.unwrap() {
                ExecEvent::Stdout(chunk) => received += chunk.len(),
                ExecEvent::Stderr(_) => {}
                ExecEvent::Exit(output) => {
                    exits += 1;
                    assert!(!output.stdout_truncated);
                }
            }
            // A consumer far slower than the drain window.
            tokio::time::sleep(DRAIN_AFTER_EXIT).await;
        }
        assert_eq!((received, exits), (payload.len(), 1));
        drop(out_writer);
    }

    /// A `cat` whose pipes hold far less than its input: the exec must write stdin while it
    /// reads stdout, and every byte must come back in order whatever the size of each read
    /// (small ones are copied out of the read buffer, large ones split off it).
    #[tokio::test]
    async fn feeds_stdin_while_reading_output_and_keeps_every_byte() {
        let (stdin_writer, mut stdin_reader) = duplex(16 * 1024);
        let (mut out_writer, out_reader) = duplex(96 * 1024);
        let (err_writer, err_reader) = duplex(1024);
        let (exit_sender, exit_receiver) = tokio::sync::oneshot::channel();
        let input: Vec<u8> = (0..3 * 1024 * 1024 + 17).map(|index: u32| (index % 251) as u8).collect();
        let cat = tokio::spawn(async move {
            let mut block = vec![0; 3000];
            loop {
                let read = stdin_reader.read(&mut block).await.unwrap();
                if read == 0 {
                    break;
                }
                out_writer.write_all(&block[..read]).await.unwrap();
            }
            drop((out_writer, err_writer));
            exit_sender.send(ExitInfo { code: Some(0), signal: None }).unwrap();
        });
        let spawned = exiting_on(exit_receiver, stdin_writer, out_reader, err_reader);
        let mut spec = ExecSpec::new(vec!["cat".into()]);
        spec.stdin = Bytes::from(input.clone());
        spec.max_output_bytes = input.len() - 5;
        let output = tokio::time::timeout(Duration::from_secs(30), run_to_completion(spawned, &spec))
            .await
            .expect("stdin and stdout were served together")
            .unwrap();
        cat.await.unwrap();
        assert_eq!(output.exit_code, 0);
        assert!(output.stdout_truncated);
        assert_eq!(output.stdout.len(), input.len() - 5);
        assert!(output.stdout[..] == input[..input.len() - 5], "output differs from its input");
    }
}
