//! The clients of a run: producers that send unique values and retry what ended unknown (with
//! the same dedup ids), consumers of several kinds (client ack, auto ack, a `Consume` stream,
//! poison consumers that always give back), consumers that come and go or die without closing,
//! and the drain that empties every queue at the end. Each records what it did in the history.
//!
//! Every loop is bounded in time (a deadline or the run's stop signal) and in count; every call
//! is bounded by the operation timeout, and a call that runs past it ends unknown.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ferry_client::{
    pb, AutoAckFailures, Client, ClientError, ConsumerOptions, Message, ReceiveOptions, Received,
};
use rand::{Rng, SeedableRng};
use tokio::sync::watch;
use tokio::time::{timeout, Instant};

use super::history::{self, Delivery, History, Op, Outcome, Value};

/// What every worker shares.
#[derive(Debug, Clone)]
pub struct Ctx {
    pub history: History,
    pub node_name: String,
    /// Where clients connect (the node, or the proxy in front of it).
    pub url: String,
    /// Bound on every call.
    pub op_timeout: Duration,
    /// Becomes true when the load phase ends.
    pub stop: watch::Receiver<bool>,
    /// Run seed; each worker derives its own generator from it.
    pub seed: u64,
    /// In a cluster, every node as (name, client URL): a worker whose call failed opens its
    /// next session through the node after the one it used (`url`, `node_name`). Empty for
    /// one node.
    pub nodes: Vec<(String, String)>,
    /// Every connection's count of auto acknowledgements that failed or got no answer (read
    /// once the run is over: [`Ctx::auto_ack_failures`]).
    pub auto_ack_failures: Arc<Mutex<Vec<AutoAckFailures>>>,
    /// The planted client bug [`AUTO_ACK_DROPS_UNCONFIRMED_BATCH`] is on.
    pub auto_ack_drops_unconfirmed_batch: bool,
}

/// A planted bug of the client, emulated by the auto-acknowledge consumers (the library itself
/// has no switch for it): the library before the kill9 seed 1 postmortem, whose auto receive
/// awaited its acknowledgement and, when that failed or got no answer, returned the error and
/// threw its batch away. The acknowledgement may have been applied (its answer lost with the
/// killed node), so those messages are lost; the `kill9-auto-receive` scenario must find them.
pub const AUTO_ACK_DROPS_UNCONFIRMED_BATCH: &str = "auto-ack-drops-unconfirmed-batch";

/// Pause between attempts to reach a node that is down (pacing, not synchronization).
const RECONNECT_PAUSE: Duration = Duration::from_millis(100);
/// A producer tries one batch at most this many times.
const SEND_ATTEMPTS_MAX: u32 = 200;

impl Ctx {
    /// This context connected through the `index`-th node (modulo their number); unchanged
    /// for one node.
    pub fn via(mut self, index: usize) -> Ctx {
        if !self.nodes.is_empty() {
            (self.node_name, self.url) = self.nodes[index % self.nodes.len()].clone();
        }
        self
    }

    /// Moves to the next node of the cluster, for the next session (a no-op for one node): a
    /// call through a node failed (UNAVAILABLE, a broken connection, a timeout...).
    fn fail_over(&mut self) {
        let Some(at) = self.nodes.iter().position(|(n, _)| *n == self.node_name) else {
            return;
        };
        (self.node_name, self.url) = self.nodes[(at + 1) % self.nodes.len()].clone();
    }

    fn stopped(&self) -> bool {
        *self.stop.borrow()
    }

    /// How many auto acknowledgements of the run failed or got no answer so far: each the end
    /// of an auto receive whose acknowledgement a fault cut off.
    pub fn auto_ack_failures(&self) -> u64 {
        self.auto_ack_failures
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .map(AutoAckFailures::count)
            .sum()
    }

    fn rng(&self, worker: u64) -> rand::rngs::StdRng {
        rand::rngs::StdRng::seed_from_u64(self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ worker)
    }

    fn record(&self, process: &str, op: Op) {
        self.history.record(process, &self.node_name, op);
    }

