//! The Linux calls the supervisor needs, declared by hand (the binary is compiled without
//! any crate but std, see the crate docs) and wrapped into functions that return
//! `io::Result`. Layouts are those of Linux on x86_64 and aarch64 (glibc and musl agree).
//!
//! Every `unsafe` block of the crate is here. The wrappers take and return plain fds
//! (`RawFd`): the supervisor forks, and after a fork ownership is per process anyway.

#![allow(unsafe_code, non_camel_case_types, dead_code)]

use std::ffi::{CStr, c_char, c_int, c_long, c_uint, c_ulong, c_void};
use std::io;
use std::os::fd::RawFd;

pub type pid_t = i32;

#[repr(C)]
struct iovec {
    iov_base: *mut c_void,
    iov_len: usize,
}

#[repr(C)]
struct msghdr {
    msg_name: *mut c_void,
    msg_namelen: u32,
    msg_iov: *mut iovec,
    msg_iovlen: usize,
    msg_control: *mut c_void,
    msg_controllen: usize,
    msg_flags: c_int,
}

#[repr(C)]
struct cmsghdr {
    cmsg_len: usize,
    cmsg_level: c_int,
    cmsg_type: c_int,
}

#[repr(C)]
pub struct pollfd {
    pub fd: c_int,
    pub events: i16,
    pub revents: i16,
}

#[repr(C)]
struct sockaddr_un {
    sun_family: u16,
    sun_path: [u8; 108],
}

#[repr(C)]
struct rlimit {
    rlim_cur: u64,
    rlim_max: u64,
}

#[repr(C)]
struct cap_header {
    version: u32,
    pid: c_int,
}

