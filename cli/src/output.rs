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
