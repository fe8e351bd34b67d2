//! The fake's `Admin` service: only `GetQueue`, which the publisher asks for a queue's dedup
//! window before it resends.

use std::sync::{Arc, Mutex};

use ferry_proto::pb;
use ferry_proto::pb::admin_server::Admin;
use tokio::sync::mpsc;
use tonic::{Request, Response, Status};

use super::{not_faked, Scripted};

/// The dedup window `GetQueue` answers once the scripted answers run out (the server's default).
pub(crate) const DEDUP_WINDOW_DEFAULT_MS: u64 = 600_000;

#[derive(Debug)]
pub(super) struct AdminService {
    pub(super) dedup_windows: Scripted<u64>,
    pub(super) lookups: mpsc::UnboundedSender<String>,
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn get_queue(
        &self,
        r: Request<pb::GetQueueRequest>,
    ) -> Result<Response<pb::GetQueueResponse>, Status> {
        let name = r.into_inner().name;
        let _ = self.lookups.send(name.clone());
        let answer = self.dedup_windows.lock().expect("not poisoned").pop_front();
        let window_ms = match answer {
            Some(Err(code)) => return Err(Status::new(code, "scripted by the test")),
            Some(Ok(ms)) => ms,
            None => DEDUP_WINDOW_DEFAULT_MS,
        };
        let config = pb::QueueConfig {
            dedup_window_ms: Some(window_ms),
            ..Default::default()
        };
        Ok(Response::new(pb::GetQueueResponse {
            queue: Some(pb::QueueInfo {
                name,
                config: Some(config),
                ..Default::default()
            }),
            ..Default::default()
        }))
    }

    type WatchEventsStream = tokio_stream::Empty<Result<pb::Event, Status>>;

    async fn create_queue(
        &self,
        _: Request<pb::CreateQueueRequest>,
    ) -> Result<Response<pb::CreateQueueResponse>, Status> {
        not_faked("create_queue")
    }

    async fn list_queues(
        &self,
        _: Request<pb::ListQueuesRequest>,
    ) -> Result<Response<pb::ListQueuesResponse>, Status> {
        not_faked("list_queues")
    }

    async fn delete_queue(
        &self,
        _: Request<pb::DeleteQueueRequest>,
    ) -> Result<Response<pb::DeleteQueueResponse>, Status> {
        not_faked("delete_queue")
    }

    async fn purge_queue(
        &self,
        _: Request<pb::PurgeQueueRequest>,
    ) -> Result<Response<pb::PurgeQueueResponse>, Status> {
        not_faked("purge_queue")
    }

    async fn get_queue_stats(
        &self,
        _: Request<pb::GetQueueStatsRequest>,
    ) -> Result<Response<pb::GetQueueStatsResponse>, Status> {
        not_faked("get_queue_stats")
    }

    async fn delete_message(
        &self,
        _: Request<pb::DeleteMessageRequest>,
    ) -> Result<Response<pb::DeleteMessageResponse>, Status> {
        not_faked("delete_message")
    }

    async fn list_connections(
        &self,
        _: Request<pb::ListConnectionsRequest>,
    ) -> Result<Response<pb::ListConnectionsResponse>, Status> {
        not_faked("list_connections")
    }

    async fn close_connection(
        &self,
        _: Request<pb::AdminCloseConnectionRequest>,
    ) -> Result<Response<pb::AdminCloseConnectionResponse>, Status> {
        not_faked("close_connection")
    }

    async fn move_messages(
        &self,
        _: Request<pb::MoveMessagesRequest>,
    ) -> Result<Response<pb::MoveTask>, Status> {
        not_faked("move_messages")
    }

    async fn get_move_task(
        &self,
        _: Request<pb::GetMoveTaskRequest>,
    ) -> Result<Response<pb::MoveTask>, Status> {
        not_faked("get_move_task")
    }

    async fn watch_events(
        &self,
        _: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<Self::WatchEventsStream>, Status> {
        not_faked("watch_events")
    }

    async fn get_message_history(
        &self,
        _: Request<pb::GetMessageHistoryRequest>,
    ) -> Result<Response<pb::GetMessageHistoryResponse>, Status> {
        not_faked("get_message_history")
    }

    async fn update_queue(
        &self,
        _: Request<pb::UpdateQueueRequest>,
    ) -> Result<Response<pb::UpdateQueueResponse>, Status> {
        not_faked("update_queue")
    }
}

/// What a test scripts and sees of the fake's `Admin` service.
pub(super) fn service() -> (AdminService, Scripted<u64>, mpsc::UnboundedReceiver<String>) {
    let dedup_windows: Scripted<u64> = Arc::new(Mutex::new(Default::default()));
    let (lookups, seen) = mpsc::unbounded_channel();
    let service = AdminService {
        dedup_windows: dedup_windows.clone(),
        lookups,
    };
    (service, dedup_windows, seen)
}
