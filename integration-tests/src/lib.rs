//! The harness for Ferry's multi-process tests: start real `ferry server` processes on free ports
//! with their own data directories, wait until they serve (never a fixed sleep), kill them when
//! the test ends, and print their logs when it fails.
//!
//! The `ferry` binary is found next to the test executable's directory (`target/<profile>/ferry`),
//! or at `$FERRY_BIN`. The README's test command builds it first; a binary not built from this
//! workspace's current sources is refused ([`freshness`]), so a plain `cargo test` cannot test a
//! stale server.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ferry_client::Client;

pub mod chaos;
pub mod cluster;
mod freshness;
pub mod raw;

/// Path of the `ferry` binary under test. Panics, saying how to rebuild it, when it was not built
/// from this workspace's current sources ([`freshness`]).
pub fn ferry_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_BIN") {
        return checked(PathBuf::from(p), false);
    }
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> → target/<profile>/ferry
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory");
    let bin = dir.join(format!("ferry{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: build it first (`{}`), or set FERRY_BIN",
        bin.display(),
        freshness::rebuild_command(&bin)
    );
    checked(bin, true)
}

/// `bin`, once [`freshness::ensure_fresh`] accepts it (`from_target`: it was found in the target
/// directory, not named by the caller).
fn checked(bin: PathBuf, from_target: bool) -> PathBuf {
    if let Err(e) = freshness::ensure_fresh(&bin, freshness::workspace_root(), from_target) {
        panic!("refusing to test a stale server: {e:#}");
    }
    bin
}

/// The server built with fault injection (`ferry-faults`, docs/reliability.md): `$FERRY_FAULTS_BIN`,
/// or next to [`ferry_bin`]. The README's test command builds it. Refused as [`ferry_bin`] is.
pub fn ferry_faults_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("FERRY_FAULTS_BIN") {
        return checked(PathBuf::from(p), false);
    }
    let bin = ferry_bin().with_file_name(format!("ferry-faults{}", std::env::consts::EXE_SUFFIX));
    assert!(
        bin.exists(),
        "{} is missing: build it first (`{}`), or set FERRY_FAULTS_BIN",
        bin.display(),
        freshness::rebuild_command(&bin)
    );
    checked(bin, true)
}

/// How to start a node.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub node_id: String,
    /// Extra TOML appended to the generated config file.
    pub extra_toml: String,
    pub memory: bool,
    /// Extra environment variables for the server process (`FERRY_...` settings).
    pub env: Vec<(String, String)>,
    /// Start the server under `prlimit --nofile=N:N`: at most N open file descriptors.
    pub open_files_max: Option<u32>,
    /// Start the server inside this cgroup (v2): its `cgroup.procs` file, written with the
    /// process id before `exec`, so every socket the server opens belongs to the cgroup (the
    /// chaos partitions match a node's traffic by it).
    pub cgroup_procs: Option<PathBuf>,
    /// The server binary: [`ferry_bin`] when `None` ([`ferry_faults_bin`] for fault injection).
    pub bin: Option<PathBuf>,
    /// Where the node's log goes (the data directory when `None`).
    pub log_dir: Option<PathBuf>,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            node_id: "node-1".into(),
            extra_toml: String::new(),
            memory: false,
            env: vec![],
            open_files_max: None,
            cgroup_procs: None,
            bin: None,
            log_dir: None,
        }
    }
}

/// A running `ferry server` process. Killed (SIGKILL) when dropped; its log is printed if the
/// test is failing.
#[derive(Debug)]
pub struct Node {
    child: Option<Child>,
    /// The client listener: `Messaging`, `Admin`, health, reflection.
    pub addr: SocketAddr,
    /// The peer listener: the internal `Backend` service other nodes call.
    pub peer_addr: SocketAddr,
    pub data_dir: PathBuf,
    log_path: PathBuf,
    options: NodeOptions,
    name: String,
    /// The server's stdout lines after the first (the metrics address, when enabled).
    more_lines: Option<std::sync::mpsc::Receiver<String>>,
    /// The metrics URL, once read from `more_lines`.
    metrics: Option<String>,
}

impl Node {
    /// Starts a node with its data in `data_dir` (kept by the caller, so a restart finds it).
    pub fn start(data_dir: &Path, options: NodeOptions) -> anyhow::Result<Node> {
        Self::start_on(data_dir, options, "127.0.0.1:0")
    }

