//! The files in `deploy/`, run: `scripts/check-deploy` (systemd-analyze on the unit, `docker
//! compose config` and the deployment's rules on the compose file, hadolint, shellcheck), and
//! `deploy/compose-local.sh`, which starts the compose file's topology as plain processes with the
//! environment, commands, volumes, healthchecks and stop grace periods the compose file gives its
//! containers, on loopback addresses of their own.
//!
//! Postmortem (issue 17, item 13): the unit failed on a fresh host (`217/USER`: nothing created
//! its user), the image had no health check and an unpinned uid, the compose file published ports
//! on every interface and set no healthcheck or stop grace: none of it had ever been run.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, ensure, Context as _};
use ferry_integration_tests::ferry_bin;

/// Exit status of `scripts/check-deploy` when one of its tools is missing.
const TOOL_MISSING: i32 = 3;

/// The ports the image and the compose file give every node: client, peer, metrics.
const NODE_PORTS: [u16; 3] = [7400, 7410, 7420];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Fails when a tool the run needs is missing (exit status `TOOL_MISSING`), naming it and how to
/// install it: a run that did not check the deploy files must not pass, in CI or outside it.
fn require_tools(output: &Output) -> anyhow::Result<()> {
    ensure!(
        output.status.code() != Some(TOOL_MISSING),
        "not run: {}",
        text(&output.stderr).trim()
    );
    Ok(())
}

#[test]
fn the_deploy_files_pass_systemd_analyze_compose_config_hadolint_and_shellcheck(
) -> anyhow::Result<()> {
    let output = Command::new(repo().join("scripts/check-deploy"))
        .env("FERRY_BIN", ferry_bin())
        .stdin(Stdio::null())
        .output()
        .context("running scripts/check-deploy")?;
    require_tools(&output)?;
    ensure!(
        output.status.success(),
        "scripts/check-deploy failed ({}):\n{}{}",
        output.status,
        text(&output.stdout),
        text(&output.stderr)
    );
    Ok(())
}

/// A run of `deploy/compose-local.sh` in a directory of its own, on addresses of its own. Dropped,
/// it stops the nodes (and kills any left) before the directory goes.
struct ComposeLocal {
    dir: tempfile::TempDir,
    prefix: String,
}

impl ComposeLocal {
    fn new() -> anyhow::Result<ComposeLocal> {
        Ok(ComposeLocal {
            dir: tempfile::tempdir()?,
            prefix: free_prefix()?,
        })
    }

    fn run(&self, action: &str) -> anyhow::Result<Output> {
        Command::new(repo().join("deploy/compose-local.sh"))
            .arg(action)
            .env("FERRY_BIN", ferry_bin())
            .env("FERRY_COMPOSE_LOCAL_DIR", self.dir.path())
            .env("FERRY_COMPOSE_LOCAL_ADDRS", &self.prefix)
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("running deploy/compose-local.sh {action}"))
    }

    /// Runs `action`, failing with its output unless it succeeds; returns its stdout.
    fn run_ok(&self, action: &str) -> anyhow::Result<String> {
        let output = self.run(action)?;
        if !output.status.success() {
            self.print_logs();
            bail!(
                "deploy/compose-local.sh {action} failed ({}):\n{}{}",
                output.status,
                text(&output.stdout),
                text(&output.stderr)
            );
        }
        Ok(text(&output.stdout))
    }

    /// The process ids the script recorded for the nodes it runs.
    fn pids(&self) -> Vec<u32> {
        let Ok(entries) = std::fs::read_dir(self.dir.path()) else {
            return vec![];
        };
        entries
            .filter_map(Result::ok)
            .filter_map(|e| std::fs::read_to_string(e.path().join("ferry.pid")).ok())
            .filter_map(|pid| pid.trim().parse().ok())
            .collect()
    }

    fn print_logs(&self) {
        let Ok(entries) = std::fs::read_dir(self.dir.path()) else {
            return;
        };
        for entry in entries.filter_map(Result::ok) {
            let log = entry.path().join("ferry.log");
            if let Ok(text) = std::fs::read_to_string(&log) {
                eprintln!("----- {} -----\n{text}", log.display());
            }
        }
    }
}

impl Drop for ComposeLocal {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.print_logs();
        }
        let pids = self.pids();
        let _ = self.run("stop");
        // Whatever the script could not stop.
        for pid in pids {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// `127.X.Y`: a loopback /24 where every node's ports are free (Linux routes all of 127/8 to the
/// loopback interface), so the compose file's fixed ports can be used as they are.
fn free_prefix() -> anyhow::Result<String> {
    let seed = SystemTime::now().duration_since(UNIX_EPOCH)?.subsec_nanos() ^ std::process::id();
    for attempt in 0..50u32 {
        let n = seed.wrapping_add(attempt.wrapping_mul(7919));
        let (x, y) = (100 + (n % 150) as u8, (n / 150 % 256) as u8);
        // The compose file has three services; a few spare addresses in case it grows.
        let free = (1..=5u8).all(|host| {
            NODE_PORTS.iter().all(|&port| {
                TcpListener::bind(SocketAddrV4::new(Ipv4Addr::new(127, x, y, host), port)).is_ok()
            })
        });
        if free {
            return Ok(format!("127.{x}.{y}"));
        }
    }
    bail!("no loopback /24 with ports {NODE_PORTS:?} free after 50 tries")
}

/// `ferry --server ADDR ARGS...`, which must succeed; its stdout.
fn ferry(addr: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(ferry_bin())
        .arg("--server")
        .arg(addr)
        .args(args)
        .env_remove("FERRY_SERVER")
        .env_remove("FERRY_OUTPUT")
        .stdin(Stdio::null())
        .output()?;
    ensure!(
        output.status.success(),
        "ferry --server {addr} {args:?} failed: {}",
        text(&output.stderr)
    );
    Ok(text(&output.stdout))
}

/// One service as `compose-local.sh start` reports it: `a: pid 123, clients ADDR, metrics URL`.
#[derive(Debug)]
struct Service {
    name: String,
    client: String,
    metrics: String,
}

fn parse_started(stdout: &str) -> anyhow::Result<Vec<Service>> {
    stdout
        .lines()
        .map(|line| {
            let (name, rest) = line.split_once(": pid ").context("no service")?;
            let client = rest.split(", clients ").nth(1).context("no client")?;
            let (client, metrics) = client.split_once(", metrics ").context("no metrics")?;
            Ok(Service {
                name: name.to_owned(),
                client: client.to_owned(),
                metrics: metrics.to_owned(),
            })
        })
        .collect::<anyhow::Result<_>>()
        .with_context(|| format!("compose-local.sh start printed {stdout:?}"))
}

/// The compose file's services, as `docker compose config` resolved them for the script.
fn compose_services(dir: &Path) -> anyhow::Result<BTreeSet<String>> {
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("compose.json"))?)?;
    Ok(config["services"]
        .as_object()
        .context("no services")?
        .keys()
        .cloned()
        .collect())
}

