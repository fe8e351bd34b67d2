//! `ferry rtt`: the round trip of the cheapest call, in the spirit of `nats rtt`. A connection's
//! `Heartbeat`, one at a time: what the network, gRPC and the node's dispatch cost before any
//! queue work. Any figure `ferry bench` reports sits on top of it: a send waits for one such
//! round trip plus the disk; a request-reply round trip crosses the node twice.

use std::time::Instant;

use ferry_proto::pb;
use serde_json::json;

use super::{connect, latency, ClientArgs};
use crate::output::{outln, Format};

#[derive(Debug, clap::Args)]
pub struct RttArgs {
    /// Round trips to time, one after another.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    count: u64,
}

pub async fn run(c: &ClientArgs, a: RttArgs) -> anyhow::Result<()> {
    let client = connect(c).await?;
    let connection = client.open_connection("ferry-rtt").await?;
    let mut messaging = client.messaging();
    let heartbeat = pb::HeartbeatRequest {
        connection_id: connection.id().to_string(),
    };
    let mut rtt = latency::histogram()?;
    let timed = async {
        // The first call sets up the HTTP/2 stream machinery on both sides: not timed.
        messaging.heartbeat(heartbeat.clone()).await?;
        let started = Instant::now();
        for _ in 0..a.count {
            let t = Instant::now();
            messaging.heartbeat(heartbeat.clone()).await?;
            latency::record(&mut rtt, t.elapsed());
        }
        Ok::<_, tonic::Status>(started.elapsed())
    }
    .await;
    // Closed however the calls went, so it does not linger until its lease runs out.
    let closed = connection.close().await;
    let elapsed = timed?;
    closed?;
    let per_sec = a.count as f64 / elapsed.as_secs_f64().max(1e-9);
    match c.output {
        Format::Json => {
            let summary = json!({
                "server": c.server,
                "calls": a.count,
                "calls_per_sec": per_sec.round(),
                "min_ms": latency::ms(rtt.min()),
            });
            outln!("{}", latency::with_quantiles(summary, &rtt))?;
        }
        Format::Human => {
            let cells = vec![
                a.count.to_string(),
                format!("{per_sec:.0}"),
                format!("{:.3}", latency::ms(rtt.min())),
            ];
            let t = latency::table(&["calls", "per second", "min ms"], cells, &rtt);
            outln!("{t}")?;
            outln!("round trips of a Heartbeat call to {}", c.server)?;
        }
    }
    Ok(())
}
