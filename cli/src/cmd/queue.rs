use anyhow::Context as _;
use comfy_table::Table;
use ferry_proto::pb;
use serde_json::json;

use super::{connect, ClientArgs};
use crate::output::{outln, Format};

#[derive(Debug, clap::Subcommand)]
pub enum QueueCommand {
    /// Create a queue.
    Create {
        name: String,
        /// Succeed if it already exists.
        #[arg(long)]
        if_not_exists: bool,
        /// Put it on this node (its node id); default: the node owning the fewest queues.
        #[arg(long)]
        node: Option<String>,
        /// Lease of a delivery when the receiver asks for none.
        #[arg(long)]
        lease_ms: Option<u64>,
        /// Largest message (body + properties + headers).
        #[arg(long)]
        max_message_size_bytes: Option<u64>,
        /// The most messages the queue may hold (ready, delayed, delivered and not acknowledged);
        /// a send over it fails. 0 or absent: no limit.
        #[arg(long)]
        max_messages: Option<u64>,
        /// The most bytes of messages the queue may hold; a send over it fails. 0 or absent: no
        /// limit.
        #[arg(long)]
        max_bytes: Option<u64>,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Show a queue's settings.
    Show { name: String },
    /// List queues.
    List,
    /// Delete a queue and its messages.
    Delete { name: String },
    /// Remove every message that is not currently being processed.
    Purge { name: String },
    /// Move messages (all, or those a selector matches) to another queue, at most --rate per
    /// second, as a background task on the node; shows its progress until it ends.
    Move {
        #[arg(long)]
        from: String,
        #[arg(long)]
        to: String,
        #[arg(long)]
        selector: Option<String>,
        /// Messages per second; 0: as fast as possible.
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Stop after this many; 0: until none is left.
        #[arg(long, default_value_t = 0)]
        max: u64,
        /// Print the task id and return at once (follow it with `ferry queue move-status`).
        #[arg(long)]
        detach: bool,
    },
    /// Show a move task's progress.
    MoveStatus { task_id: String },
    /// Show statistics of one queue, or of every queue.
    Stats {
        name: Option<String>,
        /// Show them again every --interval-ms until interrupted.
        #[arg(long)]
        watch: bool,
        #[arg(long, default_value_t = 1_000)]
        interval_ms: u64,
    },
}

/// Redelivery, dead-letter and dedup settings of a new queue; unset ones keep the server's
/// defaults (6 redeliveries without delay, dead letters and expired messages to `<queue>.DLQ`,
/// a 10-minute dedup window).
#[derive(Debug, clap::Args)]
pub struct PolicyArgs {
    /// Deliveries after the first before a message is dead-lettered.
    #[arg(long, conflicts_with = "unlimited_redeliveries")]
    max_redeliveries: Option<u32>,
    /// Redeliver for ever.
    #[arg(long)]
    unlimited_redeliveries: bool,
    /// Delay before the first redelivery.
    #[arg(long)]
    redelivery_initial_delay_ms: Option<u64>,
    /// Delay before later redeliveries (the base of exponential backoff).
    #[arg(long)]
    redelivery_delay_ms: Option<u64>,
    /// Multiply the delay by --backoff-multiplier at each redelivery.
    #[arg(long)]
    exponential_backoff: bool,
    #[arg(long)]
    backoff_multiplier: Option<f64>,
    /// Spread each delay by up to ± this percent at random.
    #[arg(long)]
    collision_avoidance_percent: Option<u32>,
    /// Cap on every redelivery delay.
    #[arg(long)]
    max_redelivery_delay_ms: Option<u64>,
    /// Where messages go after their last delivery or when rejected (default <queue>.DLQ).
    #[arg(long, conflicts_with = "discard_dead_letters")]
    dead_letter_queue: Option<String>,
    /// Drop such messages instead (they are counted).
    #[arg(long)]
    discard_dead_letters: bool,
    /// Where expired messages go (default <queue>.DLQ).
    #[arg(long, conflicts_with = "discard_expired")]
    expiry_queue: Option<String>,
    /// Drop expired messages instead (they are counted).
    #[arg(long)]
    discard_expired: bool,
    /// How long a producer dedup id is remembered; 0 turns dedup off.
    #[arg(long)]
    dedup_window_ms: Option<u64>,
}

impl PolicyArgs {
    fn apply(self, config: &mut pb::QueueConfig) {
        use pb::dead_letter_target::Target;
        let target = |queue: Option<String>, discard: bool| {
            if discard {
                Some(pb::DeadLetterTarget {
                    target: Some(Target::Discard(true)),
                })
            } else {
                queue.map(|q| pb::DeadLetterTarget {
                    target: Some(Target::Queue(q)),
                })
            }
        };
        config.redelivery = Some(pb::RedeliveryPolicy {
            max_redeliveries: self.max_redeliveries,
            unlimited_redeliveries: self.unlimited_redeliveries,
            initial_delay_ms: self.redelivery_initial_delay_ms,
            delay_ms: self.redelivery_delay_ms,
            exponential_backoff: self.exponential_backoff.then_some(true),
            backoff_multiplier: self.backoff_multiplier,
            collision_avoidance_percent: self.collision_avoidance_percent,
            max_delay_ms: self.max_redelivery_delay_ms,
        });
        config.dead_letter = target(self.dead_letter_queue, self.discard_dead_letters);
        config.expiry = target(self.expiry_queue, self.discard_expired);
        config.dedup_window_ms = self.dedup_window_ms;
    }
}

fn target_text(t: Option<&pb::DeadLetterTarget>) -> String {
    match t.and_then(|t| t.target.as_ref()) {
        Some(pb::dead_letter_target::Target::Queue(q)) => q.clone(),
        Some(pb::dead_letter_target::Target::Discard(true)) => "discard".into(),
        _ => "default".into(),
    }
}

pub async fn run(c: &ClientArgs, cmd: QueueCommand) -> anyhow::Result<()> {
    let mut admin = connect(c).await?.admin();
    match cmd {
        QueueCommand::Create {
            name,
            if_not_exists,
            node,
            lease_ms,
            max_message_size_bytes,
            max_messages,
            max_bytes,
            policy,
        } => {
            let mut config = pb::QueueConfig {
                default_lease_ms: lease_ms,
                max_message_size_bytes,
                max_messages,
                max_bytes,
                ..Default::default()
            };
            policy.apply(&mut config);
            let r = admin
                .create_queue(pb::CreateQueueRequest {
                    name: name.clone(),
                    config: Some(config),
                    if_not_exists,
                    node: node.unwrap_or_default(),
                })
                .await
                .with_context(|| format!("cannot create queue {name}"))?
                .into_inner();
            let owner = r.queue.map(|q| q.owner_node).unwrap_or_default();
            match c.output {
                Format::Json => outln!(
                    "{}",
                    json!({ "queue": name, "created": r.created, "owner_node": owner })
                )?,
                Format::Human if r.created => outln!("created queue {name} on {owner}")?,
                Format::Human => outln!("queue {name} already exists (on {owner})")?,
            }
        }
        QueueCommand::Move {
            from,
            to,
            selector,
            rate,
            max,
            detach,
        } => {
            let task = admin
                .move_messages(pb::MoveMessagesRequest {
                    from_queue: from.clone(),
                    to_queue: to.clone(),
                    selector: selector.unwrap_or_default(),
                    rate_per_sec: rate,
                    max_messages: max,
                })
                .await
                .with_context(|| format!("cannot move messages from {from} to {to}"))?
                .into_inner();
            if detach {
                print_move(c.output, &task)?;
                return Ok(());
            }
            let bar = crate::output::progress_bar(c.output, Some(task.source_messages_at_start));
            let mut task = task;
            while task.state == pb::MoveState::Running as i32 {
                bar.set_position(task.moved);
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                task = admin
                    .get_move_task(pb::GetMoveTaskRequest {
                        task_id: task.task_id.clone(),
                    })
                    .await?
                    .into_inner();
            }
            bar.finish_and_clear();
            print_move(c.output, &task)?;
            if task.state == pb::MoveState::Failed as i32 {
                anyhow::bail!(
                    "the move failed after {} messages: {}",
                    task.moved,
                    task.error
                );
            }
        }
        QueueCommand::MoveStatus { task_id } => {
            let task = admin
                .get_move_task(pb::GetMoveTaskRequest { task_id })
                .await?
                .into_inner();
            print_move(c.output, &task)?;
        }
        QueueCommand::Show { name } => {
            let q = admin
                .get_queue(pb::GetQueueRequest { name: name.clone() })
                .await
                .with_context(|| format!("cannot show queue {name}"))?
                .into_inner()
                .queue
                .unwrap_or_default();
            let cfg = q.config.unwrap_or_default();
            let r = cfg.redelivery.unwrap_or_default();
            let opt = |v: Option<u64>| v.map_or_else(String::new, |v| v.to_string());
            let limit = |v: Option<u64>| match v {
                Some(n) if n > 0 => n.to_string(),
                _ => "unlimited".into(),
            };
            let rows: Vec<(&str, String)> = vec![
                ("queue", q.name.clone()),
                ("owner node", q.owner_node.clone()),
                ("temporary", q.temporary.to_string()),
                ("default lease ms", opt(cfg.default_lease_ms)),
                ("lease max ms", opt(cfg.lease_max_ms)),
                ("max message size bytes", opt(cfg.max_message_size_bytes)),
                ("max messages", limit(cfg.max_messages)),
                ("max bytes", limit(cfg.max_bytes)),
                (
                    "max redeliveries",
                    if r.unlimited_redeliveries {
                        "unlimited".into()
                    } else {
                        opt(r.max_redeliveries.map(u64::from))
                    },
                ),
                ("redelivery initial delay ms", opt(r.initial_delay_ms)),
                ("redelivery delay ms", opt(r.delay_ms)),
                (
                    "exponential backoff",
                    r.exponential_backoff.unwrap_or_default().to_string(),
                ),
                (
                    "backoff multiplier",
                    r.backoff_multiplier
                        .map_or_else(String::new, |m| m.to_string()),
                ),
                (
                    "collision avoidance percent",
                    opt(r.collision_avoidance_percent.map(u64::from)),
                ),
                ("max redelivery delay ms", opt(r.max_delay_ms)),
                ("dead-letter queue", target_text(cfg.dead_letter.as_ref())),
                ("expiry queue", target_text(cfg.expiry.as_ref())),
                ("dedup window ms", opt(cfg.dedup_window_ms)),
            ];
            match c.output {
                Format::Json => {
                    let map: serde_json::Map<String, serde_json::Value> = rows
                        .iter()
                        .map(|(k, v)| (k.replace([' ', '-'], "_"), json!(v)))
                        .collect();
                    outln!("{}", serde_json::Value::Object(map))?;
                }
                Format::Human => {
                    let mut t = Table::new();
                    for (k, v) in rows {
                        t.add_row([k.to_string(), v]);
                    }
                    outln!("{t}")?;
                }
            }
        }
        QueueCommand::List => {
            let (queues, unreachable) = super::partial::list_queues(&mut admin).await?;
            match c.output {
                Format::Json => {
                    for q in queues {
                        outln!(
                            "{}",
                            json!({ "name": q.name, "owner_node": q.owner_node, "temporary": q.temporary })
                        )?;
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
                    outln!("{t}")?;
                }
            }
            super::partial::tell(c.output, &unreachable)?;
            super::partial::complete(&unreachable)?;
        }
        QueueCommand::Delete { name } => {
            let r = admin
                .delete_queue(pb::DeleteQueueRequest { name: name.clone() })
                .await
                .with_context(|| format!("cannot delete queue {name}"))?
                .into_inner();
            match c.output {
                Format::Json => outln!(
                    "{}",
                    json!({ "queue": name, "deleted_messages": r.deleted_messages })
                )?,
                Format::Human => outln!("deleted queue {name} ({} messages)", r.deleted_messages)?,
            }
        }
        QueueCommand::Purge { name } => {
            let r = admin
                .purge_queue(pb::PurgeQueueRequest { name: name.clone() })
                .await
                .with_context(|| format!("cannot purge queue {name}"))?
                .into_inner();
            match c.output {
                Format::Json => outln!("{}", json!({ "queue": name, "purged": r.purged }))?,
                Format::Human => outln!("purged {} messages from {name}", r.purged)?,
            }
        }
        QueueCommand::Stats {
            name,
            watch,
            interval_ms,
        } => loop {
            let pb::GetQueueStatsResponse {
                queues,
                unreachable_nodes,
            } = admin
                .get_queue_stats(pb::GetQueueStatsRequest {
                    name: name.clone().unwrap_or_default(),
                })
                .await?
                .into_inner();
            match c.output {
                Format::Json => {
                    for s in queues {
                        outln!("{}", stats_json(&s))?;
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
                        "paged out",
                        "memory / budget",
                        "sent",
                        "acked",
                        "redelivered",
                        "dead-lettered",
                        "expired",
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
                            s.paged_out.to_string(),
                            memory_text(s.memory_bytes, s.memory_budget_bytes),
                            s.sent_total.to_string(),
                            s.acked_total.to_string(),
                            s.redelivered_total.to_string(),
                            (s.dead_lettered_max_deliveries_total + s.dead_lettered_rejected_total)
                                .to_string(),
                            s.expired_total.to_string(),
                            s.owner_node,
                        ]);
                    }
                    outln!("{t}")?;
                }
            }
            super::partial::tell(c.output, &unreachable_nodes)?;
            if !watch {
                super::partial::complete(&unreachable_nodes)?;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(interval_ms.max(100))).await;
        },
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
        "dead_lettered_max_deliveries_total": s.dead_lettered_max_deliveries_total,
        "dead_lettered_rejected_total": s.dead_lettered_rejected_total,
        "staged": s.staged,
        "groups": s.groups,
        "paged_out": s.paged_out,
        "memory_bytes": s.memory_bytes,
        "memory_budget_bytes": (s.memory_budget_bytes > 0).then_some(s.memory_budget_bytes),
        "owner_node": s.owner_node,
    })
}

