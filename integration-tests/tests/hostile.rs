//! A hostile client against every RPC of `Messaging` and `Admin`: each row is a request, the
//! code it must get, and after it the node must still answer at once, keep its memory, and have
//! answered with a short message (an error never echoes a large input back).

#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use ferry_client::pb;
use ferry_client::{AckMode, Message, ReceiveOptions};
use ferry_integration_tests::{create_queue, stats, Node, NodeOptions};
use tonic::Code;

type Call = Pin<Box<dyn Future<Output = Result<(), tonic::Status>> + Send>>;

/// The longest error message a row may get back (the largest inputs are megabytes).
const MESSAGE_BYTES_MAX: usize = 2_048;
/// How much the node's resident memory may grow over the whole matrix.
const RSS_GROWTH_MAX_BYTES: u64 = 256 * 1024 * 1024;

fn rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn big(bytes: usize) -> String {
    "x".repeat(bytes)
}

fn outgoing(body: &str) -> pb::OutgoingMessage {
    pb::OutgoingMessage {
        body: body.as_bytes().to_vec().into(),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_refuses_hostile_input_with_the_right_code_and_stays_well() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path(), NodeOptions::default())?;
    let pid = node.pid().unwrap();
    let client = node.client().await?;
    create_queue(&client, "q").await?;
    let m = client.messaging();
    let a = client.admin();

    // A victim with a delivery, a session and a temporary queue of its own.
    let victim = client.open_connection("victim").await?;
    let victim_session = victim.create_session(AckMode::Client).await?;
    victim_session
        .send("q", vec![Message::text("victim's")])
        .await?;
    let held = victim_session
        .receive("q", ReceiveOptions::no_wait())
        .await?;
    let victim_handle = held[0].receipt_handle().to_string();
    let victim_tmp = m
        .clone()
        .create_temporary_queue(pb::CreateTemporaryQueueRequest {
            connection_id: victim.id().to_string(),
        })
        .await?
        .into_inner()
        .queue;
    // The attacker's own connection and session.
    let mine = m
        .clone()
        .open_connection(pb::OpenConnectionRequest {
            client_id: "attacker".into(),
            lease_ms: None,
        })
        .await?
        .into_inner()
        .connection_id;
    let my_session = m
        .clone()
        .create_session(pb::CreateSessionRequest {
            connection_id: mine.clone(),
            ack_mode: pb::AckMode::Client as i32,
        })
        .await?
        .into_inner()
        .session_id;
    // What an administrator sees of the victim's connection.
    let listed = a
        .clone()
        .list_connections(pb::ListConnectionsRequest::default())
        .await?
        .into_inner()
        .connections;
    let listed_victim = listed
        .iter()
        .find(|c| c.client_id == "victim")
        .unwrap()
        .connection_id
        .clone();
    assert_ne!(
        listed_victim,
        victim.id(),
        "a listing never shows a connection's id"
    );
    // A handle of the right form whose check value was made up.
    let forged = {
        // r3.<uid>.<seq>.<lease>.<count>.<tag>.<queue>
        let mut parts: Vec<&str> = victim_handle.splitn(7, '.').collect();
        parts[5] = "0123456789abcdef";
        parts.join(".")
    };
    let huge = big(8 * 1024 * 1024);

    let baseline = rss_bytes(pid);
    let rows: Vec<(&str, Code, Call)> = vec![
        // ---- Messaging
        (
            "OpenConnection: 8 MiB client_id",
            Code::ResourceExhausted,
            {
                let (mut m, huge) = (m.clone(), huge.clone());
                Box::pin(async move {
                    m.open_connection(pb::OpenConnectionRequest {
                        client_id: huge,
                        lease_ms: None,
                    })
                    .await
                    .map(drop)
                })
            },
        ),
        ("Heartbeat: 8 MiB connection id", Code::NotFound, {
            let (mut m, huge) = (m.clone(), huge.clone());
            Box::pin(async move {
                m.heartbeat(pb::HeartbeatRequest {
                    connection_id: huge,
                })
                .await
                .map(drop)
            })
        }),
        ("Heartbeat: the id a listing shows", Code::NotFound, {
            let (mut m, id) = (m.clone(), listed_victim.clone());
            Box::pin(async move {
                m.heartbeat(pb::HeartbeatRequest { connection_id: id })
                    .await
                    .map(drop)
            })
        }),
        ("CloseConnection: unknown", Code::NotFound, {
            let mut m = m.clone();
            Box::pin(async move {
                m.close_connection(pb::CloseConnectionRequest {
                    connection_id: "c-nope".into(),
                })
                .await
                .map(drop)
            })
        }),
        ("CreateSession: ack mode 99", Code::InvalidArgument, {
            let (mut m, c) = (m.clone(), mine.clone());
            Box::pin(async move {
                m.create_session(pb::CreateSessionRequest {
                    connection_id: c,
                    ack_mode: 99,
                })
                .await
                .map(drop)
            })
        }),
        ("CloseSession: not a session id", Code::InvalidArgument, {
            let (mut m, huge) = (m.clone(), huge.clone());
            Box::pin(async move {
                m.close_session(pb::CloseSessionRequest { session_id: huge })
                    .await
                    .map(drop)
            })
        }),
        ("Send: unknown queue", Code::NotFound, {
            let mut m = m.clone();
            Box::pin(async move {
                m.send(pb::SendRequest {
                    queue: "nope".into(),
                    messages: vec![outgoing("x")],
                    ..Default::default()
                })
                .await
                .map(drop)
            })
        }),
        ("Send: 1 MiB dedup id", Code::ResourceExhausted, {
            let mut m = m.clone();
            Box::pin(async move {
                m.send(pb::SendRequest {
                    queue: "q".into(),
                    messages: vec![pb::OutgoingMessage {
                        dedup_id: big(1024 * 1024),
                        ..outgoing("x")
                    }],
                    ..Default::default()
                })
                .await
                .map(drop)
            })
        }),
        (
            "Send: 100 000 properties in one message",
            Code::ResourceExhausted,
            {
                let mut m = m.clone();
                Box::pin(async move {
                    let properties = (0..100_000)
                        .map(|i| {
                            let v = pb::property_value::Value::IntValue(i);
                            (format!("p{i}"), pb::PropertyValue { value: Some(v) })
                        })
                        .collect();
                    m.send(pb::SendRequest {
                        queue: "q".into(),
                        messages: vec![pb::OutgoingMessage {
                            properties,
                            ..outgoing("x")
                        }],
                        ..Default::default()
                    })
                    .await
                    .map(drop)
                })
            },
        ),
        ("Send: 8 MiB queue name", Code::InvalidArgument, {
            let (mut m, huge) = (m.clone(), huge.clone());
            Box::pin(async move {
                m.send(pb::SendRequest {
                    queue: huge,
                    messages: vec![outgoing("x")],
                    ..Default::default()
                })
                .await
                .map(drop)
            })
        }),
        ("Receive: negative wait", Code::InvalidArgument, {
            let mut m = m.clone();
            Box::pin(async move {
                m.receive(pb::ReceiveRequest {
                    queue: "q".into(),
                    wait_ms: Some(-1),
                    max_messages: 1,
                    ..Default::default()
                })
                .await
                .map(drop)
            })
        }),
        ("Ack: not a handle", Code::InvalidArgument, {
            let (mut m, huge) = (m.clone(), huge.clone());
            Box::pin(async move {
                m.ack(pb::AckRequest {
                    session_id: String::new(),
                    receipt_handles: vec![huge],
                })
                .await
                .map(drop)
            })
        }),
        ("Ack: a forged check value", Code::FailedPrecondition, {
            let (mut m, s, h) = (m.clone(), my_session.clone(), forged.clone());
            Box::pin(async move {
                m.ack(pb::AckRequest {
                    session_id: s,
                    receipt_handles: vec![h],
                })
                .await
                .map(drop)
            })
        }),
        (
            "Ack: another session's delivery",
            Code::FailedPrecondition,
            {
                let (mut m, s, h) = (m.clone(), my_session.clone(), victim_handle.clone());
                Box::pin(async move {
                    m.ack(pb::AckRequest {
                        session_id: s,
                        receipt_handles: vec![h],
                    })
                    .await
                    .map(drop)
                })
            },
        ),
        (
            "Nack: another session's delivery, no session named",
            Code::FailedPrecondition,
            {
                let (mut m, h) = (m.clone(), victim_handle.clone());
                Box::pin(async move {
                    m.nack(pb::NackRequest {
                        receipt_handles: vec![h],
                        dead_letter: true,
                        ..Default::default()
                    })
                    .await
                    .map(drop)
                })
            },
        ),
        (
            "ExtendLease: another session's delivery by 12 h",
            Code::FailedPrecondition,
            {
                let (mut m, s, h) = (m.clone(), my_session.clone(), victim_handle.clone());
                Box::pin(async move {
                    m.extend_lease(pb::ExtendLeaseRequest {
                        session_id: s,
                        receipt_handles: vec![h],
                        lease_ms: Some(12 * 3_600_000),
                    })
                    .await
                    .map(drop)
                })
            },
        ),
        ("Recover: unknown session", Code::NotFound, {
            let mut m = m.clone();
            Box::pin(async move {
                m.recover(pb::RecoverRequest {
                    session_id: "00000000000000ff".into(),
                })
                .await
                .map(drop)
            })
        }),
        (
            "Commit: a session that is not transacted",
            Code::FailedPrecondition,
            {
                let (mut m, s) = (m.clone(), my_session.clone());
                Box::pin(async move {
                    m.commit(pb::CommitRequest {
                        session_id: s,
                        receipt_handles: vec![],
                    })
                    .await
                    .map(drop)
                })
            },
        ),
        ("Rollback: not a session id", Code::InvalidArgument, {
            let mut m = m.clone();
            Box::pin(async move {
                m.rollback(pb::RollbackRequest {
                    session_id: "\n[forged log line]".into(),
                })
                .await
                .map(drop)
            })
        }),
        (
            "CreateTemporaryQueue: the id a listing shows",
            Code::NotFound,
            {
                let (mut m, id) = (m.clone(), listed_victim.clone());
                Box::pin(async move {
                    m.create_temporary_queue(pb::CreateTemporaryQueueRequest { connection_id: id })
                        .await
                        .map(drop)
                })
            },
        ),
        (
            "DeleteTemporaryQueue: another connection's",
            Code::FailedPrecondition,
            {
                let (mut m, c, q) = (m.clone(), mine.clone(), victim_tmp.clone());
                Box::pin(async move {
                    m.delete_temporary_queue(pb::DeleteTemporaryQueueRequest {
                        connection_id: c,
                        queue: q,
                    })
                    .await
                    .map(drop)
                })
            },
        ),
        ("Browse: bad page token", Code::InvalidArgument, {
            let mut m = m.clone();
            Box::pin(async move {
                m.browse(pb::BrowseRequest {
                    queue: "q".into(),
                    page_token: "zz".into(),
                    ..Default::default()
                })
                .await
                .map(drop)
            })
        }),
        // ---- Admin
        (
            "CreateQueue: lease_max_ms = u64::MAX",
            Code::InvalidArgument,
            {
                let mut a = a.clone();
                Box::pin(async move {
                    a.create_queue(pb::CreateQueueRequest {
                        replicas: 0,
                        own_shard: false,
                        name: "forever".into(),
                        config: Some(pb::QueueConfig {
                            lease_max_ms: Some(u64::MAX),
                            ..Default::default()
                        }),
                        if_not_exists: false,
                        node: String::new(),
                    })
                    .await
                    .map(drop)
                })
            },
        ),
        (
            "CreateQueue: dedup_window_ms = u64::MAX",
            Code::InvalidArgument,
            {
                let mut a = a.clone();
                Box::pin(async move {
                    a.create_queue(pb::CreateQueueRequest {
                        replicas: 0,
                        own_shard: false,
                        name: "forever".into(),
                        config: Some(pb::QueueConfig {
                            dedup_window_ms: Some(u64::MAX),
                            ..Default::default()
                        }),
                        if_not_exists: false,
                        node: String::new(),
                    })
                    .await
                    .map(drop)
                })
            },
        ),
        ("GetQueue: unknown", Code::NotFound, {
            let mut a = a.clone();
            Box::pin(async move {
                a.get_queue(pb::GetQueueRequest {
                    name: "nope".into(),
                })
                .await
                .map(drop)
            })
        }),
        ("ListQueues", Code::Ok, {
            let mut a = a.clone();
            Box::pin(async move {
                a.list_queues(pb::ListQueuesRequest::default())
                    .await
                    .map(drop)
            })
        }),
        ("DeleteQueue: unknown", Code::NotFound, {
            let mut a = a.clone();
            Box::pin(async move {
                a.delete_queue(pb::DeleteQueueRequest {
                    name: "nope".into(),
                    if_empty: false,
                })
                .await
                .map(drop)
            })
        }),
        ("PurgeQueue: unknown", Code::NotFound, {
            let mut a = a.clone();
            Box::pin(async move {
                a.purge_queue(pb::PurgeQueueRequest {
                    name: "nope".into(),
                })
                .await
                .map(drop)
            })
        }),
        ("GetQueueStats: 8 MiB name", Code::InvalidArgument, {
            let (mut a, huge) = (a.clone(), huge.clone());
            Box::pin(async move {
                a.get_queue_stats(pb::GetQueueStatsRequest { name: huge })
                    .await
                    .map(drop)
            })
        }),
        ("DeleteMessage: not a message id", Code::InvalidArgument, {
            let (mut a, huge) = (a.clone(), huge.clone());
            Box::pin(async move {
                a.delete_message(pb::DeleteMessageRequest {
                    queue: "q".into(),
                    message_id: huge,
                })
                .await
                .map(drop)
            })
        }),
        ("ListQueues: a page of 20 000", Code::InvalidArgument, {
            let mut a = a.clone();
            Box::pin(async move {
                a.list_queues(pb::ListQueuesRequest {
                    page_size: 20_000,
                    page_token: String::new(),
                })
                .await
                .map(drop)
            })
        }),
        ("ListConnections", Code::Ok, {
            let mut a = a.clone();
            Box::pin(async move {
                a.list_connections(pb::ListConnectionsRequest::default())
                    .await
                    .map(drop)
            })
        }),
        ("CloseConnection (admin): unknown", Code::NotFound, {
            let (mut a, huge) = (a.clone(), huge.clone());
            Box::pin(async move {
                a.close_connection(pb::AdminCloseConnectionRequest {
                    connection_id: huge,
                })
                .await
                .map(drop)
            })
        }),
        ("MoveMessages: unknown queue", Code::NotFound, {
            let mut a = a.clone();
            Box::pin(async move {
                a.move_messages(pb::MoveMessagesRequest {
                    from_queue: "nope".into(),
                    to_queue: "q".into(),
                    ..Default::default()
                })
                .await
                .map(drop)
            })
        }),
        ("GetMoveTask: unknown", Code::NotFound, {
            let mut a = a.clone();
            Box::pin(async move {
                a.get_move_task(pb::GetMoveTaskRequest {
                    task_id: "nope".into(),
                })
                .await
                .map(drop)
            })
        }),
        ("WatchEvents", Code::Ok, {
            let mut a = a.clone();
            Box::pin(async move {
                a.watch_events(pb::WatchEventsRequest::default())
                    .await
                    .map(drop)
            })
        }),
        ("GetMessageHistory: 8 MiB id", Code::InvalidArgument, {
            let (mut a, huge) = (a.clone(), huge.clone());
            Box::pin(async move {
                a.get_message_history(pb::GetMessageHistoryRequest { message_id: huge })
                    .await
                    .map(drop)
            })
        }),
        ("UpdateQueue: unknown", Code::NotFound, {
            let mut a = a.clone();
            Box::pin(async move {
                a.update_queue(pb::UpdateQueueRequest {
                    name: "nope".into(),
                    config: Some(pb::QueueConfig {
                        max_messages: Some(1),
                        ..Default::default()
                    }),
                    node: String::new(),
                })
                .await
                .map(drop)
            })
        }),
        (
            "UpdateQueue: dedup_window_ms = u64::MAX",
            Code::InvalidArgument,
            {
                let mut a = a.clone();
                Box::pin(async move {
                    a.update_queue(pb::UpdateQueueRequest {
                        name: "q".into(),
                        config: Some(pb::QueueConfig {
                            dedup_window_ms: Some(u64::MAX),
                            ..Default::default()
                        }),
                        node: String::new(),
                    })
                    .await
                    .map(drop)
                })
            },
        ),
    ];

    let mut failures = vec![];
    for (name, want, call) in rows {
        let got = tokio::time::timeout(Duration::from_secs(30), call).await;
        let (code, message) = match got {
            Ok(Ok(())) => (Code::Ok, String::new()),
            Ok(Err(s)) => (s.code(), s.message().to_string()),
            Err(_) => {
                failures.push(format!("{name}: no answer within 30 s"));
                continue;
            }
        };
        if code != want {
            failures.push(format!("{name}: got {code:?} ({message}), want {want:?}"));
        }
        if message.len() > MESSAGE_BYTES_MAX {
            failures.push(format!("{name}: a {} byte error message", message.len()));
        }
        if message.contains('\n') {
            failures.push(format!("{name}: a newline in the error message"));
        }
        // Still answering at once, and no runaway memory.
        let alive = tokio::time::timeout(Duration::from_secs(5), stats(&client, "q")).await;
        if !matches!(alive, Ok(Ok(_))) {
            failures.push(format!("{name}: the node stopped answering after it"));
        }
        let rss = rss_bytes(pid);
        if rss > baseline + RSS_GROWTH_MAX_BYTES {
            failures.push(format!(
                "{name}: resident memory {} MiB, {} MiB at the start",
                rss >> 20,
                baseline >> 20
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // Nothing the attacker did touched the victim: its delivery is still its own to ack, its
    // temporary queue still there.
    victim_session.ack(&held).await?;
    let s = stats(&client, "q").await?;
    assert_eq!((s.ready, s.leased, s.acked_total), (0, 0, 1));
    assert!(a
        .clone()
        .get_queue(pb::GetQueueRequest { name: victim_tmp })
        .await
        .is_ok());
    Ok(())
}
