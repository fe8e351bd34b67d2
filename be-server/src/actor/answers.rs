//! Answers that wait for a write: each is called with the write's result once it is durable (or
//! failed), and gives back the deliveries nobody took.

use crate::log::LogError;
use ferry_kernel::{Delivery, LeaseRef};
use tokio::sync::oneshot;

use super::Reply;
use crate::error::Error;

/// Sends a caller its answer once the write it depends on is done. Returns the leases of
/// deliveries that could not be handed over (the receiver was gone or the write failed).
pub(super) type Answer = Box<dyn FnOnce(Result<(), LogError>) -> Vec<LeaseRef> + Send>;

pub(super) fn answer<T: Send + 'static>(reply: Reply<T>, value: T) -> Answer {
    Box::new(move |written| {
        let _ = reply.send(written.map(|()| value).map_err(Error::from));
        vec![]
    })
}

/// Answers once the write is durable and every dead letter of the command is in its dead-letter
/// queue (a failed move fails the answer: the message stays in its queue on disk and is judged
/// again at restart).
pub(super) fn answer_after_moves<T: Send + 'static>(
    reply: Reply<T>,
    value: T,
    moving: Vec<oneshot::Receiver<Result<(), Error>>>,
) -> Answer {
    if moving.is_empty() {
        return answer(reply, value);
    }
    Box::new(move |written| {
        match written {
            Err(e) => drop(reply.send(Err(e.into()))),
            // Ends when the moves end: each job is answered or dropped (which ends it too).
            Ok(()) => drop(tokio::spawn(async move {
                for moved in moving {
                    match moved.await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => return drop(reply.send(Err(e))),
                        Err(_) => return drop(reply.send(Err(Error::ShuttingDown))),
                    }
                }
                let _ = reply.send(Ok(value));
            })),
        }
        vec![]
    })
}

pub(super) fn deliver(reply: Reply<Vec<Delivery>>, deliveries: Vec<Delivery>) -> Answer {
    Box::new(move |written| {
        let leases: Vec<LeaseRef> = deliveries.iter().map(Delivery::lease_ref).collect();
        match written {
            Ok(()) => match reply.send(Ok(deliveries)) {
                Ok(()) => vec![],
                // The receiver is gone: these messages never reached anyone.
                Err(_) => leases,
            },
            Err(e) => {
                let _ = reply.send(Err(e.into()));
                leases
            }
        }
    })
}
