use std::io::{IsTerminal, Read};

use anyhow::{bail, Context as _};
use ferry_client::{AckMode, Message, Session};
use ferry_proto::pb;
use serde_json::json;

use super::{connect, with_connection, ClientArgs};
use crate::output::{outln, Format};

/// Messages per Send call when sending many.
const BATCH: usize = 500;

#[derive(Debug, clap::Args)]
pub struct SendArgs {
    /// The queue to send to.
    #[arg(long, short)]
    queue: String,
    /// The message body; read from stdin when absent (and stdin is not a terminal).
    body: Option<String>,
    /// Send this many messages: the body each time, or "message N" when there is no body.
    #[arg(long)]
    count: Option<u64>,
    /// A typed property, NAME=VALUE: an int, long, double or bool when VALUE parses as one, else a
    /// string; NAME:TYPE=VALUE forces the type (string, int, long, double, bool). Repeatable.
    #[arg(long = "property", short = 'p', value_parser = parse_property)]
    properties: Vec<(String, pb::PropertyValue)>,
    /// The JMS correlation id: what a reply carries to name its request, or any id of yours.
    #[arg(long)]
    correlation_id: Option<String>,
    /// Queue for replies (must exist).
    #[arg(long)]
    reply_to: Option<String>,
    /// JMSType.
    #[arg(long = "type")]
    jms_type: Option<String>,
    /// 0-9, higher first (default 4).
    #[arg(long)]
    priority: Option<u32>,
    /// Time to live: the message expires after this.
    #[arg(long)]
    ttl_ms: Option<u64>,
    /// Delivery delay: the message is invisible until then.
    #[arg(long)]
    delay_ms: Option<u64>,
    /// Keep the message in memory only.
    #[arg(long)]
    non_persistent: bool,
    /// JMSXGroupID: a group's messages go to one consumer at a time, in order.
    #[arg(long)]
    group_id: Option<String>,
    /// Producer dedup id: resending it within the queue's dedup window stores nothing new and
    /// returns the first message id.
    #[arg(long)]
    dedup_id: Option<String>,
}

/// Parses `NAME=VALUE` or `NAME:TYPE=VALUE` into a typed property.
pub fn parse_property(s: &str) -> Result<(String, pb::PropertyValue), String> {
    use pb::property_value::Value;
    let (key, value) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: write a property as NAME=VALUE"))?;
    let (name, ty) = match key.split_once(':') {
        Some((n, t)) => (n, Some(t)),
        None => (key, None),
    };
    ferry_kernel::validate_property_name(name).map_err(|e| e.to_string())?;
    let bad = |t: &str| format!("{s:?}: {value:?} is not a {t}");
    let v = match ty {
        Some("string") => Value::StringValue(value.into()),
        Some("int") => Value::IntValue(value.parse().map_err(|_| bad("int"))?),
        Some("long") => Value::LongValue(value.parse().map_err(|_| bad("long"))?),
        Some("double") => Value::DoubleValue(value.parse().map_err(|_| bad("double"))?),
        Some("bool") => Value::BoolValue(value.parse().map_err(|_| bad("bool (true or false)"))?),
        Some(t) => {
            return Err(format!(
                "{s:?}: unknown type {t:?}; use string, int, long, double or bool"
            ))
        }
        None => {
            if let Ok(i) = value.parse::<i32>() {
                Value::IntValue(i)
            } else if let Ok(l) = value.parse::<i64>() {
                Value::LongValue(l)
            } else if let Ok(d) = value.parse::<f64>().map_err(|_| ()).and_then(|d| {
                if d.is_finite() {
                    Ok(d)
                } else {
                    Err(())
                }
            }) {
                Value::DoubleValue(d)
            } else if let Ok(b) = value.parse::<bool>() {
                Value::BoolValue(b)
            } else {
                Value::StringValue(value.into())
            }
        }
    };
    Ok((name.to_string(), pb::PropertyValue { value: Some(v) }))
}

pub async fn run(c: &ClientArgs, a: SendArgs) -> anyhow::Result<()> {
    let body: Option<Vec<u8>> = match a.body.clone() {
        Some(b) => Some(b.into_bytes()),
        None if a.count.is_none() && !std::io::stdin().is_terminal() => {
            let mut buf = vec![];
            std::io::stdin()
                .read_to_end(&mut buf)
                .context("cannot read the body from stdin")?;
            Some(buf)
        }
        None if a.count.is_none() => {
            bail!("give a body: ferry send --queue Q 'hello', pipe one on stdin, or use --count N")
        }
        None => None,
    };
    let count = a.count.unwrap_or(1);
    let client = connect(c).await?;
    with_connection(&client, "ferry-cli", async |connection| {
        let session = connection.create_session(AckMode::Auto).await?;
        send_all(c, &a, &session, body.as_deref(), count).await
    })
    .await
}

/// Sends `count` messages in batches, printing their ids.
async fn send_all(
    c: &ClientArgs,
    a: &SendArgs,
    session: &Session,
    body: Option<&[u8]>,
    count: u64,
) -> anyhow::Result<()> {
    let make = |i: u64| {
        let body = body.map_or_else(|| format!("message {i}").into_bytes(), <[u8]>::to_vec);
        let mut m = Message::bytes(body);
        for (k, v) in &a.properties {
            m.0.properties.insert(k.clone(), v.clone());
        }
        m.0.correlation_id = a.correlation_id.clone();
        m.0.reply_to = a.reply_to.clone().unwrap_or_default();
        m.0.r#type = a.jms_type.clone().unwrap_or_default();
        m.0.priority = a.priority;
        m.0.time_to_live_ms = a.ttl_ms;
        m.0.delivery_delay_ms = a.delay_ms;
        if let Some(g) = &a.group_id {
            m = m.group_id(g.clone());
        }
        if let Some(d) = &a.dedup_id {
            m = m.dedup_id(d.clone());
        }
        if a.non_persistent {
            m = m.non_persistent();
        }
        m
    };
    let mut sent = 0u64;
    while sent < count {
        let n = (count - sent).min(BATCH as u64);
        let batch: Vec<Message> = (sent + 1..=sent + n).map(make).collect();
        let ids = session
            .send(&a.queue, batch)
            .await
            .with_context(|| format!("cannot send to queue {}", a.queue))?;
        for id in &ids {
            match c.output {
                Format::Json => outln!("{}", json!({ "message_id": id, "queue": a.queue }))?,
                Format::Human if count <= 10 => outln!("{id}")?,
                Format::Human => {}
            }
        }
        sent += n;
    }
    if c.output == Format::Human && count > 10 {
        outln!("sent {count} messages to {}", a.queue)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use pb::property_value::Value;

    fn v(s: &str) -> Value {
        parse_property(s).unwrap().1.value.unwrap()
    }

    #[test]
    fn property_types_follow_the_value_unless_forced() {
        assert_eq!(v("n=5"), Value::IntValue(5));
        assert_eq!(v("n=5000000000"), Value::LongValue(5_000_000_000));
        assert_eq!(v("n=2.5"), Value::DoubleValue(2.5));
        assert_eq!(v("n=true"), Value::BoolValue(true));
        assert_eq!(v("n=hello"), Value::StringValue("hello".into()));
        assert_eq!(v("n=inf"), Value::StringValue("inf".into()));
        assert_eq!(v("n:string=5"), Value::StringValue("5".into()));
        assert_eq!(v("n:long=5"), Value::LongValue(5));
        assert!(parse_property("n:int=x").is_err());
        assert!(parse_property("n:float=1").is_err());
        assert!(parse_property("novalue").is_err());
        assert!(parse_property("JMSX=1").is_err());
    }
}
