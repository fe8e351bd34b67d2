//! `ferry bench`: producers and consumers against one queue, in the spirit of `nats bench` and
//! `artemis perf`. Every message carries its producer, its sequence number and when it was due to
//! be sent; consumers measure end-to-end latency from that time (so an open-loop run at a fixed
//! `--rate` is not flattered by a stalled producer) and record which messages arrived, so the run
//! ends by saying whether every message sent was received, and how many more than once.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context as _};
use ferry_client::{pb, AckMode, ConsumerOptions, Message, ReceiveOptions, Received, Session};
use futures::stream::{FuturesUnordered, StreamExt};
use hdrhistogram::Histogram;
use serde_json::json;

use super::{connect, latency, ClientArgs};
use crate::output::{outln, Format};

/// Producer id (u32), sequence number (u64), due time in ns since the Unix epoch (u64).
const HEADER_BYTES: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchAck {
    /// The client library acknowledges each batch as it is received.
    Auto,
    /// One cumulative acknowledge per received batch.
    Client,
    /// Every message acknowledged by its own handle (in one call per batch).
    Individual,
}

#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// The queue to use (created if missing, kept afterwards). Default: a fresh queue, deleted at
    /// the end.
    #[arg(long, short)]
    queue: Option<String>,
    /// Producers: concurrent senders.
    #[arg(long, default_value_t = 1)]
    producers: u32,
    /// Consumers; 0 only fills the queue (needs --queue, which keeps the messages).
    #[arg(long, default_value_t = 1)]
    consumers: u32,
    /// Body size in bytes (at least 20: the bench's own header).
    #[arg(long, default_value_t = 1024)]
    size: usize,
    /// Messages to send in all (default 10 000 unless --duration is given).
    #[arg(long, conflicts_with = "duration_ms")]
    count: Option<u64>,
    /// Send for this long instead of a count.
    #[arg(long = "duration-ms")]
    duration_ms: Option<u64>,
    /// Unconfirmed sends in flight per producer.
    #[arg(long, default_value_t = 1_000)]
    window: usize,
    /// Messages a consumer asks for at once.
    #[arg(long, default_value_t = 1_000)]
    prefetch: u32,
    /// Offered load in messages per second over all producers (open loop); 0: as fast as
    /// possible.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Keep messages in memory only.
    #[arg(long)]
    non_persistent: bool,
    /// Send without the dedup ids the client gives persistent messages (so that it can resend
    /// them safely after a failover): measures what those ids cost.
    #[arg(long)]
    no_dedup_ids: bool,
    /// How consumers acknowledge.
    #[arg(long, value_enum, default_value_t = BenchAck::Auto)]
    ack: BenchAck,
    /// Producers send and consumers receive in transactions of this many messages (0: no
    /// transactions).
    #[arg(long, default_value_t = 0)]
    tx_batch: u32,
    /// Give up waiting for the remaining messages after this long once sending ended.
    #[arg(long, default_value_t = 30_000)]
    drain_timeout_ms: u64,
    /// The request-reply workload instead: one requester makes --count sequential round trips
    /// (default 10 000) through the queue to a responder on its own connection, which answers
    /// each on the requester's temporary queue; reports the round-trip latency.
    #[arg(long, conflicts_with_all = ["duration_ms", "rate", "tx_batch"])]
    request_reply: bool,
}

/// Which messages arrived, per producer: a count per sequence number.
struct Seen {
    per_producer: Vec<Mutex<Vec<u8>>>,
}

impl Seen {
    fn record(&self, producer: u32, seq: u64) -> bool {
        let Some(slot) = self.per_producer.get(producer as usize) else {
            return false;
        };
        let mut v = slot.lock().unwrap_or_else(PoisonError::into_inner);
        let i = seq as usize;
        if v.len() <= i {
            v.resize(i + 1, 0);
        }
        v[i] = v[i].saturating_add(1);
        v[i] == 1
    }
}

