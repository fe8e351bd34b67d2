//! Idle cost of many Raft groups: 3 engines in one process, one thread each, `--groups` groups
//! (default 64) on every engine, real-time ticks every `--tick-ms` (default 100 ms; election
//! after 10 ticks, heartbeat every 2), RocksDB stores in a temporary directory, and an
//! in-process channel network. After the elections settle it measures, for `--seconds`
//! (default 10): process CPU time per second of wall time, and per directed peer link the
//! batches, Raft messages and bytes per second.
//!
//! ```sh
//! CARGO_TARGET_DIR=$HOME/.cache/ferry-target cargo run --release -p ferry-multiraft \
//!     --example idle_cpu -- --groups 64 --seconds 10
//! ```
//!
//! CPU time is the sum of the process's threads' on-CPU time from `/proc/self/task/*/schedstat`
//! (the kernel's accounting that getrusage(RUSAGE_SELF) reports as user + system time), read
//! without unsafe code.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};
use ferry_multiraft::{Engine, EngineConfig, GroupId, LogStore, NodeId, RocksStore};

const NODES: u64 = 3;

struct Args {
    groups: u64,
    tick_ms: u64,
    seconds: u64,
}

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        groups: 64,
        tick_ms: 100,
        seconds: 10,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value: u64 = it.next().context("a value after each flag")?.parse()?;
        match flag.as_str() {
            "--groups" => args.groups = value,
            "--tick-ms" => args.tick_ms = value,
            "--seconds" => args.seconds = value,
            other => bail!("unknown flag {other}; use --groups, --tick-ms, --seconds"),
        }
    }
    Ok(args)
}

/// Counters of one node, shared with the main thread.
#[derive(Default)]
struct Counters {
    batches: AtomicU64,
    messages: AtomicU64,
    bytes: AtomicU64,
    rounds: AtomicU64,
    jobs: AtomicU64,
    leaders: AtomicU64,
    max_batches_per_peer_round: AtomicU64,
}

#[derive(Clone, Copy, Default)]
struct Snapshot {
    batches: u64,
    messages: u64,
    bytes: u64,
    rounds: u64,
    jobs: u64,
}

impl Snapshot {
    fn minus(self, earlier: &Snapshot) -> Snapshot {
        Snapshot {
            batches: self.batches - earlier.batches,
            messages: self.messages - earlier.messages,
            bytes: self.bytes - earlier.bytes,
            rounds: self.rounds - earlier.rounds,
            jobs: self.jobs - earlier.jobs,
        }
    }
}

impl Counters {
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            batches: self.batches.load(Ordering::Relaxed),
            messages: self.messages.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            rounds: self.rounds.load(Ordering::Relaxed),
            jobs: self.jobs.load(Ordering::Relaxed),
        }
    }
}

type Packet = (NodeId, bytes::Bytes);
type NodeThread = thread::JoinHandle<anyhow::Result<()>>;

struct NodeTask {
    engine: Engine,
    store: RocksStore,
    inbox: Receiver<Packet>,
    peers: Vec<(NodeId, Sender<Packet>)>,
    counters: Arc<Counters>,
    tick: Duration,
    stop: Arc<AtomicBool>,
}

