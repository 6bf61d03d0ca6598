//! Strings envd takes from Go's standard library, reproduced: `os.FileMode.String()` (the
//! `permissions` field of an entry) and `os.ProcessState.String()` (the `status` of a
//! process's end event, e.g. `exit status 3`, `signal: killed`).

/// Go's names of the Linux signals (`syscall.Signal.String()`).
const SIGNAL_NAMES: [(i32, &str); 31] = [
    (1, "hangup"),
    (2, "interrupt"),
    (3, "quit"),
    (4, "illegal instruction"),
    (5, "trace/breakpoint trap"),
    (6, "aborted"),
    (7, "bus error"),
    (8, "floating point exception"),
    (9, "killed"),
    (10, "user defined signal 1"),
    (11, "segmentation fault"),
    (12, "user defined signal 2"),
    (13, "broken pipe"),
    (14, "alarm clock"),
    (15, "terminated"),
    (16, "stack fault"),
    (17, "child exited"),
    (18, "continued"),
    (19, "stopped (signal)"),
    (20, "stopped"),
    (21, "stopped (tty input)"),
    (22, "stopped (tty output)"),
    (23, "urgent I/O condition"),
    (24, "CPU time limit exceeded"),
    (25, "file size limit exceeded"),
    (26, "virtual timer expired"),
    (27, "profiling timer expired"),
    (28, "window changed"),
    (29, "I/O possible"),
    (30, "power failure"),
    (31, "bad system call"),
];

/// `os.ProcessState.String()` of a process that exited with `code` or died of `signal`.
pub fn process_state(code: Option<i32>, signal: Option<i32>, core_dumped: bool) -> String {
    match (code, signal) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => {
            let name = SIGNAL_NAMES
                .iter()
                .find(|(number, _)| *number == signal)
                .map_or_else(|| format!("signal {signal}"), |(_, name)| (*name).to_owned());
            if core_dumped { format!("signal: {name} (core dumped)") } else { format!("signal: {name}") }
        }
        (None, None) => "exit status -1".to_owned(),
    }
}

/// `os.FileMode.String()` for a Unix `st_mode`.
pub fn file_mode(st_mode: u32) -> String {
    let mut text = String::new();
    let kind = st_mode & 0o170000;
    // Go's order of type letters: "dalTLDpSugct?".
    if kind == 0o040000 {
        text.push('d');
    }
    if kind == 0o120000 {
        text.push('L');
    }
    if kind == 0o060000 {
        text.push('D');
    }
    if kind == 0o010000 {
        text.push('p');
    }
    if kind == 0o140000 {
        text.push('S');
    }
    if st_mode & 0o4000 != 0 {
        text.push('u');
    }
    if st_mode & 0o2000 != 0 {
        text.push('g');
    }
    if kind == 0o020000 {
        text.push('D');
        text.push('c');
    }
    if st_mode & 0o1000 != 0 {
        text.push('t');
    }
    if text.is_empty() {
        text.push('-');
    }
    const RWX: &[u8; 9] = b"rwxrwxrwx";
    for (index, letter) in RWX.iter().enumerate() {
        let bit = 1 << (8 - index);
        text.push(if st_mode & bit != 0 { *letter as char } else { '-' });
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_like_go() {
        assert_eq!(file_mode(0o100644), "-rw-r--r--");
        assert_eq!(file_mode(0o040755), "drwxr-xr-x");
        assert_eq!(file_mode(0o120777), "Lrwxrwxrwx");
        assert_eq!(process_state(Some(3), None, false), "exit status 3");
        assert_eq!(process_state(None, Some(9), false), "signal: killed");
        assert_eq!(process_state(None, Some(15), false), "signal: terminated");
    }
}
