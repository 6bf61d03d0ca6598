//! One exec, from request to exit status: a forked child of the supervisor that owns the
//! exec's connection, starts the command and cleans up everything it left.

use std::ffi::{CString, c_char};
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt as _;

use super::sys::{self, ChildStack};
use super::wire::{Reply, Request, Rlimit, Stage};

/// How often the shim looks for its command's exit when pidfds are unavailable (Linux
/// before 5.3).
const FALLBACK_POLL_MS: i32 = 5;

/// The stack the command's child runs on until its `execve`: system calls only, a few
/// frames deep.
const CHILD_STACK_BYTES: usize = 64 * 1024;

/// How a command's environment is made from its request.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Env {
    /// Exactly the request's.
    Exact,
    /// The supervisor's own (what the container runtime gives every exec: the image's env,
    /// `HOME`, `HOSTNAME`), with the request's entries over it.
    OverOwn,
}

/// Runs the exec on `connection` with the command's `stdio`; never returns.
pub fn run(connection: RawFd, stdio: [RawFd; 3], env: Env) -> ! {
    // Orphans of the command come here, so the exec can kill them all at its end.
    let _ = sys::set_child_subreaper();
    let Some(request) = read_request(connection) else {
        reply(connection, Reply::Failed { stage: Stage::Request, errno: 0 });
        sys::exit_now(1)
    };
    if let Some(size) = request.private_tmp_bytes
        && let Err(error) = sys::private_tmp(size)
    {
        reply(connection, failed(Stage::Tmp, &error));
        sys::exit_now(1)
    }
    let mut launch = Launch::new(&request, env, stdio);
    let pid = match ChildStack::new(CHILD_STACK_BYTES)
        .and_then(|mut stack| sys::spawn_sharing_memory(&mut stack, &mut launch, Launch::become_command))
    {
        Ok(pid) => pid,
        Err(error) => {
            reply(connection, failed(Stage::Fork, &error));
            sys::exit_now(1)
        }
    };
    for fd in stdio {
        sys::close_fd(fd);
    }
    // The child is past its execve or has exited: a failure on the way is in `launch`.
    if let Some((stage, errno)) = launch.failure {
        let mut status = None;
        kill_tree(pid, &mut status);
        reply(connection, Reply::Failed { stage, errno });
        sys::exit_now(0)
    }
    reply(connection, Reply::Started { pid });
    let status = supervise(connection, pid);
    let (code, signal) = sys::decode_status(status);
    reply(connection, Reply::Exited { code, signal });
    sys::exit_now(0)
}

/// Waits for the command to end or for a kill (a `KILL` byte or the node closing the
/// connection); then kills what is left of its tree. Returns the command's wait status.
fn supervise(connection: RawFd, pid: sys::pid_t) -> i32 {
    let pidfd = sys::pidfd(pid).ok();
    let mut status = None;
    loop {
        let mut fds = [
            sys::pollfd { fd: connection, events: sys::POLLIN, revents: 0 },
            sys::pollfd { fd: pidfd.unwrap_or(-1), events: sys::POLLIN, revents: 0 },
        ];
        let timeout = if pidfd.is_some() { -1 } else { FALLBACK_POLL_MS };
        if sys::poll_fds(&mut fds, timeout).is_err() {
            break;
        }
        if fds[0].revents != 0 {
            let mut byte = [0u8; 1];
            // A kill byte, the end of the connection or an error: all mean kill.
            let _ = sys::recv_some(connection, &mut byte);
            break;
        }
        if let Ok(Some((_, raw))) = sys::wait_for(pid, sys::WNOHANG) {
            status = Some(raw);
            break;
        }
    }
    if let Some(fd) = pidfd {
        sys::close_fd(fd);
    }
    kill_tree(pid, &mut status);
    status.unwrap_or(sys::SIGKILL)
}

/// Kills the command's process group and every process below the shim, until the shim has
/// no child left; records the command's status in `status` if it is reaped here.
fn kill_tree(pid: sys::pid_t, status: &mut Option<i32>) {
    // The group id stays reserved while any member lives, so signalling it is safe even
    // after the command was reaped; the pid alone is signalled only while it is unreaped
    // (afterwards it could be another process's).
    let _ = sys::signal(-pid, sys::SIGKILL);
    if status.is_none() {
        let _ = sys::signal(pid, sys::SIGKILL);
    }
    loop {
        // Killed processes' children are reparented here and listed in the next round;
        // a process with SIGKILL pending cannot fork, so this ends.
        for child in children_of(sys::own_pid()) {
            let _ = sys::signal(child, sys::SIGKILL);
        }
        match sys::wait_for(-1, 0) {
            Ok(Some((reaped, raw))) => {
                if reaped == pid && status.is_none() {
                    *status = Some(raw);
                }
            }
            Ok(None) => {}
            Err(error) if error.raw_os_error() == Some(sys::EINTR) => {}
            Err(_) => break,
        }
    }
}

