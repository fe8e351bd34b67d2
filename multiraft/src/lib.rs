//! Ferry's multi-group Raft engine: many Raft groups on one node (group 0 for the cluster
//! metadata, groups 1..N for queue shards), built on tikv's `raft` crate.
//!
//! The core is sans-I/O. An [`Engine`] is driven by explicit inputs ([`Engine::step`],
//! [`Engine::tick`], [`Engine::propose`], [`Engine::propose_conf_change`],
//! [`Engine::on_persisted`]...) and every call of [`Engine::round`] returns what the shell must
//! do: ONE [`PersistJob`] covering every group (written with one write, synced unless
//! [`PersistJob::must_sync`] says it need not be), ONE encoded
//! batch per peer node covering every group (so the wire cost grows with peers, not groups),
//! the committed entries and installed snapshots to apply, and leader changes. Messages that
//! must wait for durability are released only by [`Engine::on_persisted`].
//!
//! A round, in order (see [`Engine::round`] for the details):
//! 1. feed inputs: `step` for each received batch, `tick` when the tick timer fires,
//!    `propose`, `on_persisted` when the previous job's synced write returned;
//! 2. `let round = engine.round()`;
//! 3. send each `round.batches` entry to its node, and each of `round.snapshots` (on a stream
//!    of its own, in chunks: they can be large; the receiver steps [`OutSnapshot::as_batch`]);
//! 4. apply `round.applies` in order and add the state machine's own writes (with its applied
//!    index) to `round.persist` with [`PersistJob::put_app`]; note `round.role_changes`;
//! 5. write `round.persist` with [`LogStore::write`] (synced if it must be), then call
//!    `engine.on_persisted(job.id())`; jobs are written in the order they were made (a
//!    writer thread may lag behind the rounds: that is the async-ready flow);
//! 6. for each group in `round.snapshot_requests`, and whenever the log grows long, call
//!    [`Engine::compact`] with the state machine's state at its applied index.
//!
//! raft-rs runs with `check_quorum`, `pre_vote` and `skip_bcast_commit` on. Its
//! `batch_append` is off: in raft-rs 0.7 it can make a follower acknowledge an entry it does
//! not have (see `config.rs`); the engine's one batch per peer per round does that job.
//!
//! Storage is one [`LogStore`] for every group's log, hard state, snapshot and apply state:
//! [`RocksStore`] (a `raft` column family with group-prefixed big-endian keys) and [`MemStore`]
//! (the same key layout in memory, modelling durability: writes not covered by a sync are read
//! back until a simulated crash loses them). On start, [`LogStore::load`] gives the [`Recovered`] state that
//! [`Engine::open`] resumes from.
//!
//! Steps 2 to 6 are written once, in [`Driver`], generic over each group's [`GroupMachine`]:
//! the node's threads and the simulations run it. With the feature `sim`, [`sim::Sim`] runs
//! many nodes' drivers in one process on a seeded network and simulated time.
//!
//! Must not depend on: tonic, ferry-proto, tokio or any async runtime, a clock, threads or a
//! random source. raft-rs's protobuf types (prost 0.11) stay inside this crate: between nodes
//! travel opaque bytes ([`OutBatch`]), and the public API speaks in [`GroupId`], [`NodeId`],
//! [`ConfChange`] and byte strings.

mod codec;
mod config;
mod driver;
mod engine;
mod error;
mod group;
mod group_log;
mod ids;
mod keys;
mod logger;
mod persist;
mod round;
#[cfg(feature = "sim")]
pub mod sim;
mod storage;

pub use codec::{decode_batch, encode_batch, snapshot_position, BATCH_VERSION};
pub use config::EngineConfig;
pub use driver::{
    Driver, DriverConfig, GroupMachine, Halt, Outbound, ProposeFailure, Proposed, Reply, RoundsDone,
};
pub use engine::{Engine, FollowerProgress, GroupStatus, LeaderProgress};
pub use error::Error;
pub use ids::{GroupId, LogPosition, NodeId, PersistId};
pub use keys::{KvOp, Space};
pub use logger::raft_logger;
pub use persist::{Attachment, PersistJob};
pub use round::{Apply, ConfChange, EntryKind, OutBatch, OutSnapshot, Role, RoleChange, Round};
pub use storage::memory::MemStore;
pub use storage::rocks::{RocksStore, APP_CF, RAFT_CF};
pub use storage::{KeyValue, LogStore, Recovered};
