//! What the transport alone costs to move a file's bytes: the same number of bytes sent over
//! loopback TCP with no protocol on top, once straight from a sender to the reader (the
//! least any read from a node agent pays) and once through a relay that forwards each piece
//! as it arrives (the least any read through a replica pays). `file-throughput` reports its
//! read rows against these beside the local-read floor, so a ratio says how much of the gap
//! is Berth's and how much is the sockets'. A third path, one hop over a Unix socket pair,
//! is the least any socket costs on one host (no TCP/IP, one copy in and one out), for a
//! reader asking whether a local transport would close the gap.
//!
//! Sender, relay and reader are threads of this process on blocking sockets with Nagle off;
//! each transfer is asked for with one byte, like a request, and timed until its last byte
//! is read. One unmeasured transfer first, as the measured calls run on warm connections.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

/// A stuck floor fails its row instead of hanging the run.
const SOCKET_TIMEOUT: Duration = Duration::from_secs(30);

/// Latencies of `repetitions` transfers of `size` bytes, directly and through a relay over
/// loopback TCP, and directly over a Unix socket.
pub struct TransportFloor {
    pub one_hop: Vec<Duration>,
    pub relayed: Vec<Duration>,
    pub unix_one_hop: Vec<Duration>,
}

/// Measures the three paths; `piece` is the read size of the relay and of the reader (the
/// file stream's chunk size).
pub async fn measure(size: usize, piece: usize, repetitions: usize) -> anyhow::Result<TransportFloor> {
    tokio::task::spawn_blocking(move || {
        let one_hop = timed(size, piece, repetitions, false).context("one loopback TCP hop")?;
        let relayed = timed(size, piece, repetitions, true).context("two loopback TCP hops through a relay")?;
        let unix_one_hop = timed_unix(size, piece, repetitions).context("one Unix socket hop")?;
        Ok(TransportFloor { one_hop, relayed, unix_one_hop })
    })
    .await
    .context("transport floor task")?
}

fn timed(size: usize, piece: usize, repetitions: usize, relay: bool) -> anyhow::Result<Vec<Duration>> {
    let (sender_address, sender) = serve(move |mut client| {
        let data = vec![0x5a; size];
        while request(&mut client)? {
            client.write_all(&data)?;
        }
        Ok(())
    })?;
    let (address, relay_thread) = if relay {
        let (address, thread) = serve(move |mut client| {
            let mut upstream = connect(sender_address)?;
            let mut buffer = vec![0; piece];
            while request(&mut client)? {
                upstream.write_all(b"r")?;
                let mut left = size;
                while left > 0 {
                    let read = upstream.read(&mut buffer[..piece.min(left)])?;
                    if read == 0 {
                        return Err(std::io::ErrorKind::UnexpectedEof.into());
                    }
                    client.write_all(&buffer[..read])?;
                    left -= read;
                }
            }
            upstream.shutdown(Shutdown::Both)
        })?;
        (address, Some(thread))
    } else {
        (sender_address, None)
    };

    let mut reader = connect(address)?;
    let latencies = transfers(&mut reader, size, piece, repetitions);
    reader.shutdown(Shutdown::Both)?;
    drop(reader);
    for thread in [relay_thread, Some(sender)].into_iter().flatten() {
        thread.join().map_err(|_| anyhow::anyhow!("a transport floor thread panicked"))??;
    }
    latencies
}

/// The same transfers as [`timed`]'s one hop, over a connected pair of Unix sockets.
fn timed_unix(size: usize, piece: usize, repetitions: usize) -> anyhow::Result<Vec<Duration>> {
    let (mut reader, mut sender_end) = UnixStream::pair().context("Unix socket pair")?;
    for stream in [&reader, &sender_end] {
        stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
        stream.set_write_timeout(Some(SOCKET_TIMEOUT))?;
    }
    let sender = std::thread::spawn(move || -> std::io::Result<()> {
        let data = vec![0x5a; size];
        while request(&mut sender_end)? {
            sender_end.write_all(&data)?;
        }
        Ok(())
    });
    let latencies = transfers(&mut reader, size, piece, repetitions);
    reader.shutdown(Shutdown::Both)?;
    drop(reader);
    sender.join().map_err(|_| anyhow::anyhow!("a transport floor thread panicked"))?.context("transfer")?;
    latencies
}

/// One unmeasured, then `repetitions` timed transfers of `size` bytes, each asked for with
/// one byte and read in `piece`-sized reads.
fn transfers(
    reader: &mut (impl Read + Write),
    size: usize,
    piece: usize,
    repetitions: usize,
) -> anyhow::Result<Vec<Duration>> {
    let mut buffer = vec![0; piece];
    let mut latencies = Vec::with_capacity(repetitions);
    for repetition in 0..=repetitions {
        let started = Instant::now();
        reader.write_all(b"r")?;
        let mut left = size;
        while left > 0 {
            let read = reader.read(&mut buffer[..piece.min(left)])?;
            if read == 0 {
                bail!("the sender closed after {} of {size} bytes", size - left);
            }
            left -= read;
        }
        if repetition > 0 {
            latencies.push(started.elapsed());
        }
    }
    Ok(latencies)
}

/// A thread serving one connection on a fresh loopback port.
fn serve(
    handle: impl FnOnce(TcpStream) -> std::io::Result<()> + Send + 'static,
) -> anyhow::Result<(std::net::SocketAddr, JoinHandle<anyhow::Result<()>>)> {
    let listener = TcpListener::bind("127.0.0.1:0").context("loopback listener")?;
    let address = listener.local_addr()?;
    let thread = std::thread::spawn(move || {
        let (stream, _) = listener.accept().context("accept")?;
        configure(&stream)?;
        handle(stream).context("transfer")
    });
    Ok((address, thread))
}

fn connect(address: std::net::SocketAddr) -> std::io::Result<TcpStream> {
    let stream = TcpStream::connect(address)?;
    configure(&stream)?;
    Ok(stream)
}

fn configure(stream: &TcpStream) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(SOCKET_TIMEOUT))?;
    stream.set_write_timeout(Some(SOCKET_TIMEOUT))
}

/// Waits for the next one-byte request; `false` when the peer closed.
fn request(stream: &mut impl Read) -> std::io::Result<bool> {
    let mut byte = [0u8; 1];
    Ok(stream.read(&mut byte)? == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_path_delivers_every_byte_and_times_each_transfer() {
        let floor = measure(3 * 65536 + 17, 65536, 4).await.unwrap();
        assert_eq!(floor.one_hop.len(), 4);
        assert_eq!(floor.relayed.len(), 4);
        assert_eq!(floor.unix_one_hop.len(), 4);
        assert!(
            floor.one_hop.iter().chain(&floor.relayed).chain(&floor.unix_one_hop).all(|latency| !latency.is_zero())
        );
    }
}