struct Shared {
    sent: AtomicU64,
    received: AtomicU64,
    unique: AtomicU64,
    duplicates: AtomicU64,
    sending_done: AtomicBool,
    stop: AtomicBool,
    seen: Seen,
    latency: Mutex<Histogram<u64>>,
    errors: Mutex<Vec<String>>,
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

fn body(producer: u32, seq: u64, due_ns: u64, size: usize) -> Vec<u8> {
    let mut b = vec![b'x'; size];
    b[..4].copy_from_slice(&producer.to_be_bytes());
    b[4..12].copy_from_slice(&seq.to_be_bytes());
    b[12..20].copy_from_slice(&due_ns.to_be_bytes());
    b
}

fn header(b: &[u8]) -> Option<(u32, u64, u64)> {
    let p = u32::from_be_bytes(b.get(..4)?.try_into().ok()?);
    let s = u64::from_be_bytes(b.get(4..12)?.try_into().ok()?);
    let t = u64::from_be_bytes(b.get(12..20)?.try_into().ok()?);
    Some((p, s, t))
}

pub async fn run(c: &ClientArgs, a: BenchArgs) -> anyhow::Result<()> {
    if a.size < HEADER_BYTES {
        bail!("--size must be at least {HEADER_BYTES} bytes (the bench's header: producer, sequence number, send time)");
    }
    if a.producers == 0 {
        bail!("--producers must be at least 1");
    }
    if a.consumers == 0 && a.queue.is_none() {
        bail!("--consumers 0 fills a queue and leaves the messages there: name it with --queue");
    }
    let fill_only = a.consumers == 0;
    if a.request_reply {
        return request_reply(c, a).await;
    }
    if a.window == 0 || a.prefetch == 0 {
        bail!("--window and --prefetch must be at least 1");
    }
    let client = connect(c).await?;
    let (queue, temporary) = bench_queue(&client, a.queue.as_deref(), "bench").await?;
    let total = match (a.count, a.duration_ms) {
        (Some(n), _) => Some(n),
        (None, Some(_)) => None,
        (None, None) => Some(10_000),
    };
    let shared = Arc::new(Shared {
        sent: AtomicU64::new(0),
        received: AtomicU64::new(0),
        unique: AtomicU64::new(0),
        duplicates: AtomicU64::new(0),
        sending_done: AtomicBool::new(false),
        stop: AtomicBool::new(false),
        seen: Seen {
            per_producer: (0..a.producers).map(|_| Mutex::new(Vec::new())).collect(),
        },
        latency: Mutex::new(latency::histogram()?),
        errors: Mutex::new(Vec::new()),
    });
    let progress = crate::output::progress_bar(c.output, total);
    let started = Instant::now();

    let mut consumers = Vec::new();
    for _ in 0..a.consumers {
        let conn = client.open_connection("ferry-bench").await?;
        let mode = if a.tx_batch > 0 {
            AckMode::Transacted
        } else {
            match a.ack {
                BenchAck::Auto => AckMode::Auto,
                BenchAck::Client => AckMode::Client,
                BenchAck::Individual => AckMode::Individual,
            }
        };
        let session = conn.create_session(mode).await?;
        let (shared, queue) = (shared.clone(), queue.clone());
        let prefetch = if a.tx_batch > 0 {
            a.tx_batch.min(a.prefetch)
        } else {
            a.prefetch
        };
        consumers.push(tokio::spawn(async move {
            let r = consume(&session, &queue, prefetch, mode, &shared).await;
            drop(conn);
            r
        }));
    }
    let mut producers = Vec::new();
    for p in 0..a.producers {
        let conn = client.open_connection("ferry-bench").await?;
        let mode = if a.tx_batch > 0 {
            AckMode::Transacted
        } else {
            AckMode::Auto
        };
        let session = conn
            .create_session(mode)
            .await?
            .with_auto_dedup_ids(!a.no_dedup_ids);
        let plan = Plan {
            producer: p,
            count: total.map(|t| {
                t / u64::from(a.producers) + u64::from(u64::from(p) < t % u64::from(a.producers))
            }),
            until: a.duration_ms.map(|d| started + Duration::from_millis(d)),
            rate: (a.rate > 0).then(|| a.rate as f64 / f64::from(a.producers)),
            size: a.size,
            window: a.window,
            persistent: !a.non_persistent,
            tx_batch: a.tx_batch,
        };
        let (shared, queue) = (shared.clone(), queue.clone());
        producers.push(tokio::spawn(async move {
            let r = produce(&session, &queue, plan, &shared).await;
            drop(conn);
            r
        }));
    }

    let ticker = {
        let (shared, progress) = (shared.clone(), progress.clone());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            loop {
                tick.tick().await;
                let r = shared.received.load(Ordering::Relaxed);
                progress.set_position(r);
                progress.set_message(format!(
                    "received, sent {}",
                    shared.sent.load(Ordering::Relaxed)
                ));
            }
        })
    };
    for p in producers {
        if let Err(e) = p.await? {
            shared
                .errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(format!("producer: {e:#}"));
        }
    }
    shared.sending_done.store(true, Ordering::Release);
    let sending_elapsed = started.elapsed();
    let sent = shared.sent.load(Ordering::Acquire);
    // Consumers stop once everything sent arrived, or when the drain timeout says so.
    let drain_deadline = Instant::now() + Duration::from_millis(a.drain_timeout_ms);
    while !fill_only
        && shared.unique.load(Ordering::Acquire) < sent
        && Instant::now() < drain_deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shared.stop.store(true, Ordering::Release);
    for h in consumers {
        if let Err(e) = h.await? {
            shared
                .errors
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(format!("consumer: {e:#}"));
        }
    }
    let elapsed = started.elapsed();
    ticker.abort();
    progress.finish_and_clear();
    drop_bench_queue(&client, &queue, temporary).await;

    let received = shared.received.load(Ordering::Acquire);
    let unique = shared.unique.load(Ordering::Acquire);
    let duplicates = shared.duplicates.load(Ordering::Acquire);
    // Filling only, nothing is received: what was sent stays in the queue.
    let missing = if fill_only {
        0
    } else {
        sent.saturating_sub(unique)
    };
    let h = shared
        .latency
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let secs = elapsed.as_secs_f64().max(1e-9);
    let rate = if fill_only {
        sent as f64 / sending_elapsed.as_secs_f64().max(1e-9)
    } else {
        unique as f64 / secs
    };
    let mb_per_sec = rate * a.size as f64 / 1_000_000.0;
    let errors = shared
        .errors
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    match c.output {
        Format::Json => {
            let summary = json!({
                "queue": queue,
                "producers": a.producers,
                "consumers": a.consumers,
                "size": a.size,
                "persistent": !a.non_persistent,
                "dedup_ids": !a.no_dedup_ids && !a.non_persistent,
                "window": a.window,
                "prefetch": a.prefetch,
                "rate": a.rate,
                "sent": sent,
                "received": received,
                "unique_received": unique,
                "duplicates": duplicates,
                "missing": missing,
                "elapsed_ms": elapsed.as_millis() as u64,
                "sending_ms": sending_elapsed.as_millis() as u64,
                "msgs_per_sec": rate.round(),
                "mb_per_sec": (mb_per_sec * 100.0).round() / 100.0,
                "errors": errors,
            });
            outln!("{}", latency::with_quantiles(summary, &h))?;
        }
        Format::Human => {
            let cells = vec![
                sent.to_string(),
                received.to_string(),
                format!("{rate:.0}"),
                format!("{mb_per_sec:.2}"),
            ];
            let t = latency::table(&["sent", "received", "msgs/s", "MB/s"], cells, &h);
            outln!("{t}")?;
            outln!(
                "{} producers, {} consumers, {} B {} messages, {:.2} s",
                a.producers,
                a.consumers,
                a.size,
                if a.non_persistent {
                    "non-persistent"
                } else {
                    "persistent"
                },
                secs
            )?;
            for e in &errors {
                outln!("error: {e}")?;
            }
            if fill_only {
                outln!("filled: {sent} messages sent to {queue} and left there (no consumer, no latency)")?;
            } else if missing == 0 {
                outln!(
                    "verified: every message sent ({sent}) was received{}",
                    if duplicates == 0 {
                        " exactly once".to_string()
                    } else {
                        format!(", {duplicates} of them more than once (redeliveries)")
                    }
                )?;
            }
        }
    }
    if missing > 0 {
        bail!("{missing} of {sent} messages sent were not received within the drain timeout");
    }
    if !errors.is_empty() {
        bail!("the run had errors: {}", errors.join("; "));
    }
    Ok(())
}

