use std::process::ExitCode;

/// jemalloc, not the system allocator: a broker frees and allocates message-sized blocks by the
/// million, and glibc's allocator fragments under that (after a queue paged a backlog in and out,
/// a quarter of the node's CPU went to searching and merging its free lists: `_int_malloc`,
/// `unlink_chunk`, `malloc_consolidate`), and keeps freed memory.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

use clap::Parser;

fn main() -> ExitCode {
    let cli = ferry_cli::cmd::Cli::parse();
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
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(ferry_cli::cmd::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
