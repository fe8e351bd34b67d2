//! `chaos SCENARIO [--seed S] [--minutes M] [--smoke] [--planted BUG] [--out DIR]`: runs one fault scenario
//! against a real `ferry server` or a cluster of three (the binary next to this one, or `$FERRY_BIN`), writes its
//! JSON report and history to DIR (default `chaos-results/`), prints a summary, and exits
//! non-zero unless the checker found nothing (no loss, no unflagged duplicate, no broken
//! invariant) and the run itself went through. `--planted BUG` runs the node built with fault
//! injection (`ferry-faults`) with that bug switched on: the checker must then find it (the run
//! is INVALID and the exit status non-zero). `scripts/chaos` builds and runs it.

use std::time::Duration;

use anyhow::{bail, Context};
use ferry_integration_tests::chaos::scenario::{self, Size, PLANTED, SCENARIOS};

const USAGE: &str =
    "usage: chaos SCENARIO [--seed S] [--minutes M] [--smoke] [--planted BUG] [--out DIR]";

struct Args {
    scenario: String,
    seed: u64,
    size: Size,
    planted: Option<String>,
    out: std::path::PathBuf,
}

fn parse() -> anyhow::Result<Args> {
    let mut args = std::env::args().skip(1);
    let mut scenario = None;
    let mut seed = None;
    let mut minutes = 2.0;
    let mut smoke = false;
    let mut planted = None;
    let mut out = scenario::default_out_dir();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seed" => seed = Some(args.next().context(USAGE)?.parse()?),
            "--minutes" => minutes = args.next().context(USAGE)?.parse()?,
            "--smoke" => smoke = true,
            "--planted" => planted = Some(args.next().context(USAGE)?),
            "--out" => out = args.next().context(USAGE)?.into(),
            "-h" | "--help" => {
                println!("{USAGE}\nscenarios: {}", SCENARIOS.join(", "));
                for (bug, scenario, finds) in PLANTED {
                    println!("--planted {bug}: {scenario} must find {finds}");
                }
                std::process::exit(0);
            }
            s if !s.starts_with('-') && scenario.is_none() => scenario = Some(s.to_string()),
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    let scenario =
        scenario.with_context(|| format!("{USAGE}\nscenarios: {}", SCENARIOS.join(", ")))?;
    if !(minutes > 0.0 && minutes <= 24.0 * 60.0) {
        bail!("--minutes must be in (0, 1440]");
    }
    // A seed from the clock when none is given; the report names it, for a replay.
    let seed = seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64 % 1_000_000_007)
    });
    let size = if smoke {
        Size::Smoke
    } else {
        Size::Full { minutes }
    };
    Ok(Args {
        scenario,
        seed,
        size,
        planted,
        out,
    })
}

fn main() -> anyhow::Result<()> {
    let args = parse()?;
    if std::env::var_os("FERRY_BIN").is_none() {
        // The server binary sits next to this one (target/<profile>/).
        let exe = std::env::current_exe()?;
        let bin = exe.with_file_name(format!("ferry{}", std::env::consts::EXE_SUFFIX));
        // Set before any thread starts.
        std::env::set_var("FERRY_BIN", bin);
    }
    let mut spec = scenario::spec(&args.scenario, args.seed, args.size)?;
    if let Some(bug) = &args.planted {
        spec.plant(bug)?;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let report = runtime.block_on(async {
        tokio::select! {
            r = scenario::run(&spec, &args.out) => r,
            // Ctrl-C: return, so the node processes, temp dirs and iptables rules are cleaned up
            // by their guards.
            _ = tokio::signal::ctrl_c() => bail!("interrupted"),
        }
    });
    // Give spawned tasks a moment to see their resources go (bounded).
    runtime.shutdown_timeout(Duration::from_secs(5));
    let report = report?;
    print!("{}", report.summary());
    println!(
        "report: {}",
        args.out
            .join(format!("{}-{}.json", report.scenario, report.seed))
            .display()
    );
    if !report.valid {
        std::process::exit(1);
    }
    Ok(())
}
