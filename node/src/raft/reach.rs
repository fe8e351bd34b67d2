//! Each peer's reachability in the log: once it is first known after this node starts, and at
//! every change ("peer n3 reachable", "peer n3 unreachable since 2026-12-02T10:15:03.120Z"), at
//! info level. The judge is the one [`super::MetaNode::is_reachable`] uses: heard from within the
//! liveness timeout. A peer never heard from is given that timeout from the first look before
//! it counts as unreachable, so a node that just started does not log every peer down.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ferry_kernel::NodeId;

/// A peer as one look sees it.
#[derive(Debug, Clone)]
pub(crate) struct PeerSeen {
    pub(crate) node: NodeId,
    pub(crate) peer_addr: String,
    /// Time since it was last heard from; `None`: never.
    pub(crate) silent_for: Option<Duration>,
}

/// A change to log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Change {
    pub(crate) node: NodeId,
    pub(crate) peer_addr: String,
    pub(crate) reachable: bool,
    /// For an unreachable peer: how long ago it was last heard from, or (never heard) how long
    /// ago this node began to wait for it.
    pub(crate) silent_for: Duration,
    pub(crate) never_heard: bool,
}

/// What the looks so far concluded, per peer.
#[derive(Debug)]
pub(crate) struct ReachLog {
    liveness_timeout: Duration,
    peers: HashMap<NodeId, Known>,
}

#[derive(Debug)]
struct Known {
    first_look: Instant,
    /// `None` until known: heard from, or silent past the timeout.
    reachable: Option<bool>,
}

impl ReachLog {
    pub(crate) fn new(liveness_timeout: Duration) -> Self {
        Self {
            liveness_timeout,
            peers: HashMap::new(),
        }
    }

    /// One look at `peers` (every other active node) at `now`: the peers whose reachability
    /// became known or changed. Peers no longer listed are forgotten.
    pub(crate) fn look(&mut self, now: Instant, peers: &[PeerSeen]) -> Vec<Change> {
        self.peers
            .retain(|node, _| peers.iter().any(|p| &p.node == node));
        let mut changes = vec![];
        for p in peers {
            let known = self.peers.entry(p.node.clone()).or_insert(Known {
                first_look: now,
                reachable: None,
            });
            let waited = now.saturating_duration_since(known.first_look);
            let reachable = match p.silent_for {
                Some(silent) => Some(silent <= self.liveness_timeout),
                None if waited > self.liveness_timeout => Some(false),
                None => None,
            };
            let Some(reachable) = reachable else { continue };
            if known.reachable == Some(reachable) {
                continue;
            }
            known.reachable = Some(reachable);
            changes.push(Change {
                node: p.node.clone(),
                peer_addr: p.peer_addr.clone(),
                reachable,
                silent_for: p.silent_for.unwrap_or(waited),
                never_heard: p.silent_for.is_none(),
            });
        }
        changes
    }
}

/// Logs one change.
pub(crate) fn log(change: &Change) {
    let peer = &change.node;
    if change.reachable {
        tracing::info!(%peer, address = %change.peer_addr, reachable = true, "peer {peer} reachable");
        return;
    }
    let since = SystemTime::now()
        .checked_sub(change.silent_for)
        .unwrap_or(UNIX_EPOCH);
    let since = utc_text(since);
    tracing::info!(
        %peer,
        address = %change.peer_addr,
        reachable = false,
        %since,
        never_heard = change.never_heard,
        "peer {peer} unreachable since {since}{}",
        if change.never_heard { " (never heard from since this node started)" } else { "" }
    );
}

/// `t` as RFC 3339 in UTC with milliseconds: `2026-12-02T10:15:03.120Z`.
pub fn utc_text(t: SystemTime) -> String {
    humantime::format_rfc3339_millis(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(3);

    fn seen(node: &str, silent_ms: Option<u64>) -> PeerSeen {
        PeerSeen {
            node: NodeId::new(node).expect("id"),
            peer_addr: format!("{node}:7410"),
            silent_for: silent_ms.map(Duration::from_millis),
        }
    }

    fn told(changes: &[Change]) -> Vec<(String, bool)> {
        changes
            .iter()
            .map(|c| (c.node.to_string(), c.reachable))
            .collect()
    }

    #[test]
    fn a_peer_is_logged_once_known_and_again_only_when_it_changes() {
        let mut log = ReachLog::new(TIMEOUT);
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        // n2 heard at once; n3 never heard, still within its grace.
        let first = log.look(t0, &[seen("n2", Some(100)), seen("n3", None)]);
        assert_eq!(told(&first), [("n2".into(), true)]);
        assert!(log
            .look(at(1_000), &[seen("n2", Some(200)), seen("n3", None)])
            .is_empty());
        // n3's grace runs out (3 s after the first look): unreachable, never heard.
        let changes = log.look(at(3_001), &[seen("n2", Some(50)), seen("n3", None)]);
        assert_eq!(told(&changes), [("n3".into(), false)]);
        assert!(changes[0].never_heard);
        assert_eq!(changes[0].silent_for, Duration::from_millis(3_001));
        // n2 goes silent past the timeout; n3 is heard from.
        let changes = log.look(at(6_000), &[seen("n2", Some(3_001)), seen("n3", Some(10))]);
        assert_eq!(told(&changes), [("n2".into(), false), ("n3".into(), true)]);
        assert!(!changes[0].never_heard);
        assert_eq!(changes[0].silent_for, Duration::from_millis(3_001));
        // Nothing new: nothing logged.
        assert!(log
            .look(at(7_000), &[seen("n2", Some(4_000)), seen("n3", Some(10))])
            .is_empty());
    }

    #[test]
    fn a_removed_peer_is_forgotten_and_told_anew_if_it_returns() {
        let mut log = ReachLog::new(TIMEOUT);
        let t0 = Instant::now();
        assert_eq!(log.look(t0, &[seen("n2", Some(0))]).len(), 1);
        assert!(log.look(t0, &[]).is_empty());
        assert_eq!(log.look(t0, &[seen("n2", Some(0))]).len(), 1);
    }

    #[test]
    fn times_are_written_as_rfc_3339_in_utc() {
        let at = |ms: u64| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(utc_text(at(0)), "1970-01-01T00:00:00.000Z");
        // 2000-02-29 (a leap day of a century divisible by 400) 12:34:56.789.
        assert_eq!(utc_text(at(951_827_696_789)), "2000-02-29T12:34:56.789Z");
        assert_eq!(utc_text(at(1_798_761_599_000)), "2026-12-31T23:59:59.000Z");
    }
}
