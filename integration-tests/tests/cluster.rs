//! The cluster on real processes: bootstrap, placement by the rule, routing from any node, the
//! metadata leader killed, a node added while traffic flows, removal, a full restart, and bad
//! membership input. Each node runs on its own 127.x.y.N address (see `cluster.rs`).

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use anyhow::Context;

use ferry_client::{pb, AckMode, Message, ReceiveOptions};
use ferry_integration_tests::cluster::{
    create_queue_on, expect_error, status, wait_health, Cluster,
};
use ferry_integration_tests::{ferry_cli, stats, wait_until};
use tonic::Code;

const LEADER_WAIT: Duration = Duration::from_secs(20);

/// The owner the cluster recorded for `queue`.
async fn owner(client: &ferry_client::Client, queue: &str) -> anyhow::Result<String> {
    Ok(stats(client, queue).await?.owner_node)
}

/// Sends `count` messages in batches of 100 through `session`.
async fn send_many(
    session: &ferry_client::Session,
    queue: &str,
    count: usize,
) -> anyhow::Result<()> {
    for start in (0..count).step_by(100) {
        let batch = (start..(start + 100).min(count))
            .map(|i| Message::text(format!("m{i}")))
            .collect();
        session.send(queue, batch).await?;
    }
    Ok(())
}

/// Receives until `count` distinct messages arrived (or 60 s passed); fails on a duplicate.
async fn receive_all(
    session: &ferry_client::Session,
    queue: &str,
    count: usize,
) -> anyhow::Result<()> {
    let mut seen = std::collections::HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < count {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "received {} of {count}",
            seen.len()
        );
        let got = session
            .receive(queue, ReceiveOptions::timeout_ms(1_000).max(500))
            .await?;
        for m in &got {
            anyhow::ensure!(
                seen.insert(m.message_id().to_string()),
                "{} delivered twice",
                m.message_id()
            );
        }
        session.ack(&got).await?;
    }
    Ok(())
}

