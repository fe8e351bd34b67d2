//! `ferry shard list`: the queue shards (the Raft groups holding replicated queues), one row per
//! shard, from `Cluster.ListShards` on the node asked; `ferry shard transfer-leader`: moves a
//! shard's leadership (`Cluster.TransferShardLeader`); `ferry shard move-replica`: moves a
//! shard's replica to another node (`Cluster.MoveShardReplica`).

use anyhow::Context as _;
use comfy_table::Table;
use ferry_proto::pb;
use serde_json::{json, Value};

use super::{connect, ClientArgs};
use crate::output::{outln, Format};

/// At most this many queue names in a row of the table (JSON lists them all).
const QUEUES_SHOWN_MAX: usize = 4;

#[derive(Debug, clap::Subcommand)]
pub enum ShardCommand {
    /// One row per queue shard: its leader, replicas, queues, the leader's applied index and
    /// the lag of its least caught-up replica (log entries the leader has and it has not
    /// acknowledged). `-` where no leader is known (an election, or most replicas down).
    List {
        /// Only this shard (its id, as listed).
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        shard: Option<u64>,
    },
    /// Moves a shard's leadership to one of its replicas, and returns once that node leads it
    /// (at most 5 s). The node keeps it while it leads at that term; after a restart or a
    /// failover the balancer hands the shard back to its preferred leader (its first replica).
    TransferLeader {
        /// The shard (its id, as listed).
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        shard: u64,
        /// The replica to lead it.
        node: String,
    },
    /// Moves a shard's replica off a node (its disk lost, gone for good, or to be drained
    /// before `ferry node remove`) to another node, and returns once the move is committed.
    /// The shard's leader then adds the new replica, fills it with a snapshot, and removes the
    /// old one: `ferry shard list` shows it under "moving" until done. Without a shard, moves
    /// every shard replica the node holds, one shard after the other.
    MoveReplica {
        /// The shard (its id, as listed); none: every shard `--from` holds a replica of.
        #[arg(value_parser = clap::value_parser!(u64).range(1..))]
        shard: Option<u64>,
        /// The node whose replica moves.
        #[arg(long)]
        from: String,
        /// The node that takes it (default: the active node holding the fewest replicas).
        #[arg(long)]
        to: Option<String>,
    },
}

pub async fn run(c: &ClientArgs, cmd: ShardCommand) -> anyhow::Result<()> {
    match cmd {
        ShardCommand::List { shard } => list(c, shard).await,
        ShardCommand::TransferLeader { shard, node } => transfer_leader(c, shard, node).await,
        ShardCommand::MoveReplica { shard, from, to } => move_replica(c, shard, from, to).await,
    }
}

async fn move_replica(
    c: &ClientArgs,
    shard: Option<u64>,
    from: String,
    to: Option<String>,
) -> anyhow::Result<()> {
    let mut cluster = connect(c).await?.cluster();
    let shards: Vec<u64> = match shard {
        Some(shard) => vec![shard],
        None => cluster
            .list_shards(pb::ListShardsRequest { shard: 0 })
            .await
            .context("cannot list the queue shards")?
            .into_inner()
            .shards
            .into_iter()
            .filter(|s| s.replicas.contains(&from))
            .map(|s| s.shard)
            .collect(),
    };
    if shards.is_empty() && c.output == Format::Human {
        outln!("node {from} holds no shard replica: nothing to move")?;
    }
    for shard in shards {
        let answer = cluster
            .move_shard_replica(pb::MoveShardReplicaRequest {
                shard,
                from_node: from.clone(),
                to_node: to.clone().unwrap_or_default(),
            })
            .await
            .with_context(|| format!("cannot move shard {shard}'s replica off {from}"))?
            .into_inner();
        match c.output {
            Format::Json => outln!(
                "{}",
                json!({ "shard": shard, "from": from, "to": answer.to_node, "replicas": answer.replicas })
            )?,
            Format::Human => outln!(
                "shard {shard}: replica moved from {from} to {}; replicas now {}",
                answer.to_node,
                answer.replicas.join(", ")
            )?,
        }
    }
    Ok(())
}

async fn transfer_leader(c: &ClientArgs, shard: u64, node: String) -> anyhow::Result<()> {
    let mut cluster = connect(c).await?.cluster();
    let answer = cluster
        .transfer_shard_leader(pb::TransferShardLeaderRequest {
            shard,
            node_id: node,
        })
        .await
        .with_context(|| format!("cannot move the leadership of shard {shard}"))?
        .into_inner();
    match c.output {
        Format::Json => outln!(
            "{}",
            json!({ "shard": shard, "leader": answer.leader, "term": answer.term })
        )?,
        Format::Human => outln!(
            "shard {shard} is led by {} (term {})",
            answer.leader,
            answer.term
        )?,
    }
    Ok(())
}

