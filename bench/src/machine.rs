//! What the numbers were measured on: CPU, memory, kernel, the commit, tool versions. And
//! per-process readings from `/proc` (resident memory, CPU time).

use std::path::Path;
use std::process::Command;

use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct MachineInfo {
    /// When the run started, UTC (RFC 3339, seconds).
    pub started_at: String,
    pub cpu_model: String,
    pub cores: usize,
    pub memory_bytes: u64,
    pub kernel: String,
    pub git_commit: String,
    /// Uncommitted changes in the work tree the binaries were built from.
    pub git_dirty: bool,
    pub etcd_version: String,
    pub docker_version: Option<String>,
    pub berth_binary: String,
    /// The filesystem of the temporary directory, where the clusters' data directories
    /// and etcd's go (`ext4 without a journal on /dev/vda`): it moves the provision rows
    /// (`bench/results/bind-and-group-commit.md`).
    pub data_filesystem: String,
}

impl MachineInfo {
    pub fn collect(berth_binary: &Path) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find(|line| line.starts_with("model name"))
            .and_then(|line| line.split_once(':'))
            .map(|(_, model)| model.trim().to_owned())
            .unwrap_or_else(|| "unknown".into());
        let cores = std::thread::available_parallelism().map(usize::from).unwrap_or(1);
        let memory_bytes = meminfo_kib("MemTotal").unwrap_or(0) * 1024;
        let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim().to_owned();
        let git_commit = command_line("git", &["rev-parse", "HEAD"]).unwrap_or_else(|| "unknown".into());
        let git_dirty = command_line("git", &["status", "--porcelain", "--untracked-files=no"])
            .is_some_and(|status| !status.is_empty());
        let etcd_version = command_line(&berth_tests::etcd::etcd_binary().display().to_string(), &["--version"])
            .and_then(|text| text.lines().next().map(str::to_owned))
            .unwrap_or_else(|| "unknown".into());
        let docker_version = command_line("docker", &["version", "--format", "{{.Server.Version}}"]);
        Self {
            started_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
            cpu_model,
            cores,
            memory_bytes,
            kernel,
            git_commit,
            git_dirty,
            etcd_version,
            docker_version,
            // Relative to the repository, so a committed report names no machine's paths.
            berth_binary: Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .and_then(|root| berth_binary.strip_prefix(root).ok())
                .unwrap_or(berth_binary)
                .display()
                .to_string(),
            data_filesystem: data_filesystem(&std::env::temp_dir()),
        }
    }
}

/// The filesystem holding `dir`, from `/proc/self/mountinfo` (the mount with the longest
/// mount point that contains it): its type and source, and for ext4 whether it has a
/// journal (a journaled ext4 has a `/proc/fs/jbd2/<device>-8` entry). Without a journal,
/// ext4 does not reuse an inode freed in the last minutes and searches inode tables for a
/// free one, which makes every storm after another slower.
fn data_filesystem(dir: &Path) -> String {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned());
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let Some((fs_type, source)) = mount_of(&mountinfo, &dir) else {
        return "unknown".into();
    };
    if fs_type != "ext4" {
        return format!("{fs_type} on {source}");
    }
    let device = Path::new(&source).file_name().map(|name| name.to_string_lossy().into_owned()).unwrap_or_default();
    let journaled = Path::new("/proc/fs/jbd2").join(format!("{device}-8")).exists();
    format!("ext4 {} on {source}", if journaled { "with a journal" } else { "without a journal" })
}

/// `(type, source)` of the mount in `mountinfo` whose mount point is the longest prefix of
/// `dir` (the last one mounted there, when several are).
fn mount_of(mountinfo: &str, dir: &Path) -> Option<(String, String)> {
    let mut best: Option<(usize, String, String)> = None;
    for line in mountinfo.lines() {
        // `id parent major:minor root mount-point options [optional...] - type source super`
        let fields: Vec<&str> = line.split(' ').collect();
        let (Some(mount_point), Some(dash)) = (fields.get(4), fields.iter().position(|field| *field == "-")) else {
            continue;
        };
        let (Some(fs_type), Some(source)) = (fields.get(dash + 1), fields.get(dash + 2)) else { continue };
        let mount_point = mount_point.replace("\\040", " ");
        if !dir.starts_with(&mount_point) {
            continue;
        }
        if best.as_ref().is_none_or(|(length, ..)| mount_point.len() >= *length) {
            best = Some((mount_point.len(), (*fs_type).to_owned(), (*source).to_owned()));
        }
    }
    best.map(|(_, fs_type, source)| (fs_type, source))
}

/// The trimmed stdout of a successful command, `None` if it fails or prints nothing.
pub fn command_line(program: &str, args: &[&str]) -> Option<String> {
    let output = Command::new(program).args(args).output().ok()?;
    let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    (output.status.success() && !text.is_empty()).then_some(text)
}

fn meminfo_kib(field: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|line| line.starts_with(field) && line[field.len()..].starts_with(':'))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The host's 1-minute load average: other work on the machine shows here.
pub fn load_average() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg").ok()?.split_whitespace().next()?.parse().ok()
}

/// Resident memory of `pid` in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

fn parse_vm_rss(status: &str) -> Option<u64> {
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<u64>().ok()? * 1024)
}

/// CPU time of `pid` (user + system) in clock ticks, from `/proc/<pid>/stat`.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_cpu_ticks(&stat)
}

fn parse_cpu_ticks(stat: &str) -> Option<u64> {
    // The command name (field 2) may contain spaces and parentheses: fields after the last
    // ')' are fixed. utime and stime are fields 14 and 15, i.e. 12 and 13 after it.
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(user + system)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every common Linux).
pub fn clock_ticks_per_second() -> u64 {
    command_line("getconf", &["CLK_TCK"]).and_then(|text| text.parse().ok()).unwrap_or(100)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard
30 22 0:26 / /dev/shm rw,nosuid shared:3 - tmpfs tmpfs rw
41 22 7:0 / /mnt/jfs rw,relatime shared:9 - ext4 /dev/loop0 rw
42 22 0:40 / /mnt/jfs rw,relatime shared:10 - tmpfs over rw
";

    #[test]
    fn the_mount_of_a_directory_is_its_longest_mount_point_last_mounted() {
        let of = |dir: &str| mount_of(MOUNTINFO, Path::new(dir));
        assert_eq!(of("/tmp"), Some(("ext4".into(), "/dev/vda".into())));
        assert_eq!(of("/dev/shm/bench"), Some(("tmpfs".into(), "tmpfs".into())));
        assert_eq!(of("/dev/shmem"), Some(("ext4".into(), "/dev/vda".into())), "a prefix of a name is no mount");
        assert_eq!(of("/mnt/jfs/tmp"), Some(("tmpfs".into(), "over".into())), "the later mount hides the earlier");
    }

    #[test]
    fn proc_fields_parse() {
        let stat = "1234 (berth (x) y) S 1 2 3 4 5 6 7 8 9 10 250 50 0 0 20 0 9 0 100 0 0";
        assert_eq!(parse_cpu_ticks(stat), Some(300));
        assert_eq!(parse_vm_rss("Name:\tberth\nVmRSS:\t  2048 kB\n"), Some(2048 * 1024));
        assert_eq!(parse_vm_rss("Name:\tberth\n"), None);
    }
}
