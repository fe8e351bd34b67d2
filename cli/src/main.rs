use std::process::ExitCode;

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
