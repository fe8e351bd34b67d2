//! `ferry status`: the node asked, as it sees itself (the `Node` service).

use anyhow::Context as _;
use comfy_table::Table;
use ferry_proto::pb;
use serde_json::json;

use super::{connect, ClientArgs};
use crate::output::{bytes_text, duration_text, outln, Format, StdoutClosed};

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// List every setting, not only those that are not at their defaults (-o json always lists
    /// every one).
    #[arg(long)]
    all: bool,
}

pub async fn run(c: &ClientArgs, a: StatusArgs) -> anyhow::Result<()> {
    let r = connect(c)
        .await?
        .node()
        .get_node_status(pb::GetNodeStatusRequest {})
        .await
        .context("cannot read the node's status")?
        .into_inner();
    match c.output {
        Format::Json => outln!("{}", report_json(&r))?,
        Format::Human => print_human(&r, a.all)?,
    }
    Ok(())
}

fn report_json(r: &pb::NodeStatusReport) -> serde_json::Value {
    let store = r.store.clone().unwrap_or_default();
    json!({
        "node_id": r.node_id,
        "version": r.version,
        "uptime_ms": r.uptime_ms,
        "started_at_ms": r.started_at_ms,
        "ready": r.ready,
        "not_ready": r.not_ready,
        "alarms": r.alarms,
        "data_dir": r.data_dir,
        "storage": r.storage,
        "store": {
            "state": store.state,
            "size_bytes": store.size_bytes,
            "disk_free_bytes": store.disk_free_bytes,
            "disk_free_min_bytes": store.disk_free_min_bytes,
            "disk_guard_tripped": store.disk_guard_tripped,
        },
        "listeners": r.listeners.iter().map(|l| json!({
            "name": l.name, "address": l.address, "serves": l.serves,
        })).collect::<Vec<_>>(),
        "cluster_id": r.cluster_id,
        "leader_node_id": r.leader_node_id,
        "peers": r.peers.iter().map(|p| json!({
            "node_id": p.node_id,
            "role": p.role,
            "reachable": p.reachable,
            "last_heard_ms_ago": p.last_heard_ms_ago,
            "peer_address": p.peer_address,
            "client_address": p.client_address,
        })).collect::<Vec<_>>(),
        "config": r.config.iter().map(|s| json!({
            "key": s.key, "value": s.value, "source": s.source,
        })).collect::<Vec<_>>(),
    })
}

fn print_human(r: &pb::NodeStatusReport, all: bool) -> Result<(), StdoutClosed> {
    let store = r.store.clone().unwrap_or_default();
    let started = std::time::UNIX_EPOCH + std::time::Duration::from_millis(r.started_at_ms);
    outln!("node        {}", r.node_id)?;
    outln!("version     ferry {}", r.version)?;
    outln!(
        "uptime      {} (since {})",
        duration_text(r.uptime_ms),
        ferry_node::raft::utc_text(started)
    )?;
    if r.ready {
        outln!("ready       yes")?;
    } else {
        outln!("ready       no: {}", r.not_ready.join("; "))?;
    }
    outln!(
        "alarms      {}",
        if r.alarms.is_empty() {
            "none".to_owned()
        } else {
            r.alarms.join(", ")
        }
    )?;
    if r.storage == "memory" {
        outln!("data        in memory (nothing survives a restart)")?;
    } else {
        outln!(
            "data dir    {} ({}, {} on disk)",
            r.data_dir,
            r.storage,
            bytes_text(store.size_bytes)
        )?;
    }
    outln!("store       {}", store_text(&store.state))?;
    outln!("disk guard  {}", disk_guard_text(&store))?;
    let or_none = |s: &str| {
        if s.is_empty() {
            "(none)".to_owned()
        } else {
            s.to_owned()
        }
    };
    outln!(
        "cluster     {} (metadata leader: {})",
        or_none(&r.cluster_id),
        or_none(&r.leader_node_id)
    )?;
    outln!("listeners")?;
    let mut t = plain_table();
    for l in &r.listeners {
        t.add_row([l.name.clone(), l.address.clone(), l.serves.clone()]);
    }
    outln!("{t}")?;
    if r.peers.is_empty() {
        outln!("peers       none")?;
    } else {
        outln!("peers")?;
        outln!("{}", peer_table(&r.peers))?;
    }
    print_config(&r.config, all)
}

fn store_text(state: &str) -> String {
    match state {
        "poisoned" => {
            "POISONED: a write failed; writes are refused until the node restarts (see its log)"
                .to_owned()
        }
        "memory" => "in memory".to_owned(),
        other => other.to_owned(),
    }
}

fn disk_guard_text(s: &pb::StoreReport) -> String {
    if s.disk_free_min_bytes == 0 {
        return "off (disk_free_min_bytes = 0, or storage in memory)".to_owned();
    }
    let min = bytes_text(s.disk_free_min_bytes);
    match s.disk_free_bytes {
        None => format!("not read yet (sends are refused under {min} free)"),
        Some(free) if s.disk_guard_tripped => format!(
            "TRIPPED: {} free, under {min}: sends are refused until there is more",
            bytes_text(free)
        ),
        Some(free) => format!(
            "ok: {} free as last read; sends are refused under {min}",
            bytes_text(free)
        ),
    }
}

fn peer_table(peers: &[pb::PeerReport]) -> Table {
    let mut t = plain_table();
    for p in peers {
        let heard = match p.last_heard_ms_ago {
            Some(ms) => format!("heard {} ago", duration_text(ms)),
            None => "never heard from".to_owned(),
        };
        t.add_row([
            p.node_id.clone(),
            p.role.clone(),
            if p.reachable {
                "reachable"
            } else {
                "UNREACHABLE"
            }
            .to_owned(),
            p.peer_address.clone(),
            heard,
        ]);
    }
    t
}

fn print_config(config: &[pb::ConfigSetting], all: bool) -> Result<(), StdoutClosed> {
    let shown: Vec<&pb::ConfigSetting> = config
        .iter()
        .filter(|s| all || s.source != "default")
        .collect();
    if all {
        outln!("configuration (every setting, with where its value comes from)")?;
    } else {
        outln!("configuration (settings not at their defaults; --all lists every one)")?;
    }
    let mut t = plain_table();
    for s in &shown {
        t.add_row([s.key.clone(), s.value.clone(), s.source.clone()]);
    }
    if !shown.is_empty() {
        outln!("{t}")?;
    }
    let hidden = config.len() - shown.len();
    if hidden > 0 {
        outln!("  ({hidden} more at their defaults)")?;
    }
    Ok(())
}

fn plain_table() -> Table {
    let mut t = Table::new();
    t.load_preset(comfy_table::presets::NOTHING);
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_in_units() {
        assert_eq!(bytes_text(512), "512 B");
        assert_eq!(bytes_text(64 * 1024 * 1024), "64 MiB");
        assert_eq!(bytes_text(1536 * 1024 * 1024), "1.5 GiB");
        assert_eq!(duration_text(850), "850 ms");
        assert_eq!(duration_text(12_400), "12 s");
        assert_eq!(duration_text(185_000), "3 min 5 s");
        assert_eq!(duration_text(7_380_000), "2 h 3 min");
        assert_eq!(duration_text(90_000_000), "1 d 1 h");
    }
}
