//! Queue calls of the `Messaging` service: temporary queues and browsing.

use ferry_proto::pb;
use tonic::{Request, Status};

use super::{queue_name, Dispatch};

/// Browse pages: the default and the largest number of messages in one.
const BROWSE_PAGE_DEFAULT: u32 = 100;
const BROWSE_PAGE_MAX: u32 = 1_000;

impl Dispatch {
    pub(crate) async fn create_temporary_queue(
        &self,
        r: pb::CreateTemporaryQueueRequest,
    ) -> Result<pb::CreateTemporaryQueueResponse, Status> {
        let connection = r.connection_id;
        let name = self
            .sessions
            .add_temporary_queue(&connection, self.router.local_node())?;
        // Named after this node, so placement puts it here: the requester is here.
        let created = self
            .router
            .call(&name, |be, placement_epoch| {
                let create = pb::BackendCreateQueueRequest {
                    name: name.to_string(),
                    temporary: true,
                    placement_epoch: placement_epoch.get(),
                    ..Default::default()
                };
                async move { be.create_queue(Request::new(create)).await }
            })
            .await;
        if let Err(e) = created {
            let _ = self.sessions.remove_temporary_queue(&connection, &name);
            return Err(e);
        }
        Ok(pb::CreateTemporaryQueueResponse {
            queue: name.to_string(),
        })
    }

    pub(crate) async fn delete_temporary_queue(
        &self,
        r: pb::DeleteTemporaryQueueRequest,
    ) -> Result<pb::DeleteTemporaryQueueResponse, Status> {
        let queue = queue_name(&r.queue)?;
        self.sessions
            .remove_temporary_queue(&r.connection_id, &queue)?;
        self.router
            .call(&queue, |be, placement_epoch| {
                let req = pb::BackendQueueRequest {
                    name: r.queue.clone(),
                    placement_epoch: placement_epoch.get(),
                    wait_placed_ms: 0,
                    wait_settings: None,
                };
                async move { be.delete_queue(Request::new(req)).await }
            })
            .await?;
        Ok(pb::DeleteTemporaryQueueResponse {})
    }

    pub(crate) async fn browse(&self, r: pb::BrowseRequest) -> Result<pb::BrowseResponse, Status> {
        let queue = queue_name(&r.queue)?;
        let after_seq = if r.page_token.is_empty() {
            0
        } else {
            r.page_token.parse().map_err(|_| {
                Status::invalid_argument(
                    "page_token: pass back the next_page_token of the previous answer",
                )
            })?
        };
        let max_messages = if r.max_messages == 0 {
            BROWSE_PAGE_DEFAULT
        } else {
            r.max_messages.min(BROWSE_PAGE_MAX)
        };
        let out = self
            .router
            .call(&queue, |be, placement_epoch| {
                let req = pb::BackendBrowseRequest {
                    queue: r.queue.clone(),
                    max_messages,
                    after_seq,
                    selector: r.selector.clone(),
                    placement_epoch: placement_epoch.get(),
                };
                async move { be.browse(Request::new(req)).await }
            })
            .await?;
        let next_page_token = match out.resume_after_seq {
            0 => String::new(),
            seq => seq.to_string(),
        };
        Ok(pb::BrowseResponse {
            messages: out.messages,
            next_page_token,
        })
    }
}
