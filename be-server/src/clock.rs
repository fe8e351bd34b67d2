//! The shell's clock: the one place that reads the system clock. The kernel never reads time; the
//! back-end and front-end are handed a [`ferry_kernel::ClockRef`], this one in production and a
//! [`ferry_kernel::ManualClock`] in tests.

use std::time::{SystemTime, UNIX_EPOCH};

use ferry_kernel::Clock;

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// Milliseconds since the Unix epoch (0 if the system clock is before 1970), from the system
/// clock. Code that serves queues takes its clock as a [`ferry_kernel::ClockRef`] instead.
pub fn now_ms() -> u64 {
    SystemClock.now_ms()
}