#[repr(C)]
struct cap_data {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

unsafe extern "C" {
    fn __errno_location() -> *mut c_int;
    fn fork() -> pid_t;
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
    fn _exit(status: c_int) -> !;
    fn dup2(old: c_int, new: c_int) -> c_int;
    fn close(fd: c_int) -> c_int;
    fn setsid() -> pid_t;
    fn chdir(path: *const c_char) -> c_int;
    fn fchdir(fd: c_int) -> c_int;
    fn setrlimit(resource: c_int, limit: *const rlimit) -> c_int;
    fn kill(pid: pid_t, signal: c_int) -> c_int;
    fn waitpid(pid: pid_t, status: *mut c_int, options: c_int) -> pid_t;
    fn poll(fds: *mut pollfd, count: c_ulong, timeout_ms: c_int) -> c_int;
    fn recvmsg(fd: c_int, message: *mut msghdr, flags: c_int) -> isize;
    fn sendmsg(fd: c_int, message: *const msghdr, flags: c_int) -> isize;
    fn send(fd: c_int, buffer: *const c_void, len: usize, flags: c_int) -> isize;
    fn recv(fd: c_int, buffer: *mut c_void, len: usize, flags: c_int) -> isize;
    fn pipe2(fds: *mut c_int, flags: c_int) -> c_int;
    fn socketpair(domain: c_int, kind: c_int, protocol: c_int, fds: *mut c_int) -> c_int;
    fn shutdown(fd: c_int, how: c_int) -> c_int;
    fn fcntl(fd: c_int, command: c_int, ...) -> c_int;
    fn prctl(option: c_int, ...) -> c_int;
    fn syscall(number: c_long, ...) -> c_long;
    fn unshare(flags: c_int) -> c_int;
    fn mount(
        source: *const c_char,
        target: *const c_char,
        fstype: *const c_char,
        flags: c_ulong,
        data: *const c_void,
    ) -> c_int;
    fn getpid() -> pid_t;
    fn sigprocmask(how: c_int, set: *const c_void, old: *mut c_void) -> c_int;
    fn socket(domain: c_int, kind: c_int, protocol: c_int) -> c_int;
    fn connect(fd: c_int, address: *const sockaddr_un, len: u32) -> c_int;
    fn open(path: *const c_char, flags: c_int, ...) -> c_int;
    fn clone(
        child: extern "C" fn(*mut c_void) -> c_int,
        stack: *mut c_void,
        flags: c_int,
        arg: *mut c_void,
        ...
    ) -> c_int;
    fn mmap(address: *mut c_void, len: usize, protection: c_int, flags: c_int, fd: c_int, offset: i64) -> *mut c_void;
    fn mprotect(address: *mut c_void, len: usize, protection: c_int) -> c_int;
    fn munmap(address: *mut c_void, len: usize) -> c_int;
    #[link_name = "signal"]
    fn set_disposition(signal: c_int, handler: usize) -> usize;
}

pub const SIGKILL: c_int = 9;
const SIGPIPE: c_int = 13;
const SIG_DFL: usize = 0;
const SIG_ERR: usize = usize::MAX;
pub const WNOHANG: c_int = 1;
pub const POLLIN: i16 = 0x1;
pub const POLLERR: i16 = 0x8;
pub const POLLHUP: i16 = 0x10;
pub const ENOENT: i32 = 2;
pub const EINTR: i32 = 4;
pub const ENOEXEC: i32 = 8;
pub const ECHILD: i32 = 10;
pub const EAGAIN: i32 = 11;
pub const EACCES: i32 = 13;
pub const ENOTDIR: i32 = 20;
pub const EXDEV: i32 = 18;
pub const ELOOP: i32 = 40;
pub const ENOSYS: i32 = 38;
pub const ESRCH: i32 = 3;
const AF_UNIX: c_int = 1;
const SOCK_STREAM: c_int = 1;
const SOCK_SEQPACKET: c_int = 5;
const SOCK_CLOEXEC: c_int = 0o2000000;
const O_CLOEXEC: c_int = 0o2000000;
const SOL_SOCKET: c_int = 1;
const SCM_RIGHTS: c_int = 1;
const MSG_DONTWAIT: c_int = 0x40;
const MSG_NOSIGNAL: c_int = 0x4000;
const MSG_CMSG_CLOEXEC: c_int = 0x4000_0000;
const SHUT_RD: c_int = 0;
const F_GETFD: c_int = 1;
const F_SETFD: c_int = 2;
const FD_CLOEXEC: c_int = 1;
const PR_SET_PDEATHSIG: c_int = 1;
const PR_SET_DUMPABLE: c_int = 4;
const PR_CAPBSET_READ: c_int = 23;
const PR_CAPBSET_DROP: c_int = 24;
const O_RDWR: c_int = 2;
const EPERM: i32 = 1;
const EINVAL: i32 = 22;
const PR_SET_CHILD_SUBREAPER: c_int = 36;
const PR_CAP_AMBIENT: c_int = 47;
const PR_CAP_AMBIENT_CLEAR_ALL: c_ulong = 4;
const CLONE_NEWNS: c_int = 0x0002_0000;
const MS_NOSUID: c_ulong = 2;
const MS_NODEV: c_ulong = 4;
const MS_REC: c_ulong = 16384;
const MS_PRIVATE: c_ulong = 1 << 18;
const SIG_SETMASK: c_int = 2;
const CLONE_VM: c_int = 0x0000_0100;
const CLONE_VFORK: c_int = 0x0000_4000;
const SIGCHLD: c_int = 17;
const PROT_NONE: c_int = 0;
const PROT_READ: c_int = 1;
const PROT_WRITE: c_int = 2;
const MAP_PRIVATE: c_int = 0x02;
const MAP_ANONYMOUS: c_int = 0x20;
const MAP_STACK: c_int = 0x0002_0000;
const PAGE: usize = 4096;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
/// Highest capability number the supervisor tries to drop from the bounding set; the loop
/// ends at the kernel's own last one (the first that answers `EINVAL`).
const CAP_LAST_TRIED: c_ulong = 63;

#[cfg(target_arch = "x86_64")]
const SYS_CAPSET: c_long = 126;
#[cfg(target_arch = "aarch64")]
const SYS_CAPSET: c_long = 91;
const SYS_PIDFD_OPEN: c_long = 434;
const SYS_CLOSE_RANGE: c_long = 436;
const SYS_OPENAT2: c_long = 437;

fn errno() -> i32 {
    // SAFETY: glibc and musl return a valid pointer to this thread's errno.
    unsafe { *__errno_location() }
}

fn check(result: c_int) -> io::Result<c_int> {
    if result < 0 { Err(io::Error::from_raw_os_error(errno())) } else { Ok(result) }
}

fn check_size(result: isize) -> io::Result<usize> {
    if result < 0 { Err(io::Error::from_raw_os_error(errno())) } else { Ok(result as usize) }
}

/// `fork(2)`: `Ok(0)` in the child, the child's pid in the parent. Callers are
/// single-threaded (the supervisor and its shims never start threads), so the child may
/// allocate and use std freely.
pub fn fork_process() -> io::Result<pid_t> {
    // SAFETY: no other thread exists whose locks the child could inherit held.
    check(unsafe { fork() })
}

/// The stack a [`spawn_sharing_memory`] child runs on: mapped once, untouched pages cost
/// nothing, and its lowest page is a guard (an overflow faults instead of writing into the
/// parent's memory).
pub struct ChildStack {
    base: *mut c_void,
    len: usize,
}

impl ChildStack {
    pub fn new(len: usize) -> io::Result<Self> {
        let len = len.next_multiple_of(PAGE).max(2 * PAGE);
        // SAFETY: an anonymous private mapping at an address of the kernel's choice.
        let base = unsafe {
            mmap(std::ptr::null_mut(), len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0)
        };
        if base as isize == -1 {
            return Err(io::Error::from_raw_os_error(errno()));
        }
        let stack = Self { base, len };
        // SAFETY: the first page of the mapping just made.
        check(unsafe { mprotect(base, PAGE, PROT_NONE) })?;
        Ok(stack)
    }
}

impl Drop for ChildStack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used (a child that ran on it has
        // exec'd or exited before `spawn_sharing_memory` returned).
        unsafe { munmap(self.base, self.len) };
    }
}

