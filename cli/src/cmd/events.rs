//! `ferry events`: what happens on the cluster, as it happens.

use anyhow::Context as _;
use ferry_proto::pb;
use serde_json::json;

use super::{connect, ClientArgs};
use crate::output::{outln, Format};

#[derive(Debug, clap::Args)]
pub struct EventsArgs {
    /// Only this queue's events.
    #[arg(long, short)]
    queue: Option<String>,
    /// Tell when a queue's depth (ready + scheduled) reaches this (0: off).
    #[arg(long, default_value_t = 0)]
    depth_high: u64,
    /// ... and when it is back at or below this (default: half of --depth-high).
    #[arg(long)]
    depth_low: Option<u64>,
    /// Tell when a queue's oldest ready message is this old (0: off).
    #[arg(long, default_value_t = 0)]
    age_high_ms: u64,
    /// How often the thresholds are checked (default 250 ms, at least 50).
    #[arg(long)]
    check_every_ms: Option<u64>,
    /// Stop after this many events.
    #[arg(long)]
    count: Option<u64>,
}

pub async fn run(c: &ClientArgs, a: EventsArgs) -> anyhow::Result<()> {
    let mut admin = connect(c).await?.admin();
    let mut stream = admin
        .watch_events(pb::WatchEventsRequest {
            queue: a.queue.unwrap_or_default(),
            depth_high: a.depth_high,
            depth_low: a.depth_low,
            age_high_ms: a.age_high_ms,
            check_every_ms: a.check_every_ms,
        })
        .await
        .context("cannot watch events")?
        .into_inner();
    let mut seen = 0u64;
    while a.count.is_none_or(|n| seen < n) {
        // The node ends the stream with a status saying why (UNAVAILABLE: it is shutting down).
        let Some(e) = stream
            .message()
            .await
            .map_err(ferry_client::ClientError::from)
            .context("the event stream ended")?
        else {
            break;
        };
        seen += 1;
        match c.output {
            Format::Json => outln!(
                "{}",
                json!({
                    "at_ms": e.at_ms,
                    "kind": e.kind,
                    "queue": e.queue,
                    "message_id": e.message_id,
                    "reason": e.reason,
                    "value": e.value,
                    "node": e.node,
                    "detail": e.detail,
                })
            )?,
            Format::Human => {
                let mut line = format!(
                    "{} {} {}",
                    crate::output::timestamp_text(e.at_ms),
                    e.kind,
                    e.queue
                );
                for part in [&e.message_id, &e.reason, &e.detail] {
                    if !part.is_empty() {
                        line.push(' ');
                        line.push_str(part);
                    }
                }
                if e.value > 0 {
                    line.push_str(&format!(" value={}", e.value));
                }
                outln!("{line}")?;
            }
        }
    }
    Ok(())
}
