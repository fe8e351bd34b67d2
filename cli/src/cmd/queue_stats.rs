//! How `ferry queue stats` shows queues: JSON, and the table with its columns.

use comfy_table::Table;
use ferry_proto::pb;
use serde_json::json;

use crate::output::{bytes_text, duration_text};

pub(super) fn stats_json(s: &pb::QueueStats) -> serde_json::Value {
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
pub(super) fn memory_text(memory_bytes: u64, budget_bytes: u64) -> String {
    if budget_bytes == 0 {
        format!("{} / -", bytes_text(memory_bytes))
    } else {
        format!(
            "{} / {}",
            bytes_text(memory_bytes),
            bytes_text(budget_bytes)
        )
    }
}

/// A column of `queue stats`: its name for `--columns`, its header, its value.
pub(super) struct Column {
    name: &'static str,
    header: &'static str,
    value: fn(&pb::QueueStats, u64) -> String,
}

/// Every column, in the order `--wide` shows them.
pub(super) const COLUMNS: &[Column] = &[
    Column {
        name: "name",
        header: "queue",
        value: |s, _| s.name.clone(),
    },
    Column {
        name: "messages",
        header: "messages",
        value: |s, _| (s.ready + s.scheduled + s.leased).to_string(),
    },
    Column {
        name: "ready",
        header: "ready",
        value: |s, _| s.ready.to_string(),
    },
    Column {
        name: "scheduled",
        header: "scheduled",
        value: |s, _| s.scheduled.to_string(),
    },
    Column {
        name: "leased",
        header: "leased",
        value: |s, _| s.leased.to_string(),
    },
    Column {
        name: "consumers",
        header: "consumers",
        value: |s, _| s.consumers.to_string(),
    },
    Column {
        name: "bytes",
        header: "bytes",
        value: |s, _| bytes_text(s.bytes),
    },
    Column {
        name: "oldest",
        header: "oldest",
        value: |s, _| oldest_text(s),
    },
    Column {
        name: "paged_out",
        header: "paged out",
        value: |s, _| s.paged_out.to_string(),
    },
    Column {
        name: "memory",
        header: "memory / budget",
        value: |s, _| memory_text(s.memory_bytes, s.memory_budget_bytes),
    },
    Column {
        name: "sent",
        header: "sent",
        value: |s, _| s.sent_total.to_string(),
    },
    Column {
        name: "delivered",
        header: "delivered",
        value: |s, _| s.delivered_total.to_string(),
    },
    Column {
        name: "acked",
        header: "acked",
        value: |s, _| s.acked_total.to_string(),
    },
    Column {
        name: "redelivered",
        header: "redelivered",
        value: |s, _| s.redelivered_total.to_string(),
    },
    Column {
        name: "dead_lettered",
        header: "dead-lettered",
        value: |s, _| {
            (s.dead_lettered_max_deliveries_total + s.dead_lettered_rejected_total).to_string()
        },
    },
    Column {
        name: "expired",
        header: "expired",
        value: |s, _| s.expired_total.to_string(),
    },
    Column {
        name: "lease_expired",
        header: "lease expired",
        value: |s, _| s.lease_expired_total.to_string(),
    },
    Column {
        name: "purged",
        header: "purged",
        value: |s, _| s.purged_total.to_string(),
    },
    Column {
        name: "staged",
        header: "staged",
        value: |s, _| s.staged.to_string(),
    },
    Column {
        name: "groups",
        header: "groups",
        value: |s, _| s.groups.to_string(),
    },
    Column {
        name: "owner",
        header: "owner",
        value: |s, _| s.owner_node.clone(),
    },
];

/// What `queue stats` shows without `--wide` or `--columns`: it fits 80 characters.
pub(super) const DEFAULT_COLUMNS: &[&str] = &[
    "name",
    "ready",
    "scheduled",
    "leased",
    "consumers",
    "bytes",
    "oldest",
];

/// Names `--wide` leaves out (`messages` is the sum of three it shows; `lease_expired` and
/// `purged` are in `-o json`).
pub(super) const NOT_WIDE: &[&str] = &["messages", "lease_expired", "purged"];

/// The columns asked for.
pub(super) fn stats_columns(wide: bool, asked: &[String]) -> anyhow::Result<Vec<&'static Column>> {
    if wide {
        return Ok(COLUMNS
            .iter()
            .filter(|c| !NOT_WIDE.contains(&c.name))
            .collect());
    }
    if asked.is_empty() {
        return Ok(DEFAULT_COLUMNS
            .iter()
            .filter_map(|n| COLUMNS.iter().find(|c| c.name == *n))
            .collect());
    }
    asked
        .iter()
        .map(|a| {
            let a = a.trim().replace('-', "_");
            let a = if a == "queue" { "name".to_owned() } else { a };
            COLUMNS.iter().find(|c| c.name == a).ok_or_else(|| {
                let names: Vec<&str> = COLUMNS.iter().map(|c| c.name).collect();
                anyhow::anyhow!(
                    "--columns: there is no column {a:?}; choose among {}",
                    names.join(", ")
                )
            })
        })
        .collect()
}

/// How wide a table may be: `--wide` as wide as it takes, else the terminal's width (80 when
/// the output is not a terminal).
pub(super) fn table_width(wide: bool) -> Option<u16> {
    use std::io::IsTerminal as _;
    if wide {
        None
    } else if std::io::stdout().is_terminal() {
        Some(comfy_table::Table::new().width().unwrap_or(80))
    } else {
        Some(80)
    }
}

/// The oldest ready message's age, `-` when none is ready.
pub(super) fn oldest_text(s: &pb::QueueStats) -> String {
    if s.oldest_ready_timestamp_ms == 0 && s.oldest_ready_age_ms == 0 {
        "-".into()
    } else {
        duration_text(s.oldest_ready_age_ms)
    }
}

/// The `queue stats` table for people.
pub(super) fn stats_table(
    queues: &[pb::QueueStats],
    columns: &[&Column],
    width: Option<u16>,
    now_ms: u64,
) -> String {
    let mut t = Table::new();
    t.load_preset(comfy_table::presets::ASCII_FULL_CONDENSED);
    if let Some(w) = width {
        t.set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
        t.set_width(w);
    }
    t.set_header(columns.iter().map(|c| c.header));
    for s in queues {
        t.add_row(columns.iter().map(|c| (c.value)(s, now_ms)));
    }
    t.to_string()
}
