//! Synthetic histories for testing the checker: each method appends the events a real run would
//! record, with a clock that moves 10 µs per event.

use super::history::{AckMode, Delivery, Event, History, Op, Outcome, Value};

/// Builds a history by hand.
#[derive(Debug, Default)]
pub struct Synthetic {
    events: Vec<Event>,
    next_id: u64,
    t_us: u64,
}

impl Synthetic {
    pub fn new() -> Self {
        Self::default()
    }

    fn id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn push(&mut self, process: &str, op: Op) {
        self.t_us += 10;
        self.events.push(Event {
            t_us: self.t_us,
            process: process.into(),
            node: "n1".into(),
            op,
        });
    }

    /// The message id a confirmed send of `v` gets.
    pub fn message_id(v: Value) -> String {
        format!("ID:{v}")
    }

    /// One send of `v` to `queue` that ends with `outcome` (`None`: never ends).
    pub fn send(&mut self, queue: &str, v: Value, outcome: Option<Outcome>) -> &mut Self {
        let op = self.id();
        self.push(
            "producer",
            Op::SendInvoke {
                op,
                queue: queue.into(),
                producer: v.producer,
                first_seq: v.seq,
                count: 1,
                attempt: 1,
            },
        );
        if let Some(outcome) = outcome {
            let message_ids = if outcome == Outcome::Ok {
                vec![Self::message_id(v)]
            } else {
                vec![]
            };
            self.push(
                "producer",
                Op::SendEnd {
                    op,
                    outcome,
                    message_ids,
                },
            );
        }
        self
    }

    pub fn send_ok(&mut self, queue: &str, v: Value) -> &mut Self {
        self.send(queue, v, Some(Outcome::Ok))
    }

    /// A delivery of `v` (as message `message_id`) to an explicitly acknowledging consumer;
    /// returns its delivery id.
    pub fn deliver(
        &mut self,
        queue: &str,
        v: Option<Value>,
        message_id: &str,
        delivery_count: u32,
        redelivered: bool,
    ) -> u64 {
        let delivery = self.id();
        self.t_us += 10;
        let requested_us = self.t_us;
        self.push(
            "consumer",
            Op::Deliver(Delivery {
                delivery,
                queue: queue.into(),
                value: v,
                message_id: message_id.into(),
                delivery_count,
                redelivered,
                ack: AckMode::Explicit,
                requested_us,
                dead_letter: None,
            }),
        );
        delivery
    }

    /// A dead letter of `v` delivered from `dlq`.
    pub fn deliver_dead_letter(&mut self, dlq: &str, v: Value, reason: &str, count: i64) -> u64 {
        let delivery = self.deliver(dlq, Some(v), &format!("ID:dlq-{v}"), 1, false);
        if let Some(Op::Deliver(d)) = self.events.last_mut().map(|e| &mut e.op) {
            d.dead_letter = Some((reason.into(), count));
        }
        delivery
    }

    /// An acknowledgement of `deliveries` that ends with `outcome` (`None`: never ends).
    pub fn ack(&mut self, deliveries: &[u64], outcome: Option<Outcome>) -> &mut Self {
        let op = self.id();
        self.push(
            "consumer",
            Op::AckInvoke {
                op,
                deliveries: deliveries.to_vec(),
            },
        );
        if let Some(outcome) = outcome {
            self.push("consumer", Op::AckEnd { op, outcome });
        }
        self
    }

    /// Delivers `v` as new and acknowledges it with success: the life of a healthy message.
    pub fn consume(&mut self, queue: &str, v: Value) -> &mut Self {
        let d = self.deliver(queue, Some(v), &Self::message_id(v), 1, false);
        self.ack(&[d], Some(Outcome::Ok))
    }

    pub fn history(&self) -> History {
        History::from_events(self.events.clone())
    }
}