/// Bytes of the queue's messages in memory, over its budget (`-` when it has none: a temporary
/// queue).
fn memory_text(memory_bytes: u64, budget_bytes: u64) -> String {
    if budget_bytes == 0 {
        format!("{memory_bytes} / -")
    } else {
        format!("{memory_bytes} / {budget_bytes}")
    }
}

fn print_move(format: Format, t: &pb::MoveTask) -> Result<(), crate::output::StdoutClosed> {
    let state = match pb::MoveState::try_from(t.state) {
        Ok(pb::MoveState::Running) => "running",
        Ok(pb::MoveState::Done) => "done",
        Ok(pb::MoveState::Failed) => "failed",
        _ => "unknown",
    };
    match format {
        Format::Json => outln!(
            "{}",
            json!({
                "task_id": t.task_id,
                "from": t.from_queue,
                "to": t.to_queue,
                "moved": t.moved,
                "state": state,
                "error": t.error,
                "source_messages_at_start": t.source_messages_at_start,
            })
        )?,
        Format::Human => {
            outln!(
                "{}: {} → {}: {} moved, {state}{}",
                t.task_id,
                t.from_queue,
                t.to_queue,
                t.moved,
                if t.error.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", t.error)
                }
            )?;
        }
    }
    Ok(())
}