/// What the trampoline hands the child: its function and its context.
struct SharedChild<T> {
    child: fn(&mut T) -> !,
    context: *mut T,
}

extern "C" fn shared_child_entry<T>(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `SharedChild<T>` that `spawn_sharing_memory` keeps alive and
    // does not touch while this child runs (the parent is suspended until it execs or
    // exits); its `context` is a unique borrow for that time.
    let shared = unsafe { &*arg.cast::<SharedChild<T>>() };
    // SAFETY: as above.
    (shared.child)(unsafe { &mut *shared.context })
}

/// Starts a child with `clone(CLONE_VM | CLONE_VFORK | SIGCHLD)` that runs `child(context)`
/// on `stack` in this process's own memory (what `posix_spawn` does): no page tables are
/// copied and no page is faulted in twice, which is most of what a `fork` before an
/// `execve` costs. This process is suspended until the child has exec'd or exited; returns
/// its pid. Whatever `child` writes into `context` (an error before its `execve`, say) is
/// there when this returns.
///
/// `child` must end in [`exec`] or [`exit_now`] and make nothing but system calls on the
/// way: no allocation, no lock, no unwinding — the heap and every lock are this process's.
/// Its own credentials, fds, working directory, session, limits and signal mask are
/// its own (none of `CLONE_FILES`, `CLONE_FS`, `CLONE_THREAD` is given). The caller must be
/// single-threaded, as every user of this module is.
pub fn spawn_sharing_memory<T>(stack: &mut ChildStack, context: &mut T, child: fn(&mut T) -> !) -> io::Result<pid_t> {
    let mut shared = SharedChild { child, context: context as *mut T };
    // Stacks grow down on x86_64 and aarch64; the top, 16-byte aligned as both ABIs want.
    let top = (stack.base as usize + stack.len) & !15;
    // SAFETY: `top` is the end of a live writable mapping that nothing else uses while the
    // child runs; `shared` and `context` outlive the child's use of them, since CLONE_VFORK
    // returns only after the child exec'd or exited.
    let pid = unsafe {
        clone(
            shared_child_entry::<T>,
            top as *mut c_void,
            CLONE_VM | CLONE_VFORK | SIGCHLD,
            (&mut shared as *mut SharedChild<T>).cast(),
        )
    };
    check(pid)
}

