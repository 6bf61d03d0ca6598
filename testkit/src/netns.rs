//! Stand-ins for the machines around a node, for network-isolation tests: a network
//! namespace of the test's own, joined to the host by a veth pair, holding a "public"
//! service (203.0.113.x), a "private" one (10.x) and a "cloud metadata" one
//! (169.254.169.254), plus listeners on the host itself (loopback only, and every host
//! address as etcd or a replica would). Every listener records the connections it accepts
//! (the host-side marker of a network attack test): a blocked destination must record none.
//!
//! Needs root. One [`StandIns`] exists at a time per host (a file lock), because
//! 169.254.169.254 can be routed to only one place; everything is removed on drop, even
//! when the test fails.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{Flock, FlockArg};
use nix::sched::CloneFlags;

/// The cloud metadata address every cloud serves its credentials on.
pub const METADATA: Ipv4Addr = Ipv4Addr::new(169, 254, 169, 254);
const LOCK_FILE: &str = "/run/berth-test-standins.lock";

/// One listener and the local addresses of the connections it accepted.
pub struct Recorder {
    pub port: u16,
    hits: Arc<Mutex<Vec<SocketAddr>>>,
    stop: Arc<AtomicBool>,
}

impl Recorder {
    fn start(listener: TcpListener) -> Self {
        let port = listener.local_addr().expect("listener address").port();
        listener.set_nonblocking(true).expect("nonblocking listener");
        let hits = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (recorded, stopped) = (hits.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let local = stream.local_addr().expect("accepted address");
                        recorded.lock().unwrap().push(local);
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Self { port, hits, stop }
    }

    /// Connections accepted on `address` (any of the listener's addresses when `None`).
    pub fn hits(&self, address: Option<IpAddr>) -> usize {
        let canonical = |ip: IpAddr| match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map(IpAddr::V4).unwrap_or(IpAddr::V6(v6)),
            v4 => v4,
        };
        let hits = self.hits.lock().unwrap();
        hits.iter().filter(|local| address.is_none_or(|wanted| canonical(local.ip()) == wanted)).count()
    }
}

impl Drop for Recorder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Which listener a [`Target`] reaches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Listener {
    Remote,
    HostLoopback,
    HostAny,
}

/// A destination a sandbox tries, and how to tell whether it got there.
#[derive(Clone, Debug)]
pub struct Target {
    pub what: String,
    pub address: IpAddr,
    pub port: u16,
    pub listener: Listener,
}

impl Target {
    /// `address port` as two shell words (IPv6 unbracketed).
    pub fn words(&self) -> [String; 2] {
        [self.address.to_string(), self.port.to_string()]
    }
}

/// The stand-ins; see the module docs.
pub struct StandIns {
    /// Network namespace of the remote services.
    pub netns: String,
    host_veth: String,
    routes: Vec<String>,
    pub public: Ipv4Addr,
    pub private: Ipv4Addr,
    pub metadata: Ipv4Addr,
    /// Listens in the stand-in namespace on all of `public`, `private` and `metadata`.
    pub remote: Recorder,
    /// Listens on host 127.0.0.1 only (a replica, a node agent's local port).
    pub host_loopback: Recorder,
    /// Listens on every host address, IPv4 and IPv6 (`[::]`, as etcd on `0.0.0.0` would).
    pub host_any: Recorder,
    _lock: Flock<File>,
}

