//! The `ferry` command line against a real node: send, receive, queue admin, errors.

#![allow(clippy::unwrap_used)]

use ferry_integration_tests::{ferry_cli, ferry_command, Node, NodeOptions};
use serde_json::Value;

fn json_lines(s: &str) -> Vec<Value> {
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_receive_and_queue_admin_from_the_command_line() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path(), NodeOptions::default())?;
    node.client().await?;
    let (ok, out, err) = ferry_cli(&node, &["queue", "create", "orders", "-o", "json"])?;
    assert!(ok, "{err}");
    assert_eq!(json_lines(&out)[0]["created"], true);

    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "send",
            "--queue",
            "orders",
            "hello",
            "--property",
            "n=5",
            "--property",
            "ratio=2.5",
            "--property",
            "vip=true",
            "--property",
            "code:string=007",
            "--correlation-id",
            " Req-1 ",
            "--priority",
            "7",
            "-o",
            "json",
        ],
    )?;
    assert!(ok, "{err}");
    let sent = json_lines(&out);
    let id = sent[0]["message_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("ID:"));

    let (ok, out, err) = ferry_cli(
        &node,
        &["send", "--queue", "orders", "--count", "25", "-o", "json"],
    )?;
    assert!(ok, "{err}");
    assert_eq!(json_lines(&out).len(), 25);

    let (ok, out, err) = ferry_cli(&node, &["queue", "stats", "orders", "-o", "json"])?;
    assert!(ok, "{err}");
    let s = &json_lines(&out)[0];
    assert_eq!(
        (
            s["ready"].as_u64(),
            s["leased"].as_u64(),
            s["scheduled"].as_u64(),
            s["consumers"].as_u64()
        ),
        (Some(26), Some(0), Some(0), Some(0))
    );

    // Priority 7 comes before the 25 at priority 4.
    let (ok, out, err) = ferry_cli(
        &node,
        &[
            "receive",
            "--queue",
            "orders",
            "--timeout-ms",
            "0",
            "-o",
            "json",
        ],
    )?;
    assert!(ok, "{err}");
    let m = &json_lines(&out)[0];
    assert_eq!(m["message_id"], id.as_str());
    assert_eq!(m["body"], "hello");
    assert_eq!(m["properties"]["n"], 5);
    assert_eq!(m["properties"]["ratio"], 2.5);
    assert_eq!(m["properties"]["vip"], true);
    assert_eq!(m["properties"]["code"], "007");
    assert_eq!(m["correlation_id"], " Req-1 ", "byte for byte");
    assert_eq!(
        (
            m["priority"].as_u64(),
            m["delivery_count"].as_u64(),
            m["redelivered"].as_bool()
        ),
        (Some(7), Some(1), Some(false))
    );

    // --ack none: the messages come back when the command exits.
    let (ok, out, _) = ferry_cli(
        &node,
        &[
            "receive",
            "--queue",
            "orders",
            "--count",
            "5",
            "--timeout-ms",
            "0",
            "--ack",
            "none",
            "-o",
            "json",
        ],
    )?;
    assert!(ok);
    assert_eq!(json_lines(&out).len(), 5);
    let (ok, out, _) = ferry_cli(
        &node,
        &[
            "receive",
            "--queue",
            "orders",
            "--count",
            "100",
            "--timeout-ms",
            "200",
            "-o",
            "json",
        ],
    )?;
    assert!(ok);
    let rest = json_lines(&out);
    assert_eq!(rest.len(), 25);
    assert_eq!(rest.iter().filter(|m| m["redelivered"] == true).count(), 5);

    let (ok, out, _) = ferry_cli(&node, &["queue", "list", "-o", "json"])?;
    assert!(ok);
    assert_eq!(json_lines(&out)[0]["name"], "orders");
    let (ok, out, _) = ferry_cli(&node, &["send", "--queue", "orders", "--count", "3"])?;
    assert!(ok, "{out}");
    let (ok, out, _) = ferry_cli(&node, &["queue", "purge", "orders", "-o", "json"])?;
    assert!(ok);
    assert_eq!(json_lines(&out)[0]["purged"], 3);
    let (ok, _, _) = ferry_cli(&node, &["queue", "delete", "orders"])?;
    assert!(ok);

    // Errors say what went wrong and exit non-zero.
    let (ok, _, err) = ferry_cli(&node, &["send", "--queue", "orders", "x"])?;
    assert!(!ok);
    assert!(
        err.contains("does not exist") && err.contains("ferry queue create"),
        "{err}"
    );
    assert_eq!(err.matches("does not exist").count(), 1, "said once: {err}");
    let (ok, _, err) = ferry_cli(
        &node,
        &["receive", "--queue", "orders", "--timeout-ms", "-1"],
    )?;
    assert!(!ok);
    assert!(
        err.contains("does not exist") || err.contains("wait_ms"),
        "{err}"
    );
    let (ok, _, err) = ferry_cli(
        &node,
        &["send", "--queue", "q", "--property", "1bad=2", "x"],
    )?;
    assert!(!ok);
    assert!(err.contains("1bad"), "{err}");
    Ok(())
}

