//! Everything behind the `ferry` binary: node assembly ([`node`]) and its listeners
//! ([`accept`]), configuration ([`config`]) and the client subcommands ([`cmd`]). The binary itself only parses arguments and calls in here.
//!
//! Output goes through `output::outln!` / `errln!`: `println!` panics when a pipe closes.

#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod accept;
pub mod cluster;
pub mod cmd;
pub mod config;
pub mod metrics;
pub mod node;
pub mod output;
pub mod process;
pub mod status;
