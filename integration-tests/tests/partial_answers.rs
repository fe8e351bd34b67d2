//! With a node down, listings on a surviving node answer what is reachable and name what is
//! not: `ferry queue list` and `ferry queue stats` print the queues of the nodes that answered,
//! name the silent node and its queues (a warning on stderr, or a JSON line), and exit 3. The
//! node's log tells each peer's reachability as it changes.
//!
//! Postmortem: a listing asked every node in turn and failed whole with the first error (`tcp
//! connect error` for a killed node), and waited without bound on a paused one.

#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use ferry_integration_tests::cluster::{create_queue_on, Cluster};
use ferry_integration_tests::{ferry_command, send_signal, wait_until, Node};
use serde_json::Value;

const LEADER_WAIT: Duration = Duration::from_secs(20);
/// The exit status of a partial answer (docs/operations.md).
const EXIT_PARTIAL: i32 = 3;

/// Runs `ferry ARGS` against `node`: (exit code, stdout, stderr).
fn ferry(node: &Node, args: &[&str]) -> anyhow::Result<(i32, String, String)> {
    let out = ferry_command(node, args).output()?;
    Ok((
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

/// The JSON lines of `-o json` output.
fn json_lines(out: &str) -> Vec<Value> {
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect()
}

/// Checks one listing by `via` with `silent` not answering and its queue `lost` missing, in
/// text and in JSON; `key` names a queue in a JSON line (`name` or `queue`).
fn check_partial(
    via: &Node,
    command: &[&str],
    key: &str,
    kept: &[&str],
    silent: &str,
    lost: &str,
) -> anyhow::Result<()> {
    let started = Instant::now();
    let (code, out, err) = ferry(via, command)?;
    assert_eq!(
        code, EXIT_PARTIAL,
        "{command:?}\nstdout:\n{out}\nstderr:\n{err}"
    );
    for q in kept {
        assert!(out.contains(&format!(" {q} ")), "{q} missing from\n{out}");
    }
    assert!(
        !out.contains(&format!(" {lost} ")),
        "{lost} shown in\n{out}"
    );
    let warning = err
        .lines()
        .find(|l| l.starts_with("warning: partial answer: node "))
        .unwrap_or_else(|| panic!("no warning in {err:?}"));
    assert!(
        warning.contains(&format!("node {silent} did not answer")) && warning.contains(lost),
        "{warning}"
    );
    assert_eq!(err.lines().count(), 1, "one line on stderr: {err}");

    let mut json_command = command.to_vec();
    json_command.extend(["-o", "json"]);
    let (code, out, err) = ferry(via, &json_command)?;
    assert_eq!(code, EXIT_PARTIAL, "{out}{err}");
    assert!(err.is_empty(), "{err}");
    let lines = json_lines(&out);
    let named: Vec<&str> = lines.iter().filter_map(|l| l[key].as_str()).collect();
    for q in kept {
        assert!(named.contains(q), "{q} missing from {named:?}");
    }
    assert!(!named.contains(&lost), "{named:?}");
    let missing: Vec<&Value> = lines
        .iter()
        .filter(|l| l.get("unreachable_node").is_some())
        .collect();
    assert_eq!(missing.len(), 1, "{out}");
    assert_eq!(missing[0]["unreachable_node"], silent);
    assert!(
        missing[0]["queues"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q == lost),
        "{out}"
    );
    assert!(!missing[0]["reason"].as_str().unwrap().is_empty());
    // Bounded: a silent node costs at most the listing's 5 s wait per node (twice: two runs).
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listings_with_a_node_down_answer_what_is_reachable_and_name_the_rest() -> anyhow::Result<()>
{
    let dir = tempfile::tempdir()?;
    let mut cluster = Cluster::start_with(dir.path(), &["n1", "n2", "n3"], true, "")?;
    cluster
        .wait_leader(&["n1", "n2", "n3"], LEADER_WAIT)
        .await?;
    let client = cluster.node("n1").client().await?;
    for (q, n) in [("a", "n1"), ("b", "n2"), ("c", "n3")] {
        create_queue_on(&client, q, Some(n)).await?;
    }
    // Every peer is logged reachable once heard from after the start.
    wait_until(LEADER_WAIT, "n1 to log both peers reachable", || async {
        let log = cluster.node("n1").log();
        Ok(log.contains("peer n2 reachable") && log.contains("peer n3 reachable"))
    })
    .await?;
    let (code, out, err) = ferry(cluster.node("n1"), &["queue", "list"])?;
    assert_eq!((code, err.as_str()), (0, ""), "{out}");

    // n3 paused: it accepts connections and answers nothing.
    let n3 = cluster.node("n3").pid().unwrap();
    send_signal(n3, "STOP")?;
    let via = cluster.node("n1");
    check_partial(via, &["queue", "list"], "name", &["a", "b"], "n3", "c")?;
    check_partial(via, &["queue", "stats"], "queue", &["a", "b"], "n3", "c")?;
    wait_until(LEADER_WAIT, "n1 to log n3 unreachable", || async {
        Ok(via.log().contains("peer n3 unreachable since "))
    })
    .await?;

    // Back: the listing is whole again, and the log says so.
    send_signal(n3, "CONT")?;
    wait_until(LEADER_WAIT, "a whole listing again", || async {
        let (code, out, _) = ferry(via, &["queue", "list"])?;
        Ok(code == 0 && out.contains(" c "))
    })
    .await?;
    wait_until(LEADER_WAIT, "n1 to log n3 reachable again", || async {
        let log = via.log();
        let unreachable_at = log.find("peer n3 unreachable since").unwrap_or(log.len());
        Ok(log[unreachable_at..].contains("peer n3 reachable"))
    })
    .await?;

    // n2 killed: its connections are refused at once.
    cluster.node_mut("n2").kill9();
    let via = cluster.node("n1");
    check_partial(via, &["queue", "list"], "name", &["a", "c"], "n2", "b")?;
    check_partial(via, &["queue", "stats"], "queue", &["a", "c"], "n2", "b")?;
    Ok(())
}
