//! Printing for humans (default) or scripts (`-o json`: one JSON object per line).
//!
//! Commands print through [`outln!`] and [`errln!`], never `println!`: `println!` panics when its
//! reader went away (`ferry browse | head -1`). A write to a closed stdout is an error
//! ([`StdoutClosed`]) that ends the command through its usual cleanup (connections closed,
//! unacknowledged messages returned), and the binary then exits quietly with status 141, as a
//! Unix tool killed by SIGPIPE does.

use std::collections::BTreeMap;
use std::io::Write as _;

use ferry_proto::pb;
use serde_json::{json, Value};

/// Writing to stdout failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot write to standard output: {0}")]
pub struct StdoutClosed(#[from] std::io::Error);

impl StdoutClosed {
    /// Whether the reader closed its end (a pipe to `head`, a pager quit early): the end of the
    /// output, not a failure to report.
    pub fn is_broken_pipe(&self) -> bool {
        self.0.kind() == std::io::ErrorKind::BrokenPipe
    }

    /// Whether `e` ended because its output's reader went away.
    pub fn ended(e: &anyhow::Error) -> bool {
        e.chain()
            .any(|c| c.downcast_ref::<Self>().is_some_and(Self::is_broken_pipe))
    }
}

/// The exit status after stdout's reader went away: 128 + SIGPIPE, what a shell reports for a
/// Unix tool killed by SIGPIPE (`cat big | head -1`).
pub const EXIT_STDOUT_CLOSED: u8 = 141;

/// Writes one line to stdout; fails (never panics) when it cannot.
pub fn write_line(line: std::fmt::Arguments<'_>) -> Result<(), StdoutClosed> {
    let mut out = std::io::stdout().lock();
    out.write_fmt(line)?;
    out.write_all(b"\n")?;
    // Stdout is line-buffered: the line is out (or the pipe is known closed) before this returns.
    out.flush()?;
    Ok(())
}

/// Writes one line to stderr; if stderr is gone too there is nobody left to tell.
pub fn write_err_line(line: std::fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(line).and_then(|()| err.write_all(b"\n"));
}

/// `println!` that returns `Result<(), StdoutClosed>` instead of panicking.
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::output::write_line(format_args!($($arg)*))
    };
}
pub(crate) use outln;

/// `eprintln!` that never panics.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::output::write_err_line(format_args!($($arg)*))
    };
}
pub(crate) use errln;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Human,
    Json,
}

pub fn property_json(v: &pb::PropertyValue) -> Value {
    use pb::property_value::Value as V;
    match &v.value {
        Some(V::BoolValue(b)) => json!(b),
        Some(V::IntValue(i)) => json!(i),
        Some(V::LongValue(l)) => json!(l),
        Some(V::DoubleValue(d)) => json!(d),
        Some(V::StringValue(s)) => json!(s),
        None => Value::Null,
    }
}

pub fn property_text(v: &pb::PropertyValue) -> String {
    use pb::property_value::Value as V;
    match &v.value {
        Some(V::BoolValue(b)) => format!("{b} (bool)"),
        Some(V::IntValue(i)) => format!("{i} (int)"),
        Some(V::LongValue(l)) => format!("{l} (long)"),
        Some(V::DoubleValue(d)) => format!("{d} (double)"),
        Some(V::StringValue(s)) => format!("{s:?} (string)"),
        None => "null".into(),
    }
}

/// How message bodies are shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum BodyAs {
    /// As text when the body is UTF-8; a body that is not is shown as base64, marked so
    /// (JSON: `body` null and `body_base64`).
    #[default]
    Text,
    /// Always as base64 (JSON: `body_base64`, no `body`): for binary payloads.
    Base64,
}

/// The options of commands that print messages.
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct BodyArgs {
    /// How to show message bodies.
    #[arg(long = "body-as", value_enum, default_value_t = BodyAs::Text)]
    pub body_as: BodyAs,
}

/// A body as text, or `None` when it is to be shown as base64.
fn body_text(body: &[u8], how: BodyAs) -> Option<&str> {
    match how {
        BodyAs::Text => std::str::from_utf8(body).ok(),
        BodyAs::Base64 => None,
    }
}

fn base64(body: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(body)
}