/// `_exit(2)`: ends the process without running destructors or flushing stdio (which, in a
/// fork child, would be the parent's).
pub fn exit_now(status: i32) -> ! {
    // SAFETY: always safe to call.
    unsafe { _exit(status) }
}

/// `execve(2)`; returns only on failure. `argv` and `envp` are NULL-terminated arrays of
/// pointers into C strings that outlive the call.
pub fn exec(path: &CStr, argv: &[*const c_char], envp: &[*const c_char]) -> io::Error {
    debug_assert!(argv.last().is_some_and(|last| last.is_null()));
    debug_assert!(envp.last().is_some_and(|last| last.is_null()));
    // SAFETY: path is a C string; argv/envp are NULL-terminated arrays of C strings.
    unsafe { execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    io::Error::from_raw_os_error(errno())
}

pub fn dup_onto(old: RawFd, new: RawFd) -> io::Result<()> {
    // SAFETY: plain fd call.
    check(unsafe { dup2(old, new) }).map(drop)
}

pub fn close_fd(fd: RawFd) {
    // SAFETY: plain fd call; errors (EBADF) are of no interest to a close.
    unsafe { close(fd) };
}

/// Closes every fd from `first` on except `keep`.
pub fn close_all_from(first: RawFd, keep: RawFd) {
    let ranges =
        if keep >= first { [(first, keep - 1), (keep + 1, RawFd::MAX)] } else { [(first, RawFd::MAX), (1, 0)] };
    for (low, high) in ranges {
        if low > high {
            continue;
        }
        // SAFETY: close_range(2) only closes fds.
        let done = unsafe { syscall(SYS_CLOSE_RANGE, low as c_uint, high as c_uint, 0 as c_uint) };
        if done < 0 {
            // Before Linux 5.9: one by one up to a sane bound.
            for fd in low..high.min(1024) {
                close_fd(fd);
            }
        }
    }
}

pub fn new_session() -> io::Result<()> {
    // SAFETY: plain call.
    check(unsafe { setsid() }).map(drop)
}

pub fn change_dir(path: &CStr) -> io::Result<()> {
    // SAFETY: path is a C string.
    check(unsafe { chdir(path.as_ptr()) }).map(drop)
}

/// `struct open_how` of `openat2(2)`.
#[repr(C)]
struct open_how {
    flags: u64,
    mode: u64,
    resolve: u64,
}

const AT_FDCWD: c_int = -100;
const OPEN_DIRECTORY: u64 = 0o200000;
const OPEN_PATH: u64 = 0o10000000;
const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_BENEATH: u64 = 0x08;

/// Enters `path`, a relative path resolved below the current directory the way the host
/// backends resolve a workspace path: every symlink is followed, but one that is absolute,
/// a `..` above the current directory or a magic `/proc` link fails (`EXDEV` / `ELOOP`),
/// as does a chain of more than 40 links (`ELOOP`). `openat2(2)` with `RESOLVE_BENEATH`
/// (Linux 5.6); where it is missing or filtered: `ENOSYS` / `EPERM`.
pub fn change_dir_beneath(path: &CStr) -> io::Result<()> {
    let how = open_how {
        flags: OPEN_PATH | OPEN_DIRECTORY | O_CLOEXEC as u64,
        mode: 0,
        resolve: RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: path is a C string, how a valid open_how of the size passed.
    let fd = unsafe { syscall(SYS_OPENAT2, AT_FDCWD, path.as_ptr(), &how as *const open_how, size_of::<open_how>()) };
    if fd < 0 {
        return Err(io::Error::from_raw_os_error(errno()));
    }
    let fd = fd as RawFd;
    // SAFETY: fd was just opened.
    let entered = check(unsafe { fchdir(fd) }).map(drop);
    close_fd(fd);
    entered
}

pub fn set_rlimit(resource: u32, soft: u64, hard: u64) -> io::Result<()> {
    let limit = rlimit { rlim_cur: soft, rlim_max: hard };
    // SAFETY: limit is a valid rlimit.
    check(unsafe { setrlimit(resource as c_int, &limit) }).map(drop)
}

/// `kill(2)`; a process already gone (`ESRCH`) is success.
pub fn signal(pid: pid_t, signal: c_int) -> io::Result<()> {
    // SAFETY: plain call.
    match check(unsafe { kill(pid, signal) }) {
        Err(error) if error.raw_os_error() == Some(ESRCH) => Ok(()),
        other => other.map(drop),
    }
}

/// `waitpid(2)`: `Ok(None)` with `WNOHANG` when nothing has changed, else the pid and its
/// raw status.
pub fn wait_for(pid: pid_t, options: c_int) -> io::Result<Option<(pid_t, c_int)>> {
    let mut status: c_int = 0;
    // SAFETY: status is a valid out pointer.
    let reaped = check(unsafe { waitpid(pid, &mut status, options) })?;
    Ok((reaped != 0).then_some((reaped, status)))
}

/// `poll(2)`, retried on `EINTR`; returns how many fds are ready.
pub fn poll_fds(fds: &mut [pollfd], timeout_ms: i32) -> io::Result<usize> {
    loop {
        // SAFETY: fds is a valid array of pollfd.
        let ready = unsafe { poll(fds.as_mut_ptr(), fds.len() as c_ulong, timeout_ms) };
        if ready >= 0 {
            return Ok(ready as usize);
        }
        let error = io::Error::from_raw_os_error(errno());
        if error.raw_os_error() != Some(EINTR) {
            return Err(error);
        }
    }
}

/// Space for the control message of up to `fds` descriptors (`CMSG_SPACE`).
const fn cmsg_space(fds: usize) -> usize {
    std::mem::size_of::<cmsghdr>() + (fds * 4).next_multiple_of(8)
}

/// Largest number of fds one message carries.
pub const MAX_FDS: usize = 8;

/// Receives one message of at most `buffer.len()` bytes and the fds passed with it
/// (close-on-exec), without blocking. `Ok(None)`: nothing queued. `Ok(Some((0, [])))`: the
/// peer is gone.
pub fn recv_with_fds(fd: RawFd, buffer: &mut [u8]) -> io::Result<Option<(usize, Vec<RawFd>)>> {
    let mut control = [0u64; cmsg_space(MAX_FDS) / 8];
    let mut iov = iovec { iov_base: buffer.as_mut_ptr().cast(), iov_len: buffer.len() };
    let mut message = msghdr {
        msg_name: std::ptr::null_mut(),
        msg_namelen: 0,
        msg_iov: &mut iov,
        msg_iovlen: 1,
        msg_control: control.as_mut_ptr().cast(),
        msg_controllen: std::mem::size_of_val(&control),
        msg_flags: 0,
    };
    // SAFETY: message points at live buffers of the given sizes.
    let received = unsafe { recvmsg(fd, &mut message, MSG_DONTWAIT | MSG_CMSG_CLOEXEC) };
    let received = match check_size(received) {
        Ok(received) => received,
        Err(error) if error.raw_os_error() == Some(EAGAIN) => return Ok(None),
        Err(error) => return Err(error),
    };
    let mut fds = Vec::new();
    let header_len = std::mem::size_of::<cmsghdr>();
    let mut offset = 0usize;
    let control_bytes = message.msg_controllen.min(std::mem::size_of_val(&control));
    while offset + header_len <= control_bytes {
        // SAFETY: offset + header_len is within `control`, which is 8-aligned, and offset
        // is a multiple of 8 (CMSG_ALIGN).
        let header = unsafe { &*(control.as_ptr().cast::<u8>().add(offset).cast::<cmsghdr>()) };
        if header.cmsg_len < header_len || offset + header.cmsg_len > control_bytes {
            break;
        }
        if header.cmsg_level == SOL_SOCKET && header.cmsg_type == SCM_RIGHTS {
            let count = (header.cmsg_len - header_len) / 4;
            for index in 0..count {
                // SAFETY: within the cmsg's data, which the kernel filled with ints.
                let value = unsafe {
                    std::ptr::read_unaligned(
                        control.as_ptr().cast::<u8>().add(offset + header_len + index * 4).cast::<i32>(),
                    )
                };
                fds.push(value);
            }
        }
        offset += header.cmsg_len.next_multiple_of(8);
    }
    Ok(Some((received, fds)))
}

/// Sends `bytes` with `fds` attached (`SCM_RIGHTS`) in one `sendmsg`, without blocking
/// and without `SIGPIPE` (a closed peer is `EPIPE`).
pub fn send_with_fds(fd: RawFd, bytes: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    assert!(fds.len() <= MAX_FDS, "too many fds for one message");
    let mut control = [0u64; cmsg_space(MAX_FDS) / 8];
    let header_len = std::mem::size_of::<cmsghdr>();
    let space = cmsg_space(fds.len());
    // SAFETY: control is 8-aligned and at least `space` bytes long.
    unsafe {
        let header = control.as_mut_ptr().cast::<cmsghdr>();
        (*header).cmsg_len = header_len + fds.len() * 4;
        (*header).cmsg_level = SOL_SOCKET;
        (*header).cmsg_type = SCM_RIGHTS;
        let data = control.as_mut_ptr().cast::<u8>().add(header_len).cast::<i32>();
        for (index, value) in fds.iter().enumerate() {
            std::ptr::write_unaligned(data.add(index), *value);
        }
    }
    let mut iov = iovec { iov_base: bytes.as_ptr().cast_mut().cast(), iov_len: bytes.len() };
    let message = msghdr {
        msg_name: std::ptr::null_mut(),
        msg_namelen: 0,
        msg_iov: &mut iov,
        msg_iovlen: 1,
        msg_control: if fds.is_empty() { std::ptr::null_mut() } else { control.as_mut_ptr().cast() },
        msg_controllen: if fds.is_empty() { 0 } else { space },
        msg_flags: 0,
    };
    // SAFETY: message points at live buffers of the given sizes.
    check_size(unsafe { sendmsg(fd, &message, MSG_DONTWAIT | MSG_NOSIGNAL) })
}

/// `send(2)` of all of `bytes` on a socket, blocking, never raising `SIGPIPE`.
pub fn send_all(fd: RawFd, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: bytes is a live buffer.
        match check_size(unsafe { send(fd, bytes.as_ptr().cast(), bytes.len(), MSG_NOSIGNAL) }) {
            Ok(sent) => bytes = &bytes[sent..],
            Err(error) if error.raw_os_error() == Some(EINTR) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

/// `recv(2)` into `buffer`, blocking; `Ok(0)` at end of stream.
pub fn recv_some(fd: RawFd, buffer: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buffer is a live buffer.
        match check_size(unsafe { recv(fd, buffer.as_mut_ptr().cast(), buffer.len(), 0) }) {
            Err(error) if error.raw_os_error() == Some(EINTR) => {}
            other => return other,
        }
    }
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe_cloexec() -> io::Result<(RawFd, RawFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: fds is a valid out array of two ints.
    check(unsafe { pipe2(fds.as_mut_ptr(), O_CLOEXEC) })?;
    Ok((fds[0], fds[1]))
}

/// A close-on-exec `SOCK_SEQPACKET` pair (message boundaries, fds travel with messages).
pub fn seqpacket_pair() -> io::Result<(RawFd, RawFd)> {
    socket_pair(SOCK_SEQPACKET)
}

/// A close-on-exec `SOCK_STREAM` pair.
pub fn stream_pair() -> io::Result<(RawFd, RawFd)> {
    socket_pair(SOCK_STREAM)
}

fn socket_pair(kind: c_int) -> io::Result<(RawFd, RawFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: fds is a valid out array of two ints.
    check(unsafe { socketpair(AF_UNIX, kind | SOCK_CLOEXEC, 0, fds.as_mut_ptr()) })?;
    Ok((fds[0], fds[1]))
}

/// Stops receiving on `fd`: the peer's sends fail with `EPIPE` from now on, and what is
/// already queued can still be read.
pub fn shutdown_read(fd: RawFd) -> io::Result<()> {
    // SAFETY: plain call.
    check(unsafe { shutdown(fd, SHUT_RD) }).map(drop)
}

pub fn set_cloexec(fd: RawFd) -> io::Result<()> {
    // SAFETY: F_GETFD/F_SETFD take and return ints.
    let flags = check(unsafe { fcntl(fd, F_GETFD) })?;
    // SAFETY: as above.
    check(unsafe { fcntl(fd, F_SETFD, flags | FD_CLOEXEC) }).map(drop)
}

/// Makes the process undumpable: a process of the same uid can then neither ptrace it nor
/// open its `/proc/<pid>/fd`, `mem` or `environ` (that takes `CAP_SYS_PTRACE`, which no
/// sandboxed command has). Inherited by fork, reset by execve of a normal program.
pub fn set_undumpable() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { prctl(PR_SET_DUMPABLE, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong) }).map(drop)
}

/// Orphans of this process's descendants are reparented to it instead of pid 1.
pub fn set_child_subreaper() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { prctl(PR_SET_CHILD_SUBREAPER, 1 as c_ulong, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong) }).map(drop)
}

