//! `Cluster.MoveShardReplica` (`ferry shard move-replica`): moves a queue shard's replica from
//! one node to another. The request is checked against this node's metadata (so a mistake is
//! answered with what to fix before anything is proposed), the replacement chosen when none is
//! named ([`choose_replacement`]), the shard's leader required (its group must be running for
//! the new replica to be filled), and [`MetaCommand::MoveReplica`] proposed. The shard's group
//! then follows on its own (`members.rs`).

use ferry_be_server::ShardId;
use ferry_cluster::meta::{choose_replacement, MetaCommand, MetaError};
use ferry_proto::pb;
use tonic::Status;

use super::super::propose::meta_status;
use super::super::service::node_id;
use super::super::MetaNode;
use super::list::ShardListError;

impl MetaNode {
    /// See the module docs and `ferry.v1.Cluster.MoveShardReplica`.
    pub(crate) async fn move_shard_replica(
        &self,
        r: pb::MoveShardReplicaRequest,
    ) -> Result<pb::MoveShardReplicaResponse, Status> {
        if r.shard == 0 {
            return Err(Status::invalid_argument(
                "shard: name a queue shard by its id (1 or more), as `ferry shard list` shows it",
            ));
        }
        let shard = ShardId(r.shard);
        let from = node_id("from_node", &r.from_node)?;
        let named = match r.to_node.as_str() {
            "" => None,
            to => Some(node_id("to_node", to)?),
        };
        let view = self.shared.view.borrow().clone();
        let meta = &view.meta;
        let def = meta
            .shard(shard)
            .ok_or(ShardListError::UnknownShard { shard })?;
        if !def.replicas.contains(&from) {
            return Err(meta_status(&MetaError::NotAReplica {
                shard,
                node: from,
                replicas: def.replicas.clone(),
            }));
        }
        let to = match named {
            Some(to) => {
                let Some(node) = meta.node(&to) else {
                    return Err(Status::not_found(format!(
                        "node {to} is no node of the cluster; `ferry cluster status` lists them"
                    )));
                };
                if !node.is_active() {
                    return Err(meta_status(&MetaError::NodeRemoved { node: to }));
                }
                if def.replicas.contains(&to) {
                    return Err(meta_status(&MetaError::AlreadyAReplica { shard, node: to }));
                }
                to
            }
            None => choose_replacement(meta, shard, &from, &self.down_nodes(meta))
                .map_err(|e| meta_status(&e))?,
        };
        let listed = self.list_shards(Some(shard)).await?;
        if listed.first().is_none_or(|s| s.leader.is_empty()) {
            return Err(Status::unavailable(format!(
                "shard {} has no leader now (an election, or most of its replicas down); a replica moves only while the shard's group runs: try again",
                shard.0
            )));
        }
        let command = MetaCommand::MoveReplica {
            shard,
            from: from.clone(),
            to: to.clone(),
        };
        self.propose(&command).await?;
        tracing::info!(%shard, %from, %to, "a queue shard's replica moved");
        let replicas = self
            .shared
            .view
            .borrow()
            .meta
            .shard(shard)
            .map(|d| d.replicas.iter().map(ToString::to_string).collect())
            .unwrap_or_default();
        Ok(pb::MoveShardReplicaResponse {
            to_node: to.to_string(),
            replicas,
        })
    }
}
