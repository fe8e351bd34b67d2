//! Accepting connections for the node's gRPC listeners, without letting a failing `accept` spin
//! and without letting a silent socket hold a descriptor for ever.
//!
//! tonic retries a failed accept at once, so at the open-file limit (`EMFILE`) its accept loop
//! took a whole core. [`Incoming`] never hands tonic an error: after a failure it pauses
//! ([`Backoff`]: 10 ms doubling to 1 s, reset by the next accepted connection) and logs at most
//! once per 10 s. Each accepted connection then gets `TCP_NODELAY`, TCP keepalive and a
//! [`Handshake`] deadline.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Sleep;
use tokio_stream::{Stream, StreamExt as _};
use tonic::transport::server::Connected;

/// Where connections come from: a listener, or a scripted fake in tests.
pub trait Accept {
    type Conn;
    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<Self::Conn>>;
}

impl Accept for TcpListener {
    type Conn = TcpStream;

    fn poll_accept(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<TcpStream>> {
        TcpListener::poll_accept(self, cx).map_ok(|(stream, _)| stream)
    }
}

/// How long to pause after a failed accept, and when to say so in the log. Time is an input.
#[derive(Debug)]
pub struct Backoff {
    delay: Duration,
    failures_unlogged: u64,
    next_log_at: Option<Instant>,
}

/// What to do after one failed accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pause {
    /// Wait this long before the next accept.
    pub delay: Duration,
    /// `Some(n)`: log now, for the `n` failures since the last log line.
    pub log_failures: Option<u64>,
}

impl Backoff {
    pub const DELAY_MIN: Duration = Duration::from_millis(10);
    pub const DELAY_MAX: Duration = Duration::from_secs(1);
    pub const LOG_INTERVAL: Duration = Duration::from_secs(10);

    pub fn new() -> Self {
        Self {
            delay: Self::DELAY_MIN,
            failures_unlogged: 0,
            next_log_at: None,
        }
    }

    /// An accept failed at `now`.
    pub fn failed(&mut self, now: Instant) -> Pause {
        let delay = self.delay;
        self.delay = (delay * 2).min(Self::DELAY_MAX);
        self.failures_unlogged += 1;
        let log_failures = match self.next_log_at {
            Some(at) if now < at => None,
            _ => {
                self.next_log_at = Some(now + Self::LOG_INTERVAL);
                Some(std::mem::take(&mut self.failures_unlogged))
            }
        };
        Pause {
            delay,
            log_failures,
        }
    }

    /// A connection was accepted: the next failure pauses briefly again.
    pub fn accepted(&mut self) {
        self.delay = Self::DELAY_MIN;
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new()
    }
}

/// Errors about one connection (gone before it was accepted), not about the listener: the next
/// accept may succeed at once. The rest (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) pause.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// Connection errors handled in one poll before [`Incoming`] lets other tasks run.
const CONNECTION_ERRORS_PER_POLL_MAX: usize = 64;

/// Accepted connections, pausing after failures; never yields an error and never ends.
#[derive(Debug)]
pub struct Incoming<A> {
    source: A,
    backoff: Backoff,
    pause: Option<Pin<Box<Sleep>>>,
}

impl<A> Incoming<A> {
    pub fn new(source: A) -> Self {
        Self {
            source,
            backoff: Backoff::new(),
            pause: None,
        }
    }
}

