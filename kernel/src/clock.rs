//! The clock the shell reads, as an interface. The kernel itself never reads time: every
//! operation takes `now_ms`. This trait lets the back-end and front-end be given their clock, so
//! that tests can run several nodes in one process under a clock they step by hand. The
//! implementation that reads the system clock lives in the shell (`ferry-be-server`), never here.

use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Wall-clock time in milliseconds since the Unix epoch, as the shell sees it.
pub trait Clock: Send + Sync + Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> u64;
}

/// A shared clock handle.
pub type ClockRef = Arc<dyn Clock>;

/// A clock that only moves when told to: for tests.
#[derive(Debug, Default)]
pub struct ManualClock {
    now_ms: AtomicU64,
}

impl ManualClock {
    /// A clock standing at `now_ms`.
    pub fn new(now_ms: u64) -> Arc<Self> {
        Arc::new(Self {
            now_ms: AtomicU64::new(now_ms),
        })
    }

    /// Moves the clock forward by `ms` (time never goes back through this call).
    pub fn advance_ms(&self, ms: u64) {
        self.now_ms.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the clock; a test of clock jumps may set it backwards.
    pub fn set_ms(&self, now_ms: u64) {
        self.now_ms.store(now_ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.now_ms.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_only_when_told() {
        let clock = ManualClock::new(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance_ms(250);
        assert_eq!(clock.now_ms(), 1_250);
        clock.set_ms(900);
        assert_eq!(clock.now_ms(), 900);
    }
}
