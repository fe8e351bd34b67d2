//! Moving messages between queues as a background task: the "retry everything in the DLQ" action.
//! Each batch is received from the source (leased, no session), sent to the target, and only then
//! acknowledged at the source: a crash in between leaves a message in both, never in neither.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use ferry_kernel::ClockRef;
use tokio::time::Instant;

use ferry_kernel::QueueName;
use ferry_proto::pb;
use tonic::{Request, Status};

use crate::router::Router;

/// Messages per receive while moving.
const BATCH: u64 = 100;

#[derive(Debug)]
pub(crate) struct Task {
    id: String,
    from: QueueName,
    to: QueueName,
    moved: AtomicU64,
    at_start: u64,
    started_at_ms: u64,
    end: Mutex<Option<End>>,
}

/// How a task ended, and when (ms since the Unix epoch).
#[derive(Debug, Clone)]
struct End {
    result: Result<(), String>,
    at_ms: u64,
}

impl Task {
    pub(crate) fn info(&self) -> pb::MoveTask {
        let end = self
            .end
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let finished_at_ms = end.as_ref().map_or(0, |e| e.at_ms);
        let (state, error) = match end.map(|e| e.result) {
            None => (pb::MoveState::Running, String::new()),
            Some(Ok(())) => (pb::MoveState::Done, String::new()),
            Some(Err(e)) => (pb::MoveState::Failed, e),
        };
        pb::MoveTask {
            task_id: self.id.clone(),
            from_queue: self.from.to_string(),
            to_queue: self.to.to_string(),
            moved: self.moved.load(Ordering::Relaxed),
            state: state as i32,
            error,
            source_messages_at_start: self.at_start,
            started_at_ms: self.started_at_ms,
            finished_at_ms,
        }
    }
}

/// The move tasks this node runs or ran (kept until the node stops; they are small).
#[derive(Debug, Clone, Default)]
pub(crate) struct Movers {
    tasks: Arc<Mutex<HashMap<String, Arc<Task>>>>,
}

pub(crate) struct MoveSpec {
    pub(crate) from: QueueName,
    pub(crate) to: QueueName,
    pub(crate) selector: String,
    pub(crate) rate_per_sec: u64,
    pub(crate) max_messages: u64,
}

impl Movers {
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Task>> {
        self.tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
            .cloned()
    }

    pub(crate) fn start(
        &self,
        router: Arc<Router>,
        clock: ClockRef,
        spec: MoveSpec,
        at_start: u64,
    ) -> Arc<Task> {
        let task = Arc::new(Task {
            id: format!("move-{:016x}", rand::random::<u64>()),
            from: spec.from.clone(),
            to: spec.to.clone(),
            moved: AtomicU64::new(0),
            at_start,
            started_at_ms: clock.now_ms(),
            end: Mutex::new(None),
        });
        self.tasks
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(task.id.clone(), task.clone());
        let t = task.clone();
        tokio::spawn(async move {
            let result = run(&router, &clock, &spec, &t)
                .await
                .map_err(|s| s.message().to_owned());
            match &result {
                Ok(()) => {
                    tracing::info!(task = %t.id, from = %t.from, to = %t.to, moved = t.moved.load(Ordering::Relaxed), "move done")
                }
                Err(e) => {
                    tracing::warn!(task = %t.id, from = %t.from, to = %t.to, error = %e, "move failed")
                }
            }
            let at_ms = clock.now_ms();
            *t.end.lock().unwrap_or_else(PoisonError::into_inner) = Some(End { result, at_ms });
        });
        task
    }
}

/// Lease of the messages a move has received and not yet acknowledged at the source.
const MOVE_LEASE_MS: u64 = 60_000;

async fn run(
    router: &Router,
    clock: &ClockRef,
    spec: &MoveSpec,
    task: &Task,
) -> Result<(), Status> {
    // After the task's `started_at_ms` was read: the rate counts from no earlier than it.
    let started = Instant::now();
    loop {
        let moved = task.moved.load(Ordering::Relaxed);
        let left = match spec.max_messages {
            0 => BATCH,
            max => max.saturating_sub(moved).min(BATCH),
        };
        if left == 0 {
            return Ok(());
        }
        let batch = match spec.rate_per_sec {
            0 => left,
            // The rate: message n (from 0) moves no sooner than n / rate after the start. Wait
            // for the next message's turn, then take every message whose turn has come (at
            // least that one: the sleep ends no sooner than its deadline).
            rate => {
                tokio::time::sleep_until(started + turn_of(moved, rate)).await;
                let due = turns_come(started.elapsed(), rate);
                left.min(due.saturating_sub(moved).max(1))
            }
        };
        let n = move_batch(router, clock, spec, batch).await?;
        if n == 0 {
            return Ok(());
        }
        task.moved.fetch_add(n, Ordering::Relaxed);
    }
}

