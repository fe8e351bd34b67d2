use std::fmt::Write;
use std::path::PathBuf;

use anyhow::Context as _;
use tracing::field::{Field, Visit};
use tracing_subscriber::field::RecordFields;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::FormatFields;
use tracing_subscriber::EnvFilter;

use crate::output::outln;
use ferry_node::config::{Config, LogFormat, Overrides, Storage};

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
    /// Form a new cluster of these nodes: ID=HOST:PORT,... (each node's peer listener, this
    /// one included; the same list on every initial node). Without it and without --join, the
    /// node is a one-node cluster. Read only on the first start.
    #[arg(long, value_name = "ID=HOST:PORT,...")]
    initial_cluster: Option<String>,
    /// Join a running cluster through the peer listener of one of its members (HOST:PORT);
    /// the node waits until an admin runs `ferry node add`. Read only on the first start.
    #[arg(long, value_name = "HOST:PORT")]
    join: Option<String>,
    #[command(flatten)]
    not_a_client: super::NotAClient,
}

pub async fn run(a: ServerArgs) -> anyhow::Result<()> {
    let overrides = Overrides {
        node_id: a.node_id,
        listen: a.listen,
        peer_listen: a.peer_listen,
        data_dir: a.data_dir,
        storage: a.memory.then_some(Storage::Memory),
        cluster: ferry_node::config::ClusterOverrides {
            initial: a.initial_cluster,
            join: a.join,
        },
    };
    let (config, settings) =
        Config::load_explained(a.config.as_deref(), &overrides).map_err(anyhow::Error::msg)?;
    init_logging(&config)?;
    let listeners = ferry_node::run::Listeners {
        client: bind(&config.listen, "--listen").await?,
        peer: bind(&config.peer_listen, "--peer-listen").await?,
    };
    tracing::info!(data_dir = %config.data_dir.display(), storage = ?config.storage, "starting ferry node");
    // Lines on stdout once the node serves, for people and for scripts that started it on port 0
    // and wait for it: the client address first (scripts read that line), then the peer address,
    // then the metrics URL when metrics are on.
    // A node whose stdout nobody reads any more (a pipe closed early) keeps serving.
    let ready = |addrs: &ferry_node::run::Addresses| {
        let _ = outln!(
            "ferry {} listening on {}",
            env!("CARGO_PKG_VERSION"),
            addrs.client
        );
        let _ = outln!("peer listener on {}", addrs.peer);
        if let Some(m) = addrs.metrics {
            let _ = outln!("metrics on http://{m}/metrics");
        }
    };
    ferry_node::run::run(
        config,
        settings,
        listeners,
        ferry_node::run::shutdown_signal(),
        ready,
    )
    .await
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
    // Colours are for a person at a terminal (who has not set NO_COLOR); a file or a log collector
    // would get escape codes.
    let colours = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(colours);
    let result = match config.log.format {
        LogFormat::Text => builder.fmt_fields(EscapedFields).try_init(),
        // JSON escapes control characters itself.
        LogFormat::Json => builder.json().try_init(),
    };
    result.map_err(|e| anyhow::anyhow!("cannot set up logging: {e}"))
}

/// Longest field value a log line shows, in characters; the rest is cut.
const LOG_VALUE_CHARS_MAX: usize = 4096;

/// The text format's fields, as tracing-subscriber writes them (`message name=value ...`), except
/// that control characters in values are escaped and values are cut at [`LOG_VALUE_CHARS_MAX`].
/// tracing-subscriber writes `%value` fields as they are: text a caller chose (a client id, a nack
/// reason, anything an error echoes) could otherwise end the line and start a forged one.
#[derive(Debug, Clone, Copy)]
struct EscapedFields;

impl<'w> FormatFields<'w> for EscapedFields {
    fn format_fields<R: RecordFields>(&self, writer: Writer<'w>, fields: R) -> std::fmt::Result {
        let mut visitor = EscapingVisitor {
            writer,
            seen: false,
            result: Ok(()),
        };
        fields.record(&mut visitor);
        visitor.result
    }
}

struct EscapingVisitor<'w> {
    writer: Writer<'w>,
    seen: bool,
    result: std::fmt::Result,
}