impl StandIns {
    /// Builds the namespace, the veth pair, the host routes and the listeners.
    pub fn create() -> Self {
        let lock_file = File::options().create(true).truncate(false).write(true).open(LOCK_FILE).expect("lock file");
        let lock = Flock::lock(lock_file, FlockArg::LockExclusive).map_err(|(_, error)| error).expect("lock");
        let tag: u32 = rand::random::<u32>() % 0xff_ffff;
        let netns = format!("berth-t-{tag:06x}");
        let host_veth = format!("bth{tag:06x}");
        let peer_veth = format!("btp{tag:06x}");
        let public = Ipv4Addr::new(203, 0, 113, 10 + (tag % 200) as u8);
        let private = Ipv4Addr::new(10, 123, (tag >> 8) as u8, 10);
        let mut stand_ins = Self {
            netns: netns.clone(),
            host_veth: host_veth.clone(),
            routes: Vec::new(),
            public,
            private,
            metadata: METADATA,
            remote: Recorder::start(TcpListener::bind("127.0.0.1:0").expect("placeholder")),
            host_loopback: Recorder::start(TcpListener::bind("127.0.0.1:0").expect("loopback listener")),
            host_any: Recorder::start(TcpListener::bind("[::]:0").expect("[::] listener")),
            _lock: lock,
        };
        ip(&["netns", "add", &netns]);
        ip(&["link", "add", &host_veth, "type", "veth", "peer", "name", &peer_veth]);
        ip(&["link", "set", &peer_veth, "netns", &netns]);
        ip(&["link", "set", &host_veth, "up"]);
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        ip(&["-n", &netns, "link", "set", &peer_veth, "up"]);
        for address in [public, private, METADATA] {
            ip(&["-n", &netns, "addr", "add", &format!("{address}/32"), "dev", &peer_veth]);
            let route = format!("{address}/32");
            ip(&["route", "add", &route, "dev", &host_veth]);
            stand_ins.routes.push(route);
        }
        ip(&["-n", &netns, "route", "add", "default", "dev", &peer_veth]);
        stand_ins.remote = Recorder::start(bind_in(&netns));
        stand_ins
    }

    fn target(&self, what: &str, address: IpAddr, listener: Listener) -> Target {
        let port = match listener {
            Listener::Remote => self.remote.port,
            Listener::HostLoopback => self.host_loopback.port,
            Listener::HostAny => self.host_any.port,
        };
        Target { what: what.to_owned(), address, port, listener }
    }

    /// The service on the public internet (reachable by every networked sandbox).
    pub fn public_target(&self) -> Target {
        self.target("public service", self.public.into(), Listener::Remote)
    }

    /// The service at a private (10/8) address (reachable only when allowed).
    pub fn private_target(&self) -> Target {
        self.target("private service", self.private.into(), Listener::Remote)
    }

    /// Everything a sandbox must not reach by default: the private service, cloud
    /// metadata, host loopback (v4 and v6) and every address of the host.
    pub fn blocked_targets(&self) -> Vec<Target> {
        let mut targets = vec![
            self.private_target(),
            self.target("cloud metadata", self.metadata.into(), Listener::Remote),
            self.target("host loopback listener", Ipv4Addr::LOCALHOST.into(), Listener::HostLoopback),
            self.target("host-wide listener on loopback", Ipv4Addr::LOCALHOST.into(), Listener::HostAny),
            self.target("host-wide listener on ::1", std::net::Ipv6Addr::LOCALHOST.into(), Listener::HostAny),
        ];
        for address in Self::host_addresses() {
            targets.push(self.target("host-wide listener on a host address", address, Listener::HostAny));
        }
        // pasta maps the gateway to the host unless told not to (`--no-map-gw`).
        for gateway in Self::default_gateways() {
            targets.push(self.target("host-wide listener via the default gateway", gateway, Listener::HostAny));
            targets.push(self.target(
                "host loopback listener via the default gateway",
                gateway,
                Listener::HostLoopback,
            ));
        }
        targets
    }

