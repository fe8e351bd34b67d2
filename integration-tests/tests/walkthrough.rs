//! The README's walkthrough ("Five minutes with Ferry") is `docs/walkthrough.sh`: the README must
//! show its blocks as the script has them, and the script's commands, run against a real node,
//! must print what the script says (see the script's header for the format).
//!
//! Postmortem: the README's walkthrough was written by hand and broke: `ferry reply --queue
//! pricing` failed because nothing created `pricing`, and `ferry browse` after a receive that had
//! emptied the queue printed nothing, where the README said "the rest is still there".

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context as _};
use ferry_integration_tests::{ferry_bin, memory_node, Node};

/// Blocks of the README's walkthrough section the test does not run, by their first line: each
/// needs more than one node on fixed ports, or minutes.
const NOT_RUN: &[&str] = &[
    // Benchmarks of 100 000 messages and 30 s runs.
    "ferry bench --count 100000",
    // Three nodes on the fixed ports 7401-7403.
    "deploy/local-cluster.sh start 3",
];

/// How long a background command may take after its block's other commands are done.
const BACKGROUND_MAX: Duration = Duration::from_secs(30);

/// One command of the script, with what it must print.
#[derive(Debug, Default)]
struct Step {
    /// As written (several lines when continued with `\`).
    lines: Vec<String>,
    background: bool,
    stdout: Vec<String>,
    stderr: Vec<String>,
}

impl Step {
    /// The command for `bash -c`, without a trailing `&`.
    fn command(&self) -> String {
        let text = self.lines.join("\n");
        let text = text.trim_end();
        if self.background {
            // The `&` and whatever comment follows it.
            text.rsplit_once('&').map_or(text, |(c, _)| c).to_string()
        } else {
            text.to_string()
        }
    }
}

/// One code block of the README.
#[derive(Debug, Default)]
struct Block {
    /// Shown as a terminal session (`$ command`, then its output).
    transcript: bool,
    steps: Vec<Step>,
}

impl Block {
    /// The block as the README shows it: its fence and its body.
    fn render(&self) -> String {
        let mut out = String::from(if self.transcript {
            "```console\n"
        } else {
            "```sh\n"
        });
        for step in &self.steps {
            for (i, line) in step.lines.iter().enumerate() {
                let prompt = if self.transcript && i == 0 { "$ " } else { "" };
                out += &format!("{prompt}{line}\n");
            }
            if self.transcript {
                for line in &step.stdout {
                    out += &format!("{line}\n");
                }
            }
        }
        out + "```\n"
    }
}

fn repo_file(path: &str) -> anyhow::Result<(PathBuf, String)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok((path, text))
}

/// The script's blocks.
fn parse(script: &str) -> anyhow::Result<Vec<Block>> {
    let mut blocks: Vec<Block> = vec![];
    let mut continued = false;
    for (n, line) in script.lines().enumerate() {
        let at = || format!("docs/walkthrough.sh:{}", n + 1);
        if let Some(kind) = line.strip_prefix("# block") {
            let transcript = match kind {
                "" => false,
                " transcript" => true,
                _ => bail!("{}: a block is \"# block\" or \"# block transcript\"", at()),
            };
            blocks.push(Block {
                transcript,
                steps: vec![],
            });
            continue;
        }
        let Some(block) = blocks.last_mut() else {
            // The preamble: the shebang, this file's header, `set -euo pipefail`.
            continue;
        };
        let expected = [("#>", true), ("#!", false)]
            .into_iter()
            .find_map(|(p, out)| line.strip_prefix(p).map(|rest| (rest, out)));
        if let Some((rest, stdout)) = expected {
            let step = block
                .steps
                .last_mut()
                .with_context(|| format!("{}: output expected before any command", at()))?;
            let text = rest.strip_prefix(' ').unwrap_or(rest).to_string();
            if stdout {
                step.stdout.push(text);
            } else {
                step.stderr.push(text);
            }
            continue;
        }
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        if continued {
            let step = block.steps.last_mut().context("a continued command")?;
            step.lines.push(line.to_string());
        } else {
            block.steps.push(Step {
                lines: vec![line.to_string()],
                ..Step::default()
            });
        }
        continued = line.ends_with('\\');
        let step = block.steps.last_mut().context("a command")?;
        let code = line.split(" #").next().unwrap_or(line).trim_end();
        step.background = !continued && code.ends_with('&');
    }
    Ok(blocks)
}

/// The code blocks of the README's walkthrough section, each with its fence.
fn readme_blocks(readme: &str) -> anyhow::Result<Vec<String>> {
    let start = readme
        .find("## Five minutes with Ferry")
        .context("the README has no \"Five minutes with Ferry\" section")?;
    let section = &readme[start..];
    let end = section[3..].find("\n## ").map_or(section.len(), |e| e + 3);
    let mut blocks = vec![];
    let mut current: Option<String> = None;
    for line in section[..end].lines() {
        match (&mut current, line.starts_with("```")) {
            (None, true) => current = Some(format!("{line}\n")),
            (Some(b), true) => {
                b.push_str("```\n");
                blocks.extend(current.take());
            }
            (Some(b), false) => {
                b.push_str(line);
                b.push('\n');
            }
            (None, false) => {}
        }
    }
    Ok(blocks)
}

