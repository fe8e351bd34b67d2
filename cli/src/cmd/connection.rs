//! One client connection per command, closed however the command ends.
//!
//! A connection the server is not told about stays open until its lease runs out (30 s by
//! default), holding its sessions' unacknowledged messages and its temporary queues. So a
//! command runs its work inside [`with_connection`], which closes the connection after it on
//! every path: success, an error from the server, a closed stdout, ctrl-c or SIGTERM.

use std::time::Duration;

use anyhow::Context as _;
use ferry_client::{Client, Connection};

/// How long closing may take before the command gives up on it (the lease then ends it).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The command was stopped by a signal (ctrl-c: SIGINT, or SIGTERM) after it closed its
/// connection. The binary exits quietly with 128 + the signal's number, as a shell reports for a
/// process the signal killed.
#[derive(Debug, thiserror::Error)]
#[error("interrupted by {name}")]
pub struct Interrupted {
    name: &'static str,
    number: u8,
}

impl Interrupted {
    /// 128 + the signal's number.
    pub fn exit_status(&self) -> u8 {
        128 + self.number
    }
}

/// Opens a connection named `client_id`, runs `body` on it, and closes it whatever happened.
/// `body`'s error wins over a failure to close.
pub(crate) async fn with_connection<T>(
    client: &Client,
    client_id: &str,
    body: impl AsyncFnOnce(&Connection) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    // Listen before the connection exists, so a signal never finds it unguarded.
    let mut signals = Signals::new()?;
    let connection = client
        .open_connection(client_id)
        .await
        .context("cannot open a connection")?;
    let result = tokio::select! {
        r = body(&connection) => r,
        i = signals.next() => Err(i.into()),
    };
    let closed = tokio::time::timeout(CLOSE_TIMEOUT, connection.close()).await;
    let value = result?;
    match closed {
        Ok(Ok(())) => Ok(value),
        Ok(Err(e)) => Err(anyhow::Error::new(e).context("cannot close the connection")),
        Err(_) => anyhow::bail!(
            "the node did not confirm closing the connection within {} s; it ends when its lease runs out",
            CLOSE_TIMEOUT.as_secs()
        ),
    }
}

/// SIGINT and SIGTERM, while a command holds a connection.
struct Signals {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> anyhow::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        let listen = |kind| signal(kind).context("cannot listen for signals");
        Ok(Self {
            int: listen(SignalKind::interrupt())?,
            term: listen(SignalKind::terminate())?,
        })
    }

    async fn next(&mut self) -> Interrupted {
        tokio::select! {
            _ = self.int.recv() => Interrupted { name: "SIGINT", number: 2 },
            _ = self.term.recv() => Interrupted { name: "SIGTERM", number: 15 },
        }
    }
}
