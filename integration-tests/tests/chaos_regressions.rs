//! What the chaos scenarios found or suspected, each on its own. The partition tests cut a
//! node from a queue's owner (iptables, as in `chaos::partition`) while a client's call through
//! it is under way: root and the iptables command are needed, as for the cluster scenarios.

use std::time::Duration;

use anyhow::Context as _;
use ferry_client::{pb, AckMode, Client, ConsumerOptions, Message, ReceiveOptions};
use ferry_integration_tests::chaos::cluster::{self, ClusterTarget};
use ferry_integration_tests::chaos::proxy::{Mode, Proxy};
use ferry_integration_tests::{memory_node, stats, wait_until};

/// Short leases, as in the chaos scenarios: a vanished client's messages come back in seconds.
const NODE_TOML: &str = "
[limits]
connection_lease_default_ms = 4000
delivery_lease_default_ms = 10000
";

/// Three nodes, queue `q` on n3; a client through n2 and one through n3 (the owner).
async fn start(dir: &std::path::Path) -> anyhow::Result<(ClusterTarget, Client, Client)> {
    let queues = [("q".to_string(), "n3".to_string())];
    let config = pb::QueueConfig::default();
    let target = cluster::start(dir, &["n1", "n2", "n3"], NODE_TOML, &queues, &config).await?;
    let urls = target.urls();
    let via2 = Client::connect(&urls[1].1).await?;
    let owner = Client::connect(&urls[2].1).await?;
    Ok((target, via2, owner))
}

/// Sends one message to `q` through n1.
async fn send_one(target: &ClusterTarget) -> anyhow::Result<()> {
    let via1 = Client::connect(&target.urls()[0].1).await?;
    let conn = via1.open_connection("producer").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    session
        .send("q", vec![Message::text("m").dedup_id("m")])
        .await?;
    Ok(())
}

/// Once a receive through n2 is parked on n3: cuts n2 from n3, sends a message through n1 and
/// waits until n3 handed it to the parked receive (whose answer cannot reach n2).
async fn cut_and_deliver_to_the_parked_receive(
    target: &ClusterTarget,
    owner: &Client,
) -> anyhow::Result<()> {
    wait_until(
        Duration::from_secs(10),
        "the receive parked on n3",
        || async { Ok(stats(owner, "q").await?.consumers == 1) },
    )
    .await?;
    target
        .firewall
        .partition(&target.ips[1], &[target.ips[2].clone()])?;
    send_one(target).await?;
    wait_until(Duration::from_secs(10), "the message delivered", || async {
        Ok(stats(owner, "q").await?.delivered_total == 1)
    })
    .await
}

/// Waits until the owner holds the message as ready again (its lease given back or run out):
/// 30 s covers the connection lease (4 s) and the delivery lease (10 s) with room to spare.
async fn wait_message_back(owner: &Client) -> anyhow::Result<()> {
    let r = wait_until(Duration::from_secs(30), "the message back in q", || async {
        let s = stats(owner, "q").await?;
        Ok(s.ready == 1)
    })
    .await;
    if r.is_err() {
        let s = stats(owner, "q").await?;
        anyhow::bail!(
            "the message did not come back: ready {} leased {} acked_total {} delivered_total {} \
             redelivered_total {} lease_expired_total {}",
            s.ready,
            s.leased,
            s.acked_total,
            s.delivered_total,
            s.redelivered_total,
            s.lease_expired_total
        );
    }
    Ok(())
}

/// A receive through n2, parked on the owner n3; n2 is cut from n3; a message arrives and is
/// handed to the parked receive, whose answer cannot reach n2. Nobody acknowledged it: it must
/// come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_whose_answer_a_partition_cut_gives_its_message_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (target, via2, owner) = start(dir.path()).await?;
    let conn = via2.open_connection("consumer").await?;
    let session = conn.create_session(AckMode::Client).await?;
    let receive = tokio::spawn(async move {
        let opts = ReceiveOptions::timeout_ms(8_000).max(1);
        let got = tokio::time::timeout(Duration::from_secs(10), session.receive("q", opts)).await;
        (session, got)
    });
    cut_and_deliver_to_the_parked_receive(&target, &owner).await?;
    let (_session, got) = receive.await?;
    assert!(
        !matches!(&got, Ok(Ok(m)) if !m.is_empty()),
        "the answer crossed the partition: {got:?}"
    );
    assert!(target.firewall.heal()?);
    drop((conn, via2));
    wait_message_back(&owner).await
}

