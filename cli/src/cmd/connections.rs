//! `ferry connections`: the client connections open on a node, and closing one.

use anyhow::Context as _;
use comfy_table::Table;
use ferry_proto::pb;
use serde_json::json;

use super::{connect, ClientArgs};
use crate::output::{outln, Format};

#[derive(Debug, clap::Subcommand)]
pub enum ConnectionsCommand {
    /// List the client connections open on the node (each node keeps its own).
    List,
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
        ConnectionsCommand::List => {
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
            .await?;
            match c.output {
                Format::Json => {
                    for x in list {
                        outln!(
                            "{}",
                            json!({
                                "connection_id": x.connection_id,
                                "client_id": x.client_id,
                                "sessions": x.sessions,
                                "temporary_queues": x.temporary_queues,
                                "lease_left_ms": x.lease_left_ms,
                                "node": x.node,
                            })
                        )?;
                    }
                }
                Format::Human => {
                    let mut t = Table::new();
                    t.set_header([
                        "connection",
                        "client",
                        "sessions",
                        "temporary queues",
                        "lease left ms",
                        "node",
                    ]);
                    for x in list {
                        t.add_row([
                            x.connection_id,
                            x.client_id,
                            x.sessions.to_string(),
                            x.temporary_queues.to_string(),
                            x.lease_left_ms.to_string(),
                            x.node,
                        ]);
                    }
                    outln!("{t}")?;
                }
            }
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