/// `SIGKILL` when the parent (thread) dies.
pub fn die_with_parent() -> io::Result<()> {
    // SAFETY: prctl with integer arguments.
    check(unsafe { prctl(PR_SET_PDEATHSIG, SIGKILL as c_ulong, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong) }).map(drop)
}

/// Drops every capability: the bounding set (needs `CAP_SETPCAP` unless it is empty), the ambient set, then
/// effective, permitted and inheritable. After it the process holds exactly what bwrap's
/// `--cap-drop ALL` leaves a command: nothing.
pub fn drop_all_capabilities() -> io::Result<()> {
    for capability in 0..=CAP_LAST_TRIED {
        // SAFETY: prctl with integer arguments; EINVAL past the last capability.
        let dropped = unsafe { prctl(PR_CAPBSET_DROP, capability, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong) };
        if dropped < 0 {
            match errno() {
                // Capabilities are numbered without gaps: past the kernel's last one.
                EINVAL => break,
                // No CAP_SETPCAP (a container started with every capability dropped):
                // fine exactly when the capability is already outside the bounding set
                // (0) or past the kernel's last one (-1, EINVAL).
                // SAFETY: prctl with integer arguments.
                EPERM
                    if unsafe { prctl(PR_CAPBSET_READ, capability, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong) } <= 0 => {
                }
                other => return Err(io::Error::from_raw_os_error(other)),
            }
        }
    }
    // SAFETY: prctl with integer arguments.
    check(unsafe { prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0 as c_ulong, 0 as c_ulong, 0 as c_ulong) })?;
    let header = cap_header { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
    let data = [
        cap_data { effective: 0, permitted: 0, inheritable: 0 },
        cap_data { effective: 0, permitted: 0, inheritable: 0 },
    ];
    // SAFETY: capset(2) with a v3 header and two data structs.
    let set = unsafe { syscall(SYS_CAPSET, &header as *const cap_header, data.as_ptr()) };
    if set < 0 { Err(io::Error::from_raw_os_error(errno())) } else { Ok(()) }
}

