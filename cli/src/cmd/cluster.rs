//! `ferry node` (add, remove, list the nodes of the cluster) and `ferry cluster status`.

use anyhow::Context as _;
use comfy_table::Table;
use ferry_proto::pb;
use serde_json::json;

use super::{connect, ClientArgs};
use crate::output::{outln, Format};

#[derive(Debug, clap::Subcommand)]
pub enum NodeCommand {
    /// Add a node to the running cluster. Start it first with `ferry server --join
    /// HOST:PORT` (any member's peer address) and an empty data directory.
    Add {
        /// The new node's id (its --node-id).
        node_id: String,
        /// The new node's peer listener, HOST:PORT (its --peer-listen).
        #[arg(long)]
        address: String,
        /// Join as a learner: it gets the metadata but does not vote. Voters stay 1, 3 or 5.
        #[arg(long)]
        learner: bool,
    },
    /// Remove a node that owns no queue (delete or move its queues first).
    Remove {
        /// The node to remove.
        node_id: String,
    },
    /// Make learners voters, together, so the voters go from 1 to 3 or from 3 to 5.
    Promote {
        /// The learners to make voters.
        #[arg(required = true)]
        node_ids: Vec<String>,
    },
    /// List the nodes with their role, health and queue count.
    List,
}

#[derive(Debug, clap::Subcommand)]
pub enum ClusterCommand {
    /// The cluster id, the metadata leader, term and indexes, and every node's role, health
    /// and queues, as the node asked sees them.
    Status,
}

pub async fn node(c: &ClientArgs, cmd: NodeCommand) -> anyhow::Result<()> {
    let mut cluster = connect(c).await?.cluster();
    match cmd {
        NodeCommand::Add {
            node_id,
            address,
            learner,
        } => {
            let r = cluster
                .add_node(pb::AddNodeRequest {
                    node_id: node_id.clone(),
                    peer_address: address,
                    learner,
                })
                .await
                .with_context(|| format!("cannot add node {node_id}"))?
                .into_inner();
            let role = r.node.map(|n| n.role).unwrap_or_default();
            match c.output {
                Format::Json => outln!("{}", json!({ "node_id": node_id, "role": role }))?,
                Format::Human => outln!("added node {node_id} as a {role}")?,
            }
        }
        NodeCommand::Remove { node_id } => {
            cluster
                .remove_node(pb::RemoveNodeRequest {
                    node_id: node_id.clone(),
                })
                .await
                .with_context(|| format!("cannot remove node {node_id}"))?;
            match c.output {
                Format::Json => outln!("{}", json!({ "removed": node_id }))?,
                Format::Human => outln!("removed node {node_id}")?,
            }
        }
        NodeCommand::Promote { node_ids } => {
            cluster
                .promote_nodes(pb::PromoteNodesRequest {
                    node_ids: node_ids.clone(),
                })
                .await
                .with_context(|| format!("cannot promote {}", node_ids.join(", ")))?;
            match c.output {
                Format::Json => outln!("{}", json!({ "promoted": node_ids }))?,
                Format::Human => outln!("promoted {} to voter", node_ids.join(", "))?,
            }
        }
        NodeCommand::List => {
            let s = status(&mut cluster).await?;
            match c.output {
                Format::Json => {
                    for n in &s.nodes {
                        outln!("{}", node_json(n, &s.leader_node_id))?;
                    }
                }
                Format::Human => outln!("{}", node_table(&s))?,
            }
        }
    }
    Ok(())
}

pub async fn cluster(c: &ClientArgs, cmd: ClusterCommand) -> anyhow::Result<()> {
    let mut cluster = connect(c).await?.cluster();
    match cmd {
        ClusterCommand::Status => {
            let s = status(&mut cluster).await?;
            match c.output {
                Format::Json => {
                    let nodes: Vec<_> = s
                        .nodes
                        .iter()
                        .map(|n| node_json(n, &s.leader_node_id))
                        .collect();
                    outln!(
                        "{}",
                        json!({
                            "cluster_id": s.cluster_id,
                            "node_id": s.node_id,
                            "leader_node_id": s.leader_node_id,
                            "term": s.term,
                            "commit_index": s.commit_index,
                            "applied_index": s.applied_index,
                            "nodes": nodes,
                        })
                    )?;
                }
                Format::Human => {
                    let or_none = |s: &str| {
                        if s.is_empty() {
                            "(none)".to_owned()
                        } else {
                            s.to_owned()
                        }
                    };
                    outln!("cluster   {}", or_none(&s.cluster_id))?;
                    outln!("asked     {}", s.node_id)?;
                    outln!("leader    {} (term {})", or_none(&s.leader_node_id), s.term)?;
                    outln!(
                        "metadata  committed {}, applied {}",
                        s.commit_index,
                        s.applied_index
                    )?;
                    outln!("{}", node_table(&s))?;
                }
            }
        }
    }
    Ok(())
}

async fn status(
    cluster: &mut pb::cluster_client::ClusterClient<tonic::transport::Channel>,
) -> anyhow::Result<pb::ClusterStatus> {
    Ok(cluster
        .get_cluster_status(pb::GetClusterStatusRequest {})
        .await
        .context("cannot read the cluster status")?
        .into_inner())
}

fn node_json(n: &pb::NodeStatus, leader: &str) -> serde_json::Value {
    json!({
        "node_id": n.node_id,
        "raft_id": n.raft_id,
        "role": n.role,
        "leader": n.node_id == leader,
        "health": n.health,
        "last_heard_ms_ago": n.last_heard_ms_ago,
        "client_address": n.client_address,
        "peer_address": n.peer_address,
        "queues": n.queues,
        "shards_replicated": n.shards_replicated,
        "shards_led": n.shards_led,
        "shards_preferred": n.shards_preferred,
        "incarnation": format!("{:016x}", n.incarnation),
    })
}

fn node_table(s: &pb::ClusterStatus) -> Table {
    let mut table = Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header([
        "node", "role", "health", "client", "peer", "queues", "replicas", "leads",
    ]);
    for n in &s.nodes {
        let role = if n.node_id == s.leader_node_id {
            format!("{} (leader)", n.role)
        } else {
            n.role.clone()
        };
        let health = match n.health.as_str() {
            "down" if n.last_heard_ms_ago > 0 => {
                format!("down ({} s)", n.last_heard_ms_ago / 1000)
            }
            h => h.to_owned(),
        };
        table.add_row([
            n.node_id.clone(),
            role,
            health,
            n.client_address.clone(),
            n.peer_address.clone(),
            n.queues.len().to_string(),
            n.shards_replicated.to_string(),
            format!("{} (preferred {})", n.shards_led, n.shards_preferred),
        ]);
    }
    table
}
