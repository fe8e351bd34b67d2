//! The `ferry` command line.

mod bench;
mod bench_queues;
mod browse;
mod check_disk;
mod cluster;
mod connection;
mod connections;
mod events;
mod latency;
mod message;
mod partial;
mod queue;
mod queue_stats;
mod receive;
mod request;
mod rtt;
mod send;
mod server;
mod shard;
mod status;

use clap::{Parser, Subcommand};

use crate::output::Format;
use ferry_node::config::DEFAULT_PORT;

pub(crate) use connection::with_connection;
pub use connection::Interrupted;
pub use partial::{PartialAnswer, EXIT_PARTIAL};
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

/// Options every client subcommand takes, before or after the subcommand's name. Help lists
/// them apart, under "Global options"; `server` and `check-disk` talk to no node and do not
/// take `--server` ([`NotAClient`]).
#[derive(Debug, Clone, clap::Args)]
pub struct ClientArgs {
    /// The node to talk to, HOST:PORT.
    #[arg(long, env = "FERRY_SERVER", default_value_t = format!("127.0.0.1:{DEFAULT_PORT}"), global = true, help_heading = GLOBAL)]
    pub server: String,
    /// Output for people or for scripts (one JSON object per line).
    #[arg(short = 'o', long = "output", env = "FERRY_OUTPUT", value_enum, default_value_t = Format::Human, global = true, help_heading = GLOBAL)]
    pub output: Format,
}

const GLOBAL: &str = "Global options";

/// Takes the place of the global `--server` in commands that talk to no node, so help does not
/// list it there; giving it is a usage error that says so ([`Cli::parse_args`]), not an option
/// silently ignored.
#[derive(Debug, Clone, clap::Args)]
pub struct NotAClient {
    #[arg(long = "server", hide = true)]
    server: Option<String>,
}

/// The commands that talk to no node, and what to do instead of `--server`.
const NOT_CLIENTS: &[(&str, &str)] = &[
    (
        "server",
        "it is the node: set the address clients dial with --listen (or `listen` in its configuration)",
    ),
    (
        "check-disk",
        "it times the disk under --data-dir on this machine",
    ),
];