/// Whether `line` matches `pattern`: `...` matches any text, a run of spaces any run of spaces.
fn line_matches(pattern: &str, line: &str) -> bool {
    let squeeze = |s: &str| {
        s.split(' ')
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (pattern, line) = (squeeze(pattern), squeeze(line));
    let mut parts = pattern.split("...");
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = line.strip_prefix(first) else {
        return false;
    };
    let parts: Vec<&str> = parts.collect();
    for (i, part) in parts.iter().enumerate() {
        if i + 1 == parts.len() {
            return rest.ends_with(part);
        }
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.is_empty()
}

/// Whether `lines` match `patterns`, where a pattern of `...` alone matches any lines.
fn lines_match(patterns: &[String], lines: &[&str]) -> bool {
    match patterns.split_first() {
        None => lines.is_empty(),
        Some((p, rest)) if p == "..." => {
            (0..=lines.len()).any(|skip| lines_match(rest, &lines[skip..]))
        }
        Some((p, rest)) => lines
            .split_first()
            .is_some_and(|(l, more)| line_matches(p, l) && lines_match(rest, more)),
    }
}

/// Checks one finished command against what the script says it prints.
fn check(step: &Step, out: &std::process::Output) -> anyhow::Result<()> {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let command = step.command();
    anyhow::ensure!(
        out.status.success(),
        "`{command}` failed ({}):\n{stdout}{stderr}",
        out.status
    );
    for (name, expected, got) in [
        ("stdout", &step.stdout, &stdout),
        ("stderr", &step.stderr, &stderr),
    ] {
        let lines: Vec<&str> = got.lines().collect();
        anyhow::ensure!(
            lines_match(expected, &lines),
            "`{command}` printed on {name}:\n{got}\nbut docs/walkthrough.sh expects:\n{}",
            expected.join("\n")
        );
    }
    Ok(())
}

/// A `bash -c` of `step` against `node`, with `bin_dir` (holding `ferry`) first on the PATH.
fn shell(node: &Node, bin_dir: &Path, step: &Step) -> tokio::process::Command {
    let bin_dir = bin_dir.to_path_buf();
    let path = std::env::var_os("PATH").unwrap_or_default();
    let path =
        std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(&path))).unwrap();
    let mut cmd = tokio::process::Command::new("bash");
    cmd.arg("-c")
        .arg(step.command())
        .env("PATH", path)
        .env("FERRY_SERVER", node.addr.to_string())
        .env_remove("FERRY_OUTPUT")
        .env_remove("FERRY_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

#[test]
fn the_readme_shows_the_walkthrough_as_the_script_has_it() -> anyhow::Result<()> {
    let (_, script) = repo_file("docs/walkthrough.sh")?;
    let (_, readme) = repo_file("README.md")?;
    let blocks = parse(&script)?;
    assert!(blocks.len() >= 5, "{blocks:?}");
    let shown = readme_blocks(&readme)?;
    for b in &blocks {
        let text = b.render();
        assert!(
            shown.contains(&text),
            "README.md's walkthrough does not show this block of docs/walkthrough.sh as it is:\n{text}"
        );
    }
    let rendered: Vec<String> = blocks.iter().map(Block::render).collect();
    for b in &shown {
        let first = b.lines().nth(1).unwrap_or_default();
        let exempt = NOT_RUN.iter().any(|n| first.starts_with(n));
        assert!(
            exempt || rendered.contains(b),
            "README.md's walkthrough shows a block docs/walkthrough.sh does not run:\n{b}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_walkthrough_prints_what_it_says() -> anyhow::Result<()> {
    let (_, script) = repo_file("docs/walkthrough.sh")?;
    let (dir, node, _) = memory_node(&[]).await?;
    // The binary under test as `ferry` (FERRY_BIN may name it otherwise).
    let bin_dir = dir.path().join("bin");
    std::fs::create_dir(&bin_dir)?;
    std::os::unix::fs::symlink(ferry_bin(), bin_dir.join("ferry"))?;
    for block in parse(&script)? {
        let mut background = vec![];
        for step in &block.steps {
            let mut cmd = shell(&node, &bin_dir, step);
            if step.background {
                background.push((step, cmd.spawn()?));
                continue;
            }
            check(step, &cmd.output().await?)?;
        }
        for (step, child) in background {
            let out = tokio::time::timeout(BACKGROUND_MAX, child.wait_with_output())
                .await
                .with_context(|| format!("`{}` did not finish", step.command()))??;
            check(step, &out)?;
        }
    }
    Ok(())
}

#[test]
fn expected_lines_match_with_ellipses_and_any_spacing() {
    assert!(line_matches("ID:... priority 4", "ID:ab-1  priority 4"));
    assert!(line_matches("| q | 5 | ...", "| q     | 5   | 0 |"));
    assert!(line_matches(
        "{\"a\":1,...,\"q\":2,...}",
        "{\"a\":1,\"b\":0,\"q\":2,\"r\":3}"
    ));
    assert!(!line_matches("ID:... priority 4", "ID:ab-1  priority 7"));
    assert!(!line_matches("message 1", "message 10"));
    let p = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert!(lines_match(&p(&["...", "b", "..."]), &["a", "b", "c"]));
    assert!(lines_match(&p(&["..."]), &[]));
    assert!(!lines_match(&p(&["a"]), &["a", "b"]));
    assert!(!lines_match(&p(&[]), &["a"]));
}
