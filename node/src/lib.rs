//! The node shell: everything a running Ferry node is beyond its parts.
//!
//! [`config`] reads the node's configuration (TOML file, environment, flags, each value with its
//! source); [`run`] assembles a node from it — the store and its one writer, the back-end, the
//! front-end and its router, the metadata group ([`raft`]: the Raft engine's thread, the peer
//! links and the `Peer` and `Cluster` services), status, health and metrics — and serves it on
//! the listeners it is handed until shutdown. [`meta_link`] ties the metadata group to the
//! local back-end (creations and deletions carried out) and to the router (the placement it
//! follows). The `ferry` binary parses flags and calls [`run::run`]; tests call it directly.
//!
//! Depends on every server crate; nothing depends on it but the binary and its tests.

#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod accept;
pub mod config;
pub mod data_dir;
mod faults;
pub mod meta_link;
pub mod metrics;
pub mod process;
pub mod raft;
pub mod run;
pub mod status;
