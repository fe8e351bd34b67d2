//! The `Publish` stream: a producer writes send requests without waiting; the front-end confirms
//! each once the back-end has it on disk, in the order written.
//!
//! One back-end call is in flight per stream. Requests that arrive meanwhile queue up, and the
//! next call carries a run of them together (same queue and session, up to [`BATCH_MAX`]
//! messages): the front-end's group commit, so a pipelining producer costs one call per fsync
//! rather than one per message. Order is kept because calls go one after another.
//!
//! A back-end `Send` is all or nothing. When a coalesced call is refused for what one message is
//! (too large, a bad property, a missing reply queue, a full queue), nothing was stored, so each
//! request of the run is sent again on its own, still in order: only the offender fails, and the
//! stream goes on.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use ferry_proto::pb;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Status, Streaming};

use crate::dispatch::Dispatch;

pub type PublishStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<pb::PublishResponse, Status>> + Send>>;

/// The most messages one back-end call carries.
const BATCH_MAX: usize = 1_000;
/// The most bytes of messages a coalesced call carries. A single request may be larger (up to
/// the node's request limit) and then goes alone; a merged call never grows past what a remote
/// back-end accepts.
const BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Messages read off the stream and not yet sent to the back-end. Past this (or
/// [`QUEUED_BYTES_MAX`]) the front-end stops reading, and HTTP/2 flow control holds the producer
/// back.
const QUEUED_MAX: usize = 10_000;
/// Bytes of requests read off the stream and not yet sent to the back-end. (Postmortem: only
/// messages were counted, and 2 000 messages of 1 MB each took a node to 1.6 GB.)
const QUEUED_BYTES_MAX: usize = 16 * 1024 * 1024;

type Inflight = Pin<Box<dyn Future<Output = Vec<pb::PublishConfirm>> + Send>>;

pub(crate) fn start(svc: Arc<Dispatch>, inbound: Streaming<pb::PublishRequest>) -> PublishStream {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(run(svc, inbound, tx));
    Box::pin(ReceiverStream::new(rx))
}

async fn run(
    svc: Arc<Dispatch>,
    mut inbound: Streaming<pb::PublishRequest>,
    tx: mpsc::Sender<Result<pb::PublishResponse, Status>>,
) {
    let mut queued: VecDeque<(u64, pb::PublishRequest)> = VecDeque::new();
    let mut queued_messages = 0usize;
    let mut queued_bytes = 0usize;
    let mut next_sequence = 0u64;
    let mut inflight: Option<Inflight> = None;
    let mut inbound_done = false;
    let mut stopping = svc.stopping.clone();
    loop {
        if inflight.is_none() && !queued.is_empty() {
            let run = take_run(&mut queued);
            queued_messages -= run.iter().map(|(_, r)| r.messages.len()).sum::<usize>();
            queued_bytes -= run
                .iter()
                .map(|(_, r)| prost::Message::encoded_len(r))
                .sum::<usize>();
            let svc = svc.clone();
            inflight = Some(Box::pin(async move { send_run(&svc, run).await }));
        }
        if inflight.is_none() && inbound_done {
            // Everything written was answered: end the stream (OK).
            return;
        }
        tokio::select! {
            msg = inbound.message(), if !inbound_done && queued_messages < QUEUED_MAX && queued_bytes < QUEUED_BYTES_MAX => {
                match msg {
                    Ok(Some(r)) => {
                        queued_messages += r.messages.len();
                        queued_bytes += prost::Message::encoded_len(&r);
                        queued.push_back((next_sequence, r));
                        next_sequence += 1;
                    }
                    Ok(None) => inbound_done = true,
                    // The client cancelled or went away: nobody is left to confirm to.
                    Err(_) => return,
                }
            }
            confirms = async { inflight.as_mut().expect("invariant: guarded by is_some").await }, if inflight.is_some() => {
                inflight = None;
                if tx.send(Ok(pb::PublishResponse { confirms })).await.is_err() {
                    return;
                }
            }
            () = tx.closed() => return,
            () = crate::stopped(&mut stopping) => {
                let _ = tx.send(Err(Status::unavailable(
                    "the node is stopping: requests not yet confirmed may or may not have been stored",
                ))).await;
                return;
            }
        }
    }
}

/// The longest run at the front of `queued` that can go in one back-end call: same queue, same
/// session, at most [`BATCH_MAX`] messages and [`BATCH_BYTES_MAX`] bytes (always at least one
/// request).
fn take_run(queued: &mut VecDeque<(u64, pb::PublishRequest)>) -> Vec<(u64, pb::PublishRequest)> {
    let mut run = Vec::new();
    let mut messages = 0;
    let mut bytes = 0;
    while let Some((_, next)) = queued.front() {
        let next_bytes = prost::Message::encoded_len(next);
        if let Some((_, first)) = run.first() {
            let first: &pb::PublishRequest = first;
            if next.queue != first.queue
                || next.session_id != first.session_id
                || messages + next.messages.len() > BATCH_MAX
                || bytes + next_bytes > BATCH_BYTES_MAX
            {
                break;
            }
        }
        messages += next.messages.len();
        bytes += next_bytes;
        run.push(queued.pop_front().expect("front exists"));
    }
    run
}

fn confirm(sequence: u64, result: Result<Vec<String>, Status>) -> pb::PublishConfirm {
    match result {
        Ok(message_ids) => pb::PublishConfirm {
            sequence,
            message_ids,
            ..Default::default()
        },
        Err(s) => pb::PublishConfirm {
            sequence,
            message_ids: vec![],
            error_code: s.code() as i32,
            error_message: s.message().to_string(),
            replicas: 0,
        },
    }
}

fn send_request(r: pb::PublishRequest) -> pb::SendRequest {
    pb::SendRequest {
        session_id: r.session_id,
        queue: r.queue,
        messages: r.messages,
    }
}

async fn send_run(svc: &Dispatch, run: Vec<(u64, pb::PublishRequest)>) -> Vec<pb::PublishConfirm> {
    let replicas = ferry_kernel::QueueName::new(&run[0].1.queue)
        .ok()
        .map_or(0, |q| {
            svc.router
                .placement()
                .shard_of(&q)
                .map_or(1, |(_, replicas)| {
                    u32::try_from(replicas.len()).unwrap_or(0)
                })
        });
    let mut confirms = send_each(svc, run).await;
    for c in confirms.iter_mut().filter(|c| c.error_code == 0) {
        c.replicas = replicas;
    }
    confirms
}

/// The confirms of a run (see [`send_run`]).
async fn send_each(svc: &Dispatch, run: Vec<(u64, pb::PublishRequest)>) -> Vec<pb::PublishConfirm> {
    if run.len() == 1 {
        let (sequence, r) = run.into_iter().next().expect("one request");
        return vec![confirm(sequence, svc.send_messages(send_request(r)).await)];
    }
    let first = &run[0].1;
    let all = pb::SendRequest {
        session_id: first.session_id.clone(),
        queue: first.queue.clone(),
        messages: run
            .iter()
            .flat_map(|(_, r)| r.messages.iter().cloned())
            .collect(),
    };
    match svc.send_messages(all).await {
        Ok(ids) => {
            let mut ids = ids.into_iter();
            run.into_iter()
                .map(|(sequence, r)| {
                    confirm(sequence, Ok(ids.by_ref().take(r.messages.len()).collect()))
                })
                .collect()
        }
        // Refused for what a message is: nothing was stored; each request on its own, in order.
        Err(s) if is_about_a_message(s.code()) => {
            let mut confirms = Vec::with_capacity(run.len());
            for (sequence, r) in run {
                confirms.push(confirm(sequence, svc.send_messages(send_request(r)).await));
            }
            confirms
        }
        // The session, the back-end or the node: the same answer for every request of the run.
        Err(s) => run
            .into_iter()
            .map(|(sequence, _)| confirm(sequence, Err(s.clone())))
            .collect(),
    }
}

/// Codes that say a coalesced call was refused for what it carried, before anything was stored:
/// its requests may fare differently on their own. (`OUT_OF_RANGE`: too large a call for a
/// remote back-end.)
fn is_about_a_message(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::InvalidArgument
            | tonic::Code::ResourceExhausted
            | tonic::Code::NotFound
            | tonic::Code::OutOfRange
    )
}