/// One message as a JSON object.
pub fn message_json(m: &pb::Message, delivery: Option<&pb::Delivery>, how: BodyAs) -> Value {
    let properties: BTreeMap<&String, Value> = m
        .properties
        .iter()
        .map(|(k, v)| (k, property_json(v)))
        .collect();
    let mut v = json!({
        "message_id": m.message_id,
        "queue": m.queue,
        "properties": properties,
        "correlation_id": m.correlation_id,
        "reply_to": (!m.reply_to.is_empty()).then_some(&m.reply_to),
        "type": (!m.r#type.is_empty()).then_some(&m.r#type),
        "priority": m.priority,
        "timestamp_ms": m.timestamp_ms,
        "expiration_ms": m.expiration_ms,
        "persistent": m.delivery_mode != pb::DeliveryMode::NonPersistent as i32,
    });
    match (body_text(&m.body, how), how) {
        (Some(text), _) => v["body"] = json!(text),
        // Never lossy: bytes that are not UTF-8 come out exactly, in base64.
        (None, BodyAs::Text) => {
            v["body"] = Value::Null;
            v["body_base64"] = json!(base64(&m.body));
        }
        (None, BodyAs::Base64) => v["body_base64"] = json!(base64(&m.body)),
    }
    if let Some(d) = delivery {
        v["delivery_count"] = json!(d.delivery_count);
        v["redelivered"] = json!(d.redelivered);
        v["receipt_handle"] = json!(d.receipt_handle);
    }
    v
}

/// One message for a person to read.
pub fn message_text(m: &pb::Message, delivery: Option<&pb::Delivery>, how: BodyAs) -> String {
    let mut s = m.message_id.clone();
    if let Some(d) = delivery {
        s += &format!(
            "  delivery {}{}",
            d.delivery_count,
            if d.redelivered { " (redelivered)" } else { "" }
        );
    }
    s += &format!("  priority {}\n", m.priority);
    if let Some(c) = &m.correlation_id {
        s += &format!("  correlation id: {c:?}\n");
    }
    if !m.reply_to.is_empty() {
        s += &format!("  reply to: {}\n", m.reply_to);
    }
    let mut props: Vec<_> = m.properties.iter().collect();
    props.sort_by_key(|(k, _)| k.as_str());
    for (k, v) in props {
        s += &format!("  {k} = {}\n", property_text(v));
    }
    match (body_text(&m.body, how), how) {
        (Some(text), _) => s += &format!("  {text}"),
        (None, BodyAs::Text) => {
            s += &format!(
                "  (not UTF-8; {} bytes as base64) {}",
                m.body.len(),
                base64(&m.body)
            );
        }
        (None, BodyAs::Base64) => s += &format!("  {}", base64(&m.body)),
    }
    s
}

/// A progress bar on stderr for people; hidden for `-o json` or when stderr is not a terminal.
/// Without a total, a spinner.
pub fn progress_bar(format: Format, total: Option<u64>) -> indicatif::ProgressBar {
    use std::io::IsTerminal as _;
    if format == Format::Json || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = match total {
        Some(t) => indicatif::ProgressBar::new(t),
        None => indicatif::ProgressBar::new_spinner(),
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg} ({per_sec})",
    ) {
        bar.set_style(style);
    }
    bar
}

/// A size for people: `0 B`, `512 B`, `1.5 KiB`, `64 MiB` (powers of 1024).
pub fn bytes_text(bytes: u64) -> String {
    use humansize::{format_size, BINARY};
    format_size(bytes, BINARY.decimal_places(1).decimal_zeroes(0))
}

/// A duration for people, in its largest unit and at most the next one: `250 ms`, `1.5 s`,
/// `45 s`, `2 min 30 s`, `12 h`, `1 d 6 h`.
pub fn duration_text(ms: u64) -> String {
    const S: u64 = 1_000;
    const MIN: u64 = 60 * S;
    const H: u64 = 60 * MIN;
    const D: u64 = 24 * H;
    let two = |big: u64, big_unit: &str, small: u64, small_unit: &str| {
        let (a, b) = (ms / big, (ms % big) / small);
        if b == 0 {
            format!("{a} {big_unit}")
        } else {
            format!("{a} {big_unit} {b} {small_unit}")
        }
    };
    match ms {
        0..S => format!("{ms} ms"),
        S..MIN if ms.is_multiple_of(S) || ms >= 10 * S => format!("{} s", ms / S),
        S..MIN => format!("{:.1} s", ms as f64 / S as f64),
        MIN..H => two(MIN, "min", S, "s"),
        H..D => two(H, "h", MIN, "min"),
        _ => two(D, "d", H, "h"),
    }
}

/// How long ago `at_ms` was, at `now_ms` (both ms since the Unix epoch): `3 s ago`; `-` for 0
/// (never).
pub fn ago_text(at_ms: u64, now_ms: u64) -> String {
    if at_ms == 0 {
        return "-".into();
    }
    format!("{} ago", duration_text(now_ms.saturating_sub(at_ms)))
}

