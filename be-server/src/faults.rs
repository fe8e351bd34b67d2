//! Planted bugs for the chaos harness (docs/reliability.md, "The checker bites"): each breaks a
//! promise the checker must then report broken. Compiled in only with the `failpoints` feature
//! (the test binary `ferry-faults`, never a release build) and switched on by the `FAILPOINTS`
//! environment variable, e.g. `FAILPOINTS=planted-skip-delivery-count=return`. Without the
//! feature every point is off and compiles to nothing. The store has its own
//! (`ferry_store::faults`).

/// Never writes a message's delivery count: after a restart a message delivered before comes
/// again looking new (count 1, not flagged redelivered).
pub const SKIP_DELIVERY_COUNT: &str = "planted-skip-delivery-count";

/// Whether the planted bug `name` is switched on.
pub(crate) fn on(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| true);
    let _ = name;
    false
}
