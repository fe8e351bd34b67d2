//! Refuses to test a server binary that was not built from the sources this test was built from.
//!
//! The target directory is shared: between profiles, between worktrees of the repository, and
//! between a `cargo build --bins` and any later edit. A plain `cargo test` builds the test
//! executables but not the `ferry` binary they start, so without this check it tests whatever
//! server was linked last: an older one, or one built from another checkout.
//!
//! The record of what a binary is made of is cargo's own: beside every binary it writes
//! `<binary>.d`, listing every local source file (and build-script output) compiled into it. The
//! binary is fresh when every one of those files still exists, none changed after the binary was
//! linked (cargo's own rule: a newer source means a rebuild), and each belongs to this workspace or
//! to the binary's own target directory (generated code). Not covered: a manifest change that
//! alters the binary without touching a source (cargo records no file for it), and an edit made
//! while the binary was being built (cargo notices that one on its next build).

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};

/// The workspace the integration tests were built from.
pub(crate) fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("invariant: integration-tests sits in the workspace root")
}

/// The command that rebuilds `bin` in its profile (`target/<profile>/<name>`).
pub(crate) fn rebuild_command(bin: &Path) -> String {
    let release = bin
        .parent()
        .and_then(Path::file_name)
        .is_some_and(|profile| profile == "release");
    let profile = if release { " --release" } else { "" };
    let name = bin.file_stem().and_then(|n| n.to_str()).unwrap_or("ferry");
    if name == "ferry-faults" {
        format!("cargo build{profile} -p ferry-cli --features failpoints --bin ferry-faults")
    } else {
        format!("cargo build{profile} --workspace --bins")
    }
}

/// Fails, saying what to run, unless `bin` was built from the current sources of `workspace`
/// (see the module docs). `dep_info_required`: a binary of the target directory always has its
/// `.d`; one named by `$FERRY_BIN` may come from elsewhere, and is then taken as given.
pub(crate) fn ensure_fresh(
    bin: &Path,
    workspace: &Path,
    dep_info_required: bool,
) -> anyhow::Result<()> {
    let rebuild = rebuild_command(bin);
    let dep_info = bin.with_extension("d");
    if !dep_info.exists() {
        if dep_info_required {
            bail!(
                "{} has no {} beside it (cargo writes one with every build), so what it was built \
                 from is unknown: rebuild it with `{rebuild}`",
                bin.display(),
                dep_info.display()
            );
        }
        return Ok(());
    }
    let built = modified(bin)?;
    let text = std::fs::read_to_string(&dep_info)
        .with_context(|| format!("reading {}", dep_info.display()))?;
    // Generated sources (the proto crate's OUT_DIR) live in the binary's own target directory.
    let target_dir = bin
        .parent()
        .and_then(Path::parent)
        .unwrap_or(Path::new("/"));
    let mut newest: Option<(PathBuf, SystemTime)> = None;
    for source in sources(&text) {
        if !source.starts_with(workspace) && !source.starts_with(target_dir) {
            bail!(
                "{} was built from another checkout ({}), not from {}: rebuild it with `{rebuild}` \
                 in {}",
                bin.display(),
                source.display(),
                workspace.display(),
                workspace.display()
            );
        }
        let Ok(changed) = modified(&source) else {
            bail!(
                "{} was built from {}, which is gone: rebuild it with `{rebuild}`",
                bin.display(),
                source.display()
            );
        };
        if newest.as_ref().is_none_or(|(_, t)| changed > *t) {
            newest = Some((source, changed));
        }
    }
    match newest {
        None => bail!(
            "{} names no sources: rebuild {} with `{rebuild}`",
            dep_info.display(),
            bin.display()
        ),
        Some((source, changed)) if changed > built => bail!(
            "{} is older than its sources: it was linked at {}, and {} changed at {}. Rebuild it \
             with `{rebuild}` (a plain `cargo test` builds the tests, not the server they start)",
            bin.display(),
            utc(built),
            source.display(),
            utc(changed)
        ),
        Some(_) => Ok(()),
    }
}

fn modified(path: &Path) -> anyhow::Result<SystemTime> {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .with_context(|| format!("reading the modification time of {}", path.display()))
}

/// The prerequisites of the first rule of a Makefile-style dep-info file (spaces in paths are
/// escaped with a backslash).
fn sources(dep_info: &str) -> Vec<PathBuf> {
    let Some(rule) = dep_info
        .lines()
        .find(|l| !l.trim().is_empty() && !l.starts_with('#'))
    else {
        return vec![];
    };
    let Some((_, deps)) = rule.split_once(": ") else {
        return vec![];
    };
    let mut out = vec![];
    let mut current = String::new();
    let mut chars = deps.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => current.extend(chars.next()),
            ' ' => {
                if !current.is_empty() {
                    out.push(PathBuf::from(std::mem::take(&mut current)));
                }
            }
            c => current.push(c),
        }
    }
    if !current.is_empty() {
        out.push(PathBuf::from(current));
    }
    out
}

/// `YYYY-MM-DD HH:MM:SS UTC`, for messages.
fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rest / 3_600,
        rest / 60 % 60,
        rest % 60
    )
}

