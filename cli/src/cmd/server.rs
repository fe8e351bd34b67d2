use std::path::PathBuf;

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat, Overrides, Storage};

#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// TOML configuration file (see deploy/ferry.toml).
    #[arg(long, env = "FERRY_CONFIG")]
    config: Option<PathBuf>,
    /// Address clients dial, HOST:PORT (port 0: any free port).
    #[arg(long)]
    listen: Option<String>,
    /// Address other nodes of the cluster dial, HOST:PORT (port 0: any free port). Keep it off
    /// networks clients can reach.
    #[arg(long)]
    peer_listen: Option<String>,
    /// Where the node keeps its data.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// This node's id in the cluster.
    #[arg(long)]
    node_id: Option<String>,
    /// Keep everything in memory (nothing survives a restart).
    #[arg(long)]
    memory: bool,
}

pub async fn run(a: ServerArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        node_id: a.node_id,
        listen: a.listen,
        peer_listen: a.peer_listen,
        data_dir: a.data_dir,
        storage: a.memory.then_some(Storage::Memory),
    };
    let config = Config::load(a.config.as_deref(), &overrides).map_err(anyhow::Error::msg)?;
    init_logging(&config)?;
    let listeners = crate::node::Listeners {
        client: bind(&config.listen, "--listen").await?,
        peer: bind(&config.peer_listen, "--peer-listen").await?,
    };
    tracing::info!(data_dir = %config.data_dir.display(), storage = ?config.storage, "starting ferry node");
    // Lines on stdout once the node serves, for people and for scripts that started it on port 0
    // and wait for it: the client address first (scripts read that line), then the peer address,
    // then the metrics URL when metrics are on.
    let ready = |addrs: &crate::node::Addresses| {
        println!(
            "ferry {} listening on {}",
            env!("CARGO_PKG_VERSION"),
            addrs.client
        );
        println!("peer listener on {}", addrs.peer);
        if let Some(m) = addrs.metrics {
            println!("metrics on http://{m}/metrics");
        }
    };
    crate::node::run(config, listeners, crate::node::shutdown_signal(), ready).await
}

async fn bind(addr: &str, flag: &str) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.with_context(|| {
        format!(
            "cannot listen on {addr} (is another server running there? pick another with {flag})"
        )
    })
}

fn init_logging(config: &Config) -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log.filter))
        .with_context(|| format!("log.filter = {:?} is not a valid filter", config.log.filter))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let result = match config.log.format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
}
