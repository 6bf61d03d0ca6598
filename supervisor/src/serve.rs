//! The supervisor's loop: wait for spawn messages on the control socket, fork a shim for
//! each, reap shims, exit when idle or when the node agent goes away.
//!
//! Single-threaded on purpose: the shims are forked from it and may then allocate freely.

use std::collections::HashSet;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::shim::{self, Env};
use super::sys;
use super::wire;

/// How often the loop looks at its children while shims run (idle accounting only; spawn
/// messages wake it at once).
const TICK_MS: i32 = 1000;

/// Serves the control socket inherited at `control` (bubblewrap): the node agent closing
/// it ends the supervisor, and with it the sandbox.
pub fn run(control: RawFd, idle: Duration) -> ! {
    // The node passed the control socket at a fixed number and our own binary beside it;
    // nothing else we inherited may reach a command.
    sys::close_all_from(3, control);
    let setup = sys::set_cloexec(control)
        .and_then(|()| sys::set_undumpable())
        .and_then(|()| sys::set_child_subreaper())
        .and_then(|()| sys::die_with_parent());
    if let Err(error) = setup {
        eprintln!("berth-supervisor: setup failed: {error}");
        sys::exit_now(1);
    }
    if let Err(error) = sys::send_with_fds(control, &[wire::READY], &[]) {
        eprintln!("berth-supervisor: cannot signal readiness: {error}");
        sys::exit_now(1);
    }
    serve(control, idle, Env::Exact)
}

/// Connects to the node agent's socket at `path` (a container: started by `docker exec`,
/// with the socket on a read-only mount) and serves that connection; the node agent
/// closing it ends the supervisor (its running commands' shims live on and finish them).
/// Stdin, stdout and stderr become `/dev/null` once connected.
pub fn run_connected(path: &str, idle: Duration) -> ! {
    sys::close_all_from(3, -1);
    let Ok(path) = std::ffi::CString::new(path) else {
        eprintln!("berth-supervisor: the socket path holds a NUL");
        sys::exit_now(2);
    };
    let control =
        sys::set_undumpable().and_then(|()| sys::set_child_subreaper()).and_then(|()| sys::connect_unix(&path));
    let control = match control {
        Ok(control) => control,
        Err(error) => {
            eprintln!("berth-supervisor: cannot connect to {}: {error}", path.to_string_lossy());
            sys::exit_now(1);
        }
    };
    if let Err(error) = sys::send_with_fds(control, &[wire::READY], &[]) {
        eprintln!("berth-supervisor: cannot signal readiness: {error}");
        sys::exit_now(1);
    }
    for fd in 0..3 {
        let _ = sys::null_onto(fd);
    }
    serve(control, idle, Env::OverOwn)
}

fn serve(control: RawFd, idle: Duration, env: Env) -> ! {
    let mut shims: HashSet<sys::pid_t> = HashSet::new();
    let mut idle_since = Instant::now();
    loop {
        let timeout = if shims.is_empty() {
            idle.saturating_sub(idle_since.elapsed()).as_millis().min(i32::MAX as u128) as i32
        } else {
            TICK_MS
        };
        let mut fds = [sys::pollfd { fd: control, events: sys::POLLIN, revents: 0 }];
        if let Err(error) = sys::poll_fds(&mut fds, timeout) {
            eprintln!("berth-supervisor: poll failed: {error}");
            sys::exit_now(1);
        }
        let had_shims = !shims.is_empty();
        reap(&mut shims);
        if had_shims && shims.is_empty() {
            idle_since = Instant::now();
        }
        if fds[0].revents != 0 {
            match accept_spawns(control, &mut shims, env) {
                Ok(()) => idle_since = Instant::now(),
                // The node agent closed its end: nobody will ever ask again. In a bwrap
                // sandbox, exiting takes the pid namespace, and every command, down.
                Err(Gone) => sys::exit_now(0),
            }
        }
        if shims.is_empty() && idle_since.elapsed() >= idle {
            retire(control);
        }
    }
}

struct Gone;

/// Forks a shim for every spawn message queued.
fn accept_spawns(control: RawFd, shims: &mut HashSet<sys::pid_t>, env: Env) -> Result<(), Gone> {
    loop {
        let mut byte = [0u8; 1];
        let (len, fds) = match sys::recv_with_fds(control, &mut byte) {
            Ok(Some(message)) => message,
            Ok(None) => return Ok(()),
            Err(_) => return Err(Gone),
        };
        if len == 0 && fds.is_empty() {
            return Err(Gone);
        }
        let [connection, stdin, stdout, stderr] = fds[..] else {
            fds.into_iter().for_each(sys::close_fd);
            continue;
        };
        if byte[0] != wire::SPAWN {
            fds.into_iter().for_each(sys::close_fd);
            continue;
        }
        match sys::fork_process() {
            Ok(0) => {
                sys::close_fd(control);
                shim::run(connection, [stdin, stdout, stderr], env)
            }
            Ok(pid) => {
                shims.insert(pid);
            }
            Err(error) => {
                let reply = wire::Reply::Failed { stage: wire::Stage::Fork, errno: error.raw_os_error().unwrap_or(0) };
                let _ = sys::send_all(connection, &reply.encode());
            }
        }
        for fd in [connection, stdin, stdout, stderr] {
            sys::close_fd(fd);
        }
    }
}

/// Reaps every child that ended. A shim killed before it could clean up (a command may
/// signal it: same uid) leaves its command's tree reparented here; that tree is killed.
fn reap(shims: &mut HashSet<sys::pid_t>) {
    let mut shim_died_badly = false;
    while let Ok(Some((pid, status))) = sys::wait_for(-1, sys::WNOHANG) {
        if shims.remove(&pid) {
            shim_died_badly |= status != 0;
        }
    }
    if shim_died_badly {
        for orphan in shim::children_of(sys::own_pid()) {
            if !shims.contains(&orphan) {
                let _ = sys::signal(orphan, sys::SIGKILL);
            }
        }
    }
}

/// Exits after an idle period. The node may be sending a spawn right now: the read side is
/// shut first (its later sends fail with `EPIPE`, and it starts a fresh supervisor), and
/// whatever was already queued is answered `Retry` unseen.
fn retire(control: RawFd) -> ! {
    let _ = sys::shutdown_read(control);
    let mut byte = [0u8; 1];
    while let Ok(Some((len, fds))) = sys::recv_with_fds(control, &mut byte) {
        if len == 0 && fds.is_empty() {
            break;
        }
        if let Some(connection) = fds.first() {
            let _ = sys::send_all(*connection, &wire::Reply::Retry.encode());
        }
        fds.into_iter().for_each(sys::close_fd);
    }
    sys::exit_now(0)
}
