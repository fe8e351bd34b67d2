//! Each fault scenario of `scripts/chaos` at smoke size (seconds, not minutes), against a real
//! `ferry server`: the checker must find nothing lost, nothing unexpected, no unflagged
//! duplicate, no broken invariant, and the run must have gone through (queues drained, faults
//! healed). The seeds are fixed so a failure replays; `CHAOS_SEED` overrides them. The checker's
//! own bite tests are in `chaos_checker.rs`.

use ferry_integration_tests::chaos::checker::Verdict;
use ferry_integration_tests::chaos::report::Report;
use ferry_integration_tests::chaos::scenario::{self, Size};

async fn smoke(name: &str, seed: u64) -> anyhow::Result<Report> {
    let seed = std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(seed);
    let out = tempfile::tempdir()?;
    let spec = scenario::spec(name, seed, Size::Smoke)?;
    let report = scenario::run(&spec, out.path()).await?;
    print!("{}", report.summary());
    if !report.valid {
        // Keep the evidence: the report, the history and the node's log.
        let kept = out.keep();
        panic!(
            "{name} seed {seed} is not valid; report, history and node log in {}",
            kept.display()
        );
    }
    // The run did something: values went through and (where planned) faults happened.
    assert!(report.verdict.confirmed > 0, "nothing was confirmed");
    assert!(report.verdict.received >= report.verdict.confirmed);
    assert_eq!(
        report
            .faults
            .iter()
            .filter(|f| f.fault.is_planned_injection())
            .count(),
        report.fault_schedule.len(),
        "every planned fault was injected"
    );
    // ... and the run went on through each: sends were confirmed after every fault (up to the
    // next one) and after the last heal, so the node came back and took sends again.
    let idle: Vec<_> = report
        .fault_windows
        .iter()
        .filter(|w| w.confirmed == 0)
        .collect();
    assert!(idle.is_empty(), "no send confirmed after {idle:?}");
    assert_ne!(
        report.confirmed_after_last_heal,
        Some(0),
        "no send confirmed after the last heal"
    );
    if !report.fault_schedule.is_empty() {
        assert!(
            !report.fault_windows.is_empty(),
            "no fault came while sends went on"
        );
    }
    Ok(report)
}

/// kill9 on the store that loses every write no completed sync covers (the `ferry-faults`
/// build): what a crash of the machine does, which a kill -9 alone never tests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn power_loss_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    smoke("power-loss", 1).await.map(drop)
}

/// The checker bites: with a planted bug switched on (docs/reliability.md), the scenario that
/// must catch it reports it.
async fn planted(bug: &str, seed: u64) -> anyhow::Result<Verdict> {
    let report = planted_run(bug, seed).await?;
    assert!(
        report.run_errors.is_empty(),
        "{bug}: {:?}",
        report.run_errors
    );
    Ok(report.verdict)
}

/// A run with `bug` planted, which the checker must find invalid.
async fn planted_run(bug: &str, seed: u64) -> anyhow::Result<Report> {
    let (_, name, _) = scenario::PLANTED
        .iter()
        .find(|(b, _, _)| *b == bug)
        .expect("a planted bug");
    let out = tempfile::tempdir()?;
    let mut spec = scenario::spec(name, seed, Size::Smoke)?;
    spec.plant(bug)?;
    let report = scenario::run(&spec, out.path()).await?;
    print!("{}", report.summary());
    assert!(!report.valid, "{bug}: the checker found nothing");
    Ok(report)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_confirmed_before_it_is_durable_is_caught_as_lost_at_a_power_loss(
) -> anyhow::Result<()> {
    let verdict = planted("confirm-before-durable", 1).await?;
    assert!(verdict.lost > 0, "{verdict:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_count_never_written_is_caught_as_unflagged_duplicates_after_a_kill(
) -> anyhow::Result<()> {
    let verdict = planted("skip-delivery-count", 1).await?;
    assert!(verdict.duplicated_unflagged > 0, "{verdict:?}");
    Ok(())
}

/// The node's wall clock (libfaketime) stepped forward or back by 5 s to 2 min, past the
/// connection and delivery leases, then back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clock_jump_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    smoke("clock", 9).await.map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    smoke("kill9", 1).await.map(drop)
}

/// Postmortem: an auto-acknowledge `Session::receive` whose ack failed with an unknown outcome
/// (the node killed after applying it) returned the error and threw its batch away; kill9 seed 1
/// lost 3 confirmed messages that way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill9_auto_receive_smoke_hands_over_a_batch_whose_ack_outcome_is_unknown(
) -> anyhow::Result<()> {
    let report = smoke("kill9-auto-receive", 1).await?;
    // The run went through the postmortem's corner: kills cut off auto acknowledgements (whose
    // batches were handed over all the same), not only receives.
    assert!(
        report.auto_ack_failures > 0,
        "no kill cut off an auto acknowledgement, so the run did not test what it names"
    );
    Ok(())
}

