//! What a test's processes leave behind outside their directories: Docker workspace
//! containers. A node agent keeps its Docker workspaces when it stops (they outlive a restart
//! by design), so whoever started it removes them: every container whose workspace root
//! (`berth.workspace.root`) lies under the test's data directory — never another test's.

use std::path::Path;
use std::process::{Command, Stdio};

/// Removes the Docker workspace containers whose host directory is under `dir`; returns how
/// many. Quiet when Docker is absent.
pub fn remove_workspace_containers_under(dir: &Path) -> usize {
    let label = berth_backend_docker::ROOT_LABEL;
    let format = format!("{{{{.ID}}}} {{{{.Label \"{label}\"}}}}");
    let Ok(output) =
        Command::new("docker").args(["ps", "-a", "--filter", &format!("label={label}"), "--format", &format]).output()
    else {
        return 0;
    };
    let ours: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter(|(_, root)| Path::new(root).starts_with(dir))
        .map(|(id, _)| id.to_owned())
        .collect();
    if !ours.is_empty() {
        let _ = Command::new("docker")
            .args(["rm", "-f", "-v"])
            .args(&ours)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
    ours.len()
}