/// Three voters n1-n3 with a leader, and queues `a`, `b`, `c` pinned on n1, n2, n3, created
/// through `via`; returns the cluster and a client of `via`.
async fn three_nodes_with_a_queue_each(
    dir: &std::path::Path,
    via: &str,
) -> anyhow::Result<(Cluster, ferry_client::Client)> {
    let cluster = Cluster::start(dir, &["n1", "n2", "n3"])?;
    cluster
        .wait_leader(&["n1", "n2", "n3"], LEADER_WAIT)
        .await?;
    let client = cluster.node(via).client().await?;
    for (q, n) in [("a", "n1"), ("b", "n2"), ("c", "n3")] {
        create_queue_on(&client, q, Some(n)).await?;
    }
    Ok((cluster, client))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_nodes_place_by_the_rule_and_route_from_any_node() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::start(dir.path(), &["n1", "n2", "n3"])?;
    cluster
        .wait_leader(&["n1", "n2", "n3"], LEADER_WAIT)
        .await?;
    let via1 = cluster.node("n1").client().await?;
    let via2 = cluster.node("n2").client().await?;
    // n1 and n2 own a queue and its dead-letter queue each: the rule (fewest queues) picks n3.
    create_queue_on(&via1, "first", Some("n1")).await?;
    create_queue_on(&via1, "second", Some("n2")).await?;
    let created = create_queue_on(&via1, "orders", None).await?;
    assert!(created.created);
    assert_eq!(created.queue.unwrap().owner_node, "n3");
    assert_eq!(
        owner(&via2, "orders").await?,
        "n3",
        "every node routes to the owner"
    );
    assert_eq!(
        owner(&via2, "orders.DLQ").await?,
        "n3",
        "the DLQ lives with its queue"
    );

    // A producer on n2, a consumer on n1, the queue on n3: all 10 000, exactly once.
    let producer = via2.open_connection("p").await?;
    let consumer = via1.open_connection("c").await?;
    let tx_session = producer.create_session(AckMode::Auto).await?;
    let rx_session = consumer.create_session(AckMode::Client).await?;
    send_many(&tx_session, "orders", 10_000).await?;
    receive_all(&rx_session, "orders", 10_000).await?;
    let s = stats(&via2, "orders").await?;
    assert_eq!((s.ready, s.leased, s.acked_total), (0, 0, 10_000));

    // The status names the leader, and every node with its role, health and queues.
    let st = status(cluster.node("n2")).await?;
    assert_eq!(st.nodes.len(), 3);
    assert!(st.nodes.iter().all(|n| n.role == "voter"));
    let n3 = st.nodes.iter().find(|n| n.node_id == "n3").unwrap();
    assert_eq!(n3.queues, vec!["orders", "orders.DLQ"]);
    wait_health(
        cluster.node("n2"),
        &["n1", "n3"],
        "up",
        Duration::from_secs(10),
    )
    .await?;
    // The CLI shows the same, in JSON too.
    let (ok, out, err) = ferry_cli(cluster.node("n1"), &["-o", "json", "cluster", "status"])?;
    assert!(ok, "{err}");
    let json: serde_json::Value = serde_json::from_str(out.trim())?;
    assert_eq!(json["nodes"].as_array().map(Vec::len), Some(3), "{out}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_metadata_leader_elects_another_and_queues_keep_serving() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &["n1", "n2", "n3"])?;
    let leader = cluster
        .wait_leader(&["n1", "n2", "n3"], LEADER_WAIT)
        .await?;
    let survivors: Vec<&str> = ["n1", "n2", "n3"]
        .into_iter()
        .filter(|n| *n != leader)
        .collect();
    let (s1, s2) = (survivors[0], survivors[1]);
    let via = cluster.node(s1).client().await?;
    create_queue_on(&via, "kept", Some(s2)).await?;
    create_queue_on(&via, "lost", Some(&leader)).await?;
    let term = status(cluster.node(&leader)).await?.term;

    cluster.node_mut(&leader).kill9();
    // What Raft promises, as the survivors report it: they agree on a leader among themselves,
    // elected in a later term. The bound is for liveness only (10 × the longest election timeout
    // at the default tick, 20 ticks of 100 ms); how fast is a benchmark's question, not a timed
    // assertion on 3 processes sharing loaded cores: `scripts/chaos cluster-meta` reports the
    // time to a metadata write after the leader is cut off (docs/reliability.md).
    cluster
        .wait_leader_above(&survivors, term, LEADER_WAIT)
        .await?;
    // The survivors' queues serve through every survivor.
    for via_node in &survivors {
        let client = cluster.node(via_node).client().await?;
        let conn = client.open_connection("t").await?;
        let session = conn.create_session(AckMode::Auto).await?;
        session
            .send("kept", vec![Message::text("still here")])
            .await?;
        let got = session.receive("kept", ReceiveOptions::no_wait()).await?;
        assert_eq!(got.len(), 1);
    }
    // Creating a queue works again.
    let client = cluster.node(s1).client().await?;
    let created = create_queue_on(&client, "after", None).await?;
    assert!(created.created);
    // The dead node's queue answers UNAVAILABLE; the status shows the node down.
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    let e = session
        .send("lost", vec![Message::text("x")])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::Unavailable), "{e}");
    assert!(e.to_string().contains(&leader), "names the node: {e}");
    wait_health(
        cluster.node(s1),
        &[&leader],
        "down",
        Duration::from_secs(10),
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_added_while_traffic_flows_takes_the_next_queues() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut cluster, via1) = three_nodes_with_a_queue_each(dir.path(), "n1").await?;
    // Traffic on `b` through n1 while the node joins.
    let producer = {
        let client = via1.clone();
        tokio::spawn(async move {
            let conn = client.open_connection("p").await?;
            let session = conn.create_session(AckMode::Auto).await?;
            send_many(&session, "b", 3_000).await
        })
    };
    let consumer = {
        let client = cluster.node("n2").client().await?;
        tokio::spawn(async move {
            let conn = client.open_connection("c").await?;
            let session = conn.create_session(AckMode::Client).await?;
            receive_all(&session, "b", 3_000).await
        })
    };
    let d = cluster.start_joining("n4", 0)?;
    let (ok, out, err) = ferry_cli(
        cluster.node("n1"),
        &[
            "node",
            "add",
            "n4",
            "--address",
            &cluster.peer_addr(d),
            "--learner",
        ],
    )?;
    assert!(ok, "{out}{err}");
    assert!(out.contains("added node n4 as a learner"), "{out}");
    // It follows the metadata: it knows the queues, and the next queue lands on it.
    wait_until(
        Duration::from_secs(20),
        "n4 to follow the metadata",
        || async {
            Ok(status(&cluster.nodes[d]).await?.applied_index
                >= status(cluster.node("n1")).await?.applied_index)
        },
    )
    .await?;
    let created = create_queue_on(&via1, "next", None).await?;
    assert_eq!(created.queue.unwrap().owner_node, "n4");
    let via4 = cluster.nodes[d].client().await?;
    assert_eq!(owner(&via4, "b").await?, "n2", "n4 routes to the others");
    producer.await??;
    consumer.await??;

    // Removal: refused while n4 owns queues (named), accepted once it owns none.
    let cluster_client = via1.cluster();
    expect_error(
        cluster_client
            .clone()
            .remove_node(pb::RemoveNodeRequest {
                node_id: "n4".into(),
            })
            .await,
        Code::FailedPrecondition,
        "next",
    )?;
    via1.admin()
        .delete_queue(pb::DeleteQueueRequest {
            name: "next".into(),
            if_empty: false,
        })
        .await?;
    via1.admin()
        .delete_queue(pb::DeleteQueueRequest {
            name: "next.DLQ".into(),
            if_empty: false,
        })
        .await?;
    cluster_client
        .clone()
        .remove_node(pb::RemoveNodeRequest {
            node_id: "n4".into(),
        })
        .await?;
    let st = status(cluster.node("n1")).await?;
    assert!(st.nodes.iter().all(|n| n.node_id != "n4"));
    // The removed node cannot come back under its id while it runs on its old data directory
    // (on an empty one it may: `replica_moves.rs`).
    expect_error(
        cluster_client
            .clone()
            .add_node(pb::AddNodeRequest {
                node_id: "n4".into(),
                peer_address: cluster.peer_addr(d),
                learner: true,
            })
            .await,
        Code::FailedPrecondition,
        "still runs on its data directory",
    )?;
    cluster.nodes[d].kill9();
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarting_every_node_brings_metadata_and_queues_back() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (mut cluster, via1) = three_nodes_with_a_queue_each(dir.path(), "n1").await?;
    let conn = via1.open_connection("p").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    for q in ["a", "b", "c"] {
        session.send(q, vec![Message::text(q)]).await?;
    }
    let before = status(cluster.node("n1")).await?;
    drop(session);
    drop(conn);
    for id in ["n1", "n2", "n3"] {
        cluster.node_mut(id).kill9();
    }
    for id in ["n1", "n2", "n3"] {
        cluster.node_mut(id).restart_in_place()?;
    }
    cluster
        .wait_leader(&["n1", "n2", "n3"], LEADER_WAIT)
        .await?;
    let after = status(cluster.node("n3")).await?;
    assert_eq!(after.cluster_id, before.cluster_id);
    let via3 = cluster.node("n3").client().await?;
    for (q, n) in [("a", "n1"), ("b", "n2"), ("c", "n3")] {
        let s = stats(&via3, q).await?;
        assert_eq!((s.owner_node.as_str(), s.ready), (n, 1), "{q}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_membership_input_is_refused_clearly_and_changes_nothing() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &["n1", "n2", "n3"])?;
    cluster
        .wait_leader(&["n1", "n2", "n3"], LEADER_WAIT)
        .await?;
    let client = cluster.node("n2").client().await?;
    let cc = client.cluster();
    let before = status(cluster.node("n2")).await?;
    let add = |id: &str, addr: &str| pb::AddNodeRequest {
        node_id: id.into(),
        peer_address: addr.into(),
        learner: true,
    };
    // A duplicate node id.
    expect_error(
        cc.clone().add_node(add("n1", &cluster.peer_addr(0))).await,
        Code::AlreadyExists,
        "already a member",
    )?;
    // Nothing answers at the address.
    expect_error(
        cc.clone().add_node(add("n9", "127.0.0.1:1")).await,
        Code::Unavailable,
        "nothing answers",
    )?;
    // An address that is not host:port.
    expect_error(
        cc.clone().add_node(add("n9", "http://x")).await,
        Code::InvalidArgument,
        "host:port",
    )?;
    // Another id answers there.
    expect_error(
        cc.clone().add_node(add("n9", &cluster.peer_addr(2))).await,
        Code::InvalidArgument,
        "not n9",
    )?;
    // A voter that would make the voters even.
    let mut voter = add("n9", &cluster.peer_addr(2));
    voter.learner = false;
    expect_error(
        cc.clone().add_node(voter).await,
        Code::FailedPrecondition,
        "learner",
    )?;
    // An unknown node.
    expect_error(
        cc.clone()
            .remove_node(pb::RemoveNodeRequest {
                node_id: "nope".into(),
            })
            .await,
        Code::NotFound,
        "no node nope",
    )?;
    // Removing a voter of three leaves two: refused with what to do instead.
    expect_error(
        cc.clone()
            .remove_node(pb::RemoveNodeRequest {
                node_id: "n3".into(),
            })
            .await,
        Code::FailedPrecondition,
        "voter",
    )?;
    // `--node` naming an unknown node.
    let e = create_queue_on(&client, "q", Some("ghost"))
        .await
        .unwrap_err();
    let status_err = e.downcast_ref::<tonic::Status>();
    assert_eq!(
        status_err.map(tonic::Status::code),
        Some(Code::NotFound),
        "{e:#}"
    );
    // A node of another cluster.
    let other_dir = tempfile::tempdir()?;
    let other = Cluster::start(other_dir.path(), &["n9"])?;
    other.wait_leader(&["n9"], LEADER_WAIT).await?;
    expect_error(
        cc.clone().add_node(add("n9", &other.peer_addr(0))).await,
        Code::FailedPrecondition,
        "not",
    )?;
    // `--join` where nothing runs: the node refuses to start, saying so.
    let index = cluster.nodes.len();
    let joined = cluster.start_joining_to("n5", "127.0.0.1:1");
    assert!(joined.is_err(), "a node joining nothing started");
    let log = std::fs::read_to_string(dir.path().join("n5").join("n5.log"))?;
    assert!(log.contains("nothing answers"), "{log}");
    assert_eq!(cluster.nodes.len(), index);
    // Nothing changed.
    let members = |s: &pb::ClusterStatus| {
        s.nodes
            .iter()
            .map(|n| (n.node_id.clone(), n.role.clone(), n.queues.clone()))
            .collect::<Vec<_>>()
    };
    let after = status(cluster.node("n2")).await?;
    assert_eq!(members(&after), members(&before));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_last_voter_is_refused() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::start(dir.path(), &["solo"])?;
    cluster.wait_leader(&["solo"], LEADER_WAIT).await?;
    let client = cluster.node("solo").client().await?;
    expect_error(
        client
            .cluster()
            .remove_node(pb::RemoveNodeRequest {
                node_id: "solo".into(),
            })
            .await,
        Code::FailedPrecondition,
        "last voter",
    )?;
    Ok(())
}

/// A one-node cluster grows to three voters: two nodes join as learners and are promoted
/// together; then the first node can die and the other two elect a leader.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_node_cluster_grows_to_three_voters_by_promoting_two_learners() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start(dir.path(), &["n1"])?;
    cluster.wait_leader(&["n1"], LEADER_WAIT).await?;
    let client = cluster.node("n1").client().await?;
    let cc = client.cluster();
    for id in ["n2", "n3"] {
        let index = cluster.start_joining(id, 0)?;
        cc.clone()
            .add_node(pb::AddNodeRequest {
                node_id: id.into(),
                peer_address: cluster.peer_addr(index),
                learner: true,
            })
            .await?;
    }
    // One at a time would leave two voters: refused, saying how.
    expect_error(
        cc.clone()
            .promote_nodes(pb::PromoteNodesRequest {
                node_ids: vec!["n2".into()],
            })
            .await,
        Code::FailedPrecondition,
        "1, 3 or 5",
    )?;
    let (ok, out, err) = ferry_cli(cluster.node("n1"), &["node", "promote", "n2", "n3"])?;
    assert!(ok, "{out}{err}");
    let st = status(cluster.node("n1")).await?;
    assert!(st.nodes.iter().all(|n| n.role == "voter"), "{st:?}");
    cluster
        .wait_leader(&["n1", "n2", "n3"], LEADER_WAIT)
        .await?;
    // The Raft group follows the roles: without n1, n2 and n3 still form a majority.
    wait_until(
        Duration::from_secs(10),
        "n2 and n3 to vote in Raft",
        || async { Ok(status(cluster.node("n2")).await?.raft_voters.len() == 3) },
    )
    .await?;
    cluster.node_mut("n1").kill9();
    cluster.wait_leader(&["n2", "n3"], LEADER_WAIT).await?;
    // Once n1 shows down, the placement rule passes it over (it owns the fewest queues and has
    // the smallest id).
    wait_health(cluster.node("n2"), &["n1"], "down", Duration::from_secs(10)).await?;
    let via2 = cluster.node("n2").client().await?;
    let created = create_queue_on(&via2, "after-n1", None).await?;
    assert_eq!(created.queue.unwrap().owner_node, "n2");
    Ok(())
}

