//! `ferry request` and `ferry reply`: request-reply over queues from the command line.

use std::time::Duration;

use anyhow::{bail, Context as _};
use ferry_client::{AckMode, Message, ReceiveOptions, Requestor, Session};
use ferry_proto::pb;
use serde_json::json;

use super::{connect, with_connection, ClientArgs};
use crate::output::{errln, message_json, message_text, outln, BodyArgs, Format};

#[derive(Debug, clap::Args)]
pub struct RequestArgs {
    /// The queue the replier listens on.
    #[arg(long, short)]
    queue: String,
    /// The request body.
    body: String,
    /// A typed property, NAME=VALUE or NAME:TYPE=VALUE (see `ferry send --help`). Repeatable.
    #[arg(long = "property", short = 'p', value_parser = super::parse_property)]
    properties: Vec<(String, pb::PropertyValue)>,
    /// How long to wait for the reply.
    #[arg(long, default_value_t = 5_000)]
    timeout_ms: u64,
    #[command(flatten)]
    body_as: BodyArgs,
}

#[derive(Debug, clap::Args)]
pub struct ReplyArgs {
    /// The queue requests arrive on.
    #[arg(long, short)]
    queue: String,
    /// Answer this many requests, then stop.
    #[arg(long, default_value_t = 1)]
    count: u64,
    /// How long to wait for each request; absent: until one comes.
    #[arg(long)]
    timeout_ms: Option<i64>,
    /// Reply with this body; without it, the reply echoes the request's body.
    #[arg(long)]
    body: Option<String>,
    /// Time to live of each reply: a reply nobody collects in time expires instead of piling up.
    #[arg(long)]
    ttl_ms: Option<u64>,
}

pub async fn request(c: &ClientArgs, a: RequestArgs) -> anyhow::Result<()> {
    let client = connect(c).await?;
    let mut msg = Message::text(a.body);
    for (k, v) in a.properties {
        msg.0.properties.insert(k, v);
    }
    let timeout = Duration::from_millis(a.timeout_ms);
    // Closing the connection deletes the temporary reply queue with it.
    let reply = with_connection(&client, "ferry-cli-request", async |connection| {
        let mut requestor = Requestor::new(connection)
            .await
            .context("cannot set up a temporary queue for the reply")?;
        requestor
            .request(&a.queue, msg, timeout)
            .await
            .with_context(|| format!("cannot send the request to queue {}", a.queue))
    })
    .await?;
    let Some(reply) = reply else {
        bail!(
            "no reply within {} ms: is a replier running? (ferry reply --queue {})",
            a.timeout_ms,
            a.queue
        );
    };
    match c.output {
        Format::Json => outln!(
            "{}",
            message_json(reply.message(), Some(&reply.delivery), a.body_as.body_as)
        )?,
        Format::Human => outln!(
            "{}",
            message_text(reply.message(), Some(&reply.delivery), a.body_as.body_as)
        )?,
    }
    Ok(())
}

pub async fn reply(c: &ClientArgs, a: ReplyArgs) -> anyhow::Result<()> {
    let client = connect(c).await?;
    with_connection(&client, "ferry-cli-reply", async |connection| {
        // Client acknowledge: a request is acknowledged only once its reply was sent.
        let session = connection.create_session(AckMode::Client).await?;
        answer_all(c, &a, &session).await
    })
    .await
}

/// Answers up to `--count` requests.
async fn answer_all(c: &ClientArgs, a: &ReplyArgs, session: &Session) -> anyhow::Result<()> {
    let mut answered = 0u64;
    while answered < a.count {
        let opts = ReceiveOptions {
            timeout_ms: a.timeout_ms,
            ..ReceiveOptions::default()
        };
        let got = session
            .receive(&a.queue, opts)
            .await
            .with_context(|| format!("cannot receive from queue {}", a.queue))?;
        let Some(request) = got.into_iter().next() else {
            break;
        };
        let body = a
            .body
            .clone()
            .map_or_else(|| request.body().to_vec(), String::into_bytes);
        let mut reply = Message::bytes(body);
        if let Some(ttl) = a.ttl_ms {
            reply = reply.ttl_ms(ttl);
        }
        let this = std::slice::from_ref(&request);
        match session.reply(&request, reply).await {
            Ok(id) => {
                session
                    .ack(this)
                    .await
                    .context("cannot acknowledge the request")?;
                let rid = request.message_id();
                match c.output {
                    Format::Json => outln!("{}", json!({ "request_id": rid, "reply_id": id }))?,
                    Format::Human => outln!("answered {rid} with {id}")?,
                }
            }
            // The requester is gone with its temporary queue: nobody can take an answer.
            Err(e) if e.code() == Some(tonic::Code::NotFound) => {
                session
                    .ack(this)
                    .await
                    .context("cannot acknowledge the request")?;
                errln!("could not answer {}: {e}", request.message_id());
            }
            // Anything else may pass: give the request back to be answered again.
            Err(e) => {
                session
                    .nack(this, None)
                    .await
                    .context("cannot give the request back")?;
                let what = format!("cannot answer {}", request.message_id());
                return Err(anyhow::Error::new(e).context(what));
            }
        }
        answered += 1;
    }
    Ok(())
}