struct Plan {
    producer: u32,
    count: Option<u64>,
    until: Option<Instant>,
    /// Messages per second for this producer.
    rate: Option<f64>,
    size: usize,
    window: usize,
    persistent: bool,
    tx_batch: u32,
}

async fn produce(
    session: &Session,
    queue: &str,
    plan: Plan,
    shared: &Shared,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let start_ns = now_ns();
    let mut inflight = FuturesUnordered::new();
    let mut seq = 0u64;
    loop {
        if plan.count.is_some_and(|c| seq >= c) || plan.until.is_some_and(|u| Instant::now() >= u) {
            break;
        }
        // Open loop: message n is due at start + n / rate, and its latency counts from then.
        let due_ns = match plan.rate {
            Some(r) => {
                let offset = Duration::from_secs_f64(seq as f64 / r);
                let due = start + offset;
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    tokio::time::sleep(wait).await;
                }
                start_ns + u64::try_from(offset.as_nanos()).unwrap_or(u64::MAX)
            }
            None => now_ns(),
        };
        let batch_len = if plan.tx_batch > 0 {
            u64::from(plan.tx_batch).min(plan.count.map_or(u64::MAX, |c| c - seq))
        } else {
            1
        };
        let messages: Vec<Message> = (0..batch_len)
            .map(|i| {
                let m = Message::bytes(body(plan.producer, seq + i, due_ns, plan.size));
                if plan.persistent {
                    m
                } else {
                    m.non_persistent()
                }
            })
            .collect();
        seq += batch_len;
        if plan.tx_batch > 0 {
            session.send(queue, messages).await?;
            session.commit().await?;
            shared.sent.fetch_add(batch_len, Ordering::Relaxed);
            continue;
        }
        // At most `window` unconfirmed: wait for the oldest-finishing one before sending more.
        while inflight.len() >= plan.window {
            if let Some(r) = inflight.next().await {
                r?;
                shared.sent.fetch_add(1, Ordering::Relaxed);
            }
        }
        // On its way now (pipelined on the session's publish stream); confirmed later.
        inflight.push(session.send_async(queue, messages));
        // Collect confirmations that are in, without waiting.
        while let Some(Some(r)) = futures::FutureExt::now_or_never(inflight.next()) {
            r?;
            shared.sent.fetch_add(1, Ordering::Relaxed);
        }
    }
    while let Some(r) = inflight.next().await {
        r?;
        shared.sent.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}