/// The placement rule's second criterion: with as many queues everywhere, a new queue goes to
/// the node holding the fewest bytes (as the nodes report them), not the smallest id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_equal_queue_counts_the_node_holding_fewest_bytes_takes_the_next_queue(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (cluster, via3) = three_nodes_with_a_queue_each(dir.path(), "n3").await?;
    let conn = via3.open_connection("p").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    send_many(&session, "a", 200).await?;
    send_many(&session, "c", 100).await?;
    // Once n3 knows n1's and its own bytes, n2 (holding none) takes the next queue, though n1
    // has the smallest id.
    wait_until(Duration::from_secs(20), "the bytes reported", || async {
        let st = status(cluster.node("n3")).await?;
        Ok(st
            .nodes
            .iter()
            .filter(|n| n.node_id != "n2")
            .all(|n| n.stored_bytes > 0))
    })
    .await?;
    let created = create_queue_on(&via3, "next", None).await?;
    assert_eq!(created.queue.unwrap().owner_node, "n2");
    Ok(())
}

/// Sends SIGCONT to a paused process when dropped, even when the test fails.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-CONT", &self.0.to_string()])
            .status();
    }
}

/// A paused owner (SIGSTOP: its ports still accept, nothing answers) is not waited for until
/// the client's deadline: once the node routing the calls has not heard from it for the
/// liveness timeout, new calls fail at once with UNAVAILABLE naming it, nothing sent; when it
/// resumes, calls go through again. (Before, each waited for the client's own deadline, or
/// HTTP/2 keepalive's, some 30 s.) A call already under way keeps waiting: see
/// `chaos_regressions.rs`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_a_paused_owner_fail_fast_with_unavailable_and_go_through_once_it_resumes(
) -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let (cluster, client) = three_nodes_with_a_queue_each(dir.path(), "n1").await?;
    let conn = client.open_connection("t").await?;
    let session = conn.create_session(AckMode::Auto).await?;
    session.send("c", vec![Message::text("before")]).await?;
    let pid = cluster.node("n3").pid().expect("n3 runs");
    let paused = Resume(pid);
    assert!(std::process::Command::new("kill")
        .args(["-STOP", &pid.to_string()])
        .status()?
        .success());
    // n1 notices n3's silence after the liveness timeout (3 s).
    wait_health(cluster.node("n1"), &["n3"], "down", Duration::from_secs(10)).await?;
    // Far less than the half minute HTTP/2 keepalive takes to give up on a silent peer.
    let bound = Duration::from_secs(5);
    let e = tokio::time::timeout(bound, session.send("c", vec![Message::text("x")]))
        .await
        .map_err(|_| anyhow::anyhow!("a send still waits on the paused owner"))?
        .unwrap_err();
    assert_eq!(e.code(), Some(Code::Unavailable), "{e}");
    assert!(e.to_string().contains("n3"), "names the owner: {e}");
    assert!(e.to_string().contains("nothing was sent"), "{e}");
    let e = tokio::time::timeout(
        bound,
        session.receive("c", ReceiveOptions::timeout_ms(30_000)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("a receive still waits on the paused owner"))?
    .unwrap_err();
    assert_eq!(e.code(), Some(Code::Unavailable), "{e}");
    assert!(e.to_string().contains("n3"), "names the owner: {e}");
    // The other queues are untouched.
    session.send("b", vec![Message::text("b")]).await?;
    drop(paused);
    wait_until(Duration::from_secs(30), "sends through again", || async {
        Ok(session
            .send("c", vec![Message::text("after")])
            .await
            .is_ok())
    })
    .await?;
    Ok(())
}