    /// Starts a node on given client and peer addresses.
    pub fn start_at(
        data_dir: &Path,
        options: NodeOptions,
        listen: &str,
        peer_listen: &str,
    ) -> anyhow::Result<Node> {
        let mut node = Self::prepare(data_dir, options);
        node.spawn_on(listen, peer_listen)?;
        Ok(node)
    }

    /// This node's id.
    pub fn id(&self) -> &str {
        &self.name
    }

    fn prepare(data_dir: &Path, options: NodeOptions) -> Node {
        let log_path = options
            .log_dir
            .as_deref()
            .unwrap_or(data_dir)
            .join(format!("{}.log", options.node_id));
        let name = options.node_id.clone();
        let unset: SocketAddr = ([127, 0, 0, 1], 1).into();
        Node {
            child: None,
            addr: unset,
            peer_addr: unset,
            data_dir: data_dir.into(),
            log_path,
            options,
            name,
            more_lines: None,
            metrics: None,
        }
    }

    fn start_on(data_dir: &Path, options: NodeOptions, listen: &str) -> anyhow::Result<Node> {
        let mut node = Self::prepare(data_dir, options);
        node.spawn(listen)?;
        Ok(node)
    }

    fn spawn(&mut self, listen: &str) -> anyhow::Result<()> {
        self.spawn_on(listen, "127.0.0.1:0")
    }

