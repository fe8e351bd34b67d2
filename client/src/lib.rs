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
//! Depends on the API types only.

mod batch;
mod connection;
mod consumer;
#[cfg(test)]
mod fake;
mod message;
mod request;

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
