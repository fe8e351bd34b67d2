//! Connections that cost the node nothing for ever: a socket that never speaks HTTP/2 is closed
//! after the handshake timeout, and a node at its open-file limit pauses its accept loop instead
//! of spinning, then serves again once descriptors are free.

use std::io::Read as _;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use ferry_integration_tests::{ferry_cli, wait_until, Node, NodeOptions};

/// Connects `count` plain TCP sockets to `addr` that never send a byte.
fn idle_connections(addr: SocketAddr, count: usize) -> anyhow::Result<Vec<TcpStream>> {
    (0..count)
        .map(|i| {
            TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                .with_context(|| format!("idle connection {i} to {addr}"))
        })
        .collect()
}

/// Reads until the server closes `socket` (end of stream or reset), at most `deadline`.
fn wait_closed_by_server(socket: &mut TcpStream, deadline: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline
            .checked_sub(started.elapsed())
            .context("the server kept the idle connection open")?;
        socket.set_read_timeout(Some(left.max(Duration::from_millis(1))))?;
        match socket.read(&mut buf) {
            Ok(0) => return Ok(()),
            // The server's own HTTP/2 SETTINGS frame comes first.
            Ok(_) => continue,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
                ) =>
            {
                return Ok(())
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(e.into()),
        }
    }
}

// Postmortem: a TCP connection that never sent anything was held for ever, one descriptor each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_never_speaks_http2_is_closed_after_the_handshake_timeout(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(
        dir.path(),
        NodeOptions {
            memory: true,
            extra_toml: "[limits]\ngrpc_handshake_timeout_ms = 300\n".into(),
            ..Default::default()
        },
    )?;
    let _client = node.client().await?;
    for addr in [node.addr, node.peer_addr] {
        let opened = Instant::now();
        let mut socket = idle_connections(addr, 1)?.remove(0);
        let closed = tokio::task::spawn_blocking(move || {
            wait_closed_by_server(&mut socket, Duration::from_secs(10))
        })
        .await?;
        closed.with_context(|| format!("idle connection to {addr}"))?;
        assert!(
            opened.elapsed() >= Duration::from_millis(300),
            "closed by the timeout, not at once: {:?}",
            opened.elapsed()
        );
    }
    // Real clients send the preface at once and are not affected.
    node.client().await?;
    Ok(())
}

/// CPU time (user + system) the process has used so far.
fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = stat
        .rsplit_once(") ")
        .map(|(_, rest)| rest)
        .context("unexpected /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    let out = std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()?;
    let per_second: u64 = String::from_utf8(out.stdout)?.trim().parse()?;
    Ok(Duration::from_millis(ticks * 1000 / per_second))
}

const OPEN_FILES_MAX: u32 = 64;
/// Well past what the node can hold under [`OPEN_FILES_MAX`]; the rest wait in the backlog.
const FLOOD_CONNECTIONS: usize = 150;
const WINDOW: Duration = Duration::from_secs(2);

// Postmortem: at the open-file limit tonic's accept loop retried the failing accept at once,
// for ever, at 100 % CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_at_its_open_file_limit_pauses_accepting_and_serves_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(
        dir.path(),
        NodeOptions {
            memory: true,
            open_files_max: Some(OPEN_FILES_MAX),
            // Idle sockets stay for the whole test: the limit is what is being tried.
            extra_toml: "[limits]\ngrpc_handshake_timeout_ms = 120000\n".into(),
            ..Default::default()
        },
    )?;
    drop(node.client().await?);
    let pid = node.pid().context("the node runs")?;

    let addr = node.addr;
    let flood =
        tokio::task::spawn_blocking(move || idle_connections(addr, FLOOD_CONNECTIONS)).await??;
    wait_until(
        Duration::from_secs(20),
        "the node to report that it cannot accept",
        || {
            let log = node.log();
            async move { Ok(log.contains("cannot accept connections")) }
        },
    )
    .await?;

    // A bound on spinning, not a speed test: a spinning accept loop uses a whole core.
    let (cpu_before, started) = (cpu_time(pid)?, Instant::now());
    tokio::time::sleep(WINDOW).await;
    let (cpu_used, elapsed) = (cpu_time(pid)? - cpu_before, started.elapsed());
    assert!(
        cpu_used < elapsed / 2,
        "the node used {cpu_used:?} of CPU in {elapsed:?} while at its open-file limit"
    );
    let warnings = node.log().matches("cannot accept connections").count();
    assert!(
        warnings <= 2,
        "the failure is logged at most once per 10 s, not per try: {warnings} lines"
    );

    drop(flood);
    wait_until(
        Duration::from_secs(20),
        "the node to serve again",
        || async {
            // A connection still waiting in the backlog would wait for ever: bound each try.
            let tried = tokio::time::timeout(Duration::from_secs(2), node.client()).await;
            Ok(matches!(tried, Ok(Ok(_))))
        },
    )
    .await?;
    let node_ref = &node;
    let (ok, out, err) = tokio::task::block_in_place(|| ferry_cli(node_ref, &["queue", "list"]))?;
    assert!(ok, "ferry queue list: {out}{err}");
    Ok(())
}