/// The same corner with the old library's behaviour planted (emulated by the harness's auto
/// consumers): a batch whose acknowledgement got no answer is thrown away, and the checker
/// must find those messages lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_receive_that_drops_its_batch_when_its_ack_is_cut_off_is_caught_as_lost(
) -> anyhow::Result<()> {
    let verdict = planted("auto-ack-drops-unconfirmed-batch", 1).await?;
    assert!(verdict.lost > 0, "{verdict:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn activemq_200k_smoke_pages_and_churns_without_loss() -> anyhow::Result<()> {
    smoke("activemq-200k", 2).await.map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_smoke_dead_letters_each_after_exactly_max_deliveries() -> anyhow::Result<()> {
    let report = smoke("poison", 3).await?;
    // A client error switches the exact check off (a receive that failed may have counted a
    // delivery): the smoke run must have had none, or it proved nothing of "exactly".
    assert_eq!(
        report.dead_letter_exact_checked,
        Some(true),
        "exactly max deliveries was not checked ({} client errors)",
        report.client_errors
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    smoke("pause", 4).await.map(drop)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    smoke("proxy", 5).await.map(drop)
}

/// Three nodes, three queues replicated on all three (the cluster's default), clients failing
/// over to another node; every 2 s a random node is killed and restarted in place, paused, or
/// cut from the other two (iptables).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    let report = smoke("cluster", 6).await?;
    assert_eq!(report.shards_at_start.len(), 3, "the queues are replicated");
    assert_eq!(report.longest_unavailability_by_queue.len(), 3);
    Ok(())
}

/// `cluster` with each queue pinned on one node, not replicated (replication factor 1): the
/// same faults (the same seed), each queue waiting for its one node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_rf1_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    let report = smoke("cluster-rf1", 6).await?;
    assert!(report.shards_at_start.is_empty(), "no queue is replicated");
    Ok(())
}

/// The metadata leader cut from the majority (twice): a queue is created through the majority
/// within 5 s each time, and the load loses nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_meta_smoke_creates_queues_through_the_majority() -> anyhow::Result<()> {
    smoke("cluster-meta", 7).await.map(drop)
}

/// One-way cuts: every 2 s a random node is muted (its packets to the other two dropped),
/// deafened (theirs to it dropped) or cut both ways; over TCP the side still heard sees its
/// connections stall, not fail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_one_way_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    smoke("cluster-one-way", 8).await.map(drop)
}

/// Clock jumps in a cluster: every 2 s a random node's wall clock stepped 5 s to 2 min forward
/// or back (libfaketime), then back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_clock_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    smoke("cluster-clock", 10).await.map(drop)
}

/// A fourth node, a learner that clients use too, removed from the cluster halfway through the
/// load and stopped: its clients go on through the others (with the `cluster` faults on the
/// three voters).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_remove_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    smoke("cluster-remove", 11).await.map(drop)
}

/// A fourth node, a learner holding nothing; halfway through the load a replica node dies and
/// its data directory is wiped (its disk lost); its shard replicas are moved (to n4) with
/// `MoveShardReplica`, and the shards are whole again before the load goes on (with the
/// `cluster` faults on the others; the lost node never comes back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_lost_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    smoke("disk-lost", 13).await.map(drop)
}

