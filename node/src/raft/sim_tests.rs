//! The node's real metadata driver (`driver.rs`, around `ferry_multiraft::Driver` with the
//! metadata machine) on the multiraft simulator: three nodes in one process, simulated time,
//! a seeded lossy network. The cluster forms, takes commands through its leader, loses its
//! leader to a partition, elects another that takes commands, and every node ends with the
//! same metadata; one seed gives the same run twice.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use ferry_cluster::meta::{ClusterId, MetaCommand, MetaState, NewNode, RaftId, RequestId};
use ferry_kernel::{NodeId, QueueName};
use ferry_multiraft::sim::{Faults, Replica, Sim, Traced};
use ferry_multiraft::{MemStore, NodeId as PeerId};
use ferry_proto::pb;
use tokio::sync::{oneshot, watch};

use super::driver::{Driver, Input, Start};
use super::view::{MetaView, RaftCounters};

const STEPS_MAX: u64 = 4_000;

type Applied = (
    u64,
    Result<ferry_cluster::meta::MetaEvent, ferry_cluster::meta::MetaError>,
);

impl Replica for Driver {
    fn receive(&mut self, from: PeerId, bytes: &[u8]) {
        let input = Input::Batch {
            from,
            bytes: Bytes::copy_from_slice(bytes),
        };
        self.step([input], false);
    }

    fn wake(&mut self, tick: bool) {
        self.step(std::iter::empty(), tick);
    }
}

struct Node {
    view: watch::Receiver<Arc<MetaView>>,
}

struct Cluster {
    sim: Sim<Driver>,
    nodes: Vec<(PeerId, Node)>,
}

fn name(i: u64) -> NodeId {
    NodeId::new(format!("n{i}")).unwrap()
}

impl Cluster {
    fn new(seed: u64) -> Self {
        let mut sim = Sim::new(seed, Faults::lossy());
        let voters: Vec<(NodeId, String)> = (1..=3)
            .map(|i| (name(i), format!("10.0.0.{i}:7401")))
            .collect();
        let mut nodes = vec![];
        for (i, (me, _)) in voters.iter().enumerate() {
            let engine = super::bootstrap(me, &voters, seed).unwrap();
            let peer = engine.node();
            let start = Start {
                engine: Some(engine),
                meta: MetaState::new(),
                store: Box::new(MemStore::new()),
                tick: Duration::from_millis(100),
                election_seed: seed + i as u64,
                rewrite_durable: false,
                resumed: false,
                rounds: ferry_multiraft::DriverConfig::default(),
            };
            let (view_tx, view) = watch::channel(Arc::new(MetaView::empty()));
            let mut driver = Driver::new(
                start,
                Box::new(sim.outbound(peer)),
                view_tx,
                Arc::new(RaftCounters::default()),
            );
            driver.begin();
            sim.add(peer, driver);
            nodes.push((peer, Node { view }));
        }
        sim.collect();
        Cluster { sim, nodes }
    }

    fn ids(&self) -> Vec<PeerId> {
        self.nodes.iter().map(|(p, _)| *p).collect()
    }

    fn view(&self, peer: PeerId) -> Arc<MetaView> {
        let node = &self.nodes.iter().find(|(p, _)| *p == peer).unwrap().1;
        node.view.borrow().clone()
    }

    /// The node that leads, as the views say, among those not cut off.
    fn leader(&self, among: &[PeerId]) -> Option<PeerId> {
        among.iter().copied().find(|p| self.view(*p).is_leader())
    }

    fn elect(&mut self, among: &[PeerId]) -> PeerId {
        for _ in 0..STEPS_MAX {
            if let Some(leader) = self.leader(among) {
                return leader;
            }
            self.sim.step();
        }
        panic!("no leader among {among:?}");
    }