/// How long after the start message `n` (from 0) may move at `rate_per_sec` (> 0), rounded up
/// to the nanosecond: never early.
fn turn_of(n: u64, rate_per_sec: u64) -> Duration {
    let nanos = (u128::from(n) * 1_000_000_000).div_ceil(u128::from(rate_per_sec.max(1)));
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// How many messages may have moved `elapsed` after the start at `rate_per_sec`: those whose
/// turn ([`turn_of`]) has come.
fn turns_come(elapsed: Duration, rate_per_sec: u64) -> u64 {
    let n = elapsed.as_nanos().saturating_mul(u128::from(rate_per_sec)) / 1_000_000_000 + 1;
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Moves up to `batch` messages: receive at the source, send to the target, then acknowledge at
/// the source, each call routed to its queue's owner at the time. Returns how many moved (0:
/// the source has no more).
async fn move_batch(
    router: &Router,
    clock: &ClockRef,
    spec: &MoveSpec,
    batch: u64,
) -> Result<u64, Status> {
    let from = spec.from.to_string();
    let got = router
        .call(&spec.from, |be, placement_epoch| {
            let req = pb::BackendReceiveRequest {
                queue: from.clone(),
                session_id: String::new(),
                selector: spec.selector.clone(),
                max_messages: u32::try_from(batch).unwrap_or(u32::MAX),
                wait_ms: Some(0),
                lease_ms: Some(MOVE_LEASE_MS),
                clamp_max_messages: true,
                consumer: 0,
                placement_epoch: placement_epoch.get(),
            };
            async move { be.receive(Request::new(req)).await }
        })
        .await?
        .deliveries;
    if got.is_empty() {
        return Ok(0);
    }
    let handles: Vec<String> = got.iter().map(|d| d.receipt_handle.clone()).collect();
    let now = clock.now_ms();
    let messages: Vec<pb::OutgoingMessage> = got
        .iter()
        .filter_map(|d| d.message.as_ref())
        .map(|m| outgoing(m, now))
        .collect();
    let sent = router
        .call(&spec.to, |be, placement_epoch| {
            let req = pb::BackendSendRequest {
                queue: spec.to.to_string(),
                messages: messages.clone(),
                placement_epoch: placement_epoch.get(),
                ..Default::default()
            };
            async move { be.send(Request::new(req)).await }
        })
        .await;
    // At the source: acknowledged once sent; back at once if not, not counted as a delivery
    // (nobody consumed them).
    let undelivered = sent.is_err();
    let settled = router
        .call(&spec.from, |be, placement_epoch| {
            let req = pb::BackendLeaseRequest {
                queue: from.clone(),
                receipt_handles: handles.clone(),
                undelivered,
                placement_epoch: placement_epoch.get(),
                ..Default::default()
            };
            async move {
                if undelivered {
                    be.nack(Request::new(req)).await
                } else {
                    be.ack(Request::new(req)).await
                }
            }
        })
        .await;
    sent?;
    settled?;
    Ok(got.len() as u64)
}

/// The message as its producer would send it again: same body, properties and headers, the
/// time to live it has left.
fn outgoing(m: &pb::Message, now_ms: u64) -> pb::OutgoingMessage {
    pb::OutgoingMessage {
        body: m.body.clone(),
        properties: m.properties.clone(),
        correlation_id: m.correlation_id.clone(),
        reply_to: m.reply_to.clone(),
        r#type: m.r#type.clone(),
        priority: Some(m.priority),
        time_to_live_ms: (m.expiration_ms > 0)
            .then(|| m.expiration_ms.saturating_sub(now_ms).max(1)),
        delivery_delay_ms: None,
        delivery_mode: m.delivery_mode,
        dedup_id: String::new(),
        group_id: m.group_id.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_message_waits_for_its_turn_and_no_turn_comes_early() {
        // 100 per second: message n's turn is n × 10 ms after the start.
        assert_eq!(turn_of(0, 100), Duration::ZERO);
        assert_eq!(turn_of(19, 100), Duration::from_millis(190));
        assert_eq!(turns_come(Duration::ZERO, 100), 1);
        assert_eq!(
            turns_come(Duration::from_millis(190) - Duration::from_nanos(1), 100),
            19
        );
        assert_eq!(turns_come(Duration::from_millis(190), 100), 20);
        // A rate that does not divide a second: turns rounded up, and consistent both ways.
        for rate in [1, 3, 7, 100, 999, 1_000_000] {
            for n in [0, 1, 2, 10, 12_345] {
                let turn = turn_of(n, rate);
                assert_eq!(turns_come(turn, rate), n + 1, "rate {rate}, message {n}");
                if turn > Duration::ZERO {
                    let just_before = turn - Duration::from_nanos(1);
                    assert_eq!(turns_come(just_before, rate), n, "rate {rate}, message {n}");
                }
            }
        }
        // Far-off turns and huge rates neither overflow nor wrap.
        assert_eq!(turn_of(u64::MAX, 1), Duration::from_nanos(u64::MAX));
        assert_eq!(turn_of(u64::MAX, u64::MAX), Duration::from_secs(1));
        assert_eq!(turns_come(Duration::MAX, u64::MAX), u64::MAX);
    }
}
