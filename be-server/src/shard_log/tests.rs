#![allow(clippy::unwrap_used)]

use std::sync::{Arc, Mutex};

use ferry_kernel::QueueUid;
use ferry_store::{decode_entry, KvOp, KvSpace, StoreError, StoreOp};
use tokio::sync::oneshot;

use super::{ProposalOutcome, ShardId, ShardLog, ShardProposer, ShardRefusal};
use crate::log::{LogError, LogSync, QueueLog};

/// The term every test's run leads its shard at.
const TERM: u64 = 3;

type Proposed = (ShardId, Vec<u8>, oneshot::Sender<Result<(), ShardRefusal>>);

/// Keeps every proposal for the test to answer.
#[derive(Debug, Default)]
struct Fake(Mutex<Vec<Proposed>>);

impl ShardProposer for Fake {
    fn propose(&self, shard: ShardId, term: u64, entry: Vec<u8>) -> ProposalOutcome {
        assert_eq!(term, TERM, "every proposal at the run's term");
        let (tx, rx) = oneshot::channel();
        self.0.lock().unwrap().push((shard, entry, tx));
        rx
    }
}

fn setup() -> (Arc<Fake>, ShardLog) {
    let fake = Arc::new(Fake::default());
    let log = ShardLog::new(
        ShardId(4),
        TERM,
        Arc::clone(&fake) as Arc<dyn ShardProposer>,
        Arc::new(tokio::sync::watch::Sender::new(0)),
        super::new_commit_histogram(),
    );
    (fake, log)
}

fn delete(uid: u64) -> Vec<StoreOp> {
    vec![StoreOp::DeleteQueue(QueueUid(uid))]
}

#[tokio::test]
async fn batches_are_proposed_in_order_as_entries_and_durable_once_applied() {
    let (fake, log) = setup();
    let first = log.submit(delete(1), LogSync::Now).await.unwrap();
    let second = log.submit(delete(2), LogSync::Deferred).await.unwrap();
    let proposed: Vec<Proposed> = std::mem::take(&mut *fake.0.lock().unwrap());
    let entries: Vec<Vec<StoreOp>> = proposed
        .iter()
        .map(|(shard, entry, _)| {
            assert_eq!(*shard, ShardId(4));
            decode_entry(entry).unwrap()
        })
        .collect();
    assert_eq!(entries, [delete(1), delete(2)]);
    let mut senders = proposed.into_iter().map(|(_, _, tx)| tx);
    senders.next().unwrap().send(Ok(())).unwrap();
    assert_eq!(first.await, Ok(()));
    let not_leader = ShardRefusal::NotLeader {
        shard: ShardId(4),
        leader: Some("n2".into()),
    };
    senders
        .next()
        .unwrap()
        .send(Err(not_leader.clone()))
        .unwrap();
    assert_eq!(second.await, Err(LogError::Shard(not_leader)));
    // Confirmed batches are timed; a refused one is not.
    assert_eq!(log.commit_micros.snapshot().count, 1);
}

#[tokio::test]
async fn a_proposal_whose_driver_stopped_has_an_unknown_outcome() {
    let (fake, log) = setup();
    let durable = log.submit(delete(1), LogSync::Now).await.unwrap();
    fake.0.lock().unwrap().clear();
    let e = durable.await.unwrap_err();
    assert!(
        matches!(
            &e,
            LogError::Shard(ShardRefusal::Unknown {
                shard: ShardId(4),
                ..
            })
        ),
        "{e}"
    );
    assert!(e.to_string().contains("outcome"), "{e}");
}

#[tokio::test]
async fn a_batch_no_shard_entry_can_carry_is_refused_before_it_is_proposed() {
    let (fake, log) = setup();
    let kv = StoreOp::Kv(KvOp::Delete {
        space: KvSpace::RaftApp,
        key: b"k".to_vec(),
    });
    let e = log.submit(vec![kv], LogSync::Now).await.unwrap_err();
    assert!(
        matches!(e, LogError::Store(StoreError::Corrupt { .. })),
        "{e}"
    );
    assert!(fake.0.lock().unwrap().is_empty());
}

/// After a batch that is not confirmed the log refuses every later batch at once (proposing
/// nothing), and says so once on its fence channel; batches already proposed still resolve.
#[tokio::test]
async fn a_batch_not_confirmed_fences_the_log() {
    let fake = Arc::new(Fake::default());
    let fences = Arc::new(tokio::sync::watch::Sender::new(0u64));
    let mut seen = fences.subscribe();
    let log = ShardLog::new(
        ShardId(4),
        TERM,
        Arc::clone(&fake) as Arc<dyn ShardProposer>,
        Arc::clone(&fences),
        super::new_commit_histogram(),
    );
    let first = log.submit(delete(1), LogSync::Now).await.unwrap();
    let second = log.submit(delete(2), LogSync::Now).await.unwrap();
    let mut senders: Vec<_> = std::mem::take(&mut *fake.0.lock().unwrap())
        .into_iter()
        .map(|(_, _, tx)| tx)
        .collect();
    let not_leader = ShardRefusal::NotLeader {
        shard: ShardId(4),
        leader: None,
    };
    senders.remove(0).send(Err(not_leader.clone())).unwrap();
    assert_eq!(first.await, Err(LogError::Shard(not_leader)));
    assert!(log.is_fenced());
    assert!(seen.has_changed().unwrap());
    assert_eq!(*seen.borrow_and_update(), 1);
    // The batch proposed before the fence resolves as the shard decides.
    senders.remove(0).send(Ok(())).unwrap();
    assert_eq!(second.await, Ok(()));
    let refused = log.submit(delete(3), LogSync::Now).await.unwrap_err();
    assert!(
        matches!(refused, LogError::Shard(ShardRefusal::Unknown { .. })),
        "{refused}"
    );
    assert!(
        fake.0.lock().unwrap().is_empty(),
        "nothing proposed after the fence"
    );
    // A second failure does not announce the fence again.
    let clone = log.clone();
    clone.fence();
    assert!(!seen.has_changed().unwrap());
}
