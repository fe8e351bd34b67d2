use std::path::PathBuf;

use anyhow::Context as _;
use tracing_subscriber::EnvFilter;

use crate::config::{Config, LogFormat, Overrides, Storage};

#[derive(Debug, clap::Args)]
pub struct ServerArgs {
    /// TOML configuration file (see deploy/ferry.toml).
    #[arg(long, env = "FERRY_CONFIG")]
    config: Option<PathBuf>,
    /// Address to listen on, HOST:PORT (port 0: any free port).
    #[arg(long)]
    listen: Option<String>,
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
        data_dir: a.data_dir,
        storage: a.memory.then_some(Storage::Memory),
    };
    let config = Config::load(a.config.as_deref(), &overrides).map_err(anyhow::Error::msg)?;
    init_logging(&config)?;
    let listener = tokio::net::TcpListener::bind(&config.listen)
        .await
        .with_context(|| {
            format!(
                "cannot listen on {} (is another server running there? pick another with --listen)",
                config.listen
            )
        })?;
    tracing::info!(data_dir = %config.data_dir.display(), storage = ?config.storage, "starting ferry node");
    // One line on stdout once the node serves, for people and for scripts that started it on
    // port 0 and wait for it.
    let ready = |addr, metrics: Option<std::net::SocketAddr>| {
        println!("ferry {} listening on {addr}", env!("CARGO_PKG_VERSION"));
        if let Some(m) = metrics {
            println!("metrics on http://{m}/metrics");
        }
    };
    crate::node::run(config, listener, crate::node::shutdown_signal(), ready).await
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
