//! A fake back-end for unit tests: records every call (method, queues, placement epochs) and
//! answers from a script first (errors such as "not the owner"), then with an empty success.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use ferry_kernel::PlacementEpoch;
use ferry_proto::{pb, EventStream};
use tonic::{Request, Response, Status};

use crate::BackendRef;

/// One call a fake back-end received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub(crate) method: &'static str,
    pub(crate) queues: Vec<String>,
    pub(crate) epochs: Vec<PlacementEpoch>,
}

type Hook = Box<dyn FnOnce() + Send>;

/// See the module docs.
#[derive(Default)]
pub(crate) struct FakeBackend {
    calls: Mutex<Vec<Call>>,
    script: Mutex<VecDeque<Status>>,
    /// Run once, when the first scripted answer is given (before the caller sees it).
    on_scripted: Mutex<Option<Hook>>,
    /// Answer every call with this, after the script.
    always: Mutex<Option<Status>>,
    /// How many messages each `send` carried.
    sent: Mutex<Vec<usize>>,
    /// Receives wait for ever (a receive parked at an empty queue).
    park_receives: std::sync::atomic::AtomicBool,
    /// Listings wait for ever (a paused node).
    park_listings: std::sync::atomic::AtomicBool,
    /// `GetQueue` calls wait for ever (a node cut off).
    park_get_queue: std::sync::atomic::AtomicBool,
    /// The next receives answer these receipt handles, one receive each (after the script).
    deliveries: Mutex<VecDeque<Vec<String>>>,
    /// What each `release_lost` named to keep: (seq, lease) pairs.
    kept: Mutex<Vec<Vec<(u64, u64)>>>,
}