    /// The host's default gateways (`ip route show default`).
    fn default_gateways() -> Vec<IpAddr> {
        let output = Command::new("ip").args(["route", "show", "default"]).output().expect("ip route");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| line.split_whitespace().skip_while(|word| *word != "via").nth(1)?.parse().ok())
            .collect()
    }

    /// Connections that reached `target`: for the remote stand-ins, those accepted on its
    /// address; for the host's listeners, every connection they accepted (whatever address
    /// it came in on, e.g. a gateway address mapped to host loopback).
    pub fn hits(&self, target: &Target) -> usize {
        match target.listener {
            Listener::Remote => self.remote.hits(Some(target.address)),
            Listener::HostLoopback => self.host_loopback.hits(None),
            Listener::HostAny => self.host_any.hits(None),
        }
    }

    /// Panics naming every blocked target that recorded a connection.
    pub fn assert_none_reached(&self, targets: &[Target]) {
        let reached: Vec<String> = targets
            .iter()
            .filter(|target| self.hits(target) > 0)
            .map(|target| format!("{} at {} port {}", target.what, target.address, target.port))
            .collect();
        assert!(reached.is_empty(), "the sandbox reached: {reached:?}");
    }

    /// Every host address (IPv4 and IPv6) other than loopback, as `ip -o addr` lists them.
    pub fn host_addresses() -> Vec<IpAddr> {
        let output = Command::new("ip").args(["-o", "addr", "show"]).output().expect("ip addr");
        String::from_utf8_lossy(&output.stdout)
            .lines()
            .filter_map(|line| {
                let mut words = line.split_whitespace();
                words.find(|word| *word == "inet" || *word == "inet6")?;
                words.next()?.split('/').next()?.parse().ok()
            })
            .filter(|address: &IpAddr| !address.is_loopback())
            .filter(|address| !matches!(address, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80))
            .collect()
    }
}

impl Drop for StandIns {
    fn drop(&mut self) {
        for route in &self.routes {
            let _ = Command::new("ip").args(["route", "del", route]).status();
        }
        let _ = Command::new("ip").args(["link", "del", &self.host_veth]).status();
        let _ = Command::new("ip").args(["netns", "delete", &self.netns]).status();
    }
}

/// Removes a sandbox namespace a test made through a driver, even when the test fails
/// before it could call `destroy`: kills the pasta named by `pid_file`, deletes the
/// namespace and the driver's state files.
pub struct NamespaceGuard {
    pub name: String,
    pub state_dir: std::path::PathBuf,
}

impl Drop for NamespaceGuard {
    fn drop(&mut self) {
        let pid_file = self.state_dir.join(format!("{}.pid", self.name));
        if let Some(pid) = std::fs::read_to_string(&pid_file).ok().and_then(|text| text.trim().parse::<i32>().ok()) {
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            if comm.starts_with("pasta") || comm.starts_with("passt") {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
            }
        }
        if std::path::Path::new("/run/netns").join(&self.name).exists() {
            let _ = Command::new("ip").args(["netns", "delete", &self.name]).status();
        }
        let _ = std::fs::remove_file(pid_file);
        let _ = std::fs::remove_file(self.state_dir.join(format!("{}.owner", self.name)));
    }
}

/// Removes every sandbox namespace recorded in a node's state dir (`<node data dir>/netns`)
/// when a test that ran a real node agent ends, however it ends: the agent's `destroy`
/// would, but a killed agent never gets to it.
pub struct NamespaceSweep {
    pub state_dir: std::path::PathBuf,
}

impl Drop for NamespaceSweep {
    fn drop(&mut self) {
        let Ok(entries) = std::fs::read_dir(&self.state_dir) else { return };
        for entry in entries.flatten() {
            let file_name = entry.file_name().to_string_lossy().into_owned();
            if let Some(name) = file_name.strip_suffix(".pid") {
                drop(NamespaceGuard { name: name.to_owned(), state_dir: self.state_dir.clone() });
            }
        }
    }
}

/// A listener on every address of namespace `netns`: bound from a thread that joined it
/// (the socket stays in that namespace; the test's own threads never move).
fn bind_in(netns: &str) -> TcpListener {
    let path = format!("/run/netns/{netns}");
    std::thread::spawn(move || {
        let namespace = File::open(&path).expect("open the stand-in namespace");
        nix::sched::setns(namespace.as_fd(), CloneFlags::CLONE_NEWNET).expect("join the stand-in namespace");
        TcpListener::bind("0.0.0.0:0").expect("bind in the stand-in namespace")
    })
    .join()
    .expect("binding thread")
}

fn ip(args: &[&str]) {
    let output = Command::new("ip").args(args).output().expect("run ip");
    assert!(output.status.success(), "ip {}: {}", args.join(" "), String::from_utf8_lossy(&output.stderr));
}