/// The children of `pid` (from `/proc/<pid>/task/<pid>/children`, or by scanning `/proc`
/// when the kernel lacks that file).
pub fn children_of(pid: sys::pid_t) -> Vec<sys::pid_t> {
    if let Ok(listed) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
        return listed.split_whitespace().filter_map(|child| child.parse().ok()).collect();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<sys::pid_t>().ok())
        .filter(|candidate| {
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{candidate}/stat")) else {
                return false;
            };
            // The command name may hold spaces and parentheses: fields follow the last ')'.
            let fields = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
            fields.split_whitespace().nth(1).and_then(|ppid| ppid.parse::<sys::pid_t>().ok()) == Some(pid)
        })
        .collect()
}

fn read_request(connection: RawFd) -> Option<Request> {
    let mut header = [0u8; 8];
    read_exact(connection, &mut header)?;
    let len = Request::body_len(&header)?;
    let mut body = vec![0u8; len];
    read_exact(connection, &mut body)?;
    Request::decode(&body)
}

fn read_exact(fd: RawFd, buffer: &mut [u8]) -> Option<()> {
    let mut filled = 0;
    while filled < buffer.len() {
        match sys::recv_some(fd, &mut buffer[filled..]) {
            Ok(0) | Err(_) => return None,
            Ok(read) => filled += read,
        }
    }
    Some(())
}

fn reply(connection: RawFd, reply: Reply) {
    // The node may be gone (it dropped the exec): nothing to tell then.
    let _ = sys::send_all(connection, &reply.encode());
}

fn failed(stage: Stage, error: &std::io::Error) -> Reply {
    Reply::Failed { stage, errno: error.raw_os_error().unwrap_or(0) }
}

/// Everything the command's child needs, allocated before it starts: the child shares the
/// shim's memory until its `execve` and may not allocate (see
/// [`sys::spawn_sharing_memory`]).
struct Launch {
    candidates: Vec<CString>,
    /// The strings `argv_pointers` and `env_pointers` point into, kept alive with them.
    _argv: Vec<CString>,
    _env: Vec<CString>,
    /// NULL-terminated pointers into `_argv` and `_env`.
    argv_pointers: Vec<*const c_char>,
    env_pointers: Vec<*const c_char>,
    cwd: CString,
    /// Entered from `cwd`, never leaving it (see [`Request::beneath`]).
    beneath: Option<CString>,
    /// For a file without a `#!` line (`ENOEXEC`): `/bin/sh <file> <args…>`, as `execvp`.
    shell: CString,
    /// `[shell, <file>, argv[1..], NULL]`; the child fills in `<file>`.
    shell_argv: Vec<*const c_char>,
    stdio: [RawFd; 3],
    rlimits: Vec<Rlimit>,
    /// Set by the child when it could not become the command: the stage and the errno.
    failure: Option<(Stage, i32)>,
}

impl Launch {
    fn new(request: &Request, env_kind: Env, stdio: [RawFd; 3]) -> Self {
        // Decoding refused NULs, so these conversions cannot fail.
        let c_string = |bytes: &[u8]| CString::new(bytes.to_vec()).unwrap_or_default();
        let program = &request.argv[0];
        let env = environment(request, env_kind);
        let candidates = if program.contains(&b'/') {
            vec![c_string(program)]
        } else {
            search_path(request, env_kind, &env)
                .split(|byte| *byte == b':')
                .map(|dir| {
                    // POSIX: an empty PATH entry is the current directory.
                    let dir: &[u8] = if dir.is_empty() { b"." } else { dir };
                    let mut path = dir.to_vec();
                    if !path.ends_with(b"/") {
                        path.push(b'/');
                    }
                    path.extend_from_slice(program);
                    c_string(&path)
                })
                .collect()
        };
        let argv: Vec<CString> = request.argv.iter().map(|arg| c_string(arg)).collect();
        let env: Vec<CString> = env.iter().map(|pair| c_string(pair)).collect();
        let shell = c_string(std::ffi::OsStr::new("/bin/sh").as_bytes());
        // A CString's bytes live on the heap: these pointers stay valid when `Launch` moves.
        let argv_pointers = pointers(&argv);
        let env_pointers = pointers(&env);
        let mut shell_argv = vec![shell.as_ptr(), std::ptr::null()];
        shell_argv.extend(argv_pointers.iter().skip(1).copied());
        Self {
            candidates,
            _argv: argv,
            _env: env,
            argv_pointers,
            env_pointers,
            cwd: c_string(&request.cwd),
            beneath: (!request.beneath.is_empty()).then(|| c_string(&request.beneath)),
            shell,
            shell_argv,
            stdio,
            rlimits: request.rlimits.clone(),
            failure: None,
        }
    }