async fn consume(
    session: &Session,
    queue: &str,
    prefetch: u32,
    mode: AckMode,
    shared: &Shared,
) -> anyhow::Result<()> {
    let mut local = latency::histogram()?;
    if mode == AckMode::Transacted {
        // A transacted session receives with Receive and acknowledges at commit.
        while !shared.stop.load(Ordering::Acquire) {
            let got = session
                .receive(queue, ReceiveOptions::timeout_ms(200).max(prefetch))
                .await?;
            if got.is_empty() {
                continue;
            }
            record_all(&got, shared, &mut local);
            session.commit().await?;
        }
    } else {
        // A Consume stream: the server pushes up to `prefetch` ahead; acks go back on it.
        let mut consumer = session
            .consumer(queue, ConsumerOptions::default().prefetch(prefetch))
            .await?;
        while !shared.stop.load(Ordering::Acquire) {
            let got = consumer
                .receive_batch(prefetch as usize, Some(Duration::from_millis(200)))
                .await?;
            if got.is_empty() {
                continue;
            }
            record_all(&got, shared, &mut local);
            match mode {
                AckMode::Client => consumer.ack(&got[got.len() - 1..])?,
                AckMode::Individual => consumer.ack(&got)?,
                _ => {}
            }
        }
        // Every ack reaches the server, and what was pushed ahead goes back.
        consumer.close().await?;
    }
    shared
        .latency
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .add(&local)?;
    Ok(())
}

/// Records a batch received at one moment.
fn record_all(got: &[Received], shared: &Shared, latency: &mut Histogram<u64>) {
    let now = now_ns();
    for r in got {
        record(r, now, shared, latency);
    }
}

fn record(r: &Received, now: u64, shared: &Shared, latency: &mut Histogram<u64>) {
    shared.received.fetch_add(1, Ordering::Relaxed);
    let Some((producer, seq, due_ns)) = header(r.body()) else {
        return;
    };
    if shared.seen.record(producer, seq) {
        shared.unique.fetch_add(1, Ordering::Release);
        let micros = now.saturating_sub(due_ns) / 1_000;
        let _ = latency.record(micros.max(1));
    } else {
        shared.duplicates.fetch_add(1, Ordering::Relaxed);
    }
}

/// The queue a run uses: the one named (created if missing, kept), or a fresh one of its own
/// (`<prefix>.<random>`, deleted at the end: the `bool`).
async fn bench_queue(
    client: &ferry_client::Client,
    named: Option<&str>,
    prefix: &str,
) -> anyhow::Result<(String, bool)> {
    let (queue, temporary) = match named {
        Some(q) => (q.to_string(), false),
        None => (format!("{prefix}.{:08x}", rand::random::<u32>()), true),
    };
    client
        .admin()
        .create_queue(pb::CreateQueueRequest {
            replicas: 0,
            own_shard: false,
            name: queue.clone(),
            // A queue of the run's own keeps nothing past it: no dead-letter queue is created
            // beside it (a queue the user named keeps its own settings).
            config: temporary.then(|| {
                let discard = || pb::DeadLetterTarget {
                    target: Some(pb::dead_letter_target::Target::Discard(true)),
                };
                pb::QueueConfig {
                    dead_letter: Some(discard()),
                    expiry: Some(discard()),
                    ..Default::default()
                }
            }),
            if_not_exists: true,
            node: String::new(),
        })
        .await
        .with_context(|| format!("cannot create queue {queue}"))?;
    Ok((queue, temporary))
}