    fn error(&self, process: &str, what: &str, error: &str) {
        self.record(
            process,
            Op::Error {
                what: what.into(),
                error: error.into(),
            },
        );
    }

    /// A client, connection and session, each call bounded.
    async fn session(
        &self,
        client_id: &str,
        mode: pb::AckMode,
    ) -> anyhow::Result<(Client, ferry_client::Connection, ferry_client::Session)> {
        let made = timeout(self.op_timeout, async {
            let client = Client::connect(&self.url).await?;
            let conn = client.open_connection(client_id).await?;
            if mode == pb::AckMode::Auto {
                self.auto_ack_failures
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(conn.auto_ack_failures());
            }
            let session = conn.create_session(mode).await?;
            Ok::<_, ClientError>((client, conn, session))
        })
        .await;
        match made {
            Ok(Ok(s)) => Ok(s),
            Ok(Err(e)) => Err(e.into()),
            Err(_) => anyhow::bail!("timed out opening a session"),
        }
    }
}

/// How a call ended, from the client's point of view. Only a refusal that names the caller's
/// mistake or a missing session is a definite failure; anything else may have taken effect.
pub fn outcome_of(r: &Result<(), String>, code: Option<tonic::Code>) -> Outcome {
    use tonic::Code;
    match (r, code) {
        (Ok(()), _) => Outcome::Ok,
        (
            Err(e),
            Some(
                Code::InvalidArgument
                | Code::NotFound
                | Code::ResourceExhausted
                | Code::AlreadyExists
                | Code::PermissionDenied
                | Code::FailedPrecondition,
            ),
        ) => Outcome::Fail { error: e.clone() },
        (Err(e), _) => Outcome::Unknown { error: e.clone() },
    }
}

/// A call's result as an outcome; a timeout is unknown.
fn judge<T>(
    r: Result<Result<T, ClientError>, tokio::time::error::Elapsed>,
) -> (Option<T>, Outcome) {
    match r {
        Ok(Ok(v)) => (Some(v), Outcome::Ok),
        Ok(Err(e)) => {
            let code = e.code();
            (None, outcome_of(&Err(e.to_string()), code))
        }
        Err(_) => (
            None,
            Outcome::Unknown {
                error: "client timeout".into(),
            },
        ),
    }
}

/// A producer's work.
#[derive(Debug, Clone)]
pub struct ProducerSpec {
    pub id: u32,
    pub queue: String,
    /// Values per send (one call).
    pub batch: u32,
    /// Values this producer sends at most.
    pub values_max: u64,
    /// Bytes of padding in each body.
    pub pad_bytes: usize,
}

/// The message carrying `v`.
pub fn message(v: Value, pad_bytes: usize) -> Message {
    let body = format!("{v}:{}", "x".repeat(pad_bytes));
    Message::text(body)
        .property(history::PRODUCER_PROPERTY, v.producer as i32)
        .property(history::SEQ_PROPERTY, v.seq as i64)
        .dedup_id(v.to_string())
}

