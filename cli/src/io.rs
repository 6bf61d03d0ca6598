//! The standard streams a command reads and writes, injectable for tests.
//!
//! Commands never use `print!`/`println!`: those panic when stdout is a closed pipe, and
//! they cannot be captured by an in-process test.

use std::fmt;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

/// Exit status when the reader of our stdout went away (`berth fs read ... | head`), as
/// a program killed by SIGPIPE would report it; the shell prints nothing for it either.
pub const EXIT_STDOUT_CLOSED: i32 = 128 + 13;

/// Our stdout was closed by its reader. Not worth an `error:` line: the reader chose to
/// stop, nothing failed.
#[derive(Debug)]
pub struct StdoutClosed;

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("write to stdout: reader closed the pipe")
    }
}

impl std::error::Error for StdoutClosed {}

/// Whether `error` (at any depth of context) is [`StdoutClosed`].
pub fn is_stdout_closed(error: &anyhow::Error) -> bool {
    error.downcast_ref::<StdoutClosed>().is_some()
}

fn stdout_error(error: std::io::Error) -> anyhow::Error {
    if error.kind() == std::io::ErrorKind::BrokenPipe {
        anyhow::Error::new(StdoutClosed)
    } else {
        anyhow::anyhow!("write to stdout: {error}")
    }
}

/// Borrowed standard streams of one command run.
pub struct Io<'a> {
    pub stdin: &'a mut (dyn AsyncRead + Unpin + Send),
    pub stdout: &'a mut (dyn AsyncWrite + Unpin + Send),
    pub stderr: &'a mut (dyn AsyncWrite + Unpin + Send),
}

impl Io<'_> {
    /// Writes all of `bytes` to stdout.
    pub async fn write_stdout(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.stdout.write_all(bytes).await.map_err(stdout_error)
    }

    /// Pushes buffered stdout out now (for output that should appear as it happens).
    pub async fn flush_stdout(&mut self) -> anyhow::Result<()> {
        self.stdout.flush().await.map_err(stdout_error)
    }

    /// Writes all of `bytes` to stderr.
    pub async fn write_stderr(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        self.stderr.write_all(bytes).await.map_err(|error| anyhow::anyhow!("write to stderr: {error}"))
    }

    /// Prints `warning: <message>` on stderr; for facts the user must notice but that do
    /// not make the command fail (e.g. truncated output).
    pub async fn warn(&mut self, message: &str) -> anyhow::Result<()> {
        self.write_stderr(format!("warning: {message}\n").as_bytes()).await
    }

    /// Flushes stdout and stderr; tokio's standard streams buffer internally.
    pub async fn flush(&mut self) -> anyhow::Result<()> {
        self.flush_stdout().await?;
        self.stderr.flush().await.map_err(|error| anyhow::anyhow!("write to stderr: {error}"))
    }
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use super::*;

    /// A stdout whose reader has gone away.
    struct ClosedPipe;

    impl AsyncWrite for ClosedPipe {
        fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<std::io::Result<usize>> {
            Poll::Ready(Err(std::io::ErrorKind::BrokenPipe.into()))
        }
        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn closed_stdout_is_recognised_through_context() {
        let mut stdout = ClosedPipe;
        let mut stderr = Vec::new();
        let mut io = Io { stdin: &mut tokio::io::empty(), stdout: &mut stdout, stderr: &mut stderr };
        let error = io.write_stdout(b"x").await.unwrap_err().context("read ws:f");
        assert!(is_stdout_closed(&error));
        assert!(!is_stdout_closed(&anyhow::anyhow!("write to stdout: disk full")));
    }
}
