//! `Admin.WatchEvents`: one stream per watcher, merging every back-end's events (dead letters,
//! expiries), this front-end's (replies to a queue that is gone) and the thresholds the watcher
//! set, checked every `check_every_ms` with hysteresis so each crossing is told once. A stream
//! ends with UNAVAILABLE when the node stops.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ferry_kernel::{ClockRef, PlacementEpoch};
use ferry_proto::{pb, EventStream};
use futures::stream::{SelectAll, StreamExt};
use tokio::sync::{broadcast, mpsc, watch};
use tonic::{Request, Status};

use crate::error::Error;
use crate::router::Router;

/// Whether a threshold is currently crossed, per queue.
#[derive(Debug, Default, Clone, Copy)]
struct Crossed {
    depth: bool,
    age: bool,
}

#[derive(Debug, Clone, Copy)]
struct Thresholds {
    depth_high: u64,
    depth_low: u64,
    age_high_ms: u64,
}

pub(crate) async fn watch(
    router: Arc<Router>,
    clock: ClockRef,
    local: broadcast::Receiver<pb::Event>,
    stopping: watch::Receiver<bool>,
    req: pb::WatchEventsRequest,
) -> Result<EventStream, Status> {
    let depth_low = req.depth_low.unwrap_or(req.depth_high / 2);
    if req.depth_high > 0 && depth_low >= req.depth_high {
        return Err(Status::invalid_argument(format!(
            "depth_low ({depth_low}) must be below depth_high ({}) so a depth can come back",
            req.depth_high
        )));
    }
    let every = Duration::from_millis(req.check_every_ms.unwrap_or(250).max(50));
    let only = (!req.queue.is_empty()).then(|| req.queue.clone());
    let t = Thresholds {
        depth_high: req.depth_high,
        depth_low,
        age_high_ms: req.age_high_ms,
    };
    // Subscribe before answering, so nothing that happens after the call returns is missed.
    let mut sources: SelectAll<EventStream> = SelectAll::new();
    for (node, be) in router.nodes() {
        match be
            .watch_events(Request::new(pb::BackendWatchEventsRequest {}))
            .await
        {
            Ok(s) => sources.push(s.into_inner()),
            Err(e) => tracing::warn!(%node, error = %e, "cannot watch a back-end's events"),
        }
    }
    let (tx, rx) = mpsc::channel::<Result<pb::Event, Status>>(EVENTS_QUEUED_MAX);
    let watcher = Watcher {
        node: router.local_node().to_string(),
        router,
        clock,
        only,
        thresholds: t,
    };
    tokio::spawn(watcher.run(sources, local, stopping, every, tx));
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// Events queued for one watcher before the sources wait for it.
const EVENTS_QUEUED_MAX: usize = 1_024;

/// One watcher's settings, for its task.
struct Watcher {
    router: Arc<Router>,
    clock: ClockRef,
    /// This node, as events name it.
    node: String,
    /// Only this queue's events.
    only: Option<String>,
    thresholds: Thresholds,
}

impl Watcher {
    /// Forwards events to `tx` until the watcher goes away, this node's bus closes or the node
    /// stops (the stream then ends with UNAVAILABLE).
    async fn run(
        self,
        mut sources: SelectAll<EventStream>,
        mut local: broadcast::Receiver<pb::Event>,
        mut stopping: watch::Receiver<bool>,
        every: Duration,
        tx: mpsc::Sender<Result<pb::Event, Status>>,
    ) {
        let t = self.thresholds;
        let mut crossed: HashMap<String, Crossed> = HashMap::new();
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let out: Vec<pb::Event> = tokio::select! {
                () = tx.closed() => return,
                () = crate::stopped(&mut stopping) => {
                    let node = self.router.local_node().clone();
                    let _ = tx.send(Err(Error::NodeStopping { node }.into())).await;
                    return;
                }
                Some(e) = sources.next(), if !sources.is_empty() => match e {
                    Ok(e) => vec![e],
                    Err(s) => {
                        tracing::warn!(error = %s, "a back-end's event stream ended");
                        vec![]
                    }
                },
                e = local.recv() => match e {
                    Ok(e) => vec![e],
                    Err(broadcast::error::RecvError::Lagged(n)) => vec![pb::Event {
                        at_ms: self.clock.now_ms(),
                        kind: "events-lost".into(),
                        value: n,
                        node: self.node.clone(),
                        ..Default::default()
                    }],
                    Err(broadcast::error::RecvError::Closed) => return,
                },
                _ = tick.tick(), if t.depth_high > 0 || t.age_high_ms > 0 => {
                    let now = self.clock.now_ms();
                    check(&self.router, self.only.as_deref(), t, &mut crossed, &self.node, now).await
                }
            };
            for e in out {
                if self.only.as_ref().is_some_and(|q| *q != e.queue) {
                    continue;
                }
                if tx.send(Ok(e)).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Reads every queue's depth and oldest ready age (`now`: wall time, ms); returns the crossings
/// since the last check.
async fn check(
    router: &Router,
    only: Option<&str>,
    t: Thresholds,
    crossed: &mut HashMap<String, Crossed>,
    node: &str,
    now: u64,
) -> Vec<pb::Event> {
    let mut out = vec![];
    for (_, be) in router.nodes() {
        let Ok(queues) = be
            .list_queues(Request::new(pb::BackendListQueuesRequest {}))
            .await
        else {
            continue;
        };
        for q in queues.into_inner().queues {
            if only.is_some_and(|o| o != q.name) {
                continue;
            }
            let Ok(s) = be
                .get_queue_stats(Request::new(pb::BackendQueueRequest {
                    name: q.name.clone(),
                    // Asked of the node that listed it, whoever the owner is by now.
                    placement_epoch: PlacementEpoch::UNKNOWN.get(),
                    wait_placed_ms: 0,
                    wait_settings: None,
                }))
                .await
            else {
                continue;
            };
            let s = s.into_inner();
            let c = crossed.entry(q.name.clone()).or_default();
            let event = |kind: &str, value: u64| pb::Event {
                at_ms: now,
                kind: kind.into(),
                queue: q.name.clone(),
                value,
                node: node.into(),
                ..Default::default()
            };
            let depth = s.ready + s.scheduled;
            if t.depth_high > 0 {
                if !c.depth && depth >= t.depth_high {
                    c.depth = true;
                    out.push(event("queue-depth-high", depth));
                } else if c.depth && depth <= t.depth_low {
                    c.depth = false;
                    out.push(event("queue-depth-normal", depth));
                }
            }
            if t.age_high_ms > 0 {
                let age = match s.oldest_ready_timestamp_ms {
                    0 => 0,
                    ts => now.saturating_sub(ts),
                };
                if !c.age && age >= t.age_high_ms {
                    c.age = true;
                    out.push(event("oldest-age-high", age));
                } else if c.age && age < t.age_high_ms / 2 {
                    c.age = false;
                    out.push(event("oldest-age-normal", age));
                }
            }
        }
    }
    out
}