/// Sends values until told to stop or `values_max` are sent; retries a batch whose outcome was
/// not ok (with the same dedup ids, so a retry never stores a second copy) until it is
/// confirmed, `settle_by` passes, or [`SEND_ATTEMPTS_MAX`] attempts were made.
pub async fn producer(mut ctx: Ctx, spec: ProducerSpec, settle_by: Instant) -> anyhow::Result<()> {
    let me = format!("producer-{}", spec.id);
    let mut session = None;
    let mut seq = 0u64;
    // Past `settle_by` no batch starts (its attempts could not run: the loop would spin).
    while !ctx.stopped() && seq < spec.values_max && Instant::now() < settle_by {
        let count = u32::try_from((spec.values_max - seq).min(u64::from(spec.batch)))?;
        let mut attempt = 0;
        'batch: while attempt < SEND_ATTEMPTS_MAX && Instant::now() < settle_by {
            let Some((_, _, s)) = &session else {
                match ctx.session(&me, pb::AckMode::Auto).await {
                    Ok(s) => session = Some(s),
                    Err(e) => {
                        ctx.error(&me, "open session", &e.to_string());
                        ctx.fail_over();
                        tokio::time::sleep(RECONNECT_PAUSE).await;
                    }
                }
                continue 'batch;
            };
            attempt += 1;
            let msgs = (seq..seq + u64::from(count))
                .map(|seq| {
                    let v = Value {
                        producer: spec.id,
                        seq,
                    };
                    message(v, spec.pad_bytes)
                })
                .collect();
            let op = ctx.history.next_id();
            ctx.record(
                &me,
                Op::SendInvoke {
                    op,
                    queue: spec.queue.clone(),
                    producer: spec.id,
                    first_seq: seq,
                    count,
                    attempt,
                },
            );
            let (ids, outcome) = judge(timeout(ctx.op_timeout, s.send(&spec.queue, msgs)).await);
            let ok = outcome == Outcome::Ok;
            ctx.record(
                &me,
                Op::SendEnd {
                    op,
                    outcome,
                    message_ids: ids.unwrap_or_default(),
                },
            );
            if ok {
                break 'batch;
            }
            // Whatever broke, the next attempt goes on a fresh session (through another node, in
            // a cluster).
            session = None;
            ctx.fail_over();
        }
        seq += u64::from(count);
    }
    Ok(())
}

/// How a consumer consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerKind {
    /// `Session::receive` in client-acknowledge mode, then `ack`.
    ClientAck,
    /// `Session::receive` in auto mode (acknowledged by the library before it returns).
    AutoAck,
    /// A `Consume` stream with prefetch, client acknowledge, a flush after each batch.
    Stream,
    /// A `Consume` stream in auto mode (acknowledged on the stream as the batch is handed over).
    AutoAckStream,
    /// Individual mode; every message is nacked.
    PoisonNack,
    /// Transacted; every transaction is rolled back.
    PoisonRollback,
}

/// A consumer's work.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub id: u32,
    pub queue: String,
    pub kind: ConsumerKind,
    /// Messages per receive at most.
    pub batch: u32,
    /// Come and go: each incarnation lives a random time up to this, then closes or (with
    /// `kill_percent`) is dropped mid-whatever without closing. `None`: one incarnation per
    /// session failure.
    pub lifetime_ms_max: Option<u64>,
    pub kill_percent: u32,
}

/// Consumes until told to stop.
pub async fn consumer(mut ctx: Ctx, spec: ConsumerSpec) -> anyhow::Result<()> {
    let me = format!("consumer-{}", spec.id);
    let mut rng = ctx.rng(1_000 + u64::from(spec.id));
    // Bounded by the stop signal; the count bound keeps a broken clock from spinning for ever.
    for _ in 0..1_000_000u64 {
        if ctx.stopped() {
            break;
        }
        let life = spec
            .lifetime_ms_max
            .map(|max| Duration::from_millis(rng.random_range(max / 4..=max)));
        let killed = life.is_some() && rng.random_range(0..100) < spec.kill_percent;
        // A consumer about to die stops taking work after a batch or two, holding what it got
        // unacknowledged, as a hung process would until it is killed.
        let hang_after = killed.then(|| rng.random_range(1..=3u32));
        let ended = match life {
            None => incarnation(&ctx, &spec, &me, None, None).await,
            // Closes its session when its life is over.
            Some(life) if !killed => {
                incarnation(&ctx, &spec, &me, Some(Instant::now() + life), None).await
            }
            // Dropped at whatever it is doing when its life is over: its session, connection
            // and HTTP/2 connection go without a close, as a killed process's would.
            Some(life) => {
                match timeout(life, incarnation(&ctx, &spec, &me, None, hang_after)).await {
                    Ok(r) => r,
                    Err(_) => {
                        ctx.record(
                            &me,
                            Op::Fault(history::Fault::ClientKilled { client: me.clone() }),
                        );
                        Ok(())
                    }
                }
            }
        };
        if let Err(e) = ended {
            ctx.error(&me, "consume", &e.to_string());
            ctx.fail_over();
            tokio::time::sleep(RECONNECT_PAUSE).await;
        }
    }
    Ok(())
}