#[cfg(test)]
mod tests {
    use std::fs::File;
    use std::time::Duration;

    use super::*;

    /// A workspace with one source file and a target directory with a `ferry` binary whose
    /// dep-info names that source (and a generated file), with the given modification times.
    struct Fixture {
        _dir: tempfile::TempDir,
        workspace: PathBuf,
        source: PathBuf,
        bin: PathBuf,
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    fn touch(path: &Path, time: SystemTime) {
        std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        let f = File::create(path).expect("create");
        f.set_modified(time).expect("set mtime");
    }

    fn fixture(profile: &str, bin_name: &str, source_time: u64, bin_time: u64) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let workspace = dir.path().join("my checkout");
        let source = workspace.join("kernel/src/queue/ack.rs");
        let target = dir.path().join("target");
        let generated = target
            .join(profile)
            .join("build/ferry-proto-1/out/ferry.v1.rs");
        let bin = target.join(profile).join(bin_name);
        touch(&source, at(source_time));
        touch(&generated, at(1_000));
        touch(&bin, at(bin_time));
        write_dep_info(&bin, &[&generated, &source]);
        Fixture {
            _dir: dir,
            workspace,
            source,
            bin,
        }
    }

    fn write_dep_info(bin: &Path, sources: &[&Path]) {
        let escape = |p: &Path| p.display().to_string().replace(' ', "\\ ");
        let deps: Vec<String> = sources.iter().map(|p| escape(p)).collect();
        let text = format!("{}: {}\n", escape(bin), deps.join(" "));
        std::fs::write(bin.with_extension("d"), text).expect("write dep-info");
    }

    #[test]
    fn a_binary_linked_after_its_sources_changed_is_accepted() {
        let f = fixture("release", "ferry", 2_000, 3_000);
        ensure_fresh(&f.bin, &f.workspace, true).expect("fresh");
    }

    #[test]
    fn a_binary_older_than_a_source_is_refused_with_the_rebuild_command() {
        let f = fixture("release", "ferry", 1_700_000_100, 1_700_000_000);
        let e = ensure_fresh(&f.bin, &f.workspace, true)
            .expect_err("stale")
            .to_string();
        assert!(e.contains(&f.bin.display().to_string()), "{e}");
        assert!(e.contains(&f.source.display().to_string()), "{e}");
        assert!(e.contains("2023-11-14 22:13:20 UTC"), "binary time: {e}");
        assert!(e.contains("2023-11-14 22:15:00 UTC"), "source time: {e}");
        assert!(
            e.contains("`cargo build --release --workspace --bins`"),
            "{e}"
        );
    }

    #[test]
    fn a_stale_debug_binary_gets_the_debug_command() {
        let f = fixture("debug", "ferry", 3_000, 2_000);
        let e = ensure_fresh(&f.bin, &f.workspace, true)
            .expect_err("stale")
            .to_string();
        assert!(e.contains("`cargo build --workspace --bins`"), "{e}");
    }

    #[test]
    fn a_stale_fault_injection_binary_gets_its_own_command() {
        let f = fixture("release", "ferry-faults", 3_000, 2_000);
        let e = ensure_fresh(&f.bin, &f.workspace, true)
            .expect_err("stale")
            .to_string();
        assert!(
            e.contains(
                "`cargo build --release -p ferry-cli --features failpoints --bin ferry-faults`"
            ),
            "{e}"
        );
    }

    #[test]
    fn a_binary_built_from_another_checkout_is_refused() {
        let f = fixture("release", "ferry", 2_000, 3_000);
        let other = f.workspace.with_file_name("other checkout");
        let e = ensure_fresh(&f.bin, &other, true)
            .expect_err("foreign")
            .to_string();
        assert!(e.contains("another checkout"), "{e}");
    }

    #[test]
    fn a_binary_whose_source_is_gone_is_refused() {
        let f = fixture("release", "ferry", 2_000, 3_000);
        std::fs::remove_file(&f.source).expect("remove");
        let e = ensure_fresh(&f.bin, &f.workspace, true)
            .expect_err("gone")
            .to_string();
        assert!(e.contains("which is gone"), "{e}");
    }

    #[test]
    fn a_target_binary_without_dep_info_is_refused_and_a_chosen_one_taken_as_given() {
        let f = fixture("release", "ferry", 3_000, 2_000);
        std::fs::remove_file(f.bin.with_extension("d")).expect("remove");
        let e = ensure_fresh(&f.bin, &f.workspace, true)
            .expect_err("unknown")
            .to_string();
        assert!(e.contains("has no"), "{e}");
        ensure_fresh(&f.bin, &f.workspace, false).expect("FERRY_BIN without dep-info");
    }

    #[test]
    fn dep_info_paths_with_escaped_spaces_parse() {
        let text = "/t/release/ferry: /w/a\\ b.rs /w/c.rs\n\n/w/a\\ b.rs:\n";
        assert_eq!(
            sources(text),
            vec![PathBuf::from("/w/a b.rs"), PathBuf::from("/w/c.rs")]
        );
    }
}
