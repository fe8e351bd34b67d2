//! Per-queue policies for messages that come back: when they are redelivered, and where they go
//! when they will not be delivered again (the dead-letter queue).

use crate::types::QueueName;

/// When a message that was delivered and came back (nack, rollback, recover, session closed,
/// lease expired) is delivered again, and how many times. The parameters are ActiveMQ's.
///
/// The delay before redelivery `n` (1 for the first redelivery):
/// - `n = 1`: `initial_delay_ms`;
/// - `n ≥ 2` without `exponential_backoff`: `delay_ms`;
/// - `n ≥ 2` with `exponential_backoff`, as ActiveMQ's `RedeliveryPolicy` does it, each delay
///   the previous one times `backoff_multiplier`: `initial_delay_ms × m^(n-1)`; with no initial
///   delay the second redelivery waits `delay_ms` and the growth starts from there
///   (`delay_ms × m^(n-2)`);
/// - then ± up to `collision_avoidance_percent` % of it at random;
/// - then at most `max_delay_ms`, always (ActiveMQ lets a large initial delay escape its cap).
///
/// A delay a consumer names in a nack is capped by `max_delay_ms` too.
#[derive(Debug, Clone, PartialEq)]
pub struct RedeliveryPolicy {
    /// Deliveries after the first before the message is dead-lettered (`max-deliveries`);
    /// `None`: redelivered for ever. A message is delivered at most `1 + max_redeliveries` times.
    pub max_redeliveries: Option<u32>,
    pub initial_delay_ms: u64,
    pub delay_ms: u64,
    pub exponential_backoff: bool,
    /// Growth per redelivery with `exponential_backoff`; at least 1.
    pub backoff_multiplier: f64,
    /// Random spread (0-100) so consumers that failed together do not retry together.
    pub collision_avoidance_percent: u8,
    /// Cap on every computed delay.
    pub max_delay_ms: u64,
}

impl Default for RedeliveryPolicy {
    fn default() -> Self {
        Self {
            max_redeliveries: Some(6),
            initial_delay_ms: 0,
            delay_ms: 0,
            exponential_backoff: false,
            backoff_multiplier: 2.0,
            collision_avoidance_percent: 0,
            max_delay_ms: 3_600_000,
        }
    }
}

impl RedeliveryPolicy {
    /// The delay before redelivery `n` (≥ 1). `spread` in `[-1, 1]` picks where in the
    /// collision-avoidance band the delay lands.
    pub fn delay_ms(&self, n: u32, spread: f64) -> u64 {
        let grown = |start: u64, steps: u32| {
            let exp = i32::try_from(steps).unwrap_or(i32::MAX);
            start as f64 * self.backoff_multiplier.powi(exp)
        };
        let base = if n <= 1 {
            self.initial_delay_ms as f64
        } else if self.exponential_backoff && self.initial_delay_ms > 0 {
            grown(self.initial_delay_ms, n - 1)
        } else if self.exponential_backoff {
            grown(self.delay_ms, n - 2)
        } else {
            self.delay_ms as f64
        };
        let band = f64::from(self.collision_avoidance_percent.min(100)) / 100.0;
        let jittered = base * (1.0 + band * spread.clamp(-1.0, 1.0));
        let cap = self.max_delay_ms as f64;
        // `as` saturates for floats: an overflowing product becomes the cap, never wraps.
        if jittered.is_nan() {
            self.max_delay_ms
        } else {
            jittered.clamp(0.0, cap).round() as u64
        }
    }

    /// A delay a consumer asked for, held to the cap like every computed one.
    pub fn capped_ms(&self, delay_ms: u64) -> u64 {
        delay_ms.min(self.max_delay_ms)
    }

    /// Whether a message delivered `delivery_count` times may be delivered again.
    pub fn exhausted(&self, delivery_count: u32) -> bool {
        self.max_redeliveries
            .is_some_and(|max| delivery_count > max)
    }

    /// Why the policy is unusable, if it is.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if !self.backoff_multiplier.is_finite() || !(1.0..=100.0).contains(&self.backoff_multiplier)
        {
            return Err((
                "redelivery.backoff_multiplier",
                format!("must be between 1 and 100, got {}", self.backoff_multiplier),
            ));
        }
        if self.collision_avoidance_percent > 100 {
            return Err((
                "redelivery.collision_avoidance_percent",
                format!(
                    "must be between 0 and 100, got {}",
                    self.collision_avoidance_percent
                ),
            ));
        }
        if self.initial_delay_ms > self.max_delay_ms || self.delay_ms > self.max_delay_ms {
            return Err((
                "redelivery.max_delay_ms",
                format!(
                    "is {} but initial_delay_ms is {} and delay_ms is {}; the cap must not be below them",
                    self.max_delay_ms, self.initial_delay_ms, self.delay_ms
                ),
            ));
        }
        Ok(())
    }
}

/// Where messages go that will not be delivered again.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum DeadLetterTarget {
    /// `<queue>.DLQ`, created on demand next to the queue.
    #[default]
    Default,
    /// A queue of the same back-end, created on demand.
    Queue(QueueName),
    /// Dropped, and counted.
    Discard,
}

impl DeadLetterTarget {
    /// The queue dead letters of `source` go to, if any.
    pub fn resolve(&self, source: &QueueName) -> Option<QueueName> {
        match self {
            DeadLetterTarget::Default => source.dead_letter_queue(),
            DeadLetterTarget::Queue(q) => Some(q.clone()),
            DeadLetterTarget::Discard => None,
        }
    }
}

/// Why a message was dead-lettered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeadLetterReason {
    /// Its time-to-live ran out before it was consumed.
    Expired,
    /// It was delivered `1 + max_redeliveries` times and came back again.
    MaxDeliveries,
    /// A consumer rejected it (nack with dead-letter).
    Rejected,
}

impl DeadLetterReason {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterReason::Expired => "expired",
            DeadLetterReason::MaxDeliveries => "max-deliveries",
            DeadLetterReason::Rejected => "rejected",
        }
    }
}

/// A small deterministic random source (SplitMix64) for collision avoidance: the kernel stays
/// pure, and tests that seed it get the same delays every run.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64(u64);

impl SplitMix64 {
    pub(crate) fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub(crate) fn spread(&mut self) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        unit * 2.0 - 1.0
    }
}