    /// The command's child, in the shim's memory: becomes the command, or records why not
    /// in `failure` and exits.
    fn become_command(&mut self) -> ! {
        let (stage, error) = self.start();
        self.failure = Some((stage, error.raw_os_error().unwrap_or(0)));
        sys::exit_now(127)
    }

    /// Returns only on failure, with the stage. System calls only: no allocation.
    fn start(&mut self) -> (Stage, std::io::Error) {
        if let Err(error) = sys::new_session() {
            return (Stage::Session, error);
        }
        for (target, fd) in self.stdio.into_iter().enumerate() {
            if let Err(error) = sys::dup_onto(fd, target as RawFd) {
                return (Stage::Stdio, error);
            }
        }
        if let Err(error) = sys::change_dir(&self.cwd) {
            return (Stage::Chdir, error);
        }
        if let Some(beneath) = &self.beneath
            && let Err(error) = sys::change_dir_beneath(beneath)
        {
            return (Stage::Resolve, error);
        }
        for limit in &self.rlimits {
            if let Err(error) = sys::set_rlimit(limit.resource, limit.soft, limit.hard) {
                return (Stage::Rlimit, error);
            }
        }
        let signals = sys::default_sigpipe().and_then(|()| sys::unblock_all_signals());
        if let Err(error) = signals.and_then(|()| sys::drop_all_capabilities()) {
            return (Stage::Capabilities, error);
        }
        // execvp's rules: the first candidate that runs wins; EACCES on any candidate is
        // reported over ENOENT; other errors stop the search.
        let mut seen_eacces = false;
        let mut last = std::io::Error::from_raw_os_error(sys::ENOENT);
        for candidate in &self.candidates {
            let error = sys::exec(candidate, &self.argv_pointers, &self.env_pointers);
            match error.raw_os_error() {
                Some(sys::ENOEXEC) => {
                    self.shell_argv[1] = candidate.as_ptr();
                    return (Stage::Exec, sys::exec(&self.shell, &self.shell_argv, &self.env_pointers));
                }
                Some(sys::EACCES) => seen_eacces = true,
                Some(sys::ENOENT | sys::ENOTDIR) => {}
                _ => return (Stage::Exec, error),
            }
            last = error;
        }
        if seen_eacces {
            last = std::io::Error::from_raw_os_error(sys::EACCES);
        }
        (Stage::Exec, last)
    }
}

/// Where a bare program name is looked up: the request's search path; with
/// [`Env::OverOwn`] and none given, the `PATH` the command itself gets (the image's, unless
/// the request sets one), as a shell starting it would search. Without any `PATH`, the
/// shells' default.
fn search_path<'a>(request: &'a Request, env_kind: Env, env: &'a [Vec<u8>]) -> &'a [u8] {
    if env_kind == Env::Exact || !request.search_path.is_empty() {
        return &request.search_path;
    }
    env.iter()
        .rev()
        .find_map(|pair| pair.strip_prefix(b"PATH="))
        .unwrap_or(b"/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
}

/// The command's `NAME=VALUE` entries: the request's, over the supervisor's own for
/// [`Env::OverOwn`] (each name once, the request's value winning).
fn environment(request: &Request, env: Env) -> Vec<Vec<u8>> {
    if env == Env::Exact {
        return request.env.clone();
    }
    let name = |pair: &[u8]| pair.split(|byte| *byte == b'=').next().unwrap_or_default().to_vec();
    let asked: std::collections::HashSet<Vec<u8>> = request.env.iter().map(|pair| name(pair)).collect();
    let mut merged: Vec<Vec<u8>> = std::env::vars_os()
        .filter(|(key, _)| !asked.contains(key.as_bytes()))
        .map(|(key, value)| [key.as_bytes(), b"=", value.as_bytes()].concat())
        .collect();
    merged.extend(request.env.iter().cloned());
    merged
}

/// A NULL-terminated pointer array into `strings`.
fn pointers(strings: &[CString]) -> Vec<*const c_char> {
    strings.iter().map(|string| string.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}