impl Cli {
    /// Parses the command line (exiting with clap's usage error on bad input). `--server` given
    /// on the command line to a command that talks to no node is such an error; FERRY_SERVER in
    /// the environment is not (it is there for the client commands).
    pub fn parse_args() -> Self {
        use clap::{CommandFactory as _, FromArgMatches as _};
        let matches = Self::command().get_matches();
        if let Some((name, sub)) = matches.subcommand() {
            let given = sub.value_source("server") == Some(clap::parser::ValueSource::CommandLine);
            if let Some((_, instead)) = NOT_CLIENTS.iter().find(|(n, _)| *n == name) {
                if given {
                    Self::command()
                        .error(
                            clap::error::ErrorKind::ArgumentConflict,
                            format!("`ferry {name}` talks to no node, so it takes no --server; {instead}"),
                        )
                        .exit();
                }
            }
        }
        Self::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a node.
    #[command(after_help = r#"Examples:
  ferry server                                   one node; data in ./ferry-data, clients on 127.0.0.1:7400
  ferry server --config /etc/ferry/ferry.toml    settings from a file (deploy/ferry.toml lists them all)
  FERRY_LIMITS__MAX_MESSAGE_SIZE_BYTES=1048576 ferry server    any setting: FERRY_ and its TOML path, `__` between
  ferry server --node-id n2 --join 10.0.0.1:7401 --peer-listen 10.0.0.2:7401    a node joining a cluster"#)]
    Server(server::ServerArgs),
    /// The node asked: version, uptime, readiness and alarms, data directory, store and disk
    /// guard, listeners, peers with their reachability, and the configuration in effect with
    /// where each value came from.
    #[command(after_help = r#"Examples:
  ferry status                              what differs from the defaults, with where each value came from
  ferry status --all                        every setting
  ferry status --server 10.0.0.2:7400 -o json"#)]
    Status(status::StatusArgs),
    /// Create, list, delete, purge queues and show their statistics.
    #[command(after_help = r#"Examples:
  ferry queue create orders --max-redeliveries 5 --dead-letter-queue orders.dlq
  ferry queue update orders --max-redeliveries 3     live, on the queue's owner
  ferry queue list
  ferry queue stats                                  every queue, in 80 columns
  ferry queue stats --columns name,messages,consumers --watch
  ferry queue show orders
  ferry queue move --from orders.dlq --to orders --rate 100
  ferry queue purge orders
  ferry queue delete orders --if-empty"#)]
    Queue {
        #[command(subcommand)]
        command: queue::QueueCommand,
    },
    /// Send messages to a queue; prints the id of each.
    #[command(after_help = r#"Examples:
  ferry send -q orders 'order 1'
  ferry send -q orders --count 3 -p region=eu -p amount:long=120 'order 2'
  ferry send -q orders --priority 9 --ttl-ms 60000 --correlation-id abc urgent"#)]
    Send(send::SendArgs),
    /// Receive messages from a queue.
    #[command(after_help = r#"Examples:
  ferry receive -q orders                                one message, waiting until it comes
  ferry receive -q orders --count 10 --timeout-ms 0      up to 10, without waiting
  ferry receive -q orders --selector "region = 'eu'" --ack client
  ferry receive -q orders -o json --body-as base64       binary bodies, for scripts"#)]
    Receive(receive::ReceiveArgs),
    /// Look at a queue's messages without taking them.
    #[command(after_help = r#"Examples:
  ferry browse -q orders
  ferry browse -q orders.dlq --count 10 -o json"#)]
    Browse(browse::BrowseArgs),
    /// Send a request and wait for its reply (on a temporary queue, matched by correlation id).
    #[command(after_help = r#"Examples:
  ferry request -q pricing 'price of 42'
  ferry request -q pricing --timeout-ms 1000 -p currency=EUR 'price of 42'"#)]
    Request(request::RequestArgs),
    /// Answer requests: reply to each request's reply-to queue with its message id as the
    /// correlation id.
    #[command(after_help = r#"Examples:
  ferry reply -q pricing                           answer one request, echoing its body
  ferry reply -q pricing --count 100 --body ok     answer 100 requests with "ok""#)]
    Reply(request::ReplyArgs),
    /// One message at a time: delete by id.
    #[command(after_help = r#"Examples:
  ferry message history ID      where a message went: sent, delivered to whom, returned, acknowledged
  ferry message delete ID --queue orders"#)]
    Message {
        #[command(subcommand)]
        command: message::MessageCommand,
    },
    /// The client connections open on a node: list them, close one.
    #[command(after_help = r#"Examples:
  ferry connections list
  ferry connections close CONNECTION      its unacknowledged messages return at once"#)]
    Connections {
        #[command(subcommand)]
        command: connections::ConnectionsCommand,
    },
    /// Watch events: dead letters, expiries, replies to a queue that is gone, and queue depth or
    /// oldest-message age crossing thresholds you set.
    #[command(after_help = r#"Examples:
  ferry events                               every event of the node, until ctrl-c
  ferry events -q orders --depth-high 10000 --depth-low 1000
  ferry events -q orders --age-high-ms 60000 -o json"#)]
    Events(events::EventsArgs),
    /// Measure: producers and consumers on one queue; throughput, latency percentiles, and a
    /// check that every message sent was received.
    #[command(after_help = r#"Examples:
  ferry bench                                           the default workload on a fresh queue
  ferry bench --producers 4 --consumers 4 --size 1024 --count 100000
  ferry bench --rate 5000 --duration-ms 60000           latency at a fixed rate"#)]
    Bench(bench::BenchArgs),
    /// Measure queue creation: creates (then deletes) queues one at a time or from several
    /// concurrent creators; queues per second and each call's latency.
    #[command(
        name = "bench-queues",
        after_help = r#"Examples:
  ferry bench-queues                                    1 000 creates, one at a time
  ferry bench-queues --count 10000 --concurrency 8      eight creators at once
  ferry bench-queues --count 100000 --keep -o json      keep them (idle figures afterwards)"#
    )]
    BenchQueues(bench_queues::BenchQueuesArgs),
    /// Time the round trip of the cheapest call to the node (a connection heartbeat): the floor
    /// under every send and receive, like `nats rtt`.
    #[command(after_help = r#"Examples:
  ferry rtt
  ferry rtt --server 10.0.0.2:7400 --count 100"#)]
    Rtt(rtt::RttArgs),
    /// The nodes of the cluster: add, remove, promote, list.
    #[command(after_help = r#"Examples:
  ferry node list
  ferry node add n4 --address 10.0.0.4:7401    after starting it with `ferry server --join ...`
  ferry node promote n4 n5
  ferry node remove n4"#)]
    Node {
        #[command(subcommand)]
        command: cluster::NodeCommand,
    },
    /// The cluster as a node sees it: leader, term, nodes' roles, health and queues, and per
    /// node the queue shards it holds a replica of and leads (its preferred share in brackets).
    #[command(after_help = r#"Examples:
  ferry cluster status
  ferry cluster status -o json"#)]
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// The queue shards (the Raft groups holding replicated queues): each one's leader,
    /// replicas, queues, applied index and how far its slowest replica lags; moving a shard's
    /// leadership.
    #[command(after_help = r#"Examples:
  ferry shard list                 one row per shard; `-` where no leader is known
  ferry shard list 3               shard 3 only
  ferry shard list -o json         one object per shard: shard, leader, replicas, queues, applied_index, lag
  ferry shard transfer-leader 3 n2 n2 leads shard 3 (answered once it does, at most 5 s)