    fn spawn_on(&mut self, listen: &str, peer_listen: &str) -> anyhow::Result<()> {
        let (data_dir, options) = (self.data_dir.clone(), self.options.clone());
        std::fs::create_dir_all(&data_dir)?;
        let config = data_dir.join("ferry.toml");
        std::fs::write(
            &config,
            format!("node_id = {:?}\n{}\n", options.node_id, options.extra_toml),
        )?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log_path)?;
        let bin = options.bin.clone().unwrap_or_else(ferry_bin);
        let mut cmd = match (&options.cgroup_procs, options.open_files_max) {
            (None, None) => Command::new(&bin),
            (Some(procs), None) => {
                // The shell joins the cgroup and then execs the server: the same process id.
                let mut c = Command::new("sh");
                c.arg("-c")
                    .arg(r#"echo $$ > "$0" && exec "$@""#)
                    .arg(procs)
                    .arg(&bin);
                c
            }
            (None, Some(n)) => {
                // prlimit sets the limit and then execs the server: the same process id.
                let mut c = Command::new("prlimit");
                c.arg(format!("--nofile={n}:{n}")).arg("--").arg(&bin);
                c
            }
            (Some(_), Some(_)) => bail!("a node takes a cgroup or a file limit, not both"),
        };
        cmd.arg("server")
            .arg("--config")
            .arg(&config)
            .arg("--listen")
            .arg(listen)
            .arg("--peer-listen")
            .arg(peer_listen)
            .arg("--data-dir")
            .arg(&data_dir)
            .env("RUST_LOG", "info,ferry=debug")
            .env_remove("FERRY_SERVER")
            // The harness's own setting; the server reads every FERRY_ variable as config.
            .env_remove("FERRY_BIN")
            .env_remove("FERRY_FAULTS_BIN")
            // Metrics (and /healthz, /readyz) are on by default at the client port + 20: a free
            // port instead, so nodes restarted on their bound ports never meet another test's.
            // A test's own `env` may set it otherwise (or FERRY_METRICS__ENABLED=false).
            .env("FERRY_METRICS__LISTEN", format!("{}:0", host_of(listen)))
            .envs(options.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        if options.memory {
            cmd.arg("--memory");
        }
        let mut child = cmd.spawn().context("spawning ferry server")?;
        let stdout = child.stdout.take().context("server stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Every line goes to the test; draining also keeps the server from blocking on a
            // full pipe.
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        self.child = Some(child);
        self.metrics = None;
        // First the client address, then the peer address.
        let started = Instant::now();
        let mut addrs = [None, None];
        for (addr, prefix) in addrs.iter_mut().zip(["ferry ", "peer listener on "]) {
            let wait = Duration::from_secs(60).saturating_sub(started.elapsed());
            let Ok(line) = rx.recv_timeout(wait) else {
                self.print_log();
                bail!(
                    "ferry server {} did not report its addresses within 60 s",
                    self.name
                );
            };
            *addr = line
                .strip_prefix(prefix)
                .and_then(|rest| rest.rsplit(' ').next())
                .and_then(|a| a.parse::<SocketAddr>().ok());
            if addr.is_none() {
                bail!("unexpected line from the server: {line:?}");
            }
        }
        if let [Some(addr), Some(peer_addr)] = addrs {
            (self.addr, self.peer_addr) = (addr, peer_addr);
        }
        self.more_lines = Some(rx);
        Ok(())
    }

    /// The metrics URL the server printed (`http://HOST:PORT/metrics`; `/healthz` and `/readyz`
    /// are beside it).
    pub fn metrics_url(&mut self) -> anyhow::Result<String> {
        if let Some(url) = &self.metrics {
            return Ok(url.clone());
        }
        let rx = self
            .more_lines
            .as_ref()
            .context("the server is not running")?;
        let line = rx
            .recv_timeout(Duration::from_secs(10))
            .context("the server printed no metrics address (are metrics off?)")?;
        let url = line
            .strip_prefix("metrics on ")
            .map(str::to_owned)
            .with_context(|| format!("unexpected line from the server: {line:?}"))?;
        self.metrics = Some(url.clone());
        Ok(url)
    }

    /// `http://HOST:PORT/<path>` on the node's metrics listener (`healthz`, `readyz`).
    pub fn http_url(&mut self, path: &str) -> anyhow::Result<String> {
        let metrics = self.metrics_url()?;
        let base = metrics.strip_suffix("/metrics").unwrap_or(&metrics);
        Ok(format!("{base}/{path}"))
    }

    /// The client listener's URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The peer listener's URL (its address is what `--initial-cluster` and `ferry node add` name).
    pub fn peer_url(&self) -> String {
        format!("http://{}", self.peer_addr)
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// A client connected to this node, once it reports SERVING on the standard health service.
    pub async fn client(&self) -> anyhow::Result<Client> {
        let client = Client::connect(&self.url()).await?;
        let channel = tonic::transport::Endpoint::from_shared(self.url())?
            .connect()
            .await?;
        let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
        let r = health
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await?
            .into_inner();
        if r.status != tonic_health::pb::health_check_response::ServingStatus::Serving as i32 {
            bail!("node {} is not serving: {r:?}", self.name);
        }
        Ok(client)
    }

    /// SIGKILL: the process dies at once, mid-whatever.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait for the process to exit; returns its exit status.
    pub fn terminate(&mut self) -> anyhow::Result<std::process::ExitStatus> {
        let Some(mut c) = self.child.take() else {
            bail!("not running")
        };
        send_signal(c.id(), "TERM")?;
        Ok(c.wait()?)
    }

    /// The process's exit status once it has exited by itself (`None` while it runs, or if it
    /// was never started or was killed by the harness).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Starts the node again on the same data directory (a new port).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.kill9();
        self.spawn("127.0.0.1:0")
    }

    /// Starts the node again on the same data directory and the same client and peer ports, so
    /// other nodes configured with its address reach the new process.
    pub fn restart_in_place(&mut self) -> anyhow::Result<()> {
        self.kill9();
        let (listen, peer_listen) = (self.addr.to_string(), self.peer_addr.to_string());
        self.spawn_on(&listen, &peer_listen)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    fn print_log(&self) {
        eprintln!(
            "----- log of ferry node {} ({}) -----\n{}\n----- end of log -----",
            self.name,
            self.log_path.display(),
            self.log()
        );
    }
}

impl Drop for Node {
    /// Prints the node's log when a test panics, or always with `TEST_NODE_LOGS=1` (for a test
    /// that fails by returning an error).
    fn drop(&mut self) {
        if std::thread::panicking() || std::env::var_os("TEST_NODE_LOGS").is_some_and(|v| v == "1")
        {
            self.print_log();
        }
        self.kill9();
    }
}

/// The host part of `HOST:PORT` (`[::1]:0` gives `[::1]`).
fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(host, _)| host)
}

/// Deletes everything in `node`'s data directory but its log: the disk that was lost (the node
/// must be down).
pub fn wipe_data(node: &Node) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(&node.data_dir)? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "log") {
            continue;
        }
        if path.is_dir() {
            std::fs::remove_dir_all(&path)?;
        } else {
            std::fs::remove_file(&path)?;
        }
    }
    Ok(())
}

