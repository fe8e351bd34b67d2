//! `ferry message`: one message at a time.

use anyhow::Context as _;
use ferry_proto::pb;
use serde_json::json;

use super::{connect, ClientArgs};
use crate::output::{errln, outln, Format};

#[derive(Debug, clap::Subcommand)]
pub enum MessageCommand {
    /// Every step of a message's life kept by the nodes: sent, delivered to which session,
    /// returned and why, redelivery delays, acknowledged, expired, dead-lettered.
    History {
        /// The id `ferry send` printed (ID:...).
        message_id: String,
    },
    /// Delete one message by its id (refused while a consumer holds it).
    Delete {
        /// The queue the message is in.
        #[arg(long, short)]
        queue: String,
        /// The id `ferry send` printed (ID:...).
        message_id: String,
    },
}

pub async fn run(c: &ClientArgs, cmd: MessageCommand) -> anyhow::Result<()> {
    let mut admin = connect(c).await?.admin();
    match cmd {
        MessageCommand::History { message_id } => {
            let pb::GetMessageHistoryResponse {
                steps,
                unreachable_nodes,
            } = admin
                .get_message_history(pb::GetMessageHistoryRequest {
                    message_id: message_id.clone(),
                })
                .await
                .with_context(|| format!("cannot show the history of {message_id}"))?
                .into_inner();
            if !unreachable_nodes.is_empty() {
                errln!(
                    "warning: nodes {} could not be asked (down or cut off): steps kept there are missing",
                    unreachable_nodes.join(", ")
                );
            }
            match c.output {
                Format::Json => {
                    for s in steps {
                        outln!(
                            "{}",
                            json!({
                                "at_ms": s.at_ms,
                                "queue": s.queue,
                                "event": s.event,
                                "detail": s.detail,
                                "node": s.node,
                                "deliver_at_ms": s.deliver_at_ms,
                            })
                        )?;
                    }
                }
                Format::Human => {
                    let mut t = comfy_table::Table::new();
                    t.set_header(["at (ms since epoch)", "queue", "event", "detail", "node"]);
                    for s in steps {
                        t.add_row([s.at_ms.to_string(), s.queue, s.event, s.detail, s.node]);
                    }
                    outln!("{t}")?;
                }
            }
        }
        MessageCommand::Delete { queue, message_id } => {
            admin
                .delete_message(pb::DeleteMessageRequest {
                    queue: queue.clone(),
                    message_id: message_id.clone(),
                })
                .await
                .with_context(|| format!("cannot delete {message_id} from {queue}"))?;
            match c.output {
                Format::Json => outln!("{}", json!({ "queue": queue, "deleted": message_id }))?,
                Format::Human => outln!("deleted {message_id} from {queue}")?,
            }
        }
    }
    Ok(())
}
