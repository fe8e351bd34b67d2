//! Fault injection for the chaos harness (docs/reliability.md): the power-loss store, and a planted
//! bug the checker must catch. Compiled in only with the
//! `failpoints` feature (the test binary `ferry-faults`, never a release build) and switched on by
//! the `FAILPOINTS` environment variable, e.g. `FAILPOINTS=store-power-loss=return`. Without the
//! feature every point is off and compiles to nothing.

/// A store that loses, at a crash, every write no completed sync covers, as a machine that
/// loses power does (`kill -9` alone keeps what the process handed to the kernel): the
/// RocksDB write-ahead log is kept in the process's own buffer (`manual_wal_flush`) until a
/// synced write or [`crate::QueueStore::sync`] writes and syncs it.
pub const POWER_LOSS: &str = "store-power-loss";

/// A planted bug (docs/reliability.md, "The checker bites"): every write is answered as durable
/// without a sync. A `kill -9` loses nothing by it (the kernel has the write-ahead log); a crash
/// of the machine ([`POWER_LOSS`]) loses confirmed messages.
pub const CONFIRM_BEFORE_DURABLE: &str = "planted-confirm-before-durable";

/// Whether fault `name` is switched on.
pub(crate) fn on(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| true);
    let _ = name;
    false
}
