//! `ferry check-disk`: how long the disk under a data directory takes to make an appended write
//! durable, the way RocksDB's write-ahead log does it (append, then `fdatasync`). Every
//! persistent send waits for one such sync, so its p50 is the floor of a send's latency and its
//! tail is the send's tail. Also says whether the file system trims online (`discard`), which
//! stalls syncs after file deletions (see "Disk latency" in `docs/operations.md`).

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hdrhistogram::Histogram;
use serde_json::json;

use super::{latency, ClientArgs};
use crate::output::{outln, Format};

#[derive(Debug, clap::Args)]
pub struct CheckDiskArgs {
    /// The directory to test: the node's data directory, or where it will be (created if
    /// missing).
    #[arg(long, default_value = "./ferry-data")]
    data_dir: PathBuf,
    /// Synced appends to time.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    count: u64,
    /// Bytes appended before each sync (a 1 KiB message's log record is about 1.1 KiB).
    #[arg(long, default_value_t = 1_100, value_parser = clap::value_parser!(u64).range(1..=16_777_216))]
    size: u64,
    #[command(flatten)]
    not_a_client: super::NotAClient,
}

/// Removes the test file however the check ends (short of the process being killed: an
/// interrupted run leaves `.ferry-check-disk-<pid>` behind).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

pub fn run(c: &ClientArgs, a: CheckDiskArgs) -> anyhow::Result<()> {
    // The directories this run creates (the data directory and any missing parents), deepest
    // first: removed again at the end, unless something else was put in them meanwhile.
    let created: Vec<PathBuf> = a
        .data_dir
        .ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .take_while(|p| !p.exists())
        .map(Path::to_path_buf)
        .collect();
    let result = fs::create_dir_all(&a.data_dir)
        .with_context(|| format!("cannot create {}", a.data_dir.display()))
        .and_then(|()| Ok(fs::canonicalize(&a.data_dir)?))
        .and_then(|dir| Ok((check(&a, &dir)?, dir)));
    for d in &created {
        if fs::remove_dir(d).is_err() {
            break;
        }
    }
    let ((syncs, elapsed), dir) = result?;
    let discard = online_discard(&dir);
    let per_sec = a.count as f64 / elapsed.as_secs_f64().max(1e-9);
    match c.output {
        Format::Json => {
            let summary = json!({
                "data_dir": dir.display().to_string(),
                "syncs": a.count,
                "size": a.size,
                "syncs_per_sec": per_sec.round(),
                "online_discard": discard,
            });
            outln!("{}", latency::with_quantiles(summary, &syncs))?;
        }
        Format::Human => {
            let cells = vec![a.count.to_string(), format!("{per_sec:.0}")];
            let t = latency::table(&["synced appends", "per second"], cells, &syncs);
            outln!("{t}")?;
            outln!(
                "appends of {} B, each followed by fdatasync, in {}",
                a.size,
                dir.display()
            )?;
            outln!(
                "a persistent send takes at least the p50 plus a network round trip (ferry rtt)"
            )?;
            match discard {
                Some(true) => outln!(
                    "warning: this file system is mounted with `discard`: file deletions stall later syncs; mount without it and run fstrim periodically"
                )?,
                Some(false) => {}
                None => outln!("(could not tell whether the file system trims online)")?,
            }
        }
    }
    Ok(())
}

/// Times `count` synced appends to a scratch file in `dir`, removed afterwards.
fn check(a: &CheckDiskArgs, dir: &Path) -> anyhow::Result<(Histogram<u64>, Duration)> {
    let path = dir.join(format!(".ferry-check-disk-{}", std::process::id()));
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&path)
        .with_context(|| format!("cannot create a test file in {}", dir.display()))?;
    // Only a file this run created is removed.
    let scratch = Scratch(path);
    let block = vec![0x5a_u8; usize::try_from(a.size)?];
    let mut syncs = latency::histogram()?;
    let started = Instant::now();
    for _ in 0..a.count {
        let t = Instant::now();
        append_synced(&mut file, &block)
            .with_context(|| format!("writing {}", scratch.0.display()))?;
        latency::record(&mut syncs, t.elapsed());
    }
    let elapsed = started.elapsed();
    drop(file);
    drop(scratch);
    Ok((syncs, elapsed))
}

fn append_synced(file: &mut File, block: &[u8]) -> std::io::Result<()> {
    file.write_all(block)?;
    file.sync_data()
}

/// Whether the file system holding `dir` is mounted with `discard`; `None` if the mount table
/// cannot be read (not Linux, say).
fn online_discard(dir: &Path) -> Option<bool> {
    let table = fs::read_to_string("/proc/self/mountinfo").ok()?;
    mount_options_for(&table, dir).map(|opts| opts.split(',').any(|o| o == "discard"))
}

/// The mount options (per-mount and the file system's own, comma-joined) of the longest mount
/// point containing `dir`, from the text of `/proc/self/mountinfo`.
fn mount_options_for(mountinfo: &str, dir: &Path) -> Option<String> {
    let mut best: Option<(usize, String)> = None;
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional...] - fstype source super-options
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = left.split(' ').collect();
        let (Some(mount_point), Some(options)) = (fields.get(4), fields.get(5)) else {
            continue;
        };
        let mount_point = unescape(mount_point);
        if !dir.starts_with(&mount_point) {
            continue;
        }
        let depth = Path::new(&mount_point).components().count();
        if best.as_ref().is_some_and(|(d, _)| *d > depth) {
            continue;
        }
        let super_options = right.split(' ').nth(2).unwrap_or("");
        best = Some((depth, format!("{options},{super_options}")));
    }
    best.map(|(_, opts)| opts)
}

/// Mount points in mountinfo escape space, tab, newline and backslash as octal (`\040`).
fn unescape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('\\') {
        out.push_str(&rest[..i]);
        let code = rest.get(i + 1..i + 4);
        match code.and_then(|c| u8::from_str_radix(c, 8).ok()) {
            Some(b) => {
                out.push(char::from(b));
                rest = &rest[i + 4..];
            }
            None => {
                out.push('\\');
                rest = &rest[i + 1..];
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw,discard,resuid=65534
40 22 0:35 / /data rw,noatime shared:20 - xfs /dev/vdb rw,attr2
41 22 0:36 / /mnt/my\\040disk rw,relatime - ext4 /dev/vdc rw
";

    #[test]
    fn the_longest_mount_point_decides() {
        let opts = |p: &str| mount_options_for(MOUNTINFO, Path::new(p));
        assert_eq!(
            opts("/var/lib/ferry").as_deref(),
            Some("rw,relatime,rw,discard,resuid=65534")
        );
        assert_eq!(opts("/data/ferry").as_deref(), Some("rw,noatime,rw,attr2"));
        // A sibling whose name merely starts the same is not under /data.
        assert_eq!(
            opts("/database").as_deref(),
            Some("rw,relatime,rw,discard,resuid=65534")
        );
        assert_eq!(opts("/mnt/my disk/x").as_deref(), Some("rw,relatime,rw"));
    }
}