#[test]
fn a_client_pointed_at_nothing_says_how_to_fix_it() -> anyhow::Result<()> {
    let out = std::process::Command::new(ferry_integration_tests::ferry_bin())
        // Client options go before or after the subcommand.
        .args(["--server", "127.0.0.1:1", "queue", "list"])
        .env_remove("FERRY_SERVER")
        .output()?;
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr)?;
    assert!(err.contains("ferry server"), "{err}");
    Ok(())
}

/// `ferry check-disk --data-dir DIR ARGS... -o json`: its JSON summary, or why it failed.
fn check_disk(dir: &std::path::Path, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let out = std::process::Command::new(ferry_integration_tests::ferry_bin())
        .arg("check-disk")
        .args(args)
        .args(["-o", "json", "--data-dir"])
        .arg(dir)
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        out.status.success(),
        "ferry check-disk {args:?} failed: {err}"
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[test]
fn check_disk_times_synced_appends_and_cleans_up() -> anyhow::Result<()> {
    let parent = tempfile::tempdir()?;
    let dir = parent.path().join("data");
    let r = check_disk(&dir, &["--count", "20", "--size", "4096"])?;
    assert_eq!(
        (r["syncs"].as_u64(), r["size"].as_u64()),
        (Some(20), Some(4096)),
        "{r}"
    );
    let at = |k: &str| r[k].as_f64().unwrap_or(-1.0);
    assert!(
        0.0 < at("p50_ms") && at("p50_ms") <= at("p99_ms") && at("p99_ms") <= at("max_ms"),
        "{r}"
    );
    assert!(
        r.get("online_discard")
            .is_some_and(|v| v.is_boolean() || v.is_null()),
        "{r}"
    );
    // Neither the scratch file nor the directory it had to create is left behind.
    assert!(!dir.exists(), "{} was left behind", dir.display());

    // Nor the missing parents it had to create.
    let deep = parent.path().join("a").join("b").join("data");
    check_disk(&deep, &["--count", "2"])?;
    assert!(!parent.path().join("a").exists(), "a/b was left behind");

    // In an existing directory, only its own scratch file goes.
    std::fs::create_dir(&dir)?;
    std::fs::write(dir.join("keep"), b"x")?;
    check_disk(&dir, &["--count", "3"])?;
    let left: Vec<_> = std::fs::read_dir(&dir)?.collect::<Result<_, _>>()?;
    assert_eq!(left.len(), 1, "{left:?}");

    // Bad input says what to fix.
    let out = std::process::Command::new(ferry_integration_tests::ferry_bin())
        .args(["check-disk", "--count", "0"])
        .output()?;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--count"));
    Ok(())
}

// Postmortem: the command line's own variables (FERRY_CONFIG, FERRY_OUTPUT, FERRY_SERVER) share
// the FERRY_ prefix with the node's configuration, which refused them as unknown settings: a
// shell that exported one for the client could not start a server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_command_lines_own_variables_do_not_stop_a_server() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let settings = dir.path().join("settings.toml");
    std::fs::write(&settings, "")?;
    let node = ferry_integration_tests::Node::start(
        dir.path(),
        ferry_integration_tests::NodeOptions {
            memory: true,
            env: vec![
                ("FERRY_OUTPUT".into(), "json".into()),
                ("FERRY_SERVER".into(), "127.0.0.1:1".into()),
                ("FERRY_CONFIG".into(), settings.display().to_string()),
            ],
            ..Default::default()
        },
    )?;
    node.client().await?;
    // And the client reads them: JSON without -o.
    let out = std::process::Command::new(ferry_integration_tests::ferry_bin())
        .args(["cluster", "status"])
        .env("FERRY_SERVER", node.addr.to_string())
        .env("FERRY_OUTPUT", "json")
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    assert_eq!(json["node_id"], "node-1");
    Ok(())
}