/// One session's life: receive and handle until stopped, `until`, or an error; with
/// `hang_after`, hang (holding the last batch unacknowledged) after that many batches.
async fn incarnation(
    ctx: &Ctx,
    spec: &ConsumerSpec,
    me: &str,
    until: Option<Instant>,
    hang_after: Option<u32>,
) -> anyhow::Result<()> {
    let live = || !ctx.stopped() && until.is_none_or(|u| Instant::now() < u);
    // The planted bug acknowledges as the old library did, by hand after the receive.
    let planted = spec.kind == ConsumerKind::AutoAck && ctx.auto_ack_drops_unconfirmed_batch;
    let mode = match spec.kind {
        _ if planted => pb::AckMode::Individual,
        ConsumerKind::ClientAck | ConsumerKind::Stream => pb::AckMode::Client,
        ConsumerKind::AutoAck | ConsumerKind::AutoAckStream => pb::AckMode::Auto,
        ConsumerKind::PoisonNack => pb::AckMode::Individual,
        ConsumerKind::PoisonRollback => pb::AckMode::Transacted,
    };
    let (_client, _conn, session) = ctx.session(me, mode).await?;
    if matches!(
        spec.kind,
        ConsumerKind::Stream | ConsumerKind::AutoAckStream
    ) {
        return stream_incarnation(ctx, spec, me, &session, &live).await;
    }
    let mut tool = Receiver::new(ctx, me, &spec.queue, spec.kind);
    let mut batches = 0u32;
    while live() {
        let requested_us = ctx.history.now_us();
        let opts = ReceiveOptions::timeout_ms(200).max(spec.batch);
        let got = timeout(ctx.op_timeout, session.receive(&spec.queue, opts))
            .await
            .map_err(|_| anyhow::anyhow!("receive timed out"))??;
        if planted && !got.is_empty() {
            // The planted bug: the batch goes to the application only if its acknowledgement
            // is answered; otherwise the receive fails and the batch is thrown away.
            timeout(ctx.op_timeout, session.ack(&got))
                .await
                .map_err(|_| anyhow::anyhow!("acknowledge timed out"))??;
        }
        let ids = tool.delivered(&got, requested_us);
        batches += u32::from(!got.is_empty());
        if hang_after.is_some_and(|n| batches >= n) {
            // Until the caller's timeout drops this future; bounded by the stop signal too.
            let mut stop = ctx.stop.clone();
            let _ = stop.wait_for(|s| *s).await;
            return Ok(());
        }
        match spec.kind {
            ConsumerKind::ClientAck => tool.ack(&session, &got, ids).await?,
            ConsumerKind::AutoAck | ConsumerKind::Stream | ConsumerKind::AutoAckStream => {}
            ConsumerKind::PoisonNack => {
                if !got.is_empty() {
                    tool.released(ids, "nack");
                    timeout(ctx.op_timeout, session.nack(&got, None)).await??;
                }
            }
            ConsumerKind::PoisonRollback => {
                if !got.is_empty() {
                    tool.released(ids, "rollback");
                    timeout(ctx.op_timeout, session.rollback()).await??;
                }
            }
        }
    }
    timeout(ctx.op_timeout, session.close()).await??;
    Ok(())
}