    /// Proposes `command` through the leader among `among` until an attempt is applied (the
    /// same request each time); its index and what applying it said.
    fn propose(&mut self, among: &[PeerId], command: &MetaCommand) -> Applied {
        let bytes = command.encode_request(Some(RequestId(rand_id(command))));
        for _ in 0..20 {
            let leader = self.elect(among);
            let (reply, mut answer) = oneshot::channel();
            let input = Input::Propose {
                command: bytes.clone(),
                reply,
            };
            self.sim.replica_mut(leader).unwrap().step([input], false);
            self.sim.collect();
            for _ in 0..STEPS_MAX {
                if let Ok(outcome) = answer.try_recv() {
                    match outcome {
                        Ok(applied) => return applied,
                        // Lost to a leader change on the lossy network: the same request again.
                        Err(_) => break,
                    }
                }
                self.sim.step();
            }
        }
        panic!("{command:?} never applied");
    }

    /// Steps until every node applied the same metadata; that metadata's applied index.
    fn converge(&mut self) -> u64 {
        let ids = self.ids();
        for _ in 0..STEPS_MAX {
            let views: Vec<Arc<MetaView>> = ids.iter().map(|p| self.view(*p)).collect();
            let first = &views[0].meta;
            if views.iter().all(|v| v.meta == *first) && first.cluster_id().is_some() {
                return first.applied_index();
            }
            self.sim.step();
        }
        panic!("the nodes' metadata never converged");
    }
}

/// A request id of the command's own (a test's commands differ in their text).
fn rand_id(command: &MetaCommand) -> u128 {
    format!("{command:?}")
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u128, |h, b| {
            (h ^ u128::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
        .max(1)
}

fn create(queue: &str, owner: u64) -> MetaCommand {
    MetaCommand::CreateQueue {
        name: QueueName::new(queue).unwrap(),
        settings: pb::QueueConfig::default(),
        owner: name(owner),
    }
}

/// Forms the cluster, creates queues, cuts the leader off, creates more through the new
/// leader, heals; the trace of the network.
fn run(seed: u64) -> (Cluster, Vec<(u64, Traced)>) {
    let mut cluster = Cluster::new(seed);
    let all = cluster.ids();
    let nodes = (1..=3)
        .map(|i| NewNode {
            id: name(i),
            client_addr: format!("10.0.0.{i}:7400"),
            peer_addr: format!("10.0.0.{i}:7401"),
        })
        .collect();
    let bootstrap = MetaCommand::Bootstrap {
        cluster_id: ClusterId(u128::from(seed) + 1),
        nodes,
    };
    let (_, formed) = cluster.propose(&all, &bootstrap);
    assert!(formed.is_ok(), "{formed:?}");
    let (_, before) = cluster.propose(&all, &create("before", 1));
    assert!(before.is_ok(), "{before:?}");

    let old = cluster.leader(&all).unwrap();
    cluster.sim.isolate(old, &all);
    let rest: Vec<PeerId> = all.iter().copied().filter(|p| *p != old).collect();
    let (_, during) = cluster.propose(&rest, &create("during", 2));
    assert!(during.is_ok(), "{during:?}");
    assert_ne!(cluster.leader(&rest), Some(old));

    cluster.sim.heal();
    cluster.converge();
    let trace = cluster.sim.trace().to_vec();
    (cluster, trace)
}

#[test]
fn the_real_driver_forms_a_cluster_fails_over_and_converges_on_the_simulator() {
    let (cluster, trace) = run(5);
    let view = cluster.view(cluster.ids()[0]);
    for queue in ["before", "during"] {
        assert!(
            view.meta.queue(&QueueName::new(queue).unwrap()).is_some(),
            "{queue} on every node"
        );
    }
    assert!(trace.iter().any(|(_, e)| matches!(e, Traced::Lost { .. })));
    // Every node ends in the cluster's voters, as the metadata recorded them.
    for peer in cluster.ids() {
        let status = cluster.view(peer).group.clone().unwrap();
        assert_eq!(status.voters.len(), 3, "{peer}: {status:?}");
        assert_eq!(cluster.view(peer).raft_id, Some(RaftId(peer.0)));
    }
}

#[test]
fn the_same_seed_gives_the_same_run() {
    let (_, first) = run(9);
    let (_, again) = run(9);
    assert_eq!(first, again);
}