/// A moment (ms since the Unix epoch) as UTC RFC 3339 to the second: `2026-12-02T02:13:00Z`.
pub fn timestamp_text(at_ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(at_ms);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Now, in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How every command reports its failure, on stderr: what failed and why on the first line,
/// what to do on the lines after it, indented with `hint:`. The server's messages say both
/// ("queue x does not exist; create it first (...)"): the part after the first "; " is the hint.
/// Transport failures are said in words (`connection refused`), never as library types.
/// `server`: the address the command was pointed at.
pub fn error_report(e: &anyhow::Error, server: &str) -> String {
    let mut what: Vec<String> = vec![];
    let mut hints: Vec<String> = vec![];
    let mut why: Option<String> = None;
    for cause in e.chain() {
        if let Some(s) = cause.downcast_ref::<tonic::Status>() {
            why = Some(status_text(s, server, &mut hints));
            break;
        }
        if let Some(c) = cause.downcast_ref::<ferry_client::ClientError>() {
            why = Some(match c {
                ferry_client::ClientError::Status(s) => status_text(s, server, &mut hints),
                ferry_client::ClientError::Connect { url, source } => {
                    hints.push(unreachable_hint());
                    let url = url.strip_prefix("http://").unwrap_or(url);
                    format!(
                        "cannot reach the server at {url}: {}",
                        transport_text(source)
                    )
                }
                ferry_client::ClientError::InvalidArgument(m) => m.clone(),
            });
            break;
        }
        if let Some(t) = cause.downcast_ref::<tonic::transport::Error>() {
            hints.push(unreachable_hint());
            why = Some(format!(
                "cannot reach the server at {server}: {}",
                transport_text(t)
            ));
            break;
        }
        let text = cause.to_string();
        let mut lines = text.lines();
        if let Some(first) = lines.next() {
            what.push(first.to_owned());
        }
        hints.extend(lines.map(|l| l.trim().to_owned()).filter(|l| !l.is_empty()));
    }
    if let Some(why) = why {
        // "cannot X: cannot reach ..." says the same twice: the reach failure is the story.
        if why.starts_with("cannot reach") {
            what.clear();
        }
        what.push(why);
    }
    let mut out = format!("error: {}", what.join(": "));
    for h in hints {
        out += &format!("\n  hint: {h}");
    }
    out
}

fn unreachable_hint() -> String {
    "is `ferry server` running there? start one with `ferry server`, or point at a node with --server HOST:PORT (or FERRY_SERVER)".into()
}

/// A gRPC answer that is an error: its message (what went wrong), with its advice (after the
/// first "; ") moved to `hints`; transport failures the client library reports as statuses are
/// said in words.
fn status_text(s: &tonic::Status, server: &str, hints: &mut Vec<String>) -> String {
    use tonic::Code;
    let message = s.message().trim();
    // A status made by the client library for a connection that failed or broke.
    use std::error::Error as _;
    let transport = s.source().is_some_and(|src| {
        let mut e: Option<&(dyn std::error::Error + 'static)> = Some(src);
        while let Some(x) = e {
            if x.is::<tonic::transport::Error>() || x.is::<std::io::Error>() {
                return true;
            }
            e = x.source();
        }
        false
    });
    if transport
        || (s.code() == Code::Unavailable
            && (message.contains("tcp connect error")
                || message.contains("transport error")
                || message.contains("connection error")
                || message.contains("h2 protocol error")))
    {
        hints.push(unreachable_hint());
        let detail = s.source().map_or_else(
            || message.to_owned(),
            |src| {
                let mut last = src;
                while let Some(next) = last.source() {
                    last = next;
                }
                last.to_string()
            },
        );
        return format!("lost the connection to the server at {server}: {detail}");
    }
    if message.is_empty() {
        return match s.code() {
            Code::DeadlineExceeded => "the server did not answer in time".into(),
            Code::Unimplemented => {
                hints.push(
                    "the node may run an older ferry: compare `ferry --version` with the node's"
                        .into(),
                );
                "the server does not know this request".into()
            }
            code => format!("the server refused: {}", code.description()),
        };
    }
    if s.code() == Code::Unimplemented && message.starts_with("Operation is not implemented") {
        hints.push(
            "the node may run an older ferry: compare `ferry --version` with the node's".into(),
        );
        return "the server does not know this request".into();
    }
    match message.split_once("; ") {
        Some((why, hint)) if !why.is_empty() && !hint.is_empty() => {
            hints.push(hint.to_owned());
            why.to_owned()
        }
        _ => message.to_owned(),
    }
}

/// What a transport error comes down to (`connection refused`), not its library type.
fn transport_text(e: &(dyn std::error::Error + 'static)) -> String {
    let mut last: &(dyn std::error::Error + 'static) = e;
    let mut io_kind = None;
    let mut cur = Some(e);
    while let Some(x) = cur {
        if let Some(io) = x.downcast_ref::<std::io::Error>() {
            io_kind = Some(io.kind());
        }
        last = x;
        cur = x.source();
    }
    use std::io::ErrorKind as K;
    match io_kind {
        Some(K::ConnectionRefused) => "connection refused".into(),
        Some(K::TimedOut) => "timed out".into(),
        Some(K::ConnectionReset) => "connection reset".into(),
        Some(K::AddrNotAvailable) => "address not available".into(),
        _ => {
            let text = last.to_string();
            if text.is_empty() || text == "transport error" {
                "no answer".into()
            } else {
                text
            }
        }
    }
}

/// Runs `render` once, or with `watch` every `interval` until ctrl-c (or `count` times). For
/// people each refresh shows under a line with the time, redrawn in place on a terminal; for
/// scripts (`-o json`) the lines just follow each other. `render` returns the text to show.
pub async fn watch<F, Fut>(
    watch: bool,
    interval: std::time::Duration,
    count: Option<u64>,
    format: Format,
    mut render: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<String>>,
{
    use std::io::IsTerminal as _;
    if !watch {
        let text = render().await?;
        let text = text.trim_end_matches('\n');
        if !text.is_empty() || format == Format::Human {
            outln!("{text}")?;
        }
        return Ok(());
    }
    let terminal = std::io::stdout().is_terminal();
    // One listener for the whole watch: a ctrl-c while a refresh is on its way ends it too.
    let interrupted = tokio::signal::ctrl_c();
    tokio::pin!(interrupted);
    let mut shown = 0u64;
    loop {
        let text = tokio::select! {
            text = render() => text?,
            _ = &mut interrupted => return Ok(()),
        };
        let text = text.trim_end_matches('\n');
        match format {
            Format::Json if text.is_empty() => {}
            Format::Json => outln!("{text}")?,
            Format::Human => {
                let stamp = watch_header(now_ms(), interval);
                // Home and clear the screen: the new table replaces the old one.
                let clear = if terminal { "\x1b[H\x1b[2J" } else { "" };
                outln!("{clear}{stamp}\n{text}")?;
            }
        }
        shown += 1;
        if count.is_some_and(|c| shown >= c) {
            return Ok(());
        }
        tokio::select! {
            () = tokio::time::sleep(interval) => {}
            _ = &mut interrupted => return Ok(()),
        }
    }
}

/// The line above each refresh of `--watch`.
pub fn watch_header(now_ms: u64, interval: std::time::Duration) -> String {
    format!(
        "{} (every {}; ctrl-c to stop)",
        timestamp_text(now_ms),
        duration_text(u64::try_from(interval.as_millis()).unwrap_or(u64::MAX))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations_read_in_units() {
        assert_eq!(bytes_text(0), "0 B");
        assert_eq!(bytes_text(512), "512 B");
        assert_eq!(bytes_text(1536), "1.5 KiB");
        assert_eq!(bytes_text(64 * 1024 * 1024), "64 MiB");
        assert_eq!(duration_text(250), "250 ms");
        assert_eq!(duration_text(1_500), "1.5 s");
        assert_eq!(duration_text(3_000), "3 s");
        assert_eq!(duration_text(45_200), "45 s");
        assert_eq!(duration_text(150_000), "2 min 30 s");
        assert_eq!(duration_text(600_000), "10 min");
        assert_eq!(duration_text(12 * 3_600_000), "12 h");
        assert_eq!(duration_text(30 * 3_600_000), "1 d 6 h");
        assert_eq!(ago_text(10_000, 13_000), "3 s ago");
        assert_eq!(ago_text(0, 13_000), "-");
        assert_eq!(timestamp_text(0), "1970-01-01T00:00:00Z");
    }

    #[test]
    fn a_server_refusal_reads_as_what_failed_why_and_what_to_do() {
        let e = anyhow::Error::new(tonic::Status::not_found(
            "queue \"orders\" does not exist; create it first (ferry queue create orders)",
        ))
        .context("cannot send to queue orders");
        let text = error_report(&e, "127.0.0.1:7400");
        assert_eq!(
            text,
            "error: cannot send to queue orders: queue \"orders\" does not exist\n  hint: create it first (ferry queue create orders)"
        );
        assert!(!text.contains("code:") && !text.contains("Some requested entity"));
    }

    #[test]
    fn a_dead_connection_is_said_in_words() {
        let s = tonic::Status::unavailable("tcp connect error");
        let e = anyhow::Error::new(s).context("cannot list queues");
        let text = error_report(&e, "127.0.0.1:9");
        assert!(
            text.starts_with(
                "error: cannot list queues: lost the connection to the server at 127.0.0.1:9"
            ),
            "{text}"
        );
        assert!(
            text.contains("--server HOST:PORT (or FERRY_SERVER)"),
            "{text}"
        );
    }
}