Leaders are balanced by every node: a shard led by a node other than its preferred leader (its
first replica) is handed to it once that node is up and caught up (see docs/operations.md)."#)]
    Shard {
        #[command(subcommand)]
        command: shard::ShardCommand,
    },
    /// Time synced appends in a data directory, as the node's write-ahead log makes them: the
    /// disk's floor under every persistent send; warns about online `discard`.
    #[command(after_help = r#"Examples:
  ferry check-disk                                 the default ./ferry-data
  ferry check-disk --data-dir /var/lib/ferry --count 5000"#)]
    CheckDisk(check_disk::CheckDiskArgs),
    /// Print the shell completion script for bash, zsh, fish, elvish or powershell.
    #[command(after_help = r#"Examples:
  ferry completions bash > /etc/bash_completion.d/ferry
  ferry completions zsh > "${fpath[1]}/_ferry"
  ferry completions fish > ~/.config/fish/completions/ferry.fish"#)]
    Completions {
        /// The shell to complete in.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Server(a) => server::run(a).await,
        Command::Status(a) => status::run(&cli.client, a).await,
        Command::Queue { command } => queue::run(&cli.client, command).await,
        Command::Send(a) => send::run(&cli.client, a).await,
        Command::Receive(a) => receive::run(&cli.client, a).await,
        Command::Browse(a) => browse::run(&cli.client, a).await,
        Command::Request(a) => request::request(&cli.client, a).await,
        Command::Reply(a) => request::reply(&cli.client, a).await,
        Command::Bench(a) => bench::run(&cli.client, a).await,
        Command::BenchQueues(a) => bench_queues::run(&cli.client, a).await,
        Command::Rtt(a) => rtt::run(&cli.client, a).await,
        // Blocking file I/O on the command's own runtime: nothing else runs on it.
        Command::CheckDisk(a) => check_disk::run(&cli.client, a),
        Command::Events(a) => events::run(&cli.client, a).await,
        Command::Message { command } => message::run(&cli.client, command).await,
        Command::Connections { command } => connections::run(&cli.client, command).await,
        Command::Node { command } => cluster::node(&cli.client, command).await,
        Command::Cluster { command } => cluster::cluster(&cli.client, command).await,
        Command::Shard { command } => shard::run(&cli.client, command).await,
        Command::Completions { shell } => completions(shell),
    }
}

/// Writes the completion script through the CLI's stdout (a closed pipe ends quietly).
fn completions(shell: clap_complete::Shell) -> anyhow::Result<()> {
    use clap::CommandFactory as _;
    let mut script = vec![];
    clap_complete::generate(shell, &mut Cli::command(), "ferry", &mut script);
    let script = String::from_utf8(script)?;
    crate::output::outln!("{}", script.trim_end())?;
    Ok(())
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    use super::Cli;

    #[test]
    fn the_command_line_is_well_formed() {
        Cli::command().debug_assert();
    }

    /// Every command says what it does, every option what it is for, and every top-level
    /// command shows examples.
    #[test]
    fn help_describes_every_command_and_option_and_shows_examples() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            if cmd.get_about().is_none() {
                missing.push(format!("{path}: no description"));
            }
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if arg.is_hide_set() || id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}: no description"));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_name() != "help" {
                    walk(sub, &format!("{path} {}", sub.get_name()), missing);
                }
            }
        }
        let cli = Cli::command();
        let mut missing = vec![];
        walk(&cli, "ferry", &mut missing);
        for sub in cli.get_subcommands().filter(|s| s.get_name() != "help") {
            let examples = sub
                .get_after_help()
                .is_some_and(|h| h.to_string().starts_with("Examples:"));
            if !examples {
                missing.push(format!("ferry {}: no examples", sub.get_name()));
            }
        }
        assert!(missing.is_empty(), "{}", missing.join("\n"));
    }
}
