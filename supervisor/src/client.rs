//! The node agent's socket calls: a control pair, passing fds, an exec's connection.

use std::io;
use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

use super::sys;

/// A close-on-exec `SOCK_STREAM` pair for the control channel: (the node's end, the
/// supervisor's end). Each spawn is one byte with its fds, sent in one `sendmsg` (so one
/// kernel buffer: concurrent senders never interleave) and read one byte at a time (so
/// every read returns exactly one message's fds).
pub fn control_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (ours, theirs) = sys::stream_pair()?;
    Ok(owned_pair(ours, theirs))
}

/// A close-on-exec `SOCK_STREAM` pair for one exec: (the node's end, the shim's end).
pub fn connection_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (ours, theirs) = sys::stream_pair()?;
    Ok(owned_pair(ours, theirs))
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let (read, write) = sys::pipe_cloexec()?;
    Ok(owned_pair(read, write))
}

fn owned_pair(first: i32, second: i32) -> (OwnedFd, OwnedFd) {
    // SAFETY: both fds were just created by socketpair(2) and are owned by nobody else.
    #[allow(unsafe_code)]
    unsafe {
        (OwnedFd::from_raw_fd(first), OwnedFd::from_raw_fd(second))
    }
}

/// Sends `bytes` with `fds` attached on `socket`, without blocking (`WouldBlock` when the
/// socket is full) and without `SIGPIPE` (`BrokenPipe` when the supervisor is gone).
pub fn send_with_fds(socket: BorrowedFd<'_>, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<usize> {
    let raw: Vec<i32> = fds.iter().map(|fd| fd.as_raw_fd()).collect();
    sys::send_with_fds(socket.as_raw_fd(), bytes, &raw)
}

/// Receives from `socket` without blocking (`WouldBlock` when nothing is queued), closing
/// any fds that came with the bytes (the node expects none). `Ok(0)`: the peer is gone.
pub fn recv_no_fds(socket: BorrowedFd<'_>, buffer: &mut [u8]) -> io::Result<usize> {
    match sys::recv_with_fds(socket.as_raw_fd(), buffer)? {
        Some((len, fds)) => {
            fds.into_iter().for_each(sys::close_fd);
            Ok(len)
        }
        None => Err(io::ErrorKind::WouldBlock.into()),
    }
}