/// Three nodes, three queues each replicated on all three in a shard of its own; every other
/// fault a kill -9 of a queue's shard leader (restarted in place later), the others a pause or a
/// partition of a random node. Every shard takes sends again after each kill; the failover times
/// are reported, not judged, at this size.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_smoke_loses_and_duplicates_nothing_when_shard_leaders_are_killed(
) -> anyhow::Result<()> {
    let report = smoke("failover", 12).await?;
    let failover = report
        .failover
        .as_ref()
        .expect("a failover run reports failover times");
    let planned = report
        .fault_schedule
        .iter()
        .filter(|f| f.queue.is_some())
        .count();
    assert!(planned > 0, "no shard leader kill planned");
    assert_eq!(failover.kills.len(), planned, "{failover:?}");
    assert_eq!(
        failover.not_recovered, 0,
        "a shard took no send after its leader's kill: {failover:?}"
    );
    Ok(())
}

/// Three nodes whose stores lose, at each kill -9, what no completed sync covers (the Raft log,
/// the metadata and the queues: one store per node), shard leaders and random nodes killed in
/// turn: nothing confirmed is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_power_loss_smoke_loses_and_duplicates_nothing() -> anyhow::Result<()> {
    smoke("cluster-power-loss", 12).await.map(drop)
}

/// The checker bites on a cluster: Raft entries acknowledged without a sync are lost at a power
/// cut of the majority that counted them. (A node whose Raft state went back past what it had
/// acknowledged may also stop, raft-rs refusing to go on: the run may report that too.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn raft_entries_acknowledged_without_a_sync_are_caught_as_lost_at_a_power_loss(
) -> anyhow::Result<()> {
    let report = planted_run("raft-entries-unsynced", 12).await?;
    assert!(report.verdict.lost > 0, "{:?}", report.verdict);
    Ok(())
}

/// How `url`'s node sees node `id`: "up", "down" or "self" ("?" when it cannot tell).
async fn health(url: &str, id: &str) -> String {
    match ferry_integration_tests::cluster::status_at(url).await {
        Ok(s) => s
            .nodes
            .into_iter()
            .find(|n| n.node_id == id)
            .map_or("?".into(), |n| n.health),
        Err(_) => "?".into(),
    }
}

/// Waits until the node at `url` sees each of `ids` with `want`.
async fn wait_health(url: &str, ids: &[&str], want: &str) -> anyhow::Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let mut seen = vec![];
        for id in ids {
            seen.push(health(url, id).await);
        }
        if seen.iter().all(|h| h == want) {
            return Ok(());
        }
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "{url} sees {ids:?} as {seen:?}, not {want}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// The cluster scenarios' partitions cut a node's peer traffic both ways (it hears no one, no
/// one hears it), one-way cuts silence it or deafen it, the heal restores it, and dropping the
/// firewall leaves no iptables rule and no cgroup behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_cuts_a_node_both_ways_and_leaves_nothing_behind() -> anyhow::Result<()> {
    use ferry_integration_tests::chaos::cluster;
    let dir = tempfile::tempdir()?;
    let ids = ["n1", "n2", "n3"];
    let target = cluster::start(dir.path(), &ids, "", &[], &Default::default()).await?;
    let urls = target.urls();
    let (n1, n3) = (&urls[0].1, &urls[2].1);
    wait_health(n1, &["n2", "n3"], "up").await?;
    let others = vec![target.ips[0].clone(), target.ips[1].clone()];
    target.firewall.partition(&target.ips[2], &others)?;
    wait_health(n1, &["n3"], "down").await?;
    wait_health(n3, &["n1", "n2"], "down").await?;
    wait_health(n1, &["n2"], "up").await?;
    assert!(target.firewall.heal()?, "a partition was in place");
    wait_health(n1, &["n2", "n3"], "up").await?;
    wait_health(n3, &["n1", "n2"], "up").await?;

    // One way: n3 muted, the others hear nothing of it (and still each other); then deafened,
    // it hears nothing of them.
    target.firewall.cut_one_way(&target.ips[2], &others)?;
    wait_health(n1, &["n3"], "down").await?;
    wait_health(n1, &["n2"], "up").await?;
    assert!(target.firewall.heal()?, "a one-way cut was in place");
    wait_health(n1, &["n2", "n3"], "up").await?;
    for o in &others {
        target.firewall.cut_one_way(o, &[target.ips[2].clone()])?;
    }
    wait_health(n3, &["n1", "n2"], "down").await?;
    assert!(target.firewall.heal()?, "a one-way cut was in place");
    wait_health(n3, &["n1", "n2"], "up").await?;

    let chain = format!("FERRY-CHAOS-{}", std::process::id());
    let rules = |table: &str| -> anyhow::Result<String> {
        let out = std::process::Command::new("iptables")
            .args(["-w", "-t", table, "-S"])
            .output()?;
        Ok(String::from_utf8(out.stdout)?)
    };
    assert!(rules("filter")?.contains(&chain) && rules("nat")?.contains(&chain));
    drop(target);
    for table in ["filter", "nat"] {
        let left = rules(table)?;
        assert!(!left.contains(&chain), "{table} still has {chain}: {left}");
    }
    assert!(
        !cgroup_left(&chain.to_lowercase())?,
        "a cgroup of the run is left"
    );
    Ok(())
}

