//! A Jepsen-style fault harness on real `ferry server` processes (issue 16): workers record
//! every operation in a [`history::History`], a nemesis injects faults (kill -9, SIGSTOP, a TCP
//! proxy that delays, resets and black-holes; in a three-node cluster, iptables partitions and
//! kills of a replicated queue's shard leader, whose [`failover`] times the report gives),
//! the queues are drained to the end, and the [`checker`] judges what happened. `scripts/chaos SCENARIO` runs one scenario at full size;
//! `tests/chaos_smoke.rs` runs each at smoke size.

pub mod checker;
pub mod cluster;
mod disk_lost;
pub mod failover;
pub mod history;
pub mod lazyfs;
pub mod nemesis;
pub mod partition;
pub mod proxy;
pub mod report;
pub mod scenario;
pub mod synthetic;
pub mod unavailability;
pub mod workload;