impl<A: Accept + Unpin> Stream for Incoming<A> {
    type Item = A::Conn;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<A::Conn>> {
        let this = self.get_mut();
        for _ in 0..CONNECTION_ERRORS_PER_POLL_MAX {
            if let Some(pause) = &mut this.pause {
                ready!(pause.as_mut().poll(cx));
                this.pause = None;
            }
            match ready!(this.source.poll_accept(cx)) {
                Ok(conn) => {
                    this.backoff.accepted();
                    return Poll::Ready(Some(conn));
                }
                Err(e) if is_connection_error(&e) => {
                    tracing::debug!(error = %e, "a connection went away before it was accepted");
                }
                Err(e) => {
                    let pause = this.backoff.failed(Instant::now());
                    if let Some(failures) = pause.log_failures {
                        tracing::warn!(
                            error = %e,
                            failures,
                            pause_ms = pause.delay.as_millis() as u64,
                            "cannot accept connections; pausing before the next try (at the \
                             open-file limit? raise `ulimit -n` / LimitNOFILE)"
                        );
                    }
                    this.pause = Some(Box::pin(tokio::time::sleep(pause.delay)));
                }
            }
        }
        // Only a run of connection errors gets here: let other tasks run, then go on.
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// The HTTP/2 client connection preface (`PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n`) is 24 bytes.
const HTTP2_PREFACE_BYTES: usize = 24;

/// An accepted connection that must send the HTTP/2 connection preface before a deadline;
/// otherwise its next read fails with `TimedOut` and the server drops it. After the preface,
/// HTTP/2 keepalive takes over.
#[derive(Debug)]
pub struct Handshake<S> {
    inner: S,
    /// `None` once the preface is in.
    deadline: Option<Pin<Box<Sleep>>>,
    preface_bytes_left: usize,
}

impl<S> Handshake<S> {
    pub fn new(inner: S, timeout: Duration) -> Self {
        Self {
            inner,
            deadline: Some(Box::pin(tokio::time::sleep(timeout))),
            preface_bytes_left: HTTP2_PREFACE_BYTES,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Handshake<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.deadline.is_some() {
                    let read = buf.filled().len() - before;
                    this.preface_bytes_left = this.preface_bytes_left.saturating_sub(read);
                    if this.preface_bytes_left == 0 {
                        this.deadline = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let expired = match &mut this.deadline {
                    Some(deadline) => deadline.as_mut().poll(cx).is_ready(),
                    None => false,
                };
                if expired {
                    Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "no HTTP/2 connection preface within limits.grpc_handshake_timeout_ms",
                    )))
                } else {
                    Poll::Pending
                }
            }
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Handshake<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl<S: Connected> Connected for Handshake<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

/// What every accepted connection gets.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionSettings {
    pub handshake_timeout: Duration,
    /// Idle time before TCP keepalive probes; `None`: no TCP keepalive.
    pub tcp_keepalive_idle: Option<Duration>,
}

/// TCP keepalive probes after the idle time: one every 10 s, the connection dropped after 3
/// unanswered.
const TCP_KEEPALIVE_PROBE_INTERVAL: Duration = Duration::from_secs(10);
const TCP_KEEPALIVE_PROBES: u32 = 3;

/// The connections a gRPC server built on `listener` serves. Nagle's algorithm is off: small
/// answers (a confirm, an ack) go out at once instead of waiting up to 40 ms for the peer's
/// delayed ACK. (`Server::tcp_nodelay` and `Server::tcp_keepalive` only apply to listeners
/// tonic binds itself.)
pub fn incoming(
    listener: TcpListener,
    settings: ConnectionSettings,
) -> impl Stream<Item = io::Result<Handshake<TcpStream>>> {
    Incoming::new(listener).filter_map(move |stream| match tune(&stream, &settings) {
        Ok(()) => Some(Ok(Handshake::new(stream, settings.handshake_timeout))),
        Err(e) => {
            // The socket is dropped; the client sees its connection closed.
            tracing::debug!(error = %e, "cannot set up an accepted connection; closing it");
            None
        }
    })
}

fn tune(stream: &TcpStream, settings: &ConnectionSettings) -> io::Result<()> {
    stream.set_nodelay(true)?;
    if let Some(idle) = settings.tcp_keepalive_idle {
        let keepalive = socket2::TcpKeepalive::new()
            .with_time(idle)
            .with_interval(TCP_KEEPALIVE_PROBE_INTERVAL)
            .with_retries(TCP_KEEPALIVE_PROBES);
        socket2::SockRef::from(stream).set_tcp_keepalive(&keepalive)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::io::Write as _;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use tokio_stream::StreamExt as _;

    use super::*;

    #[test]
    fn backoff_doubles_from_10_ms_to_1_s_and_resets_once_a_connection_is_accepted() {
        let mut b = Backoff::new();
        let now = Instant::now();
        let delays: Vec<u64> = (0..10)
            .map(|_| b.failed(now).delay.as_millis() as u64)
            .collect();
        assert_eq!(
            delays,
            [10, 20, 40, 80, 160, 320, 640, 1000, 1000, 1000],
            "bounded, never 0"
        );
        b.accepted();
        assert_eq!(b.failed(now).delay, Backoff::DELAY_MIN);
    }

    #[test]
    fn backoff_logs_the_first_failure_then_at_most_once_per_interval() {
        let mut b = Backoff::new();
        let t0 = Instant::now();
        assert_eq!(b.failed(t0).log_failures, Some(1));
        let step = Duration::from_millis(500);
        let mut logged = vec![];
        // 40 failures 500 ms apart: 19.5 s after the first.
        for i in 1..=40u32 {
            if let Some(n) = b.failed(t0 + step * i).log_failures {
                logged.push((i, n));
            }
        }
        // At 10 s and 20 s after the first line, each counting the failures it covers.
        assert_eq!(logged, [(20, 20), (40, 20)]);
    }

    /// Answers accepts from a script, then fails for ever with `EMFILE`; counts the tries.
    struct ScriptedListener {
        script: VecDeque<io::Result<u32>>,
        tries: Arc<AtomicUsize>,
    }

    impl ScriptedListener {
        fn new(script: Vec<io::Result<u32>>) -> (Self, Arc<AtomicUsize>) {
            let tries = Arc::new(AtomicUsize::new(0));
            let listener = Self {
                script: script.into(),
                tries: tries.clone(),
            };
            (listener, tries)
        }
    }

    fn emfile() -> io::Error {
        io::Error::from_raw_os_error(24) // EMFILE: too many open files
    }

    impl Accept for ScriptedListener {
        type Conn = u32;

        fn poll_accept(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<u32>> {
            self.tries.fetch_add(1, Ordering::SeqCst);
            Poll::Ready(self.script.pop_front().unwrap_or_else(|| Err(emfile())))
        }
    }

    // Postmortem: at the open-file limit tonic's accept loop retried `accept` at once, for ever,
    // at 100 % CPU.
    #[tokio::test]
    async fn a_failing_accept_pauses_instead_of_spinning() {
        let (listener, tries) = ScriptedListener::new(vec![]);
        let mut incoming = Incoming::new(listener);
        let window = Duration::from_millis(300);
        let got = tokio::time::timeout(window, incoming.next()).await;
        assert!(got.is_err(), "nothing is accepted and no error comes out");
        // Pauses of 10 + 20 + 40 + 80 + 160 ms: at most 5 tries fit in 300 ms (a spinning loop
        // makes millions). Fewer if the machine is slow.
        let tries = tries.load(Ordering::SeqCst);
        assert!(
            (1..=6).contains(&tries),
            "{tries} accept calls in {window:?}"
        );
    }

    #[tokio::test]
    async fn accepting_resumes_after_failures_and_connection_errors_do_not_pause() {
        let aborted = || io::Error::from(io::ErrorKind::ConnectionAborted);
        let (listener, tries) = ScriptedListener::new(vec![
            Err(emfile()),
            Err(emfile()),
            Ok(1),
            Err(aborted()),
            Err(aborted()),
            Err(aborted()),
            Ok(2),
        ]);
        let mut incoming = Incoming::new(listener);
        let deadline = Duration::from_secs(5);
        let first = tokio::time::timeout(deadline, incoming.next()).await;
        assert_eq!(first.expect("accepted after two pauses"), Some(1));
        // No pause for errors about one connection: the next accept is in the same poll.
        let second = std::future::poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx)).await;
        assert_eq!(second, Some(2));
        assert_eq!(tries.load(Ordering::SeqCst), 7);
    }

    #[tokio::test]
    async fn a_long_run_of_connection_errors_yields_to_other_tasks() {
        let aborted = || Err(io::Error::from(io::ErrorKind::ConnectionAborted));
        let mut script: Vec<io::Result<u32>> = (0..200).map(|_| aborted()).collect();
        script.push(Ok(7));
        let (listener, tries) = ScriptedListener::new(script);
        let mut incoming = Incoming::new(listener);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(Pin::new(&mut incoming).poll_next(&mut cx).is_pending());
        assert_eq!(tries.load(Ordering::SeqCst), CONNECTION_ERRORS_PER_POLL_MAX);
        let got = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await;
        assert_eq!(got.expect("accepted"), Some(7));
    }

    /// A connected pair on loopback: the server side wrapped, the client side plain.
    async fn pair(timeout: Duration) -> (Handshake<TcpStream>, std::net::TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let client = std::net::TcpStream::connect(addr).expect("connect");
        let (server, _) = listener.accept().await.expect("accept");
        (Handshake::new(server, timeout), client)
    }

    async fn read(conn: &mut Handshake<TcpStream>, buf: &mut [u8]) -> io::Result<usize> {
        let mut buf = ReadBuf::new(buf);
        std::future::poll_fn(|cx| Pin::new(&mut *conn).poll_read(cx, &mut buf)).await?;
        Ok(buf.filled().len())
    }

    #[tokio::test]
    async fn a_connection_without_a_preface_is_refused_after_the_handshake_timeout() {
        let (mut conn, mut client) = pair(Duration::from_millis(50)).await;
        // Part of a preface is not enough.
        let part = b"PRI * HTTP/2.0";
        client.write_all(part).expect("write");
        let mut buf = [0u8; 64];
        let mut got = 0;
        let refused = loop {
            let read = tokio::time::timeout(Duration::from_secs(5), read(&mut conn, &mut buf))
                .await
                .expect("the deadline fires well within 5 s");
            match read {
                Ok(0) => panic!("end of stream instead of the deadline"),
                Ok(n) => got += n,
                Err(e) => break e,
            }
            assert!(got <= part.len(), "read more than was sent");
        };
        assert_eq!(got, part.len());
        assert_eq!(refused.kind(), io::ErrorKind::TimedOut);
    }

    #[tokio::test]
    async fn a_connection_that_sent_its_preface_has_no_deadline() {
        let (mut conn, mut client) = pair(Duration::from_millis(50)).await;
        client
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .expect("write");
        let mut buf = [0u8; 64];
        let mut got = 0;
        while got < HTTP2_PREFACE_BYTES {
            got += read(&mut conn, &mut buf[got..]).await.expect("preface");
        }
        // Three times the handshake timeout with nothing to read: still open, still waiting.
        let idle =
            tokio::time::timeout(Duration::from_millis(150), read(&mut conn, &mut buf)).await;
        assert!(idle.is_err(), "the read is still pending: {idle:?}");
    }
}