async fn list(c: &ClientArgs, shard: Option<u64>) -> anyhow::Result<()> {
    let mut cluster = connect(c).await?.cluster();
    let shards = cluster
        .list_shards(pb::ListShardsRequest {
            shard: shard.unwrap_or(0),
        })
        .await
        .context("cannot list the queue shards")?
        .into_inner()
        .shards;
    match c.output {
        Format::Json => {
            for s in &shards {
                outln!("{}", shard_json(s))?;
            }
        }
        Format::Human if shards.is_empty() => outln!(
            "no queue shards: no replicated queue exists (`ferry queue create NAME --replicas 3` makes one)"
        )?,
        Format::Human => outln!("{}", shard_table(&shards))?,
    }
    Ok(())
}

/// One shard for scripts: `leader`, `applied_index` and `lag` are null when no leader is known.
fn shard_json(s: &pb::ShardStatus) -> Value {
    json!({
        "shard": s.shard,
        "leader": (!s.leader.is_empty()).then_some(&s.leader),
        "replicas": s.replicas,
        "queues": s.queues,
        "applied_index": s.applied_index,
        "lag": s.lag,
        "catching_up": s.catching_up,
        "leaving": s.leaving,
    })
}

fn shard_table(shards: &[pb::ShardStatus]) -> Table {
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header([
        "shard", "leader", "replicas", "queues", "applied", "lag", "moving",
    ]);
    let known = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
    for s in shards {
        let leader = if s.leader.is_empty() {
            "(none)".to_owned()
        } else if s.applied_index.is_none() {
            // Named by the others; it did not answer.
            format!("{} (no answer)", s.leader)
        } else {
            s.leader.clone()
        };
        table.add_row([
            s.shard.to_string(),
            leader,
            replicas_text(s),
            queues_text(&s.queues),
            known(s.applied_index),
            known(s.lag),
            moving_text(s),
        ]);
    }
    table
}

/// The replicas, those that did not answer marked.
fn replicas_text(s: &pb::ShardStatus) -> String {
    s.replicas
        .iter()
        .map(|r| {
            if s.unreachable.contains(r) && *r != s.leader {
                format!("{r} (no answer)")
            } else {
                r.clone()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// A move under way: the replicas catching up and the nodes leaving; empty when none.
fn moving_text(s: &pb::ShardStatus) -> String {
    let mut parts: Vec<String> = s
        .catching_up
        .iter()
        .map(|r| format!("{r} catching up"))
        .collect();
    parts.extend(s.leaving.iter().map(|r| format!("{r} leaving")));
    parts.join(", ")
}

fn queues_text(queues: &[String]) -> String {
    let shown = queues
        .iter()
        .take(QUEUES_SHOWN_MAX)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    match queues.len().saturating_sub(QUEUES_SHOWN_MAX) {
        0 => shown,
        more => format!("{shown} +{more} more"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn led() -> pb::ShardStatus {
        pb::ShardStatus {
            shard: 2,
            leader: "n2".into(),
            term: 3,
            replicas: vec!["n1".into(), "n2".into(), "n3".into()],
            queues: vec!["orders".into(), "orders.DLQ".into()],
            applied_index: Some(120),
            lag: Some(4),
            unreachable: vec![],
            catching_up: vec![],
            leaving: vec![],
        }
    }

    fn leaderless() -> pb::ShardStatus {
        pb::ShardStatus {
            leader: String::new(),
            term: 0,
            applied_index: None,
            lag: None,
            unreachable: vec!["n1".into(), "n2".into()],
            ..led()
        }
    }

    #[test]
    fn json_has_exactly_the_documented_fields_and_null_for_what_is_unknown() {
        let v = shard_json(&led());
        assert_eq!(
            v,
            json!({
                "shard": 2,
                "leader": "n2",
                "replicas": ["n1", "n2", "n3"],
                "queues": ["orders", "orders.DLQ"],
                "applied_index": 120,
                "lag": 4,
                "catching_up": [],
                "leaving": [],
            })
        );
        let v = shard_json(&leaderless());
        assert_eq!(v["leader"], Value::Null);
        assert_eq!(v["applied_index"], Value::Null);
        assert_eq!(v["lag"], Value::Null);
        assert_eq!(v.as_object().map(|o| o.len()), Some(8));
    }

    #[test]
    fn the_table_marks_a_missing_leader_and_silent_replicas() {
        let text = shard_table(&[led(), leaderless()]).to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        for word in ["shard", "leader", "replicas", "queues", "applied", "lag"] {
            assert!(lines[0].contains(word), "{text}");
        }
        assert!(
            lines[1].contains("n2") && lines[1].contains("120"),
            "{text}"
        );
        assert!(lines[2].contains("(none)"), "{text}");
        assert!(
            lines[2].contains("n1 (no answer), n2 (no answer), n3"),
            "{text}"
        );
        let cols: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(
            cols[cols.len() - 2..],
            ["-", "-"],
            "applied and lag unknown: {text}"
        );
    }

    #[test]
    fn a_long_list_of_queues_is_cut_in_the_table() {
        let queues: Vec<String> = (0..7).map(|i| format!("q{i}")).collect();
        assert_eq!(queues_text(&queues), "q0, q1, q2, q3 +3 more");
        assert_eq!(queues_text(&queues[..2]), "q0, q1");
        assert_eq!(queues_text(&[]), "");
    }
}