/// The same with a `Consume` stream through n2 (client acknowledge, prefetch): the message is
/// pushed to a stream whose other end is cut off; the client gives the stream up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_from_the_owner_gives_its_messages_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (target, via2, owner) = start(dir.path()).await?;
    let conn = via2.open_connection("consumer").await?;
    let session = conn.create_session(AckMode::Client).await?;
    let mut consumer = session
        .consumer("q", ConsumerOptions::default().prefetch(20))
        .await?;
    wait_until(Duration::from_secs(10), "the stream open on n3", || async {
        Ok(stats(&owner, "q").await?.consumers >= 1)
    })
    .await?;
    target
        .firewall
        .partition(&target.ips[1], &[target.ips[2].clone()])?;
    send_one(&target).await?;
    wait_until(Duration::from_secs(10), "the message delivered", || async {
        Ok(stats(&owner, "q").await?.delivered_total == 1)
    })
    .await?;
    let got = consumer
        .receive_batch(10, Some(Duration::from_millis(2_000)))
        .await;
    assert!(
        !matches!(&got, Ok(m) if !m.is_empty()),
        "the message crossed the partition: {got:?}"
    );
    assert!(target.firewall.heal()?);
    drop((consumer, session, conn, via2));
    wait_message_back(&owner).await
}

/// Bug 2 (docs/reliability.md), fixed: `Session::receive` in auto mode acknowledged the batch at
/// the server *before* it returned it, and waited for that acknowledgement's answer without a
/// bound. While the answer is on its way (here: every chunk through the proxy delayed 2 s; in
/// the `cluster` scenario, seed 201: the answer cut off by a partition), the message is gone
/// from the queue and the application holds nothing; an application that stops waiting then
/// (its own timeout) has lost it. JMS acknowledges when `receive` has returned, never before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_acknowledge_receive_never_acknowledges_what_it_has_not_returned(
) -> anyhow::Result<()> {
    let (_dir, node, direct) = memory_node(&["q"]).await?;
    let conn = direct.open_connection("producer").await?;
    conn.create_session(AckMode::Auto)
        .await?
        .send("q", vec![Message::text("m")])
        .await?;
    let proxy = Proxy::start(node.addr).await?;
    let via_proxy = Client::connect(&proxy.url()).await?;
    let consumer = via_proxy.open_connection("consumer").await?;
    let session = consumer.create_session(AckMode::Auto).await?;
    proxy.set_mode(Mode::Delay(Duration::from_secs(2)));
    let receive = tokio::spawn(async move {
        session
            .receive("q", ReceiveOptions::timeout_ms(1_000).max(1))
            .await
    });
    // The moment the server has the acknowledgement, the application gives up on the receive.
    wait_until(
        Duration::from_secs(30),
        "the acknowledgement applied",
        || async { Ok(stats(&direct, "q").await?.acked_total == 1) },
    )
    .await?;
    let returned = receive.is_finished();
    receive.abort();
    proxy.set_mode(Mode::Forward);
    assert!(
        returned,
        "the message was acknowledged at the server while the receive still held it back"
    );
    Ok(())
}

/// Bug 3 (docs/reliability.md): a receive through n2, parked on the owner n3; n2 is cut
/// from n3 for less than the delivery lease; a message is handed to the parked receive, whose
/// answer cannot reach n2; the application gives the receive up (its own timeout) and goes on
/// with the session. Its heartbeats renewed every lease of the session at n3, the lost delivery's
/// too: the message stayed leased to a delivery nobody had, as long as the session lived. Now
/// they renew only what n2 passed on, and the message comes back within about a delivery lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_whose_answer_was_lost_is_not_renewed_by_the_sessions_heartbeats(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (target, via2, owner) = start(dir.path()).await?;
    let conn = via2.open_connection("consumer").await?;
    let session = conn.create_session(AckMode::Client).await?;
    let receive = {
        let session = session.clone();
        tokio::spawn(async move {
            let opts = ReceiveOptions::timeout_ms(30_000).max(1);
            tokio::time::timeout(Duration::from_secs(2), session.receive("q", opts)).await
        })
    };
    cut_and_deliver_to_the_parked_receive(&target, &owner).await?;
    let got = receive.await?;
    assert!(got.is_err(), "the answer crossed the partition: {got:?}");
    // Healed well within the delivery lease (10 s); the session lives on.
    assert!(target.firewall.heal()?);
    wait_message_back(&owner).await?;
    drop(session);
    Ok(())
}

