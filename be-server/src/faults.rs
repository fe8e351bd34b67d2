//! Planted bugs for the chaos harness (docs/reliability.md, "The checker bites"): each breaks a
//! promise the checker must then report broken. Compiled in only with the `failpoints` feature
//! (the test binary `ferry-faults`, never a release build) and switched on by the `FAILPOINTS`
//! environment variable, e.g. `FAILPOINTS=planted-skip-delivery-count=return`. Without the
//! feature every point is off and compiles to nothing. The store has its own
//! (`ferry_store::faults`).

/// Never writes a message's delivery count: after a restart a message delivered before comes
/// again looking new (count 1, not flagged redelivered).
pub const SKIP_DELIVERY_COUNT: &str = "planted-skip-delivery-count";

/// Not a bug but a fault that widens a window: every acknowledgement is answered 300 ms after
/// it is applied and durable ([`SLOW_ACK_ANSWER_FOR`]). A kill -9 then almost always finds an
/// acknowledgement applied whose answer never left, the corner where a client that throws away
/// a batch whose acknowledgement got no answer loses it (planted bug
/// `auto-ack-drops-unconfirmed-batch`). Without it that corner is a window of a few
/// microseconds which four kills hit only now and then.
pub const SLOW_ACK_ANSWER: &str = "slow-ack-answer";

/// How long [`SLOW_ACK_ANSWER`] holds each acknowledgement's answer.
pub const SLOW_ACK_ANSWER_FOR: std::time::Duration = std::time::Duration::from_millis(300);

/// Not a bug but a fault that widens a window: a receive's answer that carries deliveries is
/// held [`SLOW_RECEIVE_ANSWER_FOR`] once its leases are written, before it leaves. A kill -9
/// of a replicated queue's leader meanwhile finds written leases whose answer never reaches
/// the front-end (issue 24: they must come back before their leases run out). Give it as
/// `slow-receive-answer=1*return` to hold only a node's first such answer; the node logs
/// `fault slow-receive-answer` as the hold begins (the leases are durable then: the kernel's
/// count of leased messages grows before they are).
pub const SLOW_RECEIVE_ANSWER: &str = "slow-receive-answer";

/// How long [`SLOW_RECEIVE_ANSWER`] holds an answer.
pub const SLOW_RECEIVE_ANSWER_FOR: std::time::Duration = std::time::Duration::from_secs(3);

/// Whether the planted bug (or fault) `name` is switched on.
pub(crate) fn on(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| true);
    let _ = name;
    false
}