impl NodeTask {
    fn run(mut self) -> anyhow::Result<()> {
        let mut next_tick = Instant::now() + self.tick;
        while !self.stop.load(Ordering::Relaxed) {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match self.inbox.recv_timeout(wait) {
                Ok((from, bytes)) => self.engine.step(from, &bytes)?,
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
            // Everything already queued joins this round.
            while let Ok((from, bytes)) = self.inbox.try_recv() {
                self.engine.step(from, &bytes)?;
            }
            while Instant::now() >= next_tick {
                self.engine.tick();
                next_tick += self.tick;
            }
            self.rounds()?;
        }
        Ok(())
    }

    fn rounds(&mut self) -> anyhow::Result<()> {
        while self.engine.has_ready() {
            let round = self.engine.round();
            self.counters.rounds.fetch_add(1, Ordering::Relaxed);
            if let Some(job) = round.persist {
                self.store.write(&job)?;
                self.engine.on_persisted(job.id())?;
                self.counters.jobs.fetch_add(1, Ordering::Relaxed);
            }
            let mut per_peer = std::collections::BTreeMap::new();
            for batch in &round.batches {
                *per_peer.entry(batch.to).or_insert(0u64) += 1;
            }
            let most = per_peer.values().copied().max().unwrap_or(0);
            self.counters
                .max_batches_per_peer_round
                .fetch_max(most, Ordering::Relaxed);
            for batch in round.batches {
                self.counters.batches.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .messages
                    .fetch_add(batch.message_count as u64, Ordering::Relaxed);
                self.counters
                    .bytes
                    .fetch_add(batch.bytes.len() as u64, Ordering::Relaxed);
                if let Some((_, peer)) = self.peers.iter().find(|(id, _)| *id == batch.to) {
                    // A peer that stopped is fine: the run is ending.
                    let _ = peer.send((self.engine.node(), batch.bytes));
                }
            }
        }
        self.counters
            .leaders
            .store(self.engine.leader_count() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// On-CPU nanoseconds of every thread of this process.
fn cpu_ns() -> anyhow::Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task")? {
        let stat = std::fs::read_to_string(task?.path().join("schedstat"))?;
        let on_cpu: u64 = stat
            .split_whitespace()
            .next()
            .context("schedstat")?
            .parse()?;
        total += on_cpu;
    }
    Ok(total)
}

/// Starts one thread per node, each with `groups` groups bootstrapped on all nodes.
fn start_nodes(
    args: &Args,
    dir: &std::path::Path,
    stop: &Arc<AtomicBool>,
) -> anyhow::Result<(Vec<Arc<Counters>>, Vec<NodeThread>)> {
    let ids: Vec<NodeId> = (1..=NODES).map(NodeId).collect();
    let channels: Vec<(Sender<Packet>, Receiver<Packet>)> =
        ids.iter().map(|_| mpsc::channel()).collect();
    let senders: Vec<Sender<Packet>> = channels.iter().map(|(s, _)| s.clone()).collect();
    let mut counters = Vec::new();
    let mut handles = Vec::new();
    for (&node, (_, inbox)) in ids.iter().zip(channels) {
        let store = RocksStore::open(&dir.join(format!("node-{}", node.0)))?;
        let config = EngineConfig {
            election_tick: 10,
            heartbeat_tick: 2,
            ..EngineConfig::new(node)
        };
        let mut engine = Engine::open(config, store.load()?)?;
        for g in 0..args.groups {
            engine.bootstrap_group(GroupId(g), &ids)?;
        }
        let peers = ids
            .iter()
            .zip(&senders)
            .filter(|(id, _)| **id != node)
            .map(|(id, s)| (*id, s.clone()))
            .collect();
        let c = Arc::new(Counters::default());
        counters.push(c.clone());
        let task = NodeTask {
            engine,
            store,
            inbox,
            peers,
            counters: c,
            tick: Duration::from_millis(args.tick_ms),
            stop: stop.clone(),
        };
        let handle = thread::Builder::new()
            .name(format!("node-{}", node.0))
            .spawn(move || task.run())?;
        handles.push(handle);
    }
    Ok((counters, handles))
}

/// Waits until every group has a leader, then one more election timeout.
fn settle(args: &Args, counters: &[Arc<Counters>]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let leaders = || {
        counters
            .iter()
            .map(|c| c.leaders.load(Ordering::Relaxed))
            .sum::<u64>()
    };
    while leaders() < args.groups {
        if Instant::now() > deadline {
            bail!(
                "only {} of {} groups elected a leader in 60 s",
                leaders(),
                args.groups
            );
        }
        thread::sleep(Duration::from_millis(50));
    }
    thread::sleep(Duration::from_millis(args.tick_ms * 20));
    Ok(())
}

fn report(args: &Args, counters: &[Arc<Counters>], delta: &[Snapshot], wall_s: f64, cpu_ns: u64) {
    let cpu_ms_per_s = cpu_ns as f64 / 1e6 / wall_s;
    let links = (NODES * (NODES - 1)) as f64;
    let sum = |f: fn(&Snapshot) -> u64| delta.iter().map(|d| f(d) as f64).sum::<f64>();
    println!(
        "{NODES} nodes x {} groups, tick {} ms (election 10 ticks, heartbeat 2), {wall_s:.1} s",
        args.groups, args.tick_ms
    );
    let leader_counts: Vec<u64> = counters
        .iter()
        .map(|c| c.leaders.load(Ordering::Relaxed))
        .collect();
    println!("leaders per node: {leader_counts:?}");
    println!(
        "CPU: {cpu_ms_per_s:.1} ms per second of wall time, whole process ({:.2} % of one core)",
        cpu_ms_per_s / 10.0
    );
    println!(
        "per directed peer link: {:.1} batches/s, {:.1} messages/s, {:.0} bytes/s",
        sum(|s| s.batches) / wall_s / links,
        sum(|s| s.messages) / wall_s / links,
        sum(|s| s.bytes) / wall_s / links,
    );
    let most = counters
        .iter()
        .map(|c| c.max_batches_per_peer_round.load(Ordering::Relaxed))
        .max()
        .unwrap_or(0);
    println!(
        "per node: {:.1} rounds/s, {:.2} synced writes/s; at most {most} batch(es) to a peer in a round",
        sum(|s| s.rounds) / wall_s / NODES as f64,
        sum(|s| s.jobs) / wall_s / NODES as f64,
    );
}

fn main() -> anyhow::Result<()> {
    let args = parse_args()?;
    let dir = tempfile::tempdir()?;
    let stop = Arc::new(AtomicBool::new(false));
    let (counters, handles) = start_nodes(&args, dir.path(), &stop)?;
    settle(&args, &counters)?;

    let (cpu0, wall0) = (cpu_ns()?, Instant::now());
    let before: Vec<Snapshot> = counters.iter().map(|c| c.snapshot()).collect();
    thread::sleep(Duration::from_secs(args.seconds));
    let (cpu1, wall1) = (cpu_ns()?, Instant::now());
    let delta: Vec<Snapshot> = counters
        .iter()
        .zip(&before)
        .map(|(c, b)| c.snapshot().minus(b))
        .collect();
    stop.store(true, Ordering::Relaxed);
    for handle in handles {
        match handle.join() {
            Ok(result) => result?,
            Err(_) => bail!("a node thread panicked"),
        }
    }
    report(
        &args,
        &counters,
        &delta,
        (wall1 - wall0).as_secs_f64(),
        cpu1 - cpu0,
    );
    Ok(())
}