/// What a client did through one node is seen by its next call through any other: a queue
/// deleted through one follower and created again at once through the other, and a queue
/// created through one and changed at once through the other. Each command is judged where it
/// is ordered in the log, not on the second node's view, which may not have applied the first
/// change yet (that view answered ALREADY_EXISTS and NOT_FOUND here before). Twenty rounds, so
/// that a lagging view is met.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_through_one_node_is_seen_by_the_next_call_through_another() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let cluster = Cluster::start(dir.path(), &["n1", "n2", "n3"])?;
    let leader = cluster
        .wait_leader(&["n1", "n2", "n3"], LEADER_WAIT)
        .await?;
    let followers: Vec<&str> = ["n1", "n2", "n3"]
        .into_iter()
        .filter(|n| *n != leader)
        .collect();
    let first = cluster.node(followers[0]).client().await?;
    let second = cluster.node(followers[1]).client().await?;
    for round in 0..20 {
        let name = format!("again{round}");
        create_queue_on(&first, &name, None).await?;
        first
            .admin()
            .delete_queue(pb::DeleteQueueRequest {
                name: name.clone(),
                if_empty: false,
            })
            .await?;
        let again = create_queue_on(&second, &name, None)
            .await
            .with_context(|| format!("round {round}: created again through the other node"))?;
        assert!(again.created);

        let changed = format!("changed{round}");
        create_queue_on(&first, &changed, None).await?;
        second
            .admin()
            .update_queue(pb::UpdateQueueRequest {
                name: changed.clone(),
                config: Some(pb::QueueConfig {
                    max_messages: Some(7),
                    ..Default::default()
                }),
                node: String::new(),
            })
            .await
            .with_context(|| format!("round {round}: updated through the other node"))?;
    }
    Ok(())
}

