//! `ferry rtt`: the round trip of the cheapest call, in the spirit of `nats rtt`. A connection's
//! `Heartbeat`, one at a time: what the network, gRPC and the node's dispatch cost before any
//! queue work. Any figure `ferry bench` reports sits on top of it: a send waits for one such
//! round trip plus the disk; a request-reply round trip crosses the node twice.

use std::time::Instant;

use comfy_table::Table;
use ferry_proto::pb;
use hdrhistogram::Histogram;
use serde_json::json;

use super::{connect, ClientArgs};
use crate::output::Format;

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
    // The first call sets up the HTTP/2 stream machinery on both sides: not timed.
    messaging.heartbeat(heartbeat.clone()).await?;
    let mut rtt = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let started = Instant::now();
    for _ in 0..a.count {
        let t = Instant::now();
        messaging.heartbeat(heartbeat.clone()).await?;
        let micros = u64::try_from(t.elapsed().as_micros()).unwrap_or(u64::MAX);
        rtt.saturating_record(micros.max(1));
    }
    let elapsed = started.elapsed();
    connection.close().await?;
    let ms = |micros: u64| micros as f64 / 1_000.0;
    let at = |q: f64| ms(rtt.value_at_quantile(q));
    let per_sec = a.count as f64 / elapsed.as_secs_f64().max(1e-9);
    match c.output {
        Format::Json => println!(
            "{}",
            json!({
                "server": c.server,
                "calls": a.count,
                "calls_per_sec": per_sec.round(),
                "min_ms": ms(rtt.min()),
                "p50_ms": at(0.5),
                "p90_ms": at(0.9),
                "p99_ms": at(0.99),
                "p999_ms": at(0.999),
                "max_ms": ms(rtt.max()),
            })
        ),
        Format::Human => {
            let mut t = Table::new();
            t.set_header([
                "calls",
                "per second",
                "min ms",
                "p50 ms",
                "p90 ms",
                "p99 ms",
                "p99.9 ms",
                "max ms",
            ]);
            let mut row = vec![
                a.count.to_string(),
                format!("{per_sec:.0}"),
                format!("{:.3}", ms(rtt.min())),
            ];
            row.extend(super::bench::latency_cells(&rtt));
            t.add_row(row);
            println!("{t}");
            println!("round trips of a Heartbeat call to {}", c.server);
        }
    }
    Ok(())
}
