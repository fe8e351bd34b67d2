use anyhow::Context as _;
use ferry_client::{AckMode, ReceiveOptions, Session};

use super::{connect, with_connection, ClientArgs};
use crate::output::{errln, message_json, message_text, outln, BodyArgs, Format};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Ack {
    /// Acknowledged as it is received.
    Auto,
    /// Acknowledged after it is printed (client acknowledge: one acknowledge covers the batch).
    Client,
    /// Each message acknowledged on its own after it is printed.
    Individual,
    /// Rejected after it is printed: sent to the queue's dead-letter queue.
    Reject,
    /// Not acknowledged: the messages return to the queue when this command exits.
    None,
}

#[derive(Debug, clap::Args)]
pub struct ReceiveArgs {
    /// The queue to receive from.
    #[arg(long, short)]
    queue: String,
    /// Stop after this many messages.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// How long to wait for each message; 0 = do not wait; absent = until one comes.
    #[arg(long, allow_negative_numbers = true)]
    timeout_ms: Option<i64>,
    /// Only messages matching this JMS selector.
    #[arg(long)]
    selector: Option<String>,
    /// How the received messages are acknowledged.
    #[arg(long, value_enum, default_value_t = Ack::Auto)]
    ack: Ack,
    #[command(flatten)]
    body: BodyArgs,
}

pub async fn run(c: &ClientArgs, a: ReceiveArgs) -> anyhow::Result<()> {
    let client = connect(c).await?;
    let mode = match a.ack {
        Ack::Auto => AckMode::Auto,
        Ack::Client | Ack::None => AckMode::Client,
        Ack::Individual | Ack::Reject => AckMode::Individual,
    };
    let got = with_connection(&client, "ferry-cli", async |connection| {
        let session = connection.create_session(mode).await?;
        receive_all(c, &a, &session).await
    })
    .await?;
    if got == 0 && c.output == Format::Human {
        errln!("no message arrived");
    }
    Ok(())
}

/// Receives up to `--count` messages, printing and settling each batch; returns how many came.
async fn receive_all(c: &ClientArgs, a: &ReceiveArgs, session: &Session) -> anyhow::Result<u64> {
    let mut got = 0u64;
    while got < a.count {
        let max = u32::try_from((a.count - got).min(500)).unwrap_or(500);
        let opts = ReceiveOptions {
            timeout_ms: a.timeout_ms,
            max_messages: max,
            lease_ms: None,
        };
        let batch = match &a.selector {
            Some(s) => session.receive_selected(&a.queue, s, opts).await,
            None => session.receive(&a.queue, opts).await,
        }
        .with_context(|| format!("cannot receive from queue {}", a.queue))?;
        if batch.is_empty() {
            break;
        }
        for r in &batch {
            match c.output {
                Format::Json => outln!(
                    "{}",
                    message_json(r.message(), Some(&r.delivery), a.body.body_as)
                )?,
                Format::Human => outln!(
                    "{}",
                    message_text(r.message(), Some(&r.delivery), a.body.body_as)
                )?,
            }
        }
        match a.ack {
            Ack::Client | Ack::Individual => {
                session.ack(&batch).await.context("cannot acknowledge")?;
            }
            Ack::Reject => {
                session
                    .reject(&batch, "rejected with ferry receive --ack reject")
                    .await
                    .context("cannot reject")?;
            }
            Ack::Auto | Ack::None => {}
        }
        got += batch.len() as u64;
    }
    Ok(got)
}