/// A create sent through a follower whose metadata leader dies after applying it and before
/// answering (a planted fault, `leader-dies-before-answering-a-forwarded-proposal`, once per
/// process: the proposal committed, its answer lost) is answered as created, and the queue
/// exists once: the follower's retry carries the call's request id, so the new leader answers
/// it as it applied. Before request ids the retry found the queue and the only create call the
/// client made answered ALREADY_EXISTS (2 of 2 tries with a kill -9 a few milliseconds into
/// the call). Three rounds, each killing whichever node leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_create_whose_answer_the_dying_leader_lost_is_answered_as_created() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let ids = ["n1", "n2", "n3"];
    let mut cluster = Cluster::plan(dir.path(), false);
    cluster.bin = Some(ferry_integration_tests::ferry_faults_bin());
    for id in ids {
        let fault = format!("{LEADER_DIES}=1*return");
        cluster
            .node_env
            .insert(id.into(), vec![("FAILPOINTS".into(), fault)]);
    }
    cluster.start_nodes(&ids, "", &[])?;
    for round in 0..3 {
        let leader = cluster.wait_leader(&ids, LEADER_WAIT).await?;
        let follower = *ids.iter().find(|n| **n != leader).context("a follower")?;
        let client = cluster.node(follower).client().await?;
        let name = format!("made{round}");
        let created = create_queue_on(&client, &name, Some(follower))
            .await
            .with_context(|| format!("round {round}: the create through {follower}"))?;
        assert!(created.created, "round {round}: {created:?}");
        assert!(
            cluster.node(&leader).log().contains("planted fault"),
            "round {round}: the leader {leader} died with the answer"
        );
        cluster.node_mut(&leader).restart_in_place()?;
        let listed = client
            .admin()
            .list_queues(pb::ListQueuesRequest::default())
            .await?
            .into_inner()
            .queues;
        let copies = listed.iter().filter(|q| q.name == name).count();
        assert_eq!(copies, 1, "round {round}: {listed:?}");
    }
    Ok(())
}

/// The planted fault of [`a_create_whose_answer_the_dying_leader_lost_is_answered_as_created`].
const LEADER_DIES: &str = "leader-dies-before-answering-a-forwarded-proposal";