/// Whether a cgroup named after `prefix` is left under the cgroup2 root.
fn cgroup_left(prefix: &str) -> anyhow::Result<bool> {
    let mounts = std::fs::read_to_string("/proc/self/mounts")?;
    let Some(root) = mounts.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        (f.get(2) == Some(&"cgroup2")).then(|| f[1].to_string())
    }) else {
        return Ok(false);
    };
    Ok(std::fs::read_dir(root)?
        .filter_map(Result::ok)
        .any(|e| e.file_name().to_string_lossy().starts_with(prefix)))
}

#[test]
fn the_same_seed_gives_the_same_fault_schedule() {
    use ferry_integration_tests::chaos::nemesis::{cluster_schedule, schedule, FaultKind};
    for name in scenario::SCENARIOS {
        let a =
            scenario::spec(name, 42, Size::Full { minutes: 3.0 }).unwrap_or_else(|e| panic!("{e}"));
        let b =
            scenario::spec(name, 42, Size::Full { minutes: 3.0 }).unwrap_or_else(|e| panic!("{e}"));
        let ms = 180_000;
        assert_eq!(
            schedule(a.seed, &a.faults, ms),
            schedule(b.seed, &b.faults, ms)
        );
    }
    let s =
        scenario::spec("proxy", 42, Size::Full { minutes: 3.0 }).unwrap_or_else(|e| panic!("{e}"));
    let one = schedule(42, &s.faults, 180_000);
    let other = schedule(43, &s.faults, 180_000);
    assert!(!one.is_empty());
    assert_ne!(one, other, "another seed, another schedule");
    // Faults never overlap and end within the load.
    for w in one.windows(2) {
        assert!(w[0].at_ms + w[0].for_ms < w[1].at_ms, "{w:?}");
    }
    assert!(one.iter().all(|f| f.at_ms + f.for_ms < 180_000));
    // A cluster schedule aims each fault at a node, the same for the same seed.
    let c = scenario::spec("cluster", 42, Size::Full { minutes: 3.0 })
        .unwrap_or_else(|e| panic!("{e}"));
    let nodes = ["n1", "n2", "n3"];
    let aimed = cluster_schedule(42, &c.faults, 180_000, &nodes);
    assert_eq!(aimed, cluster_schedule(42, &c.faults, 180_000, &nodes));
    assert!(aimed
        .iter()
        .all(|f| f.node.as_deref().is_some_and(|n| nodes.contains(&n))));
    let hit: std::collections::BTreeSet<_> = aimed.iter().filter_map(|f| f.node.clone()).collect();
    assert_eq!(hit.len(), 3, "18 faults hit every node: {aimed:?}");
    // `failover`: every other fault kills the leader of a queue's shard, found when it starts
    // (no node named); the others are aimed at a node.
    let f = scenario::spec("failover", 42, Size::Full { minutes: 3.0 })
        .unwrap_or_else(|e| panic!("{e}"));
    let mut aimed = cluster_schedule(42, &f.faults, 180_000, &nodes);
    let queues: Vec<String> = (1..=3).map(|i| format!("chaos-s{i}")).collect();
    ferry_integration_tests::chaos::nemesis::aim_at_queues(42, &mut aimed, &queues);
    let kills = aimed.iter().step_by(2);
    assert!(kills.clone().count() >= 10, "{aimed:?}");
    for k in kills {
        assert_eq!(k.kind, FaultKind::KillShardLeader, "{aimed:?}");
        assert!(k.node.is_none() && k.queue.as_ref().is_some_and(|q| queues.contains(q)));
    }
    for other in aimed.iter().skip(1).step_by(2) {
        assert!(other.node.is_some() && other.queue.is_none(), "{other:?}");
    }
}
