//! Everything behind the `ferry` binary but the node itself: the command line ([`cmd`]: `ferry
//! server` hands its configuration to the node library, `ferry_node`; the other subcommands are
//! clients) and the output they write ([`output`]). The binary itself only parses arguments and
//! calls in here.
//!
//! Output goes through `output::outln!` / `errln!`: `println!` panics when a pipe closes.

#![deny(clippy::print_stdout, clippy::print_stderr)]

pub mod cmd;
pub mod output;