/// How a shard's preferred leader is made unavailable.
#[derive(Debug, Clone, Copy)]
enum Gone {
    /// Cut off from the other nodes both ways (packets dropped: calls to it hang).
    Cut,
    /// Killed with SIGKILL (calls to it are refused at once).
    Killed,
}

/// Bug 4 (docs/reliability.md): a replicated queue created through one node while its shard's
/// preferred leader is cut off from the others. The metadata commits it and the shard's new
/// leader creates it within about 2 s, but the create asked the preferred leader first, with no
/// bound on the call: its answer waited for the cut node until the heal. Now it is answered
/// within `META_WRITE_MAX` of the cut (as `cluster-meta` demands), and the queue takes a send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_queue_created_while_its_shards_preferred_leader_is_cut_off_is_answered(
) -> anyhow::Result<()> {
    create_with_the_preferred_leader(Gone::Cut).await
}

/// The same with the preferred leader killed (a call to it fails at once: this passed before
/// the fix too).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replicated_queue_created_while_its_shards_preferred_leader_is_dead_is_answered(
) -> anyhow::Result<()> {
    create_with_the_preferred_leader(Gone::Killed).await
}

/// Three nodes with one shared shard each; the preferred leader of the shard the next queue
/// joins made unavailable (`gone`); that queue created through another node must be answered
/// within `META_WRITE_MAX`, served by another replica, and take a send.
async fn create_with_the_preferred_leader(gone: Gone) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let ids = ["n1", "n2", "n3"];
    let config = pb::QueueConfig::default();
    // One shared shard per node: the next queue joins one of them.
    let creates: Vec<_> = ["q1", "q2", "q3"]
        .iter()
        .map(|q| cluster::by_default(q, &config))
        .collect();
    let target =
        cluster::start_with(dir.path(), &ids, None, NODE_TOML, &creates, false, &[]).await?;
    let urls = target.urls();
    let first = Client::connect(&urls[0].1).await?;
    let shards = first
        .cluster()
        .list_shards(pb::ListShardsRequest { shard: 0 })
        .await?
        .into_inner()
        .shards;
    assert_eq!(shards.len(), 3, "{shards:?}");
    // The rule (`choose_shard`): the shared shard holding the fewest queues, then the smallest id.
    let joined = shards
        .iter()
        .min_by_key(|s| (s.queues.len(), s.shard))
        .context("no shard")?;
    let preferred = joined.replicas[0].clone();
    let gone_at = ids
        .iter()
        .position(|n| *n == preferred)
        .context("the preferred leader is not a node")?;
    let via = (gone_at + 1) % ids.len();
    let client = Client::connect(&urls[via].1).await?;

    match gone {
        Gone::Cut => {
            let others: Vec<String> = (0..ids.len())
                .filter(|i| *i != gone_at)
                .map(|i| target.ips[i].clone())
                .collect();
            target.firewall.partition(&target.ips[gone_at], &others)?;
        }
        Gone::Killed => target.nodes[gone_at]
            .node
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .kill9(),
    }
    let gone_since = tokio::time::Instant::now();
    let mut admin = client.admin();
    let create = admin.create_queue(cluster::by_default("late", &config));
    let created = tokio::time::timeout_at(gone_since + cluster::META_WRITE_MAX, create).await;
    let took = gone_since.elapsed();
    let created = created
        .map_err(|_| {
            anyhow::anyhow!(
                "creating `late` through {} with {preferred}, the preferred leader of shard {}, \
                 {gone:?}: no answer within {:?}",
                ids[via],
                joined.shard,
                cluster::META_WRITE_MAX
            )
        })??
        .into_inner();
    eprintln!("`late` created {took:?} after the preferred leader was {gone:?}");
    assert!(created.created);
    let shown = client
        .admin()
        .get_queue(pb::GetQueueRequest {
            name: "late".into(),
        })
        .await?
        .into_inner();
    assert_eq!(
        shown.shard, joined.shard,
        "the shard of the rule: {shown:?}"
    );
    assert_ne!(
        created.queue.context("no queue in the answer")?.owner_node,
        preferred,
        "served by the shard's leader, not the node {gone:?}"
    );

    let conn = client.open_connection("producer").await?;
    let session = conn.create_session(AckMode::Client).await?;
    let send = session.send("late", vec![Message::text("m").dedup_id("m")]);
    tokio::time::timeout(Duration::from_secs(10), send).await??;
    target.firewall.heal()?;
    Ok(())
}
