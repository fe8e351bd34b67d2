//! The Ferry Rust client: JMS-shaped, over the `ferry.v1` gRPC API.
//!
//! ```no_run
//! # async fn demo() -> Result<(), ferry_client::ClientError> {
//! use ferry_client::{AckMode, Client, Message, ReceiveOptions};
//! let client = Client::connect("http://127.0.0.1:7400").await?;
//! let connection = client.open_connection("demo").await?;
//! let session = connection.create_session(AckMode::Auto).await?;
//! let ids = session.send("orders", vec![Message::text("hello").property("n", 5)]).await?;
//! let got = session.receive("orders", ReceiveOptions::timeout_ms(1_000)).await?;
//! connection.close().await?;
//! # Ok(()) }
//! ```
//!
//! **Auto acknowledgement.** In `Auto` (and `DupsOk`) mode a receive hands its batch to the
//! application first and acknowledges it after it returned; the session's next receive, and the
//! connection's close, wait for that acknowledgement. If it fails or gets no answer (a node that
//! went down mid-call), the messages are still the application's: the server may have applied it
//! (the answer was lost), or the messages come again when their leases run out, flagged
//! redelivered. [`Connection::auto_ack_failures`] counts such acknowledgements, for an
//! application that must know when a redelivery may follow.
//!
//! **Failover.** A replicated queue (`ferry queue create --replicas 3`) fails over to another
//! replica when its shard's leader dies: a new leader is elected and serves within about 1.5-3 s.
//! Connect through any node: the client keeps its connection and sessions on that node, which
//! routes each call to the queue's leader. What an application sees meanwhile:
//! - **sends** ([`Session::send`], [`Session::send_async`], [`Session::reply`],
//!   [`Requestor::request`]) take longer and then succeed: a send whose outcome the dying leader
//!   left unknown, or that met no leader, is sent again with the same dedup ids (the client
//!   gives every persistent message for a replicated queue one unless the application did), so
//!   each message is stored once. No error reaches the application, unless the failover outlasts
//!   [`RESEND_ATTEMPTS`] resends (about 3 s of pauses on top of the node's own wait for a
//!   leader), the session is transacted (a transaction's sends and commit are never resent: a
//!   commit across a leader change fails `ABORTED`, and the application rolls back and starts
//!   over), or the queue keeps no dedup ids (`dedup_window_ms` 0): then the send fails with the
//!   `UNAVAILABLE` it met, and it may or may not have been stored;
//! - **consumers** ([`Consumer`]) open their stream again by themselves, up to
//!   [`REOPEN_ATTEMPTS`] times; messages already taken stay the application's and their
//!   acknowledgements land on the new leader; nothing is handed over twice without the
//!   redelivered flag (see [`Consumer`] on failover);
//! - **receives and acknowledgements** ([`Session::receive`], [`Session::ack`]) are answered
//!   by the node once the new leader serves (it waits up to 8 s); one whose answer the dying
//!   leader lost fails `UNAVAILABLE`, and the application calls it again (an acknowledgement
//!   that did land answers `FAILED_PRECONDITION` the second time; an unacknowledged message
//!   comes back flagged redelivered).
//!
//! If the node the client is connected to dies, its connection and sessions die with it: calls
//! fail with a transport error and are not retried; connect to another node and open a new
//! connection.
//!
//! Depends on the API types only.

mod batch;
mod connection;
mod consumer;
#[cfg(test)]
mod fake;
mod message;
mod request;

pub use batch::RESEND_ATTEMPTS;
pub use connection::ACK_RETRIES;
pub use connection::{AutoAckFailures, Client, Connection, ReceiveOptions, Session};
pub use consumer::{Consumer, ConsumerOptions, REOPEN_ATTEMPTS};
pub use ferry_proto::pb;
pub use ferry_proto::pb::AckMode;
pub use message::{Message, Received};
pub use request::Requestor;

/// What can go wrong talking to a server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot reach the server at {url}: {source}")]
    Connect {
        url: String,
        source: tonic::transport::Error,
    },
    /// The server's answer (its message says what to fix; the code is the gRPC status code).
    #[error("{} ({:?})", .0.message(), .0.code())]
    Status(tonic::Status),
    #[error("{0}")]
    InvalidArgument(String),
}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError::Status(s)
    }
}

impl ClientError {
    /// The gRPC code, when the server answered with an error.
    pub fn code(&self) -> Option<tonic::Code> {
        match self {
            ClientError::Status(s) => Some(s.code()),
            _ => None,
        }
    }
}