impl std::fmt::Debug for FakeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeBackend").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FakeBackend {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    pub(crate) fn backend(self: &Arc<Self>) -> BackendRef {
        self.clone()
    }

    /// The next calls are answered with these, in order.
    pub(crate) fn script(&self, answers: impl IntoIterator<Item = Status>) {
        lock(&self.script).extend(answers);
    }

    /// Runs `hook` when the first scripted answer is given.
    pub(crate) fn on_scripted(&self, hook: impl FnOnce() + Send + 'static) {
        *lock(&self.on_scripted) = Some(Box::new(hook));
    }

    /// Receives from now on wait for ever, as at an empty queue (they are still recorded).
    pub(crate) fn park_receives(&self) {
        self.park_receives
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Receives from now on are answered again (those parked stay parked).
    pub(crate) fn unpark_receives(&self) {
        self.park_receives
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// Listings from now on never answer, as a paused node's (they are still recorded).
    pub(crate) fn park_listings(&self) {
        self.park_listings
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// `GetQueue` calls from now on never answer, as a node cut off (they are still recorded).
    pub(crate) fn park_get_queue(&self) {
        self.park_get_queue
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// The next receive that succeeds answers deliveries with these receipt handles.
    pub(crate) fn deliver(&self, handles: Vec<String>) {
        lock(&self.deliveries).push_back(handles);
    }

    /// What each `release_lost` asked to keep, in order.
    pub(crate) fn kept(&self) -> Vec<Vec<(u64, u64)>> {
        lock(&self.kept).clone()
    }

    /// Every call is answered with `status` (after the script).
    pub(crate) fn always(&self, status: Status) {
        *lock(&self.always) = Some(status);
    }

    /// How many messages each `send` carried, in order.
    pub(crate) fn sent(&self) -> Vec<usize> {
        lock(&self.sent).clone()
    }

    pub(crate) fn calls(&self) -> Vec<Call> {
        lock(&self.calls).clone()
    }

    fn answer<T: Default>(
        &self,
        method: &'static str,
        queues: Vec<String>,
        epochs: Vec<u64>,
    ) -> Result<Response<T>, Status> {
        lock(&self.calls).push(Call {
            method,
            queues,
            epochs: epochs.into_iter().map(PlacementEpoch::new).collect(),
        });
        let scripted = lock(&self.script).pop_front();
        if let Some(status) = scripted {
            if let Some(hook) = lock(&self.on_scripted).take() {
                hook();
            }
            return Err(status);
        }
        if let Some(status) = lock(&self.always).clone() {
            return Err(status);
        }
        Ok(Response::new(T::default()))
    }
}

type Reply<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl pb::backend_server::Backend for FakeBackend {
    async fn create_queue(
        &self,
        r: Request<pb::BackendCreateQueueRequest>,
    ) -> Reply<pb::QueueInfo> {
        let r = r.into_inner();
        self.answer("create_queue", vec![r.name], vec![r.placement_epoch])
    }
    async fn get_queue(&self, r: Request<pb::BackendQueueRequest>) -> Reply<pb::QueueInfo> {
        let r = r.into_inner();
        let answer = self.answer("get_queue", vec![r.name], vec![r.placement_epoch]);
        if self
            .park_get_queue
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            std::future::pending::<()>().await;
        }
        answer
    }
    async fn list_queues(
        &self,
        _: Request<pb::BackendListQueuesRequest>,
    ) -> Reply<pb::BackendListQueuesResponse> {
        let answer = self.answer("list_queues", vec![], vec![]);
        if self
            .park_listings
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            std::future::pending::<()>().await;
        }
        answer
    }
    async fn delete_queue(
        &self,
        r: Request<pb::BackendQueueRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = r.into_inner();
        self.answer("delete_queue", vec![r.name], vec![r.placement_epoch])
    }
    async fn purge_queue(
        &self,
        r: Request<pb::BackendQueueRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = r.into_inner();
        self.answer("purge_queue", vec![r.name], vec![r.placement_epoch])
    }
    async fn get_queue_stats(&self, r: Request<pb::BackendQueueRequest>) -> Reply<pb::QueueStats> {
        let r = r.into_inner();
        self.answer("get_queue_stats", vec![r.name], vec![r.placement_epoch])
    }
    async fn send(&self, r: Request<pb::BackendSendRequest>) -> Reply<pb::BackendSendResponse> {
        let r = r.into_inner();
        lock(&self.sent).push(r.messages.len());
        self.answer("send", vec![r.queue], vec![r.placement_epoch])
    }
    async fn receive(
        &self,
        r: Request<pb::BackendReceiveRequest>,
    ) -> Reply<pb::BackendReceiveResponse> {
        let r = r.into_inner();
        let answer = self
            .answer::<pb::BackendReceiveResponse>("receive", vec![r.queue], vec![r.placement_epoch])
            .map(|_| {
                let handles = lock(&self.deliveries).pop_front().unwrap_or_default();
                let deliveries = handles
                    .into_iter()
                    .map(|receipt_handle| pb::Delivery {
                        receipt_handle,
                        ..Default::default()
                    })
                    .collect();
                Response::new(pb::BackendReceiveResponse { deliveries })
            });
        if self
            .park_receives
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            std::future::pending::<()>().await;
        }
        answer
    }
    async fn ack(&self, r: Request<pb::BackendLeaseRequest>) -> Reply<pb::BackendLeaseResponse> {
        let r = r.into_inner();
        self.answer("ack", vec![r.queue], vec![r.placement_epoch])
    }
    async fn nack(&self, r: Request<pb::BackendLeaseRequest>) -> Reply<pb::BackendLeaseResponse> {
        let r = r.into_inner();
        self.answer("nack", vec![r.queue], vec![r.placement_epoch])
    }
    async fn extend_lease(
        &self,
        r: Request<pb::BackendLeaseRequest>,
    ) -> Reply<pb::BackendLeaseResponse> {
        let r = r.into_inner();
        self.answer("extend_lease", vec![r.queue], vec![r.placement_epoch])
    }
    async fn release_session(
        &self,
        r: Request<pb::BackendReleaseSessionRequest>,
    ) -> Reply<pb::BackendReleaseSessionResponse> {
        let r = r.into_inner();
        self.answer("release_session", r.queues, r.placement_epochs)
    }
    async fn browse(
        &self,
        r: Request<pb::BackendBrowseRequest>,
    ) -> Reply<pb::BackendBrowseResponse> {
        let r = r.into_inner();
        self.answer("browse", vec![r.queue], vec![r.placement_epoch])
    }
    async fn commit(
        &self,
        r: Request<pb::BackendCommitRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = r.into_inner();
        let (queues, epochs) = r
            .queues
            .into_iter()
            .map(|q| (q.queue, q.placement_epoch))
            .unzip();
        self.answer("commit", queues, epochs)
    }
    async fn rollback(
        &self,
        r: Request<pb::BackendRollbackRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = r.into_inner();
        self.answer("rollback", r.queues, r.placement_epochs)
    }
    async fn delete_message(
        &self,
        r: Request<pb::BackendDeleteMessageRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = r.into_inner();
        self.answer("delete_message", vec![r.queue], vec![r.placement_epoch])
    }

    type WatchEventsStream = EventStream;

    async fn watch_events(
        &self,
        _: Request<pb::BackendWatchEventsRequest>,
    ) -> Reply<Self::WatchEventsStream> {
        Ok(Response::new(Box::pin(tokio_stream::empty())))
    }

    async fn get_message_history(
        &self,
        _: Request<pb::GetMessageHistoryRequest>,
    ) -> Reply<pb::GetMessageHistoryResponse> {
        self.answer("get_message_history", vec![], vec![])
    }

    async fn seal_queue(
        &self,
        r: Request<pb::BackendSealQueueRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = r.into_inner();
        self.answer("seal_queue", vec![r.name], vec![r.placement_epoch])
    }

    async fn session_leases(
        &self,
        r: Request<pb::BackendSessionLeasesRequest>,
    ) -> Reply<pb::BackendSessionLeasesResponse> {
        let r = r.into_inner();
        self.answer("session_leases", vec![r.queue], vec![r.placement_epoch])
    }

    async fn release_lost(
        &self,
        r: Request<pb::BackendReleaseLostRequest>,
    ) -> Reply<pb::BackendCountResponse> {
        let r = r.into_inner();
        let kept = r
            .held_seqs
            .iter()
            .copied()
            .zip(r.held_leases.iter().copied());
        lock(&self.kept).push(kept.collect());
        self.answer("release_lost", vec![r.queue], vec![r.placement_epoch])
    }
}
