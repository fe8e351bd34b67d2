//! A TCP proxy between clients and a node, in process (this kernel has no `tc netem`): it
//! forwards bytes both ways, and on command delays every chunk, resets every connection
//! (RST, not FIN), or black-holes: stops forwarding, so calls stall as on a cut link, until
//! healed (TCP would retransmit the bytes after a short cut, so nothing is dropped).
//!
//! Only 127.0.0.1. Every task belongs to the proxy and ends when it is dropped.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Forward,
    /// Each chunk waits this long before it is written on.
    Delay(Duration),
    /// Nothing moves, in either direction, on old or new connections.
    Blackhole,
}

/// Bytes read per chunk.
const CHUNK_BYTES: usize = 64 * 1024;

#[derive(Debug)]
struct Shared {
    mode: watch::Sender<Mode>,
    /// Bumped to reset every connection open at that moment.
    resets: watch::Sender<u64>,
    open: AtomicU64,
}

/// A running proxy; stops (and drops every connection) when dropped.
#[derive(Debug)]
pub struct Proxy {
    /// Where clients connect.
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    _tasks: JoinSet<()>,
}

impl Proxy {
    /// Listens on a free port of 127.0.0.1 and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> anyhow::Result<Proxy> {
        anyhow::ensure!(
            upstream.ip().is_loopback(),
            "the proxy only forwards to 127.0.0.1"
        );
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            mode: watch::channel(Mode::Forward).0,
            resets: watch::channel(0).0,
            open: AtomicU64::new(0),
        });
        let mut tasks = JoinSet::new();
        tasks.spawn(accept(listener, upstream, shared.clone()));
        Ok(Proxy {
            addr,
            shared,
            _tasks: tasks,
        })
    }

    /// The proxy's URL for clients.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_mode(&self, mode: Mode) {
        self.shared.mode.send_replace(mode);
    }

    pub fn mode(&self) -> Mode {
        *self.shared.mode.borrow()
    }

    /// Resets every open connection; returns how many there were.
    pub fn reset_all(&self) -> u64 {
        let n = self.shared.open.load(Ordering::Relaxed);
        self.shared.resets.send_modify(|g| *g += 1);
        n
    }

    /// Connections open through the proxy now.
    pub fn open_connections(&self) -> u64 {
        self.shared.open.load(Ordering::Relaxed)
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, shared: Arc<Shared>) {
    // The connection tasks live as long as this one: the proxy's JoinSet aborts it, and
    // dropping this set aborts them.
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                connections.spawn(connection(client, upstream, shared.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Counts a connection as open while it lives.
struct OpenGuard(Arc<Shared>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::Relaxed);
    }
}

async fn connection(client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) {
    shared.open.fetch_add(1, Ordering::Relaxed);
    let _open = OpenGuard(shared.clone());
    let mut resets = shared.resets.subscribe();
    let _ = resets.borrow_and_update();
    let run = async {
        // A black hole holds new connections too, before they reach the node.
        wait_while_blackholed(&mut shared.mode.subscribe()).await;
        let server = TcpStream::connect(upstream).await?;
        for s in [&client, &server] {
            let _ = s.set_nodelay(true);
            // Closing sends RST, not FIN: what a reset is meant to be.
            let _ = s.set_zero_linger();
        }
        let (cr, cw) = client.into_split();
        let (sr, sw) = server.into_split();
        let up = pump(cr, sw, shared.mode.subscribe());
        let down = pump(sr, cw, shared.mode.subscribe());
        // Either side closing ends the connection.
        tokio::select! {
            r = up => r,
            r = down => r,
        }
    };
    // A reset drops both sockets mid-flight (RST to both ends).
    tokio::select! {
        _ = run => {}
        _ = resets.changed() => {}
    }
}

async fn wait_while_blackholed(mode: &mut watch::Receiver<Mode>) {
    // Bounded: the nemesis heals every black hole it makes; the proxy's owner drops it at the
    // end of a run, which aborts this wait.
    let _ = mode.wait_for(|m| *m != Mode::Blackhole).await;
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut mode: watch::Receiver<Mode>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK_BYTES];
    loop {
        wait_while_blackholed(&mut mode).await;
        let n = from.read(&mut buf).await?;
        if n == 0 {
            to.shutdown().await?;
            return Ok(());
        }
        let current = *mode.borrow_and_update();
        match current {
            Mode::Delay(d) => tokio::time::sleep(d).await,
            Mode::Blackhole => wait_while_blackholed(&mut mode).await,
            Mode::Forward => {}
        }
        to.write_all(&buf[..n]).await?;
    }
}
