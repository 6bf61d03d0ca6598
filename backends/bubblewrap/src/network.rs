//! Networked workspaces: a network namespace per workspace, behind pasta, with the
//! address policy of [`berth_backend_host::netns`].
//!
//! The namespace is built at provision (and rebuilt by the first provision after an agent
//! restart if its pasta is gone), torn down at release and destroy. Every sandbox of the
//! workspace is started inside it: right after `setsid`, the host chain
//! ([`super::launch::Launcher::host_chain`]) runs `nsenter --net=/run/netns/<name> --`
//! (root is needed to join it, so the switch to the sandbox user comes after, with
//! `setpriv`; like every host step it has a fixed env), and bwrap then keeps that namespace
//! (`--share-net`) instead of the host's. Inside, bwrap's own user namespace and
//! `--cap-drop ALL` leave no `CAP_NET_ADMIN` over it: the sandbox cannot alter the rules.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use berth_backend_host::netns::SandboxNetworks;

/// Name of a workspace's namespace: derived from its root, which is unique per node and
/// workspace and stable across agent restarts (two agents on one host never share it).
pub fn netns_name(root: &Path) -> String {
    SandboxNetworks::name_for("bw", root.as_os_str().as_encoded_bytes())
}

/// The namespace a workspace's sandboxes run in.
#[derive(Clone, Debug)]
pub struct SandboxNetns {
    pub nsenter_path: PathBuf,
    pub path: PathBuf,
}

impl SandboxNetns {
    /// The host programs that go first in the launch chain: join the namespace, then run
    /// the rest (as root still; the caller drops to the sandbox user after this).
    pub fn host_prefix(&self) -> Vec<OsString> {
        let mut net = OsString::from("--net=");
        net.push(&self.path);
        vec![self.nsenter_path.clone().into_os_string(), net, "--".into()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_distinct_and_valid() {
        let first = netns_name(Path::new("/data/a/workspaces/ws-1"));
        assert_eq!(first, netns_name(Path::new("/data/a/workspaces/ws-1")));
        assert_ne!(first, netns_name(Path::new("/data/b/workspaces/ws-1")));
        assert!(first.starts_with("berth-bw-") && first.len() == 25, "{first}");
        let netns = SandboxNetns { nsenter_path: "/usr/bin/nsenter".into(), path: "/run/netns/x".into() };
        assert_eq!(
            netns.host_prefix(),
            vec![OsString::from("/usr/bin/nsenter"), "--net=/run/netns/x".into(), "--".into()]
        );
    }
}
