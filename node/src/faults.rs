//! Faults planted in the node for the process-level tests (docs/reliability.md): compiled in
//! only with the `failpoints` feature (the test binary `ferry-faults`, never a release build)
//! and switched on by the `FAILPOINTS` environment variable, e.g.
//! `FAILPOINTS=leader-dies-before-answering-a-forwarded-proposal=1*return` (once per process).
//! Without the feature every point is off and compiles to nothing.

/// The metadata leader dies (the process exits at once, as a kill does) after it applied a
/// proposal forwarded by another node for the first time (not a repeat of one applied before)
/// and before it answers: the proposal is committed, its answer lost.
pub(crate) const LEADER_DIES_BEFORE_ANSWER: &str =
    "leader-dies-before-answering-a-forwarded-proposal";

/// Whether the fault `name` is switched on (and, with a count, not used up).
pub(crate) fn on(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| true);
    let _ = name;
    false
}
