//! `ferry connections`: the client connections open on a node, and closing one.

use anyhow::Context as _;
use comfy_table::Table;
use ferry_proto::pb;
use serde_json::json;

use super::{connect, ClientArgs};
use crate::output::{ago_text, now_ms, outln, Format};

#[derive(Debug, clap::Subcommand)]
pub enum ConnectionsCommand {
    /// List the client connections open on the node (each node keeps its own): where each
    /// client connected from and since when, its sessions and the messages they hold
    /// unacknowledged.
    List {
        /// Show them again every --interval-ms, in place, until interrupted (ctrl-c).
        #[arg(long)]
        watch: bool,
        /// With --watch: how often to refresh.
        #[arg(long, default_value_t = 1_000)]
        interval_ms: u64,
        /// With --watch: stop after this many refreshes.
        #[arg(long, requires = "watch")]
        count: Option<u64>,
    },
    /// Close a connection as if its client had: its unacknowledged messages return at once, its
    /// temporary queues are deleted.
    Close {
        /// The connection, as `connections list` shows it.
        connection_id: String,
    },
}

pub async fn run(c: &ClientArgs, cmd: ConnectionsCommand) -> anyhow::Result<()> {
    let mut admin = connect(c).await?.admin();
    match cmd {
        ConnectionsCommand::List {
            watch,
            interval_ms,
            count,
        } => {
            let format = c.output;
            let interval = std::time::Duration::from_millis(interval_ms.max(100));
            crate::output::watch(watch, interval, count, format, || {
                let admin = admin.clone();
                async move {
                    let list = super::all_pages(|page_token| {
                        let mut admin = admin.clone();
                        async move {
                            let page = admin
                                .list_connections(pb::ListConnectionsRequest {
                                    page_size: 0,
                                    page_token,
                                })
                                .await?
                                .into_inner();
                            Ok((page.connections, page.next_page_token))
                        }
                    })
                    .await
                    .context("cannot list the connections")?;
                    Ok(match format {
                        Format::Json => list
                            .iter()
                            .map(|x| connection_json(x).to_string())
                            .collect::<Vec<_>>()
                            .join("\n"),
                        Format::Human => connections_table(&list, now_ms()),
                    })
                }
            })
            .await?;
        }
        ConnectionsCommand::Close { connection_id } => {
            let r = admin
                .close_connection(pb::AdminCloseConnectionRequest {
                    connection_id: connection_id.clone(),
                })
                .await
                .with_context(|| format!("cannot close connection {connection_id}"))?
                .into_inner();
            match c.output {
                Format::Json => outln!(
                    "{}",
                    json!({ "connection_id": connection_id, "released": r.released })
                )?,
                Format::Human => outln!(
                    "closed connection {connection_id}; {} messages went back to their queues",
                    r.released
                )?,
            }
        }
    }
    Ok(())
}

fn connection_json(x: &pb::ConnectionInfo) -> serde_json::Value {
    json!({
        "connection_id": x.connection_id,
        "client_id": x.client_id,
        "client_address": x.client_address,
        "connected_at_ms": x.connected_at_ms,
        "sessions": x.sessions,
        "unacked": x.unacked,
        "unacked_unknown_queues": x.unacked_unknown_queues,
        "temporary_queues": x.temporary_queues,
        "lease_left_ms": x.lease_left_ms,
        "node": x.node,
    })
}

/// The connections for people: who, from where, since when, and what they hold.
fn connections_table(list: &[pb::ConnectionInfo], now_ms: u64) -> String {
    let mut t = Table::new();
    t.load_preset(comfy_table::presets::ASCII_FULL_CONDENSED);
    if let Some(width) = terminal_width() {
        t.set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
        t.set_width(width);
    }
    // Temporary queues and the lease left are in `-o json`, to keep the table near 80
    // characters; piped, a row is never wrapped (see `terminal_width`).
    t.set_header([
        "connection",
        "client",
        "address",
        "connected",
        "sessions",
        "unacked",
    ]);
    for x in list {
        let unacked = if x.unacked_unknown_queues.is_empty() {
            x.unacked.to_string()
        } else {
            // Some queue's owner did not answer: at least this many.
            format!("{}+", x.unacked)
        };
        t.add_row([
            x.connection_id.clone(),
            x.client_id.clone(),
            if x.client_address.is_empty() {
                "-".into()
            } else {
                x.client_address.clone()
            },
            ago_text(x.connected_at_ms, now_ms),
            x.sessions.to_string(),
            unacked,
        ]);
    }
    t.to_string()
}

/// The terminal's width, or 80 when the output is not a terminal.
/// The terminal's width, to wrap cells in; none when the output is not a terminal: a row
/// piped to `grep` or a script stays on one line, however long.
fn terminal_width() -> Option<u16> {
    use std::io::IsTerminal as _;
    std::io::stdout()
        .is_terminal()
        .then(|| Table::new().width().unwrap_or(80))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_connection_reads_with_its_address_age_and_unacked_count() {
        let x = pb::ConnectionInfo {
            connection_id: "c42".into(),
            client_id: "billing".into(),
            sessions: 2,
            temporary_queues: 0,
            lease_left_ms: 25_000,
            node: "node-1".into(),
            client_address: "127.0.0.1:51234".into(),
            connected_at_ms: 1_000_000,
            unacked: 7,
            unacked_unknown_queues: vec![],
        };
        let table = connections_table(std::slice::from_ref(&x), 1_000_000 + 3 * 3_600_000);
        for want in ["127.0.0.1:51234", "3 h ago", "| 7 ", "billing"] {
            assert!(table.contains(want), "{want:?} in\n{table}");
        }
        assert!(table.lines().all(|l| l.chars().count() <= 80), "{table}");
        let partial = pb::ConnectionInfo {
            unacked_unknown_queues: vec!["orders".into()],
            ..x
        };
        assert!(connections_table(std::slice::from_ref(&partial), 1_000_000).contains("7+"));
        // Piped (as here: not a terminal), a row too wide for 80 columns stays on one line.
        let long = pb::ConnectionInfo {
            connection_id: "c46e4ce0d".into(),
            client_id: "billing-worker-of-the-eu-west-region".into(),
            client_address: "[2001:db8::1]:50096".into(),
            ..partial
        };
        let table = connections_table(&[long], 1_000_102);
        let row = table.lines().find(|l| l.contains("c46e4ce0d")).unwrap();
        for want in [
            "billing-worker-of-the-eu-west-region",
            "[2001:db8::1]:50096",
            "ms ago",
        ] {
            assert!(row.contains(want), "{want:?} in\n{table}");
        }
    }
}