async fn stream_incarnation(
    ctx: &Ctx,
    spec: &ConsumerSpec,
    me: &str,
    session: &ferry_client::Session,
    live: &(dyn Fn() -> bool + Sync),
) -> anyhow::Result<()> {
    let requested_us = ctx.history.now_us();
    let mut consumer = timeout(
        ctx.op_timeout,
        session.consumer(
            &spec.queue,
            ConsumerOptions::default().prefetch(spec.batch * 2),
        ),
    )
    .await??;
    let mut tool = Receiver::new(ctx, me, &spec.queue, spec.kind);
    while live() {
        let got = timeout(
            ctx.op_timeout,
            consumer.receive_batch(spec.batch as usize, Some(Duration::from_millis(200))),
        )
        .await??;
        if got.is_empty() {
            continue;
        }
        let ids = tool.delivered(&got, requested_us);
        if spec.kind == ConsumerKind::AutoAckStream {
            continue;
        }
        let stale_before = consumer.stale_acks();
        let op = ctx.history.next_id();
        ctx.record(
            me,
            Op::AckInvoke {
                op,
                deliveries: ids,
            },
        );
        // The stream acknowledges without an answer per ack; a flush says they all took effect,
        // and the stale count says whether any found its lease gone (which one is not known).
        consumer.ack(&got)?;
        let flushed = timeout(ctx.op_timeout, consumer.flush()).await;
        let outcome = match flushed {
            Ok(Ok(())) if consumer.stale_acks() == stale_before => Outcome::Ok,
            Ok(Ok(())) => Outcome::Unknown {
                error: "some acknowledgements were stale".into(),
            },
            Ok(Err(e)) => Outcome::Unknown {
                error: e.to_string(),
            },
            Err(_) => Outcome::Unknown {
                error: "flush timed out".into(),
            },
        };
        let broken = outcome != Outcome::Ok;
        ctx.record(me, Op::AckEnd { op, outcome });
        if broken {
            anyhow::bail!("the consumer stream's acknowledgements did not all take effect");
        }
    }
    timeout(ctx.op_timeout, consumer.close()).await??;
    Ok(())
}

/// Records deliveries and acknowledgements for one consumer.
struct Receiver<'a> {
    ctx: &'a Ctx,
    me: &'a str,
    queue: &'a str,
    kind: ConsumerKind,
}

impl<'a> Receiver<'a> {
    fn new(ctx: &'a Ctx, me: &'a str, queue: &'a str, kind: ConsumerKind) -> Self {
        Self {
            ctx,
            me,
            queue,
            kind,
        }
    }

    /// Records each message handed over; returns their delivery ids.
    fn delivered(&mut self, got: &[Received], requested_us: u64) -> Vec<u64> {
        let ack = if matches!(
            self.kind,
            ConsumerKind::AutoAck | ConsumerKind::AutoAckStream
        ) {
            history::AckMode::Auto
        } else {
            history::AckMode::Explicit
        };
        got.iter()
            .map(|r| {
                let delivery = self.ctx.history.next_id();
                self.ctx.record(
                    self.me,
                    Op::Deliver(delivery_of(r, delivery, self.queue, ack, requested_us)),
                );
                delivery
            })
            .collect()
    }

    fn released(&mut self, deliveries: Vec<u64>, how: &str) {
        self.ctx.record(
            self.me,
            Op::Release {
                deliveries,
                how: how.into(),
            },
        );
    }

    /// Acknowledges `got` (client or individual mode) and records how it ended.
    async fn ack(
        &mut self,
        session: &ferry_client::Session,
        got: &[Received],
        ids: Vec<u64>,
    ) -> anyhow::Result<()> {
        if got.is_empty() {
            return Ok(());
        }
        let op = self.ctx.history.next_id();
        self.ctx.record(
            self.me,
            Op::AckInvoke {
                op,
                deliveries: ids,
            },
        );
        let (_, outcome) = judge(timeout(self.ctx.op_timeout, session.ack(got)).await);
        let failed = outcome != Outcome::Ok;
        self.ctx.record(self.me, Op::AckEnd { op, outcome });
        anyhow::ensure!(!failed, "acknowledgement failed");
        Ok(())
    }
}

/// The value a message carries, from its properties.
pub fn value_of(r: &Received) -> Option<Value> {
    use pb::property_value::Value as V;
    let p = r.properties();
    let producer = match p.get(history::PRODUCER_PROPERTY)?.value.as_ref()? {
        V::IntValue(n) => u32::try_from(*n).ok()?,
        _ => return None,
    };
    let seq = match p.get(history::SEQ_PROPERTY)?.value.as_ref()? {
        V::LongValue(n) => u64::try_from(*n).ok()?,
        _ => return None,
    };
    Some(Value { producer, seq })
}