fn cluster_status(addr: &str) -> anyhow::Result<serde_json::Value> {
    Ok(serde_json::from_str(&ferry(
        addr,
        &["-o", "json", "cluster", "status"],
    )?)?)
}

#[test]
fn the_compose_topology_forms_a_cluster_as_plain_processes() -> anyhow::Result<()> {
    let local = ComposeLocal::new()?;
    let plan = local.run("plan")?;
    require_tools(&plan)?;
    ensure!(
        plan.status.success(),
        "compose-local.sh plan: {}",
        text(&plan.stderr)
    );

    let services = parse_started(&local.run_ok("start")?)?;
    let names: BTreeSet<String> = services.iter().map(|s| s.name.clone()).collect();
    assert_eq!(names, compose_services(local.dir.path())?);
    for s in &services {
        assert!(
            s.client.starts_with(&format!("{}.", local.prefix)),
            "{s:?}: not on the test's addresses"
        );
    }

    // Every node sees the same cluster: every service a voter, up, one leader.
    let mut leaders = BTreeSet::new();
    for s in &services {
        let status = cluster_status(&s.client)?;
        let nodes = status["nodes"].as_array().context("no nodes")?;
        let ids: BTreeSet<String> = nodes
            .iter()
            .filter_map(|n| n["node_id"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(ids, names, "nodes as {} sees them: {status}", s.name);
        for n in nodes {
            assert_eq!(n["role"], "voter", "{n}");
            assert!(
                n["health"] == "up" || n["health"] == "self",
                "{} as {} sees it: {n}",
                n["node_id"],
                s.name
            );
        }
        leaders.insert(status["leader_node_id"].to_string());
    }
    assert_eq!(
        leaders.len(),
        1,
        "the nodes name different leaders: {leaders:?}"
    );

    // One queue per node, created through the first: the cluster places each on the node owning
    // the fewest, so every node takes its share. (Through one node: a node places by its own view
    // of the metadata, which may not have applied a create made through another node a moment
    // before.)
    for s in &services {
        ferry(
            &services[0].client,
            &["queue", "create", &format!("q-{}", s.name)],
        )?;
    }
    let status = cluster_status(&services[0].client)?;
    for n in status["nodes"].as_array().context("no nodes")? {
        let queues: Vec<&str> = n["queues"]
            .as_array()
            .context("no queues")?
            .iter()
            .filter_map(|q| q.as_str())
            .filter(|q| !q.ends_with(".DLQ"))
            .collect();
        assert_eq!(queues.len(), 1, "every node owns one queue: {status}");
    }

    // A message sent through one node and received through another, for every pair: the calls
    // are forwarded over the peer addresses the compose file gives.
    for (i, from) in services.iter().enumerate() {
        let to = &services[(i + 1) % services.len()];
        let queue = format!("q-{}", services[(i + 2) % services.len()].name);
        let body = format!("from {} to {}", from.name, to.name);
        ferry(&from.client, &["send", "--queue", &queue, &body])?;
        let got = ferry(
            &to.client,
            &[
                "-o",
                "json",
                "receive",
                "--queue",
                &queue,
                "--count",
                "1",
                "--timeout-ms",
                "10000",
            ],
        )?;
        assert!(got.contains(&body), "{queue} through {}: {got}", to.name);
    }

    // The metrics address the image's environment sets, moved to each node's own address.
    for s in &services {
        let page = ureq::get(&s.metrics).call()?.body_mut().read_to_string()?;
        assert!(page.contains("ferry_raft_term"), "{}: {page}", s.metrics);
    }

    // The compose file's healthcheck, run against each node.
    let health = local.run("health")?;
    let report = text(&health.stdout);
    ensure!(
        !report.contains("no healthcheck"),
        "every service needs a healthcheck:\n{report}"
    );
    ensure!(
        health.status.success(),
        "compose-local.sh health:\n{report}"
    );
    for s in &services {
        ensure!(
            report.contains(&format!("{}: healthy", s.name)),
            "{} not reported healthy:\n{report}",
            s.name
        );
    }

    // SIGTERM each: all stop within their stop_grace_period, none needs SIGKILL.
    let pids = local.pids();
    let stopped = local.run_ok("stop")?;
    for s in &services {
        assert!(
            stopped.contains(&format!("{}: stopped", s.name)),
            "{stopped}"
        );
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    for pid in pids {
        while Path::new(&format!("/proc/{pid}")).exists() {
            ensure!(
                Instant::now() < deadline,
                "process {pid} still runs after stop"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    Ok(())
}
