//! The `ferry` binary: parses the command line and runs it (see `ferry_cli`).

#![deny(clippy::print_stdout, clippy::print_stderr)]

use std::process::ExitCode;

/// jemalloc, not the system allocator: a broker frees and allocates message-sized blocks by the
/// million, and glibc's allocator fragments under that (after a queue paged a backlog in and out,
/// a quarter of the node's CPU went to searching and merging its free lists: `_int_malloc`,
/// `unlink_chunk`, `malloc_consolidate`), and keeps freed memory.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use ferry_cli::cmd::Interrupted;
use ferry_cli::output::{error_report, write_err_line, StdoutClosed, EXIT_STDOUT_CLOSED};

/// RocksDB (C++) allocates with the C library's `malloc`, not jemalloc: memtable arena blocks
/// of 2 MiB, freed when a memtable is flushed. glibc serves blocks this large with `mmap`, but
/// after the first is freed it raises its threshold to the block's size, so later blocks come
/// from its heaps and stay resident after they are freed (about 10 MiB more at the peak of the
/// standard benchmark). A fixed threshold keeps them on `mmap`: freed means returned.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code)]
fn return_large_c_blocks_to_the_os() {
    // SAFETY: `mallopt` only changes an allocator setting; it is called before any other thread
    // exists, so nothing allocates concurrently.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn return_large_c_blocks_to_the_os() {}

pub fn main() -> ExitCode {
    // `ferry-faults` only (docs/reliability.md): fault points named by `FAILPOINTS`.
    #[cfg(feature = "failpoints")]
    let _fault_points = {
        if let Ok(points) = std::env::var("FAILPOINTS") {
            write_err_line(format_args!(
                "ferry-faults: fault injection on: FAILPOINTS={points}"
            ));
        }
        fail::FailScenario::setup()
    };
    let cli = ferry_cli::cmd::Cli::parse_args();
    if matches!(cli.command, ferry_cli::cmd::Command::Server(_)) {
        return_large_c_blocks_to_the_os();
    }
    // A node uses every core. A client command is one process talking to one node: a single
    // thread serves it with no cross-thread wake-ups, and leaves the cores to the node when both
    // run on one machine (as `ferry bench` usually does).
    let rt = if matches!(cli.command, ferry_cli::cmd::Command::Server(_)) {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    };
    let rt = match rt {
        Ok(rt) => rt,
        Err(e) => {
            write_err_line(format_args!("error: cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let server = cli.client.server.clone();
    match rt.block_on(ferry_cli::cmd::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => exit_status(&e, &server),
    }
}

/// How a command that failed exits.
fn exit_status(e: &anyhow::Error, server: &str) -> ExitCode {
    // The reader of stdout went away (`ferry browse | head -1`): stop quietly, as a Unix tool
    // killed by SIGPIPE does.
    if StdoutClosed::ended(e) {
        return ExitCode::from(EXIT_STDOUT_CLOSED);
    }
    // Some nodes did not answer: the command printed what the others hold and named them.
    if e.downcast_ref::<ferry_cli::cmd::PartialAnswer>().is_some() {
        return ExitCode::from(ferry_cli::cmd::EXIT_PARTIAL);
    }
    // Ctrl-c or SIGTERM: the command closed its connection and stops quietly.
    if let Some(i) = e.downcast_ref::<Interrupted>() {
        return ExitCode::from(i.exit_status());
    }
    write_err_line(format_args!("{}", error_report(e, server)));
    ExitCode::FAILURE
}