fn delivery_of(
    r: &Received,
    delivery: u64,
    queue: &str,
    ack: history::AckMode,
    requested_us: u64,
) -> Delivery {
    use pb::property_value::Value as V;
    let p = r.properties();
    let reason = match p
        .get("FerryDeadLetterReason")
        .and_then(|v| v.value.as_ref())
    {
        Some(V::StringValue(s)) => Some(s.clone()),
        _ => None,
    };
    let count = match p.get("FerryDeliveryCount").and_then(|v| v.value.as_ref()) {
        Some(V::LongValue(n)) => Some(*n),
        Some(V::IntValue(n)) => Some(i64::from(*n)),
        _ => None,
    };
    Delivery {
        delivery,
        queue: queue.into(),
        value: value_of(r),
        message_id: r.message_id().into(),
        delivery_count: r.delivery_count(),
        redelivered: r.redelivered(),
        ack,
        requested_us,
        dead_letter: reason.map(|r| (r, count.unwrap_or(-1))),
    }
}

/// What the drain does with what it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainMode {
    Ack,
    /// Poison: give back until the queue dead-letters everything.
    Nack,
}

/// Empties `queue`: receives until a receive finds nothing and the queue holds nothing (ready,
/// scheduled, leased, staged), acknowledging (or nacking) everything, all recorded. Fails at
/// `deadline` with what is left.
pub async fn drain(
    ctx: &Ctx,
    queue: &str,
    mode: DrainMode,
    deadline: Instant,
) -> anyhow::Result<()> {
    let me = "drain";
    let mut ctx = ctx.clone();
    let ctx = &mut ctx;
    let kind = match mode {
        DrainMode::Ack => ConsumerKind::ClientAck,
        DrainMode::Nack => ConsumerKind::PoisonNack,
    };
    let mut session = None;
    let mut left = String::new();
    while Instant::now() < deadline {
        let Some((client, _conn, s)) = &session else {
            match ctx.session(me, pb::AckMode::Individual).await {
                Ok(s) => session = Some(s),
                Err(e) => {
                    ctx.error(me, "open session", &e.to_string());
                    ctx.fail_over();
                    tokio::time::sleep(RECONNECT_PAUSE).await;
                }
            }
            continue;
        };
        let mut tool = Receiver::new(ctx, me, queue, kind);
        let requested_us = ctx.history.now_us();
        let opts = ReceiveOptions::timeout_ms(500).max(500);
        let got = match timeout(ctx.op_timeout, s.receive(queue, opts)).await {
            Ok(Ok(got)) => got,
            Ok(Err(e))
                if e.code() == Some(tonic::Code::NotFound)
                    && !queue_exists(client, queue).await =>
            {
                // A dead-letter queue made on demand that never was.
                return Ok(());
            }
            Ok(Err(e)) => {
                ctx.error(me, "drain receive", &e.to_string());
                session = None;
                ctx.fail_over();
                continue;
            }
            Err(_) => {
                ctx.error(me, "drain receive", "client timeout");
                session = None;
                ctx.fail_over();
                continue;
            }
        };
        let ids = tool.delivered(&got, requested_us);
        if !got.is_empty() {
            let done = match mode {
                DrainMode::Ack => tool.ack(s, &got, ids).await,
                DrainMode::Nack => {
                    tool.released(ids, "nack");
                    timeout(ctx.op_timeout, s.nack(&got, None))
                        .await
                        .map_err(anyhow::Error::from)
                        .and_then(|r| r.map_err(anyhow::Error::from))
                }
            };
            if done.is_err() {
                session = None;
            }
            continue;
        }
        match timeout(ctx.op_timeout, crate::stats(client, queue)).await {
            Ok(Ok(st)) if st.ready + st.scheduled + st.leased + st.staged == 0 => return Ok(()),
            Ok(Ok(st)) => {
                left = format!(
                    "ready {}, scheduled {}, leased {}, staged {}",
                    st.ready, st.scheduled, st.leased, st.staged
                );
            }
            _ => session = None,
        }
    }
    anyhow::bail!("draining {queue} did not finish in time; left: {left}")
}

async fn queue_exists(client: &Client, queue: &str) -> bool {
    let r = client
        .admin()
        .get_queue(pb::GetQueueRequest { name: queue.into() })
        .await;
    !matches!(r, Err(s) if s.code() == tonic::Code::NotFound)
}
