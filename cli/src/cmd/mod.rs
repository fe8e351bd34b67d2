//! The `ferry` command line.

mod bench;
mod browse;
mod check_disk;
mod cluster;
mod connection;
mod connections;
mod events;
mod latency;
mod message;
mod queue;
mod receive;
mod request;
mod rtt;
mod send;
mod server;

use clap::{Parser, Subcommand};

use crate::config::DEFAULT_PORT;
use crate::output::Format;

pub(crate) use connection::with_connection;
pub use connection::Interrupted;
pub use send::parse_property;

/// Ferry: a JMS-style message broker.
#[derive(Debug, Parser)]
#[command(name = "ferry", version, about, propagate_version = true)]
pub struct Cli {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: Command,
}

/// Options every client subcommand takes, before or after the subcommand's name.
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// The node to talk to.
    #[arg(long, env = "FERRY_SERVER", default_value_t = format!("127.0.0.1:{DEFAULT_PORT}"), global = true)]
    pub server: String,
    /// Output for people or for scripts (one JSON object per line).
    #[arg(short = 'o', long = "output", env = "FERRY_OUTPUT", value_enum, default_value_t = Format::Human, global = true)]
    pub output: Format,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a node.
    Server(server::ServerArgs),
    /// Create, list, delete, purge queues and show their statistics.
    Queue {
        #[command(subcommand)]
        command: queue::QueueCommand,
    },
    /// Send messages to a queue; prints the id of each.
    Send(send::SendArgs),
    /// Receive messages from a queue.
    Receive(receive::ReceiveArgs),
    /// Look at a queue's messages without taking them.
    Browse(browse::BrowseArgs),
    /// Send a request and wait for its reply (on a temporary queue, matched by correlation id).
    Request(request::RequestArgs),
    /// Answer requests: reply to each request's reply-to queue with its message id as the
    /// correlation id.
    Reply(request::ReplyArgs),
    /// One message at a time: delete by id.
    Message {
        #[command(subcommand)]
        command: message::MessageCommand,
    },
    /// The client connections open on a node: list them, close one.
    Connections {
        #[command(subcommand)]
        command: connections::ConnectionsCommand,
    },
    /// Watch events: dead letters, expiries, replies to a queue that is gone, and queue depth or
    /// oldest-message age crossing thresholds you set.
    Events(events::EventsArgs),
    /// Measure: producers and consumers on one queue; throughput, latency percentiles, and a
    /// check that every message sent was received.
    Bench(bench::BenchArgs),
    /// Time the round trip of the cheapest call to the node (a connection heartbeat): the floor
    /// under every send and receive, like `nats rtt`.
    Rtt(rtt::RttArgs),
    /// The nodes of the cluster: add, remove, promote, list.
    Node {
        #[command(subcommand)]
        command: cluster::NodeCommand,
    },
    /// The cluster as a node sees it: leader, term, nodes' roles, health and queues.
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// Time synced appends in a data directory, as the node's write-ahead log makes them: the
    /// disk's floor under every persistent send; warns about online `discard`.
    CheckDisk(check_disk::CheckDiskArgs),
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Server(a) => server::run(a).await,
        Command::Queue { command } => queue::run(&cli.client, command).await,
        Command::Send(a) => send::run(&cli.client, a).await,
        Command::Receive(a) => receive::run(&cli.client, a).await,
        Command::Browse(a) => browse::run(&cli.client, a).await,
        Command::Request(a) => request::request(&cli.client, a).await,
        Command::Reply(a) => request::reply(&cli.client, a).await,
        Command::Bench(a) => bench::run(&cli.client, a).await,
        Command::Rtt(a) => rtt::run(&cli.client, a).await,
        // Blocking file I/O on the command's own runtime: nothing else runs on it.
        Command::CheckDisk(a) => check_disk::run(&cli.client, a),
        Command::Events(a) => events::run(&cli.client, a).await,
        Command::Message { command } => message::run(&cli.client, command).await,
        Command::Connections { command } => connections::run(&cli.client, command).await,
        Command::Node { command } => cluster::node(&cli.client, command).await,
        Command::Cluster { command } => cluster::cluster(&cli.client, command).await,
    }
}

/// Connects; a failure is reported in words, with advice (see `output::error_report`).
pub(crate) async fn connect(args: &ClientArgs) -> anyhow::Result<ferry_client::Client> {
    Ok(ferry_client::Client::connect(&args.server).await?)
}

/// Every page of a paged listing: `fetch(token)` answers one page and the next token (empty:
/// the last page).
pub(crate) async fn all_pages<T, F, Fut>(mut fetch: F) -> anyhow::Result<Vec<T>>
where
    F: FnMut(String) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, String), tonic::Status>>,
{
    let mut all = vec![];
    let mut token = String::new();
    loop {
        let (items, next) = fetch(token).await?;
        all.extend(items);
        if next.is_empty() {
            return Ok(all);
        }
        token = next;
    }
}