/// Gives `SIGPIPE` back its default action. Rust's runtime ignores it in the supervisor, and
/// an ignored signal stays ignored across `execve`: a command would get `EPIPE` instead of
/// dying when its reader goes (`yes | head`), unlike every command std or tokio spawns (they
/// reset it the same way).
pub fn default_sigpipe() -> io::Result<()> {
    // SAFETY: installs the default action, no handler.
    if unsafe { set_disposition(SIGPIPE, SIG_DFL) } == SIG_ERR {
        Err(io::Error::from_raw_os_error(errno()))
    } else {
        Ok(())
    }
}

/// Empties the signal mask (the command starts with nothing blocked).
pub fn unblock_all_signals() -> io::Result<()> {
    let empty = [0u64; 16];
    // SAFETY: a zeroed sigset_t (128 bytes) is the empty set.
    check(unsafe { sigprocmask(SIG_SETMASK, empty.as_ptr().cast(), std::ptr::null_mut()) }).map(drop)
}

/// A private mount namespace with fresh size-capped tmpfs at `/tmp` and `/dev/shm`, owned
/// by the caller, `nosuid,nodev,mode=755`: what bwrap's `--size N --tmpfs` builds. Needs
/// `CAP_SYS_ADMIN` in the sandbox's user namespace.
pub fn private_tmp(size_bytes: u64) -> io::Result<()> {
    // SAFETY: plain call.
    check(unsafe { unshare(CLONE_NEWNS) })?;
    // Nothing mounted here may propagate back to the sandbox's other namespaces.
    // SAFETY: C strings and a null data pointer.
    check(unsafe { mount(c"none".as_ptr(), c"/".as_ptr(), std::ptr::null(), MS_REC | MS_PRIVATE, std::ptr::null()) })?;
    let options = std::ffi::CString::new(format!("size={size_bytes},mode=755")).map_err(io::Error::other)?;
    for target in [c"/tmp", c"/dev/shm"] {
        // SAFETY: C strings.
        check(unsafe {
            mount(c"tmpfs".as_ptr(), target.as_ptr(), c"tmpfs".as_ptr(), MS_NOSUID | MS_NODEV, options.as_ptr().cast())
        })?;
    }
    Ok(())
}

