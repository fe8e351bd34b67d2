#![allow(clippy::unwrap_used)]

use ferry_multiraft::FollowerProgress;

use super::*;

/// This node is peer 1; the shard's voters are 1, 2 and 3.
fn led(shard: u64, term: u64, preferred: u64) -> LedShard {
    LedShard {
        shard: ShardId(shard),
        term,
        preferred: Some(PeerId(preferred)),
        progress: LeaderProgress {
            last_index: 100,
            transferring_to: None,
            followers: [2, 3]
                .map(|n| FollowerProgress {
                    node: PeerId(n),
                    match_index: 100,
                    recently_active: true,
                })
                .to_vec(),
        },
    }
}

/// A balancer that has seen `shards` led since tick 0.
fn settled(shards: &[LedShard]) -> Balancer {
    let mut b = Balancer::default();
    assert_eq!(b.decide(0, shards), None, "nothing moves before it settles");
    b
}

#[test]
fn a_shard_led_away_from_its_preferred_leader_goes_back_once_settled() {
    let shards = [led(7, 3, 2)];
    let mut b = settled(&shards);
    assert_eq!(b.target(SETTLE_TICKS - 1, &shards[0]), Err(Stay::Settling));
    assert_eq!(b.decide(SETTLE_TICKS - 1, &shards), None);
    assert_eq!(
        b.decide(SETTLE_TICKS, &shards),
        Some((ShardId(7), PeerId(2)))
    );
}

#[test]
fn the_preferred_leader_keeps_its_shard() {
    let mut shard = led(7, 3, 1);
    let mut b = settled(std::slice::from_ref(&shard));
    assert_eq!(b.target(1_000, &shard), Err(Stay::Preferred));
    assert_eq!(b.decide(1_000, &[shard.clone()]), None);
    // A preferred leader that is not a voter of the group (the metadata is ahead) is ignored.
    shard.preferred = Some(PeerId(9));
    assert_eq!(b.target(1_000, &shard), Err(Stay::Preferred));
    shard.preferred = None;
    assert_eq!(b.target(1_000, &shard), Err(Stay::Preferred));
}

#[test]
fn a_silent_or_lagging_preferred_leader_is_not_handed_the_shard() {
    let mut shard = led(7, 3, 2);
    let b = settled(std::slice::from_ref(&shard));
    shard.progress.followers[0].recently_active = false;
    assert_eq!(b.target(SETTLE_TICKS, &shard), Err(Stay::PreferredSilent));
    shard.progress.followers[0].recently_active = true;
    shard.progress.followers[0].match_index = 100 - CAUGHT_UP_LAG_MAX - 1;
    assert_eq!(b.target(SETTLE_TICKS, &shard), Err(Stay::PreferredBehind));
    shard.progress.followers[0].match_index = 100 - CAUGHT_UP_LAG_MAX;
    assert_eq!(b.target(SETTLE_TICKS, &shard), Ok(PeerId(2)));
}

#[test]
fn a_transfer_under_way_is_left_alone() {
    let mut shard = led(7, 3, 2);
    shard.progress.transferring_to = Some(PeerId(3));
    let mut b = settled(std::slice::from_ref(&shard));
    assert_eq!(b.target(SETTLE_TICKS, &shard), Err(Stay::Transferring));
    assert_eq!(b.decide(SETTLE_TICKS, &[shard]), None);
}

#[test]
fn one_transfer_at_a_time_and_a_failed_one_is_not_tried_again_at_once() {
    let shards = [led(1, 3, 2), led(2, 3, 3)];
    let mut b = settled(&shards);
    let t = SETTLE_TICKS;
    assert_eq!(b.decide(t, &shards), Some((ShardId(1), PeerId(2))));
    // The node waits before it starts another one.
    assert_eq!(b.decide(t + NODE_INTERVAL_TICKS - 1, &shards), None);
    // Shard 1 stayed here (the transfer failed): the other shard goes, shard 1 waits.
    let next = t + NODE_INTERVAL_TICKS;
    assert_eq!(b.decide(next, &shards), Some((ShardId(2), PeerId(3))));
    assert_eq!(b.target(next, &shards[0]), Err(Stay::TriedRecently));
    let later = t + SHARD_RETRY_TICKS;
    assert_eq!(b.decide(later, &shards), Some((ShardId(1), PeerId(2))));
}

#[test]
fn a_new_term_settles_again() {
    let mut b = settled(&[led(7, 3, 2)]);
    // Lost and won again at a later term: the clock starts over.
    assert_eq!(b.decide(20, &[]), None);
    assert_eq!(b.decide(25, &[led(7, 4, 2)]), None);
    assert_eq!(b.decide(25 + SETTLE_TICKS - 1, &[led(7, 4, 2)]), None);
    assert_eq!(
        b.decide(25 + SETTLE_TICKS, &[led(7, 4, 2)]),
        Some((ShardId(7), PeerId(2)))
    );
}

#[test]
fn a_shard_an_operator_moved_here_stays_while_led_at_that_term() {
    let mut b = Balancer::default();
    b.hold(ShardId(7), 0);
    // The transfer lands: this node leads at term 4 from tick 5.
    assert_eq!(b.decide(5, &[led(7, 4, 2)]), None);
    assert_eq!(b.target(1_000, &led(7, 4, 2)), Err(Stay::Held));
    assert_eq!(b.decide(1_000, &[led(7, 4, 2)]), None);
    // Lost and led again at a later term: balanced again.
    assert_eq!(b.decide(1_001, &[]), None);
    assert_eq!(b.decide(1_002, &[led(7, 6, 2)]), None);
    assert_eq!(
        b.decide(1_002 + SETTLE_TICKS, &[led(7, 6, 2)]),
        Some((ShardId(7), PeerId(2)))
    );
}

#[test]
fn a_hold_whose_transfer_never_landed_lapses() {
    let mut b = Balancer::default();
    b.hold(ShardId(7), 0);
    assert_eq!(b.decide(HOLD_PENDING_TICKS + 1, &[]), None);
    // Led later by an election: not held.
    let shards = [led(7, 5, 2)];
    let start = HOLD_PENDING_TICKS + 2;
    assert_eq!(b.decide(start, &shards), None);
    assert_eq!(
        b.decide(start + SETTLE_TICKS, &shards),
        Some((ShardId(7), PeerId(2)))
    );
}

#[test]
fn leaders_spread_when_every_node_balances_what_it_leads() {
    // Three nodes, six shards whose preferred leaders go round the nodes, all led by node 1
    // (as after a restart): node 1 hands each over, one at a time, and keeps its own two.
    let shards: Vec<LedShard> = (1..=6).map(|s| led(s, 2, (s - 1) % 3 + 1)).collect();
    let mut b = settled(&shards);
    let mut led_here = shards.clone();
    let mut moved = Vec::new();
    for now in (SETTLE_TICKS..SETTLE_TICKS + 100).step_by(BALANCE_EVERY_TICKS as usize) {
        if let Some((shard, to)) = b.decide(now, &led_here) {
            led_here.retain(|l| l.shard != shard);
            moved.push((shard.0, to.0));
        }
    }
    assert_eq!(moved, [(2, 2), (3, 3), (5, 2), (6, 3)]);
    let kept: Vec<u64> = led_here.iter().map(|l| l.shard.0).collect();
    assert_eq!(kept, [1, 4]);
}
