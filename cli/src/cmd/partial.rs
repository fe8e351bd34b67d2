//! Listings that asked every node and got answers from only some (`queue list`, `queue stats`):
//! the command prints what it got, then names the nodes that did not answer, and exits with
//! [`EXIT_PARTIAL`] so a script cannot take a partial answer for the whole.
//!
//! Human output: one warning line on stderr per missing node, with why and which queues are
//! missing. `-o json`: one more JSON object per missing node, after the listing's lines:
//! `{"unreachable_node": "n3", "reason": "...", "queues": ["c", "c.DLQ"]}`.

use ferry_proto::pb;
use serde_json::json;

use crate::output::{errln, outln, Format, StdoutClosed};

/// The exit status of a command that printed a partial answer.
pub const EXIT_PARTIAL: u8 = 3;

/// Ends a command whose answer missed some nodes: they were named already; the binary exits
/// with [`EXIT_PARTIAL`] and prints nothing more.
#[derive(Debug, thiserror::Error)]
#[error("partial answer: {} did not answer", nodes.join(", "))]
pub struct PartialAnswer {
    pub nodes: Vec<String>,
}

/// Names the nodes that did not answer (nothing when all did).
pub(crate) fn tell(
    format: Format,
    unreachable: &[pb::UnreachableNode],
) -> Result<(), StdoutClosed> {
    for u in unreachable {
        match format {
            Format::Json => outln!("{}", unreachable_json(u))?,
            Format::Human => {
                let missing = if u.queues.is_empty() {
                    "whatever it holds is missing above".to_owned()
                } else {
                    format!("its queues are missing above: {}", u.queues.join(", "))
                };
                errln!(
                    "warning: partial answer: node {} did not answer ({}); {missing}",
                    u.node_id,
                    u.reason
                );
            }
        }
    }
    Ok(())
}

/// One node that did not answer, as a JSON line.
pub(crate) fn unreachable_json(u: &pb::UnreachableNode) -> serde_json::Value {
    json!({ "unreachable_node": u.node_id, "reason": u.reason, "queues": u.queues })
}

/// Fails with [`PartialAnswer`] when a node did not answer.
pub(crate) fn complete(unreachable: &[pb::UnreachableNode]) -> anyhow::Result<()> {
    if unreachable.is_empty() {
        return Ok(());
    }
    Err(PartialAnswer {
        nodes: unreachable.iter().map(|u| u.node_id.clone()).collect(),
    }
    .into())
}

/// Every queue of the cluster through `admin`, a page at a time, and the nodes that did not
/// answer (as the last page named them).
pub(crate) async fn list_queues(
    admin: &mut pb::admin_client::AdminClient<tonic::transport::Channel>,
) -> anyhow::Result<(Vec<pb::QueueInfo>, Vec<pb::UnreachableNode>)> {
    let mut queues = vec![];
    let mut page_token = String::new();
    loop {
        let page = admin
            .list_queues(pb::ListQueuesRequest {
                page_size: 0,
                page_token,
            })
            .await?
            .into_inner();
        queues.extend(page.queues);
        if page.next_page_token.is_empty() {
            return Ok((queues, page.unreachable_nodes));
        }
        page_token = page.next_page_token;
    }
}