/// A pollable fd that becomes readable when `pid` exits (`pidfd_open(2)`, Linux 5.3).
pub fn pidfd(pid: pid_t) -> io::Result<RawFd> {
    // SAFETY: pidfd_open takes a pid and flags.
    let fd = unsafe { syscall(SYS_PIDFD_OPEN, pid, 0 as c_uint) };
    if fd < 0 { Err(io::Error::from_raw_os_error(errno())) } else { Ok(fd as RawFd) }
}

pub fn own_pid() -> pid_t {
    // SAFETY: plain call.
    unsafe { getpid() }
}

/// Decodes a wait status into (exit code, signal).
pub fn decode_status(status: c_int) -> (Option<i32>, Option<i32>) {
    let signal = status & 0x7f;
    if signal == 0 { (Some((status >> 8) & 0xff), None) } else { (None, Some(signal)) }
}

/// A close-on-exec Unix stream socket connected to `path`.
pub fn connect_unix(path: &CStr) -> io::Result<RawFd> {
    let bytes = path.to_bytes();
    let mut address = sockaddr_un { sun_family: AF_UNIX as u16, sun_path: [0; 108] };
    if bytes.len() >= address.sun_path.len() {
        return Err(io::Error::from_raw_os_error(EINVAL));
    }
    address.sun_path[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: plain call.
    let fd = check(unsafe { socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0) })?;
    // SAFETY: address is a valid sockaddr_un of the given size.
    if let Err(error) = check(unsafe { connect(fd, &address, std::mem::size_of::<sockaddr_un>() as u32) }) {
        close_fd(fd);
        return Err(error);
    }
    Ok(fd)
}

/// Puts `/dev/null` on `target` (0, 1 or 2), so that fd number stays taken.
pub fn null_onto(target: RawFd) -> io::Result<()> {
    // SAFETY: a constant C string.
    let fd = check(unsafe { open(c"/dev/null".as_ptr(), O_RDWR | O_CLOEXEC) })?;
    if fd == target {
        // O_CLOEXEC on a standard fd would close it in every command: clear it again.
        // SAFETY: F_SETFD takes an int.
        return check(unsafe { fcntl(fd, F_SETFD, 0) }).map(drop);
    }
    let moved = dup_onto(fd, target);
    close_fd(fd);
    moved
}