impl EscapingVisitor<'_> {
    fn write_field(&mut self, name: &str, value: &dyn std::fmt::Debug) -> std::fmt::Result {
        if self.seen {
            self.writer.write_char(' ')?;
        }
        self.seen = true;
        if name != "message" {
            write!(self.writer, "{}=", name.strip_prefix("r#").unwrap_or(name))?;
        }
        let mut escaped = Escaping {
            out: &mut self.writer,
            chars_left: LOG_VALUE_CHARS_MAX,
            cut: false,
        };
        write!(escaped, "{value:?}")
    }
}

impl Visit for EscapingVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        // As tracing-subscriber does: the message as it is, other strings quoted.
        if field.name() == "message" {
            self.record_debug(field, &format_args!("{value}"));
        } else {
            self.record_debug(field, &value);
        }
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        let mut text = value.to_string();
        let mut source = value.source();
        while let Some(s) = source {
            text.push_str(": ");
            text.push_str(&s.to_string());
            source = s.source();
        }
        self.record_debug(field, &format_args!("{text}"));
    }

    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        // `log.*` fields carry the metadata of events from the `log` crate, shown elsewhere.
        if self.result.is_ok() && !field.name().starts_with("log.") {
            self.result = self.write_field(field.name(), value);
        }
    }
}

/// Writes through to `out` with control characters escaped (`\n`, `\u{1b}`); past `chars_left`
/// characters, writes `…(cut)` once and drops the rest.
struct Escaping<'a, W> {
    out: &'a mut W,
    chars_left: usize,
    cut: bool,
}

impl<W: Write> Write for Escaping<'_, W> {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        for c in s.chars() {
            if self.chars_left == 0 {
                if !self.cut {
                    self.cut = true;
                    self.out.write_str("…(cut)")?;
                }
                return Ok(());
            }
            self.chars_left -= 1;
            if c.is_control() {
                for e in c.escape_default() {
                    self.out.write_char(e)?;
                }
            } else {
                self.out.write_char(c)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Logs with the text format into a string.
    fn logged(log: impl FnOnce()) -> String {
        let out = Arc::new(Mutex::new(Vec::new()));
        let sink = out.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .fmt_fields(EscapedFields)
            .with_writer(move || SinkWriter(sink.clone()))
            .finish();
        tracing::subscriber::with_default(subscriber, log);
        let bytes = out.lock().map(|b| b.clone()).unwrap_or_default();
        String::from_utf8(bytes).unwrap_or_default()
    }

    struct SinkWriter(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for SinkWriter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut b) = self.0.lock() {
                b.extend_from_slice(buf);
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn caller_text_cannot_forge_a_log_line() {
        let forged = "x\n2026-01-01T00:00:00Z ERROR forged\r\x1b[31m";
        let line = logged(|| {
            tracing::info!(client_id = %forged, reason = forged, "closed {}", forged);
        });
        assert_eq!(line.matches('\n').count(), 1, "{line:?}");
        assert!(line.ends_with('\n'), "{line:?}");
        assert!(!line.contains('\x1b') && !line.contains('\r'), "{line:?}");
        assert!(
            line.contains(r"client_id=x\n2026-01-01T00:00:00Z ERROR forged\r\u{1b}[31m"),
            "{line:?}"
        );
        assert!(line.contains(r"closed x\n2026"), "{line:?}");
    }

    #[test]
    fn fields_read_as_before_and_long_values_are_cut() {
        let line = logged(|| tracing::info!(queue = %"orders", count = 3, "queue deleted"));
        assert!(
            line.contains("queue deleted queue=orders count=3"),
            "{line:?}"
        );
        let line = logged(|| tracing::info!(id = %"a".repeat(10_000)));
        assert!(
            line.contains(&format!("id={}…(cut)\n", "a".repeat(LOG_VALUE_CHARS_MAX))),
            "{line:?}"
        );
        let line = logged(|| tracing::info!(id = %"a".repeat(LOG_VALUE_CHARS_MAX)));
        assert!(!line.contains("(cut)"), "{line:?}");
    }
}
