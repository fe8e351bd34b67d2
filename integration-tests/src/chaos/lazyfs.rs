//! A node's data directory on LazyFS (a FUSE file system that keeps every write in its own cache
//! until it is fsynced, and drops what was not on command), through `scripts/lazyfs`: the
//! `lazyfs` scenario kills the real `ferry` binary and then drops its unsynced writes, as a
//! machine that loses power does. LazyFS must be built first (`scripts/lazyfs install`).

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

/// A LazyFS mount; unmounted when dropped (kill the node on it first).
#[derive(Debug)]
pub struct LazyFs {
    script: PathBuf,
    /// Where the node's data directory goes.
    pub dir: PathBuf,
    fifo: PathBuf,
}

/// `scripts/lazyfs` of this checkout (`$LAZYFS_SCRIPT` overrides).
fn script() -> PathBuf {
    std::env::var_os("LAZYFS_SCRIPT").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/lazyfs"),
        PathBuf::from,
    )
}

fn run(script: &Path, args: &[&Path]) -> anyhow::Result<()> {
    let out = Command::new(script)
        .args(args)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} {:?} failed: {}",
            script.display(),
            args,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

impl LazyFs {
    /// Mounts LazyFS at `under/mnt`, its data in `under/root`.
    pub fn mount(under: &Path) -> anyhow::Result<LazyFs> {
        let fs = LazyFs {
            script: script(),
            dir: under.join("mnt"),
            fifo: under.join("faults.fifo"),
        };
        run(
            &fs.script,
            &[Path::new("mount"), &fs.dir, &under.join("root"), &fs.fifo],
        )
        .context("the lazyfs scenario needs LazyFS: run scripts/lazyfs install")?;
        Ok(fs)
    }

    /// Drops every write not fsynced (the node must be dead).
    pub fn clear_cache(&self) -> anyhow::Result<()> {
        run(&self.script, &[Path::new("clear-cache"), &self.fifo])
    }
}

impl Drop for LazyFs {
    fn drop(&mut self) {
        if let Err(e) = run(&self.script, &[Path::new("umount"), &self.dir]) {
            eprintln!("could not unmount LazyFS at {}: {e:#}", self.dir.display());
        }
    }
}
