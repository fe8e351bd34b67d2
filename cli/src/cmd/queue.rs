use anyhow::Context as _;
use comfy_table::Table;
use ferry_proto::pb;
use serde_json::json;

use super::queue_stats::{stats_columns, stats_json, stats_table, table_width};
use super::{connect, ClientArgs};
use crate::output::{bytes_text, duration_text, errln, now_ms, outln, Format};

#[derive(Debug, clap::Subcommand)]
pub enum QueueCommand {
    /// Create a queue.
    Create {
        /// The queue's name.
        name: String,
        /// Succeed if it already exists.
        #[arg(long)]
        if_not_exists: bool,
        /// Put it on this node (its node id); default: the node owning the fewest queues.
        #[arg(long)]
        node: Option<String>,
        /// How many nodes keep it: 1 (one node's disk, the fastest), 3 or 5 (a queue shard:
        /// every confirmed send on a majority of the replicas' disks, failing over when the
        /// leader fails). Default: 3 on a cluster of 3 or more nodes, 1 below that and with
        /// --node (a queue whose dead-letter queue exists already: that queue's).
        #[arg(long)]
        replicas: Option<u32>,
        /// With --replicas 3 or 5: a shard of its own, which no other queue joins.
        #[arg(long)]
        own_shard: bool,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Change settings of a queue while it runs: each one given replaces the queue's, the others
    /// stay. Checked like `create`'s; applied by the queue's owner from its next delivery,
    /// redelivery or send on, and shown to `ferry events` watchers as `queue-updated`.
    Update {
        /// The queue to change.
        name: String,
        /// A queue stays on its node: naming another is refused.
        #[arg(long)]
        node: Option<String>,
        #[command(flatten)]
        limits: LimitArgs,
        #[command(flatten)]
        policy: PolicyArgs,
    },
    /// Show a queue's settings.
    Show {
        /// The queue to show.
        name: String,
    },
    /// List queues.
    List,
    /// Delete a queue and its messages.
    Delete {
        /// The queue to delete.
        name: String,
        /// Only if it holds no message (checked by its owner, which takes no send meanwhile);
        /// otherwise refused, saying what it holds.
        #[arg(long)]
        if_empty: bool,
    },
    /// Remove every message that is not currently being processed.
    Purge {
        /// The queue to empty.
        name: String,
    },
    /// Move messages (all, or those a selector matches) to another queue, at most --rate per
    /// second, as a background task on the node; shows its progress until it ends.
    Move {
        /// The queue to take messages from (e.g. a dead-letter queue).
        #[arg(long)]
        from: String,
        /// The queue to put them in.
        #[arg(long)]
        to: String,
        /// Only messages matching this JMS selector.
        #[arg(long)]
        selector: Option<String>,
        /// Messages per second, each in its turn (message n no sooner than n / rate seconds
        /// after the start); 0: as fast as possible.
        #[arg(long, default_value_t = 0)]
        rate: u64,
        /// Stop after this many; 0: until none is left (`--max` is an older name for it).
        #[arg(long = "count", alias = "max", default_value_t = 0)]
        max: u64,
        /// Print the task id and return at once (follow it with `ferry queue move-status`).
        #[arg(long)]
        detach: bool,
    },
    /// Show a move task's progress.
    MoveStatus {
        /// The task id `queue move --detach` printed.
        task_id: String,
    },
    /// Show statistics of one queue, or of every queue: by default the columns that fit 80
    /// characters (queue, ready, scheduled, leased, consumers, bytes, oldest ready message).
    Stats {
        /// One queue; absent: every queue of the cluster.
        name: Option<String>,
        /// Show them again every --interval-ms, in place, until interrupted (ctrl-c).
        #[arg(long)]
        watch: bool,
        /// With --watch: how often to refresh.
        #[arg(long, default_value_t = 1_000)]
        interval_ms: u64,
        /// With --watch: stop after this many refreshes.
        #[arg(long, requires = "watch")]
        count: Option<u64>,
        /// Every column.
        #[arg(long, conflicts_with = "columns")]
        wide: bool,
        /// These columns, comma-separated, e.g. `name,messages,consumers` (of: name, messages,
        /// ready, scheduled, leased, consumers, bytes, oldest, paged_out, memory, sent,
        /// delivered, acked, redelivered, dead_lettered, expired, lease_expired, purged, staged,
        /// groups, owner). `-o json` always carries every field.
        #[arg(long, value_delimiter = ',')]
        columns: Vec<String>,
    },
}

/// The lease and size limits of a queue (`create` and `update`).
#[derive(Debug, clap::Args)]
pub struct LimitArgs {
    /// Lease of a delivery when the receiver asks for none.
    #[arg(long)]
    lease_ms: Option<u64>,
    /// Largest message (body + properties + headers).
    #[arg(long)]
    max_message_size_bytes: Option<u64>,
    /// The most messages the queue may hold (ready, delayed, delivered and not acknowledged);
    /// a send over it fails. 0: no limit (a new queue's default).
    #[arg(long)]
    max_messages: Option<u64>,
    /// The most bytes of messages the queue may hold; a send over it fails. 0: no limit (a new
    /// queue's default).
    #[arg(long)]
    max_bytes: Option<u64>,
}

impl LimitArgs {
    /// These settings, the others unset.
    fn config(self) -> pb::QueueConfig {
        pb::QueueConfig {
            default_lease_ms: self.lease_ms,
            max_message_size_bytes: self.max_message_size_bytes,
            max_messages: self.max_messages,
            max_bytes: self.max_bytes,
            ..Default::default()
        }
    }
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
    /// Turn exponential backoff off (for `update`).
    #[arg(long, conflicts_with = "exponential_backoff")]
    no_exponential_backoff: bool,
    /// With --exponential-backoff: the factor each delay grows by.
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
            exponential_backoff: if self.no_exponential_backoff {
                Some(false)
            } else {
                self.exponential_backoff.then_some(true)
            },
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
            replicas,
            own_shard,
            limits,
            policy,
        } => {
            let mut config = limits.config();
            policy.apply(&mut config);
            let r = admin
                .create_queue(pb::CreateQueueRequest {
                    replicas: replicas.unwrap_or(0),
                    own_shard,
                    name: name.clone(),
                    config: Some(config.clone()),
                    if_not_exists,
                    node: node.unwrap_or_default(),
                })
                .await
                .with_context(|| format!("cannot create queue {name}"))?
                .into_inner();
            let queue = r.queue.unwrap_or_default();
            let owner = queue.owner_node.clone();
            // An existing queue is left as it is: say where it differs from what was asked.
            let differences = if r.created {
                vec![]
            } else {
                let existing = queue.config.clone().unwrap_or_default();
                let asked = ferry_proto::settings::merge_queue_config(&existing, &config);
                ferry_proto::settings::queue_config_changes(&existing, &asked)
            };
            match c.output {
                Format::Json => {
                    let mut v = json!({ "queue": name, "created": r.created, "owner_node": owner });
                    if !differences.is_empty() {
                        v["different_settings"] = differences
                            .iter()
                            .map(|d| json!({ "setting": d.field, "existing": d.before, "asked": d.after }))
                            .collect();
                    }
                    outln!("{v}")?;
                }
                Format::Human if r.created => outln!("created queue {name} on {owner}")?,
                Format::Human => outln!("queue {name} already exists (on {owner})")?,
            }
            if !differences.is_empty() {
                errln!(
                    "warning: queue {name} exists with other settings than asked; it keeps its own (change them with `ferry queue update {name} ...`):"
                );
                for d in &differences {
                    errln!(
                        "  {}: {} (asked {})",
                        setting_label(d.field),
                        setting_value(d.field, &d.before),
                        setting_value(d.field, &d.after)
                    );
                }
            }
        }
        QueueCommand::Update {
            name,
            node,
            limits,
            policy,
        } => {
            let mut patch = limits.config();
            policy.apply(&mut patch);
            if patch.redelivery == Some(pb::RedeliveryPolicy::default()) {
                patch.redelivery = None;
            }
            if patch == pb::QueueConfig::default() {
                anyhow::bail!(
                    "nothing to change: name at least one setting (`ferry queue update --help` lists them)"
                );
            }
            let r = admin
                .update_queue(pb::UpdateQueueRequest {
                    name: name.clone(),
                    config: Some(patch),
                    node: node.unwrap_or_default(),
                })
                .await
                .with_context(|| format!("cannot update queue {name}"))?
                .into_inner();
            let queue = r.queue.unwrap_or_default();
            let changes = ferry_proto::settings::queue_config_changes(
                &r.previous.unwrap_or_default(),
                &queue.config.unwrap_or_default(),
            );
            match c.output {
                Format::Json => outln!(
                    "{}",
                    json!({
                        "queue": name,
                        "changed": r.changed,
                        "owner_node": queue.owner_node,
                        "changes": changes
                            .iter()
                            .map(|d| json!({ "setting": d.field, "before": d.before, "after": d.after }))
                            .collect::<Vec<_>>(),
                    })
                )?,
                Format::Human if changes.is_empty() => {
                    outln!("queue {name} already has these settings; nothing changed")?;
                }
                Format::Human => {
                    outln!("updated queue {name} on {}", queue.owner_node)?;
                    for d in &changes {
                        outln!(
                            "  {}: {} -> {}",
                            setting_label(d.field),
                            setting_value(d.field, &d.before),
                            setting_value(d.field, &d.after)
                        )?;
                    }
                }
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
            let r = admin
                .get_queue(pb::GetQueueRequest { name: name.clone() })
                .await
                .with_context(|| format!("cannot show queue {name}"))?
                .into_inner();
            match c.output {
                Format::Json => outln!("{}", show_json(&r))?,
                Format::Human => outln!("{}", show_text(&r))?,
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
        QueueCommand::Delete { name, if_empty } => {
            let r = admin
                .delete_queue(pb::DeleteQueueRequest {
                    name: name.clone(),
                    if_empty,
                })
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
            count,
            wide,
            columns,
        } => {
            let columns = stats_columns(wide, &columns)?;
            let format = c.output;
            let interval = std::time::Duration::from_millis(interval_ms.max(100));
            // The nodes the last answer missed: a one-shot listing that missed some exits 3.
            let missed = std::sync::Arc::new(std::sync::Mutex::new(vec![]));
            crate::output::watch(watch, interval, count, format, || {
                let mut admin = admin.clone();
                let (name, columns) = (name.clone(), &columns);
                let missed = missed.clone();
                async move {
                    let pb::GetQueueStatsResponse {
                        queues,
                        unreachable_nodes,
                    } = admin
                        .get_queue_stats(pb::GetQueueStatsRequest {
                            name: name.clone().unwrap_or_default(),
                        })
                        .await
                        .with_context(|| match &name {
                            Some(n) => format!("cannot read the statistics of queue {n}"),
                            None => "cannot read the queues' statistics".to_owned(),
                        })?
                        .into_inner();
                    let text = match format {
                        Format::Json => queues
                            .iter()
                            .map(stats_json)
                            .chain(
                                unreachable_nodes
                                    .iter()
                                    .map(super::partial::unreachable_json),
                            )
                            .map(|v| v.to_string())
                            .collect::<Vec<_>>()
                            .join("\n"),
                        Format::Human => {
                            super::partial::tell(format, &unreachable_nodes)?;
                            stats_table(&queues, columns, table_width(wide), now_ms())
                        }
                    };
                    *missed
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = unreachable_nodes;
                    Ok(text)
                }
            })
            .await?;
            if !watch {
                let missed = missed
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                super::partial::complete(&missed)?;
            }
        }
    }
    Ok(())
}

/// `queue show -o json`: every setting by name (as text).
fn show_json(answer: &pb::GetQueueResponse) -> serde_json::Value {
    let q = answer.queue.clone().unwrap_or_default();
    let cfg = q.config.clone().unwrap_or_default();
    let r = cfg.redelivery.unwrap_or_default();
    let opt = |v: Option<u64>| v.map_or_else(String::new, |v| v.to_string());
    let limit = |v: Option<u64>| match v {
        Some(n) if n > 0 => n.to_string(),
        _ => "unlimited".into(),
    };
    json!({
        "queue": q.name,
        "owner_node": q.owner_node,
        "temporary": q.temporary.to_string(),
        "default_lease_ms": opt(cfg.default_lease_ms),
        "lease_max_ms": opt(cfg.lease_max_ms),
        "max_message_size_bytes": opt(cfg.max_message_size_bytes),
        "max_messages": limit(cfg.max_messages),
        "max_bytes": limit(cfg.max_bytes),
        "max_redeliveries": if r.unlimited_redeliveries { "unlimited".into() } else { opt(r.max_redeliveries.map(u64::from)) },
        "redelivery_initial_delay_ms": opt(r.initial_delay_ms),
        "redelivery_delay_ms": opt(r.delay_ms),
        "exponential_backoff": r.exponential_backoff.unwrap_or_default().to_string(),
        "backoff_multiplier": r.backoff_multiplier.map_or_else(String::new, |m| m.to_string()),
        "collision_avoidance_percent": opt(r.collision_avoidance_percent.map(u64::from)),
        "max_redelivery_delay_ms": opt(r.max_delay_ms),
        "dead_letter_queue": target_text(cfg.dead_letter.as_ref()),
        "expiry_queue": target_text(cfg.expiry.as_ref()),
        "dedup_window_ms": opt(cfg.dedup_window_ms),
        "shard": if answer.shard == 0 { String::new() } else { answer.shard.to_string() },
        "replicas": answer.replicas,
    })
}

/// Where a queue's data is kept: "1 (not replicated)", or its shard's replicas.
fn replicas_text(r: &pb::GetQueueResponse) -> String {
    if r.shard == 0 {
        return "1 (not replicated)".into();
    }
    format!(
        "{} in shard {}: {}",
        r.replicas.len(),
        r.shard,
        r.replicas.join(", ")
    )
}

/// `queue show` for people: one line per kind of setting, in units.
fn show_text(answer: &pb::GetQueueResponse) -> String {
    let q = answer.queue.clone().unwrap_or_default();
    let cfg = q.config.clone().unwrap_or_default();
    let r = cfg.redelivery.unwrap_or_default();
    let ms = |v: Option<u64>| v.map_or_else(|| "-".into(), duration_text);
    let limit = |v: Option<u64>, unit: fn(u64) -> String| match v {
        Some(n) if n > 0 => unit(n),
        _ => "unlimited".into(),
    };
    let redeliveries = if r.unlimited_redeliveries {
        "unlimited".to_owned()
    } else {
        r.max_redeliveries
            .map_or_else(|| "-".into(), |n| n.to_string())
    };
    let (initial, delay) = (r.initial_delay_ms.unwrap_or(0), r.delay_ms.unwrap_or(0));
    let mut backoff = if initial == 0 && delay == 0 {
        "none: redelivered at once".to_owned()
    } else {
        format!(
            "first {}, then {}",
            duration_text(initial),
            duration_text(delay)
        )
    };
    if r.exponential_backoff.unwrap_or(false) {
        backoff += &format!(
            ", x{} each time",
            r.backoff_multiplier
                .map_or_else(|| "-".into(), |m| m.to_string())
        );
    }
    if let Some(p) = r.collision_avoidance_percent.filter(|p| *p > 0) {
        backoff += &format!(", +/- {p} %");
    }
    if initial > 0 || delay > 0 {
        backoff += &format!(", at most {}", ms(r.max_delay_ms));
    }
    let rows: Vec<(&str, String)> = vec![
        (
            "lease",
            format!(
                "{} by default, {} at most",
                ms(cfg.default_lease_ms),
                ms(cfg.lease_max_ms)
            ),
        ),
        (
            "max message size",
            cfg.max_message_size_bytes
                .map_or_else(|| "-".into(), bytes_text),
        ),
        ("max messages", limit(cfg.max_messages, |n| n.to_string())),
        ("max bytes", limit(cfg.max_bytes, bytes_text)),
        ("max redeliveries", redeliveries),
        ("redelivery delay", backoff),
        ("dead letters to", target_text(cfg.dead_letter.as_ref())),
        ("expired to", target_text(cfg.expiry.as_ref())),
        (
            "dedup window",
            match cfg.dedup_window_ms {
                Some(0) => "off".into(),
                v => ms(v),
            },
        ),
        ("replicas", replicas_text(answer)),
    ];
    let mut out = format!(
        "queue {} on {}{}",
        q.name,
        q.owner_node,
        if q.temporary { " (temporary)" } else { "" }
    );
    for (k, v) in rows {
        out += &format!("\n  {k:<18} {v}");
    }
    out
}

/// A setting as `create` and `update` name it (their flag).
fn setting_label(field: &str) -> &str {
    match field {
        "default_lease_ms" => "lease-ms",
        "lease_max_ms" => "lease-max-ms",
        "max_message_size_bytes" => "max-message-size-bytes",
        "receive_batch_max" => "receive-batch-max",
        "waiters_max" => "waiters-max",
        "redelivery.max_redeliveries" => "max-redeliveries",
        "redelivery.initial_delay_ms" => "redelivery-initial-delay-ms",
        "redelivery.delay_ms" => "redelivery-delay-ms",
        "redelivery.exponential_backoff" => "exponential-backoff",
        "redelivery.backoff_multiplier" => "backoff-multiplier",
        "redelivery.collision_avoidance_percent" => "collision-avoidance-percent",
        "redelivery.max_delay_ms" => "max-redelivery-delay-ms",
        "dead_letter" => "dead-letter-queue",
        "expiry" => "expiry-queue",
        "dedup_window_ms" => "dedup-window-ms",
        "max_messages" => "max-messages",
        "max_bytes" => "max-bytes",
        other => other,
    }
}

/// A setting's value for people: durations and sizes in units.
fn setting_value(field: &str, value: &str) -> String {
    let Ok(n) = value.parse::<u64>() else {
        return if value.is_empty() {
            "default".into()
        } else {
            value.to_owned()
        };
    };
    if field.ends_with("_ms") {
        duration_text(n)
    } else if field.ends_with("bytes") {
        bytes_text(n)
    } else {
        value.to_owned()
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
                "started_at_ms": t.started_at_ms,
                "finished_at_ms": t.finished_at_ms,
            })
        )?,
        Format::Human => {
            // A task that ended says how long it ran.
            let took = if t.finished_at_ms > 0 {
                format!(
                    " in {}",
                    duration_text(t.finished_at_ms.saturating_sub(t.started_at_ms))
                )
            } else {
                String::new()
            };
            outln!(
                "{}: {} → {}: {} moved, {state}{took}{}",
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
