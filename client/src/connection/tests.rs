//! Tests of the connection and its sessions against the fake node.

use std::time::Duration;

use tokio::time::Instant;
use tonic::Code;

use crate::fake;

/// Paused time: the clock moves only when every task waits, to the next timer.
#[tokio::test(start_paused = true)]
async fn heartbeats_come_every_third_of_the_lease_through_errors_until_the_connection_is_gone() {
    let mut fake = fake::start(3_000).await;
    fake.heartbeat_answers
        .lock()
        .expect("not poisoned")
        .extend([Err(Code::Unavailable), Ok(()), Err(Code::NotFound)]);
    let start = Instant::now();
    let _connection = fake.client.open_connection("t").await.expect("open");
    for n in 1..=3 {
        assert_eq!(fake.next_heartbeat().await, "connection-1");
        // A failed heartbeat (the node busy, the network down) is no reason to stop: the
        // next one comes on time.
        assert_eq!(start.elapsed(), Duration::from_secs(n), "heartbeat {n}");
    }
    // NOT_FOUND: the server closed the connection; heartbeating it is pointless.
    let more = tokio::time::timeout(Duration::from_secs(60), fake.heartbeats.recv()).await;
    assert!(more.is_err(), "a heartbeat after NOT_FOUND: {more:?}");
}

#[tokio::test(start_paused = true)]
async fn a_connection_heartbeats_while_a_session_of_it_lives_and_stops_when_the_last_goes() {
    let mut fake = fake::start(3_000).await;
    let connection = fake.client.open_connection("t").await.expect("open");
    let session = connection
        .create_session(crate::AckMode::Auto)
        .await
        .expect("session");
    drop(connection);
    assert_eq!(
        fake.next_heartbeat().await,
        "connection-1",
        "the session keeps it"
    );
    drop(session);
    let more = tokio::time::timeout(Duration::from_secs(60), fake.heartbeats.recv()).await;
    assert!(more.is_err(), "a heartbeat with no handle left: {more:?}");
}

fn deliveries(handles: &[&str]) -> ferry_proto::pb::ReceiveResponse {
    ferry_proto::pb::ReceiveResponse {
        deliveries: handles
            .iter()
            .map(|h| ferry_proto::pb::Delivery {
                receipt_handle: (*h).into(),
                delivery_count: 1,
                ..Default::default()
            })
            .collect(),
    }
}

/// Postmortem (chaos kill9 seed 1): an auto receive whose acknowledgement failed or got no
/// answer (the node killed after applying it) returned the error and threw its batch away,
/// and those messages were lost. The batch is handed over whatever becomes of the
/// acknowledgement, and the failure is counted for the application to see.
#[tokio::test(start_paused = true)]
async fn an_auto_receive_hands_over_its_batch_when_its_acknowledgement_fails_and_counts_it() {
    let fake = fake::start(3_000).await;
    fake.receive_answers.lock().expect("not poisoned").extend([
        Ok(deliveries(&["h1", "h2"])),
        Ok(deliveries(&["h3"])),
        Ok(deliveries(&[])),
    ]);
    // Unavailable through every retry of the first acknowledgement.
    let failing = (0..=super::ACK_RETRIES).map(|_| Err(Code::Unavailable));
    fake.ack_answers
        .lock()
        .expect("not poisoned")
        .extend(failing.chain([Ok(Default::default())]));
    let connection = fake.client.open_connection("t").await.expect("open");
    let failures = connection.auto_ack_failures();
    let session = connection
        .create_session(crate::AckMode::Auto)
        .await
        .expect("session");
    let opts = crate::ReceiveOptions::no_wait().max(10);
    let first = session.receive("q", opts).await.expect("the batch");
    assert_eq!(first.len(), 2, "handed over although its ack will fail");
    // The next receive waits for the acknowledgement before it asks for more.
    let second = session.receive("q", opts).await.expect("the next batch");
    assert_eq!(second.len(), 1);
    assert_eq!(failures.count(), 1, "the failed acknowledgement is counted");
    session.receive("q", opts).await.expect("nothing more");
    assert_eq!(failures.count(), 1, "the one that succeeded is not");
    drop(session);
    connection.close().await.expect("closed");
    assert_eq!(failures.count(), 1, "still readable after the close");
}

/// An acknowledgement the node answered `UNAVAILABLE` (its queue's leader died with it under
/// way) is sent again and lands; one whose retry finds the delivery no longer live fails
/// with the first attempt's `UNAVAILABLE`: its outcome is unknown, not refused.
#[tokio::test(start_paused = true)]
async fn an_acknowledgement_whose_outcome_is_unknown_is_sent_again() {
    let fake = fake::start(3_000).await;
    fake.receive_answers
        .lock()
        .expect("not poisoned")
        .extend([Ok(deliveries(&["h1"])), Ok(deliveries(&["h2"]))]);
    fake.ack_answers.lock().expect("not poisoned").extend([
        Err(Code::Unavailable),
        Ok(Default::default()),
        Err(Code::Unavailable),
        Err(Code::FailedPrecondition),
    ]);
    let connection = fake.client.open_connection("t").await.expect("open");
    let session = connection
        .create_session(crate::AckMode::Client)
        .await
        .expect("session");
    let opts = crate::ReceiveOptions::no_wait().max(10);
    let first = session.receive("q", opts).await.expect("a delivery");
    session
        .ack(&first)
        .await
        .expect("acknowledged on the retry");
    let second = session.receive("q", opts).await.expect("a delivery");
    let Err(crate::ClientError::Status(s)) = session.ack(&second).await else {
        panic!("the second acknowledgement's outcome is unknown");
    };
    assert_eq!(s.code(), Code::Unavailable, "{s:?}");
    assert!(s.message().contains("may have been applied"), "{s:?}");
    drop(session);
    connection.close().await.expect("closed");
}