/// Deletes the queue [`bench_queue`] made for the run (a queue the user named stays).
async fn drop_bench_queue(client: &ferry_client::Client, queue: &str, temporary: bool) {
    if temporary {
        // Best effort: the figures are already in; a queue left behind is only clutter.
        let _ = client
            .admin()
            .delete_queue(pb::DeleteQueueRequest {
                name: queue.into(),
                if_empty: false,
            })
            .await;
    }
}

/// The request-reply workload: sequential round trips, each a request to `queue` (with
/// `reply_to` a temporary queue of the requester's connection) and its reply, correlated by the
/// request's message id. Persistent unless --non-persistent, as for the throughput workload.
async fn request_reply(c: &ClientArgs, a: BenchArgs) -> anyhow::Result<()> {
    let rounds = a.count.unwrap_or(10_000);
    let client = connect(c).await?;
    let (queue, temporary) = bench_queue(&client, a.queue.as_deref(), "bench.rr").await?;
    let persistent = !a.non_persistent;
    let message = move |body: Vec<u8>| {
        let m = Message::bytes(body);
        if persistent {
            m
        } else {
            m.non_persistent()
        }
    };

    // The responder: a consumer on the queue that answers every request.
    let responder_conn = client.open_connection("ferry-bench-responder").await?;
    let responder = responder_conn.create_session(AckMode::Auto).await?;
    let mut requests = responder
        .consumer(&queue, ConsumerOptions::default().prefetch(a.prefetch))
        .await?;
    let stop = Arc::new(AtomicBool::new(false));
    let answered = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut answered = 0u64;
            while !stop.load(Ordering::Acquire) {
                for r in requests
                    .receive_batch(1_000, Some(Duration::from_millis(100)))
                    .await?
                {
                    responder.reply(&r, message(r.body().to_vec())).await?;
                    answered += 1;
                }
            }
            requests.close().await?;
            anyhow::Ok(answered)
        })
    };

    let requester_conn = client.open_connection("ferry-bench-requester").await?;
    let mut requestor = ferry_client::Requestor::new(&requester_conn).await?;
    let mut rtt = latency::histogram()?;
    let progress = crate::output::progress_bar(c.output, Some(rounds));
    let mut failures = 0u64;
    let started = Instant::now();
    for i in 0..rounds {
        let body = body(0, i, now_ns(), a.size.max(HEADER_BYTES));
        let t = Instant::now();
        let reply = requestor
            .request(&queue, message(body.clone()), Duration::from_secs(10))
            .await?;
        match reply {
            Some(r) if r.body() == body.as_slice() => latency::record(&mut rtt, t.elapsed()),
            _ => failures += 1,
        }
        if i % 256 == 0 {
            progress.set_position(i);
        }
    }
    let elapsed = started.elapsed();
    progress.finish_and_clear();
    stop.store(true, Ordering::Release);
    let answered = answered.await??;
    drop(requestor);
    requester_conn.close().await?;
    responder_conn.close().await?;
    drop_bench_queue(&client, &queue, temporary).await;
    let per_sec = rounds as f64 / elapsed.as_secs_f64().max(1e-9);
    match c.output {
        Format::Json => {
            let summary = json!({
                "workload": "request-reply",
                "queue": queue,
                "size": a.size,
                "persistent": persistent,
                "rounds": rounds,
                "answered": answered,
                "failures": failures,
                "elapsed_ms": elapsed.as_millis() as u64,
                "rounds_per_sec": per_sec.round(),
            });
            outln!("{}", latency::with_quantiles(summary, &rtt))?;
        }
        Format::Human => {
            let cells = vec![rounds.to_string(), format!("{per_sec:.0}")];
            let t = latency::table(&["round trips", "per second"], cells, &rtt);
            outln!("{t}")?;
            outln!(
                "request-reply, {} B {} messages, {:.2} s",
                a.size,
                if persistent {
                    "persistent"
                } else {
                    "non-persistent"
                },
                elapsed.as_secs_f64()
            )?;
            if failures == 0 {
                outln!("verified: every request ({rounds}) got its own reply")?;
            }
        }
    }
    if failures > 0 {
        bail!("{failures} of {rounds} requests got no reply (or a wrong one) within 10 s");
    }
    Ok(())
}