/// Receives from `queue` through `session` (client acknowledgement) until a receive of 2 s
/// finds nothing, acknowledging each batch; the bodies, each once. An error when a body comes
/// twice, is in `acked` (acknowledged before, so it must not come back), or the drain takes
/// over 60 s.
pub async fn drain_once(
    session: &ferry_client::Session,
    queue: &str,
    acked: &std::collections::BTreeSet<String>,
) -> anyhow::Result<std::collections::BTreeSet<String>> {
    let mut left = std::collections::BTreeSet::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = session
            .receive(
                queue,
                ferry_client::ReceiveOptions::timeout_ms(2_000).max(500),
            )
            .await?;
        if got.is_empty() {
            return Ok(left);
        }
        for m in &got {
            let body = String::from_utf8_lossy(m.body()).into_owned();
            anyhow::ensure!(
                !acked.contains(&body),
                "{body} was acknowledged, and came back"
            );
            anyhow::ensure!(left.insert(body.clone()), "{body} delivered twice");
        }
        session.ack(&got).await?;
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "draining took over 60 s"
        );
    }
}

/// An HTTP GET: the status code and the body (any status; an error only when nothing answered).
pub fn http_get(url: &str) -> anyhow::Result<(u16, String)> {
    let mut answer = ureq::get(url)
        .config()
        .http_status_as_error(false)
        .build()
        .call()?;
    let status = answer.status().as_u16();
    Ok((status, answer.body_mut().read_to_string()?))
}

/// Waits until `check` returns true, looking every 10 ms, failing after `timeout`. For conditions
/// the test cannot be told about directly (a server noticing a dead client).
pub async fn wait_until<F, Fut>(timeout: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<bool>>,
{
    let start = Instant::now();
    loop {
        if check().await? {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The `ferry` binary with `args` against `node` (stdin empty), to run or spawn.
pub fn ferry_command(node: &Node, args: &[&str]) -> Command {
    let mut cmd = Command::new(ferry_bin());
    cmd.args(args)
        .arg("--server")
        .arg(node.addr.to_string())
        .env_remove("FERRY_SERVER")
        .env_remove("FERRY_OUTPUT")
        .stdin(Stdio::null());
    cmd
}

/// Runs the `ferry` binary with `args` against `node`, returning (success, stdout, stderr).
pub fn ferry_cli(node: &Node, args: &[&str]) -> anyhow::Result<(bool, String, String)> {
    let out = ferry_command(node, args).output()?;
    Ok((
        out.status.success(),
        String::from_utf8(out.stdout)?,
        String::from_utf8(out.stderr)?,
    ))
}

/// Sends `signal` (a name `kill` takes: `INT`, `TERM`) to process `pid`.
pub fn send_signal(pid: u32, signal: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid} failed");
    Ok(())
}

/// The client connections open on the node, through the admin API.
pub async fn connections(client: &Client) -> anyhow::Result<Vec<ferry_client::pb::ConnectionInfo>> {
    let r = client
        .admin()
        .list_connections(ferry_client::pb::ListConnectionsRequest::default())
        .await?
        .into_inner();
    Ok(r.connections)
}

/// The names of the node's temporary queues, through the admin API.
pub async fn temporary_queues(client: &Client) -> anyhow::Result<Vec<String>> {
    let r = client
        .admin()
        .list_queues(ferry_client::pb::ListQueuesRequest::default())
        .await?
        .into_inner();
    Ok(r.queues
        .into_iter()
        .filter(|q| q.temporary)
        .map(|q| q.name)
        .collect())
}

/// Queue statistics through the admin API.
pub async fn stats(client: &Client, queue: &str) -> anyhow::Result<ferry_client::pb::QueueStats> {
    let r = client
        .admin()
        .get_queue_stats(ferry_client::pb::GetQueueStatsRequest { name: queue.into() })
        .await?
        .into_inner();
    r.queues.into_iter().next().context("no stats returned")
}

/// Creates a queue through the admin API.
pub async fn create_queue(client: &Client, name: &str) -> anyhow::Result<()> {
    client
        .admin()
        .create_queue(ferry_client::pb::CreateQueueRequest {
            replicas: 0,
            own_shard: false,
            name: name.into(),
            config: None,
            if_not_exists: false,
            node: String::new(),
        })
        .await?;
    Ok(())
}

/// A running in-memory node with these queues created, and a client connected to it. Keep the
/// returned directory alive as long as the node.
pub async fn memory_node(queues: &[&str]) -> anyhow::Result<(tempfile::TempDir, Node, Client)> {
    let dir = tempfile::tempdir()?;
    let node = Node::start(
        dir.path(),
        NodeOptions {
            memory: true,
            ..Default::default()
        },
    )?;
    let client = node.client().await?;
    for q in queues {
        create_queue(&client, q).await?;
    }
    Ok((dir, node, client))
}
