//! A TCP proxy that stands between two real processes (a replica and etcd, a node agent
//! and a replica) so a test can partition them without touching either process.
//!
//! - [`ProxyMode::Pass`]: bytes flow both ways.
//! - [`ProxyMode::BlackHole`]: a partition. Nothing is forwarded in either direction and new
//!   connections are accepted but not connected upstream; bytes already read are held, not
//!   dropped, so once the partition heals they arrive like TCP retransmissions would (a
//!   peer whose own timeout fired meanwhile has closed the connection by then).
//! - [`ProxyMode::Reset`]: every open connection is closed and new ones are closed at once
//!   (a peer that crashed or refuses).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProxyMode {
    Pass,
    BlackHole,
    Reset,
}

/// A running proxy; stops (and closes every connection) when dropped.
pub struct Proxy {
    address: SocketAddr,
    upstream: SocketAddr,
    mode: watch::Sender<ProxyMode>,
    connections: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let (mode, _) = watch::channel(ProxyMode::Pass);
        let connections = Arc::new(AtomicU64::new(0));
        let accept_mode = mode.clone();
        let accepted = Arc::clone(&connections);
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                accepted.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(connection(client, upstream, accept_mode.subscribe()));
            }
        });
        Ok(Self { address, upstream, mode, connections, task })
    }

    /// Where clients connect: `127.0.0.1:<port>`.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// `http://127.0.0.1:<port>`, for endpoint flags.
    pub fn url(&self) -> String {
        format!("http://{}", self.address)
    }

    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    pub fn set_mode(&self, mode: ProxyMode) {
        self.mode.send_replace(mode);
    }

    pub fn mode(&self) -> ProxyMode {
        *self.mode.borrow()
    }

    /// Stops listening for good and closes every connection: clients get "connection
    /// refused", as from a host whose process died (a listening proxy in front of a dead
    /// upstream would instead accept and then drop every connection, which a client cannot
    /// tell from a request lost mid-way).
    pub fn close(&self) {
        self.mode.send_replace(ProxyMode::Reset);
        self.task.abort();
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.mode.send_replace(ProxyMode::Reset);
        self.task.abort();
    }
}

/// Waits until the mode is `Pass`; `false` when it turned `Reset` (or the proxy is gone).
async fn until_pass(mode: &mut watch::Receiver<ProxyMode>) -> bool {
    match mode.wait_for(|mode| *mode != ProxyMode::BlackHole).await {
        Ok(mode) => *mode == ProxyMode::Pass,
        Err(_) => false,
    }
}

async fn connection(client: TcpStream, upstream: SocketAddr, mut mode: watch::Receiver<ProxyMode>) {
    if !until_pass(&mut mode).await {
        return;
    }
    let Ok(server) = TcpStream::connect(upstream).await else { return };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let upward = pump(client_read, server_write, mode.clone());
    let downward = pump(server_read, client_write, mode);
    // Either direction ending (EOF, error, Reset) closes both.
    tokio::select! {
        _ = upward => {}
        _ = downward => {}
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<ProxyMode>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        if !until_pass(&mut mode).await {
            return;
        }
        let read = tokio::select! {
            read = from.read(&mut buffer) => read,
            // A mode change while waiting for bytes: look at it again before reading.
            changed = mode.changed() => {
                if changed.is_err() {
                    return;
                }
                continue;
            }
        };
        let count = match read {
            Ok(0) | Err(_) => return,
            Ok(count) => count,
        };
        // Bytes read during a partition are held until it heals (or dropped on Reset).
        if !until_pass(&mut mode).await {
            return;
        }
        if to.write_all(&buffer[..count]).await.is_err() {
            return;
        }
    }
}
