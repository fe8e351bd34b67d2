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

/// A planted bug (docs/reliability.md, "The checker bites"): the Raft rounds' writes (log
/// entries, hard states, the shards' applied data) are acknowledged without a sync, and synced
/// only every [`RAFT_UNSYNCED_FOR`] (fsync batching done wrong), so a power cut
/// (`store-power-loss` on every node) takes entries a majority counted as durable: the
/// `cluster-power-loss` scenario must report lost messages.
pub(crate) const RAFT_ENTRIES_UNSYNCED: &str = "planted-raft-entries-unsynced";

/// How long [`RAFT_ENTRIES_UNSYNCED`] leaves acknowledged Raft writes unsynced.
pub(crate) const RAFT_UNSYNCED_FOR: std::time::Duration = std::time::Duration::from_millis(300);

/// Whether the fault `name` is switched on (and, with a count, not used up).
pub(crate) fn on(name: &str) -> bool {
    #[cfg(feature = "failpoints")]
    fail::fail_point!(name, |_| true);
    let _ = name;
    false
}
