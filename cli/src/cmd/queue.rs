use anyhow::Context as _;
use comfy_table::Table;
use ferry_proto::pb;
use serde_json::json;

use super::{connect, ClientArgs};
use crate::output::Format;

#[derive(Debug, clap::Subcommand)]
pub enum QueueCommand {
    /// Create a queue.
    Create {
        name: String,
        /// Succeed if it already exists.
        #[arg(long)]
        if_not_exists: bool,
        /// Lease of a delivery when the receiver asks for none.
        #[arg(long)]
        lease_ms: Option<u64>,
        /// Largest message (body + properties + headers).
        #[arg(long)]
        max_message_size_bytes: Option<u64>,
    },
    /// List queues.
    List,
    /// Delete a queue and its messages.
    Delete { name: String },
    /// Remove every message that is not currently being processed.
    Purge { name: String },
    /// Show statistics of one queue, or of every queue.
    Stats { name: Option<String> },
}

pub async fn run(c: &ClientArgs, cmd: QueueCommand) -> anyhow::Result<()> {
    let mut admin = connect(c).await?.admin();
    match cmd {
        QueueCommand::Create {
            name,
            if_not_exists,
            lease_ms,
            max_message_size_bytes,
        } => {
            let config = pb::QueueConfig {
                default_lease_ms: lease_ms,
                max_message_size_bytes,
                ..Default::default()
            };
            let r = admin
                .create_queue(pb::CreateQueueRequest {
                    name: name.clone(),
                    config: Some(config),
                    if_not_exists,
                })
                .await
                .with_context(|| format!("cannot create queue {name}"))?
                .into_inner();
            let owner = r.queue.map(|q| q.owner_node).unwrap_or_default();
            match c.output {
                Format::Json => println!(
                    "{}",
                    json!({ "queue": name, "created": r.created, "owner_node": owner })
                ),
                Format::Human if r.created => println!("created queue {name} on {owner}"),
                Format::Human => println!("queue {name} already exists (on {owner})"),
            }
        }
        QueueCommand::List => {
            let queues = admin
                .list_queues(pb::ListQueuesRequest {})
                .await?
                .into_inner()
                .queues;
            match c.output {
                Format::Json => {
                    for q in queues {
                        println!(
                            "{}",
                            json!({ "name": q.name, "owner_node": q.owner_node, "temporary": q.temporary })
                        );
                    }
                }
                Format::Human => {
                    let mut t = Table::new();
                    t.set_header(["queue", "owner", "temporary"]);
                    for q in queues {
                        t.add_row([
                            q.name,
                            q.owner_node,
                            if q.temporary {
                                "yes".into()
                            } else {
                                String::new()
                            },
                        ]);
                    }
                    println!("{t}");
                }
            }
        }
        QueueCommand::Delete { name } => {
            let r = admin
                .delete_queue(pb::DeleteQueueRequest { name: name.clone() })
                .await
                .with_context(|| format!("cannot delete queue {name}"))?
                .into_inner();
            match c.output {
                Format::Json => println!(
                    "{}",
                    json!({ "queue": name, "deleted_messages": r.deleted_messages })
                ),
                Format::Human => println!("deleted queue {name} ({} messages)", r.deleted_messages),
            }
        }
        QueueCommand::Purge { name } => {
            let r = admin
                .purge_queue(pb::PurgeQueueRequest { name: name.clone() })
                .await
                .with_context(|| format!("cannot purge queue {name}"))?
                .into_inner();
            match c.output {
                Format::Json => println!("{}", json!({ "queue": name, "purged": r.purged })),
                Format::Human => println!("purged {} messages from {name}", r.purged),
            }
        }
        QueueCommand::Stats { name } => {
            let queues = admin
                .get_queue_stats(pb::GetQueueStatsRequest {
                    name: name.unwrap_or_default(),
                })
                .await?
                .into_inner()
                .queues;
            match c.output {
                Format::Json => {
                    for s in queues {
                        println!("{}", stats_json(&s));
                    }
                }
                Format::Human => {
                    let mut t = Table::new();
                    t.set_header([
                        "queue",
                        "ready",
                        "scheduled",
                        "leased",
                        "consumers",
                        "bytes",
                        "sent",
                        "acked",
                        "redelivered",
                        "owner",
                    ]);
                    for s in queues {
                        t.add_row([
                            s.name,
                            s.ready.to_string(),
                            s.scheduled.to_string(),
                            s.leased.to_string(),
                            s.consumers.to_string(),
                            s.bytes.to_string(),
                            s.sent_total.to_string(),
                            s.acked_total.to_string(),
                            s.redelivered_total.to_string(),
                            s.owner_node,
                        ]);
                    }
                    println!("{t}");
                }
            }
        }
    }
    Ok(())
}

fn stats_json(s: &pb::QueueStats) -> serde_json::Value {
    json!({
        "queue": s.name,
        "ready": s.ready,
        "scheduled": s.scheduled,
        "leased": s.leased,
        "consumers": s.consumers,
        "bytes": s.bytes,
        "sent_total": s.sent_total,
        "delivered_total": s.delivered_total,
        "redelivered_total": s.redelivered_total,
        "acked_total": s.acked_total,
        "expired_total": s.expired_total,
        "lease_expired_total": s.lease_expired_total,
        "purged_total": s.purged_total,
        "owner_node": s.owner_node,
    })
}
