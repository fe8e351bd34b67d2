//! Printing for humans (default) or scripts (`-o json`: one JSON object per line).

use std::collections::BTreeMap;

use ferry_proto::pb;
use serde_json::{json, Value};

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

/// One message as a JSON object.
pub fn message_json(m: &pb::Message, delivery: Option<&pb::Delivery>) -> Value {
    let properties: BTreeMap<&String, Value> = m
        .properties
        .iter()
        .map(|(k, v)| (k, property_json(v)))
        .collect();
    let mut v = json!({
        "message_id": m.message_id,
        "queue": m.queue,
        "body": String::from_utf8_lossy(&m.body),
        "properties": properties,
        "correlation_id": m.correlation_id,
        "reply_to": (!m.reply_to.is_empty()).then_some(&m.reply_to),
        "type": (!m.r#type.is_empty()).then_some(&m.r#type),
        "priority": m.priority,
        "timestamp_ms": m.timestamp_ms,
        "expiration_ms": m.expiration_ms,
        "persistent": m.delivery_mode != pb::DeliveryMode::NonPersistent as i32,
    });
    if let Some(d) = delivery {
        v["delivery_count"] = json!(d.delivery_count);
        v["redelivered"] = json!(d.redelivered);
        v["receipt_handle"] = json!(d.receipt_handle);
    }
    v
}

/// One message for a person to read.
pub fn message_text(m: &pb::Message, delivery: Option<&pb::Delivery>) -> String {
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
    s += &format!("  {}", String::from_utf8_lossy(&m.body));
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
