//! `ferry bench-queues`: how fast the cluster creates (and then deletes) queues, one at a time or
//! from several concurrent creators: creates per second and the latency of each create, as seen
//! by a client. What a create costs is metadata work (a Raft round through the metadata leader,
//! the placement, the owner's store), so the figure shows how the metadata path scales with the
//! number of queues (issue 24 §4).

use std::time::{Duration, Instant};

use anyhow::Context;
use ferry_proto::pb;
use futures::stream::{self, StreamExt, TryStreamExt};
use hdrhistogram::Histogram;
use serde_json::json;

use super::{connect, latency, ClientArgs};
use crate::output::{outln, Format};

#[derive(Debug, clap::Args)]
pub struct BenchQueuesArgs {
    /// Queues to create.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    count: u64,
    /// Creates (and deletes) under way at once.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1_000))]
    concurrency: u64,
    /// Name prefix of the queues (`<prefix>.<n>`). Default: `bench-queues.<random>`, so runs
    /// never meet.
    #[arg(long)]
    prefix: Option<String>,
    /// Keep the queues afterwards (default: delete them, and time the deletes too).
    #[arg(long)]
    keep: bool,
}

/// One phase's figures: how many calls, how long in all, and each call's latency.
struct Phase {
    calls: u64,
    elapsed: Duration,
    latency: Histogram<u64>,
}

impl Phase {
    fn per_sec(&self) -> f64 {
        self.calls as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

pub async fn run(c: &ClientArgs, a: BenchQueuesArgs) -> anyhow::Result<()> {
    let client = connect(c).await?;
    let prefix = a
        .prefix
        .clone()
        .unwrap_or_else(|| format!("bench-queues.{:08x}", rand::random::<u32>()));
    let names: Vec<String> = (0..a.count).map(|n| format!("{prefix}.{n}")).collect();
    let created = timed(&names, a.concurrency, |name| {
        let mut admin = client.admin();
        async move {
            admin
                .create_queue(pb::CreateQueueRequest {
                    replicas: 0,
                    own_shard: false,
                    name: name.clone(),
                    // No dead-letter or expiry queue beside each: one queue per create.
                    config: Some(pb::QueueConfig {
                        dead_letter: Some(discard()),
                        expiry: Some(discard()),
                        ..Default::default()
                    }),
                    if_not_exists: false,
                    node: String::new(),
                })
                .await
                .with_context(|| format!("cannot create queue {name}"))
                .map(drop)
        }
    })
    .await?;
    let deleted = match a.keep {
        true => None,
        false => Some(
            timed(&names, a.concurrency, |name| {
                let mut admin = client.admin();
                async move {
                    admin
                        .delete_queue(pb::DeleteQueueRequest {
                            name: name.clone(),
                            if_empty: false,
                        })
                        .await
                        .with_context(|| format!("cannot delete queue {name}"))
                        .map(drop)
                }
            })
            .await?,
        ),
    };
    report(c, &a, &prefix, &created, deleted.as_ref())
}

fn discard() -> pb::DeadLetterTarget {
    pb::DeadLetterTarget {
        target: Some(pb::dead_letter_target::Target::Discard(true)),
    }
}

/// Runs `call` for every name, `concurrency` at a time; stops at the first error.
async fn timed<F, Fut>(names: &[String], concurrency: u64, call: F) -> anyhow::Result<Phase>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let started = Instant::now();
    let latencies: Vec<Duration> = stream::iter(names.iter().cloned())
        .map(|name| {
            let call = call(name);
            async move {
                let t = Instant::now();
                call.await?;
                Ok::<_, anyhow::Error>(t.elapsed())
            }
        })
        .buffer_unordered(usize::try_from(concurrency).unwrap_or(1))
        .try_collect()
        .await?;
    let elapsed = started.elapsed();
    let mut latency = latency::histogram()?;
    for l in &latencies {
        latency::record(&mut latency, *l);
    }
    Ok(Phase {
        calls: latencies.len() as u64,
        elapsed,
        latency,
    })
}

fn report(
    c: &ClientArgs,
    a: &BenchQueuesArgs,
    prefix: &str,
    created: &Phase,
    deleted: Option<&Phase>,
) -> anyhow::Result<()> {
    match c.output {
        Format::Json => {
            let phase = |p: &Phase| {
                let summary = json!({
                    "calls": p.calls,
                    "per_sec": p.per_sec().round(),
                    "elapsed_ms": p.elapsed.as_millis() as u64,
                });
                latency::with_quantiles(summary, &p.latency)
            };
            let out = json!({
                "server": c.server,
                "prefix": prefix,
                "concurrency": a.concurrency,
                "create": phase(created),
                "delete": deleted.map(phase),
            });
            outln!("{out}")?;
        }
        Format::Human => {
            for (what, p) in
                std::iter::once(("create", created)).chain(deleted.map(|d| ("delete", d)))
            {
                let cells = vec![
                    what.to_string(),
                    p.calls.to_string(),
                    format!("{:.0}", p.per_sec()),
                ];
                let t = latency::table(&["call", "queues", "per second"], cells, &p.latency);
                outln!("{t}")?;
            }
            outln!(
                "{} queues {prefix}.* on {}, {} at a time{}",
                a.count,
                c.server,
                a.concurrency,
                if a.keep { ", kept" } else { "" }
            )?;
        }
    }
    Ok(())
}