/// 1 000 messages of 1 KiB in `queue`: their listing is far more than a pipe holds (64 KiB), so a
/// command printing them is still writing when its reader goes away.
async fn fill_past_a_pipe(client: &ferry_client::Client, queue: &str) -> anyhow::Result<()> {
    let session = client
        .open_connection("fill")
        .await?
        .create_session(ferry_client::AckMode::Auto)
        .await?;
    let batch: Vec<_> = (0..1_000)
        .map(|_| ferry_client::Message::text("x".repeat(1024)))
        .collect();
    session.send(queue, batch).await?;
    Ok(())
}

/// Spawns `ferry ARGS` against `node`, reads one line of its stdout, closes the pipe, and returns
/// how the command exited and what it wrote on stderr.
fn read_one_line_then_close(
    node: &Node,
    args: &[&str],
) -> anyhow::Result<(std::process::ExitStatus, String)> {
    use std::io::BufRead as _;
    let mut child = ferry_command(node, args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    stdout.read_line(&mut first)?;
    assert!(!first.is_empty(), "ferry {args:?} printed nothing");
    drop(stdout);
    let out = child.wait_with_output()?;
    Ok((
        out.status,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

// Postmortem: `ferry browse ... | head -1` panicked ("failed printing to stdout: Broken pipe",
// exit 101): println! panics when stdout's reader has gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_closes_early_ends_a_command_quietly() -> anyhow::Result<()> {
    let (_dir, node, client) = ferry_integration_tests::memory_node(&["orders"]).await?;
    fill_past_a_pipe(&client, "orders").await?;
    let commands: [&[&str]; 3] = [
        &["browse", "--queue", "orders", "--count", "1000"],
        &[
            "browse", "--queue", "orders", "--count", "1000", "-o", "json",
        ],
        &[
            "receive",
            "--queue",
            "orders",
            "--count",
            "1000",
            "--timeout-ms",
            "0",
            "--ack",
            "client",
        ],
    ];
    for args in commands {
        let (status, err) = read_one_line_then_close(&node, args)?;
        // 141 = 128 + SIGPIPE, what a shell reports for `cat big | head -1`.
        assert_eq!(
            status.code(),
            Some(141),
            "ferry {args:?}: {status:?}, {err}"
        );
        assert_eq!(err, "", "ferry {args:?} said nothing on stderr");
    }
    // The receive closed its connection on the way out: what it held went back at once.
    let s = ferry_integration_tests::stats(&client, "orders").await?;
    assert_eq!((s.ready, s.leased), (1_000, 0), "{s:?}");
    Ok(())
}

/// Connections and temporary queues open on the node.
async fn leftovers(client: &ferry_client::Client) -> anyhow::Result<(usize, Vec<String>)> {
    let open = ferry_integration_tests::connections(client).await?.len();
    Ok((
        open,
        ferry_integration_tests::temporary_queues(client).await?,
    ))
}

// Postmortem: a command that failed returned before closing its connection, so the node kept it,
// and `request`'s temporary queue, until its lease ran out 30 s later.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_command_closes_its_connection_before_it_exits() -> anyhow::Result<()> {
    let (_dir, node, client) = ferry_integration_tests::memory_node(&["orders"]).await?;
    let failing: [(&[&str], &str); 4] = [
        (
            &[
                "request",
                "--queue",
                "pricing",
                "quote",
                "--timeout-ms",
                "5000",
            ],
            "queue \"pricing\" does not exist",
        ),
        (
            &["send", "--queue", "nope", "x"],
            "queue \"nope\" does not exist",
        ),
        (
            &["receive", "--queue", "nope", "--timeout-ms", "0"],
            "queue \"nope\" does not exist",
        ),
        (
            &[
                "receive",
                "--queue",
                "orders",
                "--selector",
                "bad((",
                "--timeout-ms",
                "0",
            ],
            "selector is invalid",
        ),
    ];
    for (args, why) in failing {
        let (ok, _, err) = ferry_cli(&node, args)?;
        assert!(!ok && err.contains(why), "ferry {args:?}: {err}");
        // No wait: the command closed before it exited.
        assert_eq!(
            leftovers(&client).await?,
            (0, vec![]),
            "after ferry {args:?}"
        );
    }
    Ok(())
}

// Postmortem: ctrl-c killed a waiting `ferry receive` at once, and the node kept its connection
// until the lease ran out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ctrl_c_on_a_waiting_receive_closes_its_connection() -> anyhow::Result<()> {
    let (_dir, node, client) = ferry_integration_tests::memory_node(&["idle"]).await?;
    let child = ferry_command(&node, &["receive", "--queue", "idle"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    ferry_integration_tests::wait_until(
        std::time::Duration::from_secs(10),
        "the receive to wait",
        || async {
            Ok(ferry_integration_tests::stats(&client, "idle")
                .await?
                .consumers
                == 1)
        },
    )
    .await?;
    ferry_integration_tests::send_signal(child.id(), "INT")?;
    let out = child.wait_with_output()?;
    // 130 = 128 + SIGINT, as a shell reports a command ctrl-c stopped.
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert_eq!(leftovers(&client).await?, (0, vec![]));
    Ok(())
}

/// Bodies that are not UTF-8 come out exactly: as base64, marked so, never with replacement
/// characters (which lose the bytes); `--body-as base64` shows every body that way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_are_not_utf8_are_shown_as_base64_never_lossily() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(dir.path(), NodeOptions::default())?;
    let client = node.client().await?;
    let (ok, _, err) = ferry_cli(&node, &["queue", "create", "blobs"])?;
    assert!(ok, "{err}");
    let session = client
        .open_connection("blobs")
        .await?
        .create_session(ferry_client::AckMode::Auto)
        .await?;
    let binary = vec![0xff, 0x00, 0x80, b'a'];
    session
        .send(
            "blobs",
            vec![
                ferry_client::Message::bytes(binary),
                ferry_client::Message::text("plain"),
            ],
        )
        .await?;

    let (ok, out, err) = ferry_cli(&node, &["browse", "-q", "blobs", "-o", "json"])?;
    assert!(ok, "{err}");
    let m = json_lines(&out);
    assert_eq!(m[0]["body"], Value::Null);
    assert_eq!(m[0]["body_base64"], "/wCAYQ==");
    assert_eq!(m[1]["body"], "plain");
    assert!(m[1].get("body_base64").is_none(), "{}", m[1]);

    let (ok, out, err) = ferry_cli(&node, &["browse", "-q", "blobs", "--body-as", "base64"])?;
    assert!(ok, "{err}");
    assert!(out.contains("/wCAYQ=="), "{out}");
    assert!(out.contains("cGxhaW4="), "the text body too: {out}");

    let (ok, out, err) = ferry_cli(&node, &["receive", "-q", "blobs", "--timeout-ms", "0"])?;
    assert!(ok, "{err}");
    assert!(
        out.contains("(not UTF-8; 4 bytes as base64) /wCAYQ=="),
        "{out}"
    );
    assert!(!out.contains('\u{fffd}'), "{out}");
    Ok(())
}

/// `ferry completions SHELL` prints a script the shell accepts, naming the commands and flags.
#[test]
fn completion_scripts_parse_in_their_shells() -> anyhow::Result<()> {
    let out = std::process::Command::new(ferry_integration_tests::ferry_bin())
        .args(["completions", "bash"])
        .output()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let script = String::from_utf8(out.stdout)?;
    for word in ["queue", "receive", "--body-as", "--server", "completions"] {
        assert!(script.contains(word), "{word} missing from the bash script");
    }
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("ferry.bash");
    std::fs::write(&path, &script)?;
    let check = std::process::Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()?;
    assert!(
        check.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let out = std::process::Command::new(ferry_integration_tests::ferry_bin())
        .args(["completions", "tcsh"])
        .output()?;
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("possible values"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `server` and `check-disk` talk to no node: their help does not list `--server`, and giving it
/// says so rather than being ignored.
#[test]
fn commands_that_talk_to_no_node_do_not_take_server() -> anyhow::Result<()> {
    for cmd in ["server", "check-disk"] {
        let out = std::process::Command::new(ferry_integration_tests::ferry_bin())
            .args([cmd, "--help"])
            .output()?;
        let help = String::from_utf8(out.stdout)?;
        assert!(help.contains("Examples:"), "{cmd}: {help}");
        assert!(!help.contains("--server"), "{cmd} lists --server: {help}");
        let out = std::process::Command::new(ferry_integration_tests::ferry_bin())
            .args([cmd, "--server", "127.0.0.1:1"])
            .env_remove("FERRY_SERVER")
            .output()?;
        assert!(!out.status.success());
        let err = String::from_utf8(out.stderr)?;
        assert!(err.contains("takes no --server"), "{cmd}: {err}");
    }
    let out = std::process::Command::new(ferry_integration_tests::ferry_bin())
        .args(["receive", "--help"])
        .output()?;
    let help = String::from_utf8(out.stdout)?;
    let global = help
        .find("Global options:")
        .expect("a Global options section");
    assert!(help[global..].contains("--server"), "{help}");
    assert!(!help[..global].contains("--server"), "{help}");
    Ok(())
}
